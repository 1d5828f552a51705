//! The pairing rules, over [`Turn`]s.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::{Speaker, Turn};

/// A rule of the pairing of calls and results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Rule {
    /// A call no later message answers.
    CallWithoutResult,
    /// A result for a call no earlier reply asked for.
    ResultWithoutCall,
    /// A result for an earlier call, but not in the message right after it.
    ResultNotNext,
    /// The results of a reply's calls in another order than the calls.
    ResultsOutOfOrder,
    /// A call id asked twice in one reply, or a call answered twice.
    DuplicateId,
    /// A call with an empty id.
    EmptyId,
    /// A result held by an entry left off the chain a resume follows (a
    /// Claude Code session whose parallel results were re-parented off
    /// it): the call on the chain has no result there.
    ResultOffChain,
    /// A subagent's history that no call of its session started (a Claude
    /// Code subagent file whose `agentId` no `Task` result names).
    ChildWithoutCall,
    /// A reply whose stop reason disagrees with its content: `tool_use`
    /// without a call, `end_turn` with calls.
    StopReason,
    /// (Claude Code) the chain a resume follows starts at an entry whose
    /// parent is not in the file (a lost line): the conversation before it
    /// is left out.
    LostParent,
}

impl Rule {
    /// The rule's name, as in `--json` (`call_without_result`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CallWithoutResult => "call_without_result",
            Self::ResultWithoutCall => "result_without_call",
            Self::ResultNotNext => "result_not_next",
            Self::ResultsOutOfOrder => "results_out_of_order",
            Self::DuplicateId => "duplicate_id",
            Self::EmptyId => "empty_id",
            Self::ResultOffChain => "result_off_chain",
            Self::ChildWithoutCall => "child_without_call",
            Self::StopReason => "stop_reason",
            Self::LostParent => "lost_parent",
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One place a rule breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// The rule.
    pub rule: Rule,
    /// The index of the message where it breaks, in the file's own list.
    pub message: usize,
    /// The file's line, for formats with one message per line.
    pub line: Option<usize>,
    /// The call id it is about.
    pub id: Option<String>,
    /// What is wrong, in words.
    pub detail: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}, ")?;
        }
        write!(f, "message {}: {}", self.message, self.detail)
    }
}

/// Replies whose stop reason (where the file keeps one) disagrees with
/// their content: `tool_use` without a call, `end_turn` with calls.
pub(super) fn stop_reasons(turns: &[Turn]) -> Vec<Finding> {
    turns
        .iter()
        .filter(|turn| turn.speaker == Speaker::Assistant)
        .filter_map(|turn| {
            let stop = turn.stop_reason.as_deref()?;
            let detail = match (stop, turn.calls.is_empty()) {
                ("tool_use", true) => "the reply stopped for `tool_use` but asks for no call",
                ("end_turn", false) => {
                    "the reply stopped with `end_turn` but asks for calls: a client may not run them"
                }
                _ => return None,
            };
            Some(Finding {
                rule: Rule::StopReason,
                message: turn.message,
                line: turn.line,
                id: None,
                detail: detail.to_owned(),
            })
        })
        .collect()
}

