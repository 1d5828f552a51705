//! The loop's invariants, checked over a recorded run (a trace read into a
//! [`RecordedRun`]): one definition, used by the `testing` feature's checker for
//! the pairing of calls and results, and by hosts that check recorded runs
//! (for instance in CI).
//!
//! [`Policy::check`] gives one [`Verdict`] per [`Invariant`]: held, or broken with
//! every [`Breach`] and where it is (agent, call, tool_use id).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use crate::core::protocol::{Block, Message, ReplyBlock, Role, StopReason};
use crate::record::recorded::RecordedRun;

/// One rule of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Invariant {
    /// Every `tool_use` is answered exactly once, in order, in the next user
    /// message (the last round by its `tool` lines), and no result answers
    /// an id that was not asked.
    AnsweredOnce,
    /// No agent made more model calls than its budget.
    WithinBudget,
    /// An accepted reply's stop reason agrees with its content: `tool_use`
    /// with calls, `end_turn` without.
    StopReasons,
    /// A child's first request is exactly `[user: task]` and offers only
    /// the whitelisted tools.
    ChildStartsFresh,
    /// Every tool that ran was offered to that agent (a call of another name
    /// is `unregistered` and did not run).
    OfferedIsDispatched,
    /// A denied call never ran: its result says it was not executed.
    DeniedNeverRan,
    /// The trace agrees with itself, by the rules a resume holds it to
    /// ([`RecordedRun::consistency`]): each history is what its replies
    /// and results make through the conversation's own transitions, each
    /// `tool` line says what the model was sent, the outcome agrees with
    /// the last reply (its status, and the text the loop derives from that
    /// reply), and each child
    /// was started by a `task` call.
    Consistent,
}

impl Invariant {
    /// Every invariant, in report order.
    pub const ALL: [Invariant; 7] = [
        Invariant::AnsweredOnce,
        Invariant::WithinBudget,
        Invariant::StopReasons,
        Invariant::ChildStartsFresh,
        Invariant::OfferedIsDispatched,
        Invariant::DeniedNeverRan,
        Invariant::Consistent,
    ];

    /// The rule in words.
    pub fn rule(self) -> &'static str {
        match self {
            Self::AnsweredOnce => {
                "every tool_use is answered exactly once, in order, in the next user message"
            }
            Self::WithinBudget => "no agent is over its call budget",
            Self::StopReasons => "stop reasons agree with content",
            Self::ChildStartsFresh => {
                "a child's first request is exactly [user: task] and offers only whitelisted tools"
            }
            Self::OfferedIsDispatched => "the tools offered are the tools dispatched",
            Self::DeniedNeverRan => "denied calls never ran",
            Self::Consistent => {
                "the trace agrees with itself (histories, tool lines, outcome, delegations)"
            }
        }
    }
}

/// One place a rule breaks, or a trace contradicts itself
/// ([`RecordedRun::consistency`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Breach {
    /// `parent` or `child-N`.
    pub agent: String,
    /// The model call (1-based), when the breach is in one.
    pub call: Option<u32>,
    /// The tool_use id, when the breach is about one call.
    pub id: Option<String>,
    /// What is wrong.
    pub detail: String,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.agent)?;
        if let Some(call) = self.call {
            write!(f, " call {call}")?;
        }
        if let Some(id) = &self.id {
            write!(f, " ({id})")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// One rule, checked over a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Verdict {
    /// The rule.
    pub invariant: Invariant,
    /// Every place it breaks; empty when it held.
    pub breaches: Vec<Breach>,
}

impl Verdict {
    /// Whether the rule held everywhere.
    pub fn held(&self) -> bool {
        self.breaches.is_empty()
    }
}

/// What a run was allowed, for the checks the trace alone cannot decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The parent's call budget per question, if known (`--max-calls`).
    pub parent_calls: Option<u32>,
    /// Each child's call budget, if known (`--child-calls`).
    pub child_calls: Option<u32>,
    /// The tools a child may be offered (default `read_file`).
    pub child_tools: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            parent_calls: None,
            child_calls: None,
            child_tools: vec!["read_file".to_owned()],
        }
    }
}