/// Checks the pairing of calls and results over `turns`: each call is
/// answered by a result in the very next turn, once, in call order, and
/// no result answers a call that was not asked right before it. With
/// `open_end`, the calls of the last turn may be answered outside the
/// history (a subloop trace answers a last round in its `tool` lines).
/// Every breach is reported, in message order.
pub fn pairing(turns: &[Turn], open_end: bool) -> Vec<Finding> {
    let mut found = Vec::new();
    // Each call id: the latest turn that asked it (a later reply may use an
    // id again; within one reply ids are unique).
    let mut asked: HashMap<&str, usize> = HashMap::new();
    // Each call answered, as (the turn that asked it, its id): the message
    // of its result.
    let mut answered: HashMap<(usize, &str), usize> = HashMap::new();
    let mut skipped: HashSet<(usize, usize)> = HashSet::new();
    // `line`: the call's or the result's own line, when the file has lines.
    let finding = |rule: Rule,
                   turn: &Turn,
                   line: Option<usize>,
                   message: usize,
                   id: Option<&str>,
                   detail: String| Finding {
        rule,
        message,
        line: line.or(turn.line),
        id: id.map(str::to_owned),
        detail,
    };
    for (index, turn) in turns.iter().enumerate() {
        match turn.speaker {
            Speaker::Assistant => {
                let mut in_reply: HashSet<&str> = HashSet::new();
                for (position, call) in turn.calls.iter().enumerate() {
                    if call.id.is_empty() {
                        found.push(finding(
                            Rule::EmptyId,
                            turn,
                            call.line,
                            turn.message,
                            None,
                            format!("a call of {} has an empty id", call.name),
                        ));
                        skipped.insert((index, position));
                    } else if !in_reply.insert(&call.id) {
                        found.push(finding(
                            Rule::DuplicateId,
                            turn,
                            call.line,
                            turn.message,
                            Some(&call.id),
                            format!(
                                "the call {} is asked twice in this reply; a reply's ids are unique",
                                call.id
                            ),
                        ));
                        skipped.insert((index, position));
                    } else {
                        asked.insert(&call.id, index);
                    }
                }
            }
            Speaker::User => {
                let previous = index.checked_sub(1).filter(|previous| {
                    turns
                        .get(*previous)
                        .is_some_and(|turn| turn.speaker == Speaker::Assistant)
                });
                let before: Vec<&str> = previous
                    .and_then(|previous| turns.get(previous))
                    .map(|previous| previous.calls.iter().map(|call| call.id.as_str()).collect())
                    .unwrap_or_default();
                let mut in_turn: Vec<&str> = Vec::new();
                for answer in &turn.results {
                    let id = answer.id.as_str();
                    // The call it answers: the one right before, else the
                    // latest earlier one of that id.
                    let (call_turn, next) = match previous.filter(|_| before.contains(&id)) {
                        Some(previous) => (Some(previous), true),
                        None => (asked.get(id).copied(), false),
                    };
                    let Some(call_turn) = call_turn else {
                        found.push(finding(
                            Rule::ResultWithoutCall,
                            turn,
                            answer.line,
                            answer.message,
                            Some(id),
                            format!("a result for {id}, which no earlier reply asked for"),
                        ));
                        continue;
                    };
                    if let Some(first) = answered.get(&(call_turn, id)) {
                        found.push(finding(
                            Rule::DuplicateId,
                            turn,
                            answer.line,
                            answer.message,
                            Some(id),
                            format!(
                                "a second result for {id} (the first is in message {first}); a call is answered once"
                            ),
                        ));
                        continue;
                    }
                    answered.insert((call_turn, id), answer.message);
                    if next {
                        in_turn.push(id);
                    } else {
                        let at = turns.get(call_turn).map_or(0, |turn| turn.message);
                        found.push(finding(
                            Rule::ResultNotNext,
                            turn,
                            answer.line,
                            answer.message,
                            Some(id),
                            format!(
                                "the result for {id} is here, not in the message right after its call (message {at}); results go in the next message"
                            ),
                        ));
                    }
                }
                // The calls answered here, in the calls' order (an id the
                // reply asked twice counts once: that is a breach of its own).
                let mut seen = HashSet::new();
                let wanted: Vec<&str> = before
                    .iter()
                    .copied()
                    .filter(|id| in_turn.contains(id) && seen.insert(*id))
                    .collect();
                if in_turn != wanted {
                    found.push(finding(
                        Rule::ResultsOutOfOrder,
                        turn,
                        None,
                        turn.message,
                        None,
                        format!(
                            "the results answer {in_turn:?}, but the calls came as {wanted:?}; results go in call order"
                        ),
                    ));
                }
            }
        }
    }
    let last = turns.len().saturating_sub(1);
    for (index, turn) in turns.iter().enumerate() {
        if turn.speaker != Speaker::Assistant || (open_end && index == last) {
            continue;
        }
        for (position, call) in turn.calls.iter().enumerate() {
            if skipped.contains(&(index, position))
                || answered.contains_key(&(index, call.id.as_str()))
            {
                continue;
            }
            found.push(finding(
                Rule::CallWithoutResult,
                turn,
                call.line,
                turn.message,
                Some(&call.id),
                format!(
                    "the call {} ({}) has no result: the next message must hold one",
                    call.id, call.name
                ),
            ));
        }
    }
    found.sort_by_key(|finding| finding.message);
    found
}