/// The calls of a history, as `(id, name, input)`, when the pairing
/// rules hold over it ([`crate::record::history::pairing`]: every call
/// answered exactly once, in call order, by the next message, and no
/// result for a call not asked right before; the last message's calls may
/// be answered outside it). The error is the first place they break.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn answered_once(messages: &[Message]) -> Result<Vec<(String, String, Value)>, String> {
    let turns = crate::record::history::turns_of(messages);
    if let Some(finding) = crate::record::history::pairing(&turns, true).first() {
        return Err(finding.to_string());
    }
    Ok(messages
        .iter()
        .filter(|message| message.role == Role::Assistant)
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            Block::ToolUse { id, name, input } => {
                Some((id.to_string(), name.clone(), input.clone()))
            }
            _ => None,
        })
        .collect())
}

impl Policy {
    /// Checks every [`Invariant`] over `run` under this policy: one
    /// [`Verdict`] per invariant, held or broken with every place it breaks.
    pub fn check(&self, run: &RecordedRun) -> Vec<Verdict> {
        check(run, self)
    }
}

/// Checks every [`Invariant`] over `run` under `policy`.
pub(crate) fn check(run: &RecordedRun, policy: &Policy) -> Vec<Verdict> {
    let mut found: Vec<(Invariant, Breach)> = Vec::new();
    let agents: Vec<(String, u32)> = run
        .agents()
        .map(|(agent, calls)| (agent.to_owned(), calls))
        .collect();
    for (agent, calls) in &agents {
        let at = |call: Option<u32>, id: Option<&str>| (call, id.map(str::to_owned));
        let mut breach = |invariant, (call, id): (Option<u32>, Option<String>), detail: String| {
            found.push((
                invariant,
                Breach {
                    agent: agent.clone(),
                    call,
                    id,
                    detail,
                },
            ));
        };
        // Calls and results, in the history the requests carried...
        // (each history a compaction made, on its own), by the pairing
        // rules every history is checked by; a history's last round may be
        // answered by its tool lines.
        for history in run.histories(agent) {
            let turns = crate::record::history::turns_of(history);
            for finding in crate::record::history::pairing(&turns, true) {
                let id = finding.id.clone();
                breach(
                    Invariant::AnsweredOnce,
                    at(None, id.as_deref()),
                    format!("{} ({})", finding, finding.rule),
                );
            }
        }
        // ... and the last round, by its tool lines.
        if let Some(Ok(last)) = run.reply(agent, *calls) {
            let lines = run.tools_after_reply(agent, *calls);
            for block in &last.content {
                if let ReplyBlock::Known(Block::ToolUse { id, .. }) = block {
                    let count = lines
                        .iter()
                        .filter(|line| line.get("id").and_then(Value::as_str) == Some(id.as_str()))
                        .count();
                    if count > 1 {
                        breach(
                            Invariant::AnsweredOnce,
                            at(Some(*calls), Some(id.as_str())),
                            format!("answered {count} times"),
                        );
                    }
                }
            }
        }
        // Budgets.
        let budget = if agent == "parent" {
            policy.parent_calls
        } else {
            policy.child_calls
        };
        if let Some(budget) = budget
            && agent != "parent"
            && *calls > budget
        {
            breach(
                Invariant::WithinBudget,
                at(Some(*calls), None),
                format!("{calls} calls with a budget of {budget}"),
            );
        }
        if let (Some(budget), true) = (budget, agent == "parent") {
            // The parent's budget is per question: count calls between questions.
            let mut used = 0;
            for call in 1..=*calls {
                used += 1;
                if used > budget {
                    breach(
                        Invariant::WithinBudget,
                        at(Some(call), None),
                        format!("call {used} of a question with a budget of {budget}"),
                    );
                    break;
                }
                let answered = matches!(
                    run.reply(agent, call),
                    Some(Ok(reply)) if reply.stop_reason == Some(StopReason::EndTurn)
                );
                if answered {
                    used = 0;
                }
            }
        }
        // Stop reasons of accepted replies (the last one may have been refused).
        for call in 1..*calls {
            if let Some(Ok(reply)) = run.reply(agent, call) {
                let uses = reply
                    .content
                    .iter()
                    .filter(|block| matches!(block, ReplyBlock::Known(Block::ToolUse { .. })))
                    .count();
                let wrong = match reply.stop_reason {
                    Some(StopReason::ToolUse) => uses == 0,
                    Some(StopReason::EndTurn) => uses > 0,
                    _ => false,
                };
                if wrong {
                    breach(
                        Invariant::StopReasons,
                        at(Some(call), None),
                        format!("stop reason {:?} with {uses} call(s)", reply.stop_reason),
                    );
                }
            }
        }
        // Offered and dispatched (each reply's calls against the tools its
        // request offered), and denied calls.
        let calls = run.calls(agent);
        // Tool lines recorded before the first reply (a hand-made trace)
        // are checked against the first request.
        let early = run
            .tools(agent)
            .len()
            .saturating_sub(run.tools_after_reply(agent, 1).len());
        let mut groups: Vec<(u32, &[Value])> =
            vec![(1, run.tools(agent).get(..early).unwrap_or_default())];
        groups.extend((1..=calls).map(|call| (call, run.tools_of_reply(agent, call))));
        for (call, lines) in groups {
            let offered: BTreeSet<&str> = run
                .request(agent, call)
                .map(|request| {
                    request
                        .tools
                        .iter()
                        .map(|tool| tool.name.as_str())
                        .collect()
                })
                .unwrap_or_default();
            for line in lines {
                let name = line.get("name").and_then(Value::as_str).unwrap_or_default();
                let id = line.get("id").and_then(Value::as_str);
                let decision = line
                    .get("decision")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !offered.contains(name) && decision != "unregistered" {
                    breach(
                        Invariant::OfferedIsDispatched,
                        at(Some(call), id),
                        format!("{name} ran ({decision}) but was not offered"),
                    );
                }
                if decision == "denied" {
                    let content = line
                        .get("content")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let is_error = line.get("is_error").and_then(Value::as_bool) == Some(true);
                    if !is_error || !content.starts_with("not executed") {
                        breach(
                            Invariant::DeniedNeverRan,
                            at(Some(call), id),
                            format!(
                                "a denied {name} call has a result that shows it ran: {content:?}"
                            ),
                        );
                    }
                }
            }
        }
        // A child starts fresh.
        if agent != "parent" {
            child_starts_fresh(run, agent, policy, &mut |detail| {
                breach(Invariant::ChildStartsFresh, at(Some(1), None), detail);
            });
        }
    }
    for inconsistency in run.consistency() {
        found.push((Invariant::Consistent, inconsistency));
    }
    Invariant::ALL
        .into_iter()
        .map(|invariant| Verdict {
            invariant,
            breaches: found
                .iter()
                .filter(|(which, _)| *which == invariant)
                .map(|(_, breach)| breach.clone())
                .collect(),
        })
        .collect()
}

/// The child's first request against the parent's `task` call that started it.
fn child_starts_fresh(
    run: &RecordedRun,
    agent: &str,
    policy: &Policy,
    breach: &mut dyn FnMut(String),
) {
    let Some(first) = run.request(agent, 1) else {
        return;
    };
    for tool in first.tools {
        if !policy.child_tools.contains(&tool.name) {
            breach(format!("offered {}, which is not whitelisted", tool.name));
        }
    }
    let task = run
        .delegation(agent)
        .and_then(|(_, input)| input.get("task").and_then(Value::as_str).map(str::to_owned));
    let fresh = match first.messages {
        [only] => {
            only.role == Role::User
                && only
                    .content
                    .iter()
                    .all(|block| matches!(block, Block::Text { .. }))
                && task.as_deref().is_none_or(|task| only.text() == task)
        }
        _ => false,
    };
    if !fresh {
        breach(format!(
            "the first request holds {} message(s), not just [user: task]",
            first.messages.len()
        ));
    }
}
