//! A recorded run run again and compared: [`Replay`].
//!
//! The models of a replay answer from the trace (the parent's replies, and
//! each child's by its delegation), each request is compared with the
//! recorded one before its reply is given, and each approval is checked
//! against the recorded decision before the call can run. After the run,
//! each agent's number of requests, its tool calls and the parent's outcome
//! are compared too. A replay needs no network and changes nothing the
//! recorded run did not change: a call the recorded run denied never runs.
//!
//! ```no_run
//! use std::sync::Arc;
//! use subloop::agent::subagent::SubagentConfig;
//! use subloop::policy::permission::AllowAll;
//! use subloop::record::replay::Replay;
//! use subloop::{AgentBuilder, Budget, Hooks};
//!
//! type Error = Box<dyn std::error::Error>;
//!
//! let replay = Replay::load("run.jsonl".as_ref())?;
//! let report = replay.run(Arc::new(AllowAll), Budget::new(8)?, |approver, children| {
//!     let agent = AgentBuilder::new(approver)
//!         .subagents(SubagentConfig::new(children, Hooks::none()))?
//!         .build();
//!     Ok::<_, Error>(agent)
//! })?;
//! println!("{}", report.lines(false).join("\n"));
//! # Ok::<(), Error>(())
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;

pub use super::compare::{Difference, Divergence, Part, ReplayReport};

use super::compare::compare_tools_run;
use super::recorded::{RecordedRun, ReplayChildren, ReplayError, ReplayLog, ReplayModel};
use crate::agent::{Agent, ResumePoint, RunReport};
use crate::core::conversation::{Budget, OnEmptyReply, StatusKind};
use crate::core::error::InputError;
use crate::core::protocol::Role;
use crate::policy::permission::{ApprovalRequest, Approver, Decision};
use crate::run::model::ChildModels;

/// A trace to run again: see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Replay {
    recorded: Arc<RecordedRun>,
    /// Where it was read from, for errors.
    path: PathBuf,
    keep_going: bool,
    on_empty_reply: OnEmptyReply,
}

impl Replay {
    /// Reads the trace at `path`.
    pub fn load(path: &Path) -> Result<Self, ReplayError> {
        let mut replay = Self::new(RecordedRun::load(path)?);
        replay.path = path.to_owned();
        Ok(replay)
    }

    /// A replay of `recorded`; it stops at the first divergence.
    pub fn new(recorded: RecordedRun) -> Self {
        Self {
            recorded: Arc::new(recorded),
            path: PathBuf::from("(a trace read from memory)"),
            keep_going: false,
            on_empty_reply: OnEmptyReply::default(),
        }
    }

    /// With `true`, a divergence is listed and the replay goes on.
    #[must_use]
    pub fn keep_going(mut self, keep_going: bool) -> Self {
        self.keep_going = keep_going;
        self
    }

    /// How the agents built for the replay answer an empty reply (for the
    /// histories of follow-up questions; give the agents the same policy).
    #[must_use]
    pub fn on_empty_reply(mut self, policy: OnEmptyReply) -> Self {
        self.on_empty_reply = policy;
        self
    }

    /// The run read from the trace.
    pub fn recorded(&self) -> &RecordedRun {
        &self.recorded
    }

    /// The question the recorded run was asked (as asked: what its
    /// `SessionStart` and `UserPromptSubmit` hooks added is in it, so a
    /// replay's agent runs without those hooks).
    pub fn question(&self) -> Option<String> {
        self.recorded.question()
    }

    /// The output schema the recorded parent's answer was checked against.
    pub fn output_schema(&self) -> Option<&Value> {
        self.recorded.output_schema("parent")
    }

    /// Runs the recorded question again with `budget` parent calls and
    /// compares. `agent` builds the agent for each question (the first, and
    /// each follow-up the trace holds) from the approver and the children a
    /// replay must use: the approver asks `approver` and checks its
    /// decision against the recorded one; the children answer from the
    /// trace. Errors are `agent`'s, or the question's.
    pub fn run<E, F>(
        &self,
        approver: Arc<dyn Approver>,
        budget: Budget,
        mut agent: F,
    ) -> Result<ReplayReport, E>
    where
        E: From<InputError> + From<ReplayError>,
        F: FnMut(Arc<dyn Approver>, Arc<dyn ChildModels>) -> Result<Agent, E>,
    {
        let recorded = &self.recorded;
        let question = self.question().ok_or_else(|| ReplayError::Invalid {
            path: self.path.clone(),
            message: "the parent's first request holds no question".to_owned(),
        })?;
        let log = Arc::new(ReplayLog::new(self.keep_going));
        let mut parent = ReplayModel::new(Arc::clone(recorded), "parent", Arc::clone(&log));
        let children: Arc<dyn ChildModels> =
            Arc::new(ReplayChildren::new(Arc::clone(recorded), Arc::clone(&log)));
        let mut build = || {
            let checked = Arc::new(ReplayApprover {
                inner: Arc::clone(&approver),
                recorded: Arc::clone(recorded),
                log: Arc::clone(&log),
                asked: Mutex::default(),
            });
            agent(checked, Arc::clone(&children))
        };
        let mut run = build()?.run(&question, budget, &mut parent)?;
        // Follow-up questions: each is asked as it was, on the history
        // replayed so far, as long as nothing diverged.
        while !log.halted() && log.divergences().is_empty() {
            let made = log.made("parent");
            let next = match recorded
                .history_of("parent", made)
                .get(run.outcome.messages.len())
            {
                Some(message)
                    if run.outcome.status == StatusKind::Answered
                        && made < recorded.calls("parent")
                        && message.role == Role::User =>
                {
                    message.text()
                }
                _ => break,
            };
            let prefix = recorded.parent_prefix(made);
            let Ok(mut point) = ResumePoint::follow_up(&prefix, &next, budget, self.on_empty_reply)
            else {
                break;
            };
            point.spent.tokens = run.total_usage().billed();
            point.spent.delegations = run.children.len();
            let next_run = build()?.resume(point, &mut parent);
            run = merge_reports(run, next_run);
        }
        if !log.halted() {
            compare_after(recorded, &log, &run);
        }
        Ok(ReplayReport {
            run,
            recorded_status: recorded.recorded_outcome().map(|outcome| outcome.status),
            recorded_requests: recorded.request_count(),
            divergences: log.divergences(),
        })
    }
}

/// What is compared once the run is over: each agent's number of requests,
/// its tool calls (the trace's `tool` lines, which also hold a last round
/// no request carried) and the parent's outcome (status and text).
fn compare_after(recorded: &RecordedRun, log: &ReplayLog, run: &RunReport) {
    let diverged = log.divergences();
    for (name, recorded_calls) in recorded.agents() {
        let now = log.made(name);
        if now != recorded_calls && !diverged.iter().any(|found| found.agent == name) {
            log.push(Divergence {
                agent: name.to_owned(),
                call: None,
                difference: Difference::CallCount {
                    recorded: recorded_calls,
                    now,
                },
            });
        }
    }
    let mut agents_now = vec![("parent".to_owned(), run.tools.as_slice())];
    agents_now.extend(
        run.children
            .iter()
            .map(|child| (child.agent.to_string(), child.tools.as_slice())),
    );
    let diverged = log.divergences();
    for (name, tools) in agents_now {
        if diverged.iter().any(|found| found.agent == name) {
            continue;
        }
        if let Some(difference) = compare_tools_run(recorded.tools(&name), tools) {
            log.push(Divergence {
                agent: name,
                call: None,
                difference,
            });
        }
    }
    let now = format!("{} {:?}", run.outcome.status, run.outcome.text);
    let difference = match recorded.recorded_outcome() {
        Some(outcome)
            if outcome.status == run.outcome.status && outcome.text == run.outcome.text =>
        {
            None
        }
        Some(outcome) => Some(Difference::Outcome {
            recorded: format!("{} {:?}", outcome.status, outcome.text),
            now,
        }),
        None => Some(Difference::Outcome {
            recorded: "no outcome (the recorded run did not finish)".to_owned(),
            now,
        }),
    };
    if let Some(difference) = difference {
        log.push(Divergence {
            agent: "parent".to_owned(),
            call: None,
            difference,
        });
    }
}

/// One report for a replayed run and its follow-up `next`: the last
/// outcome (its history holds both), every call, child, warning and entry.
fn merge_reports(mut run: RunReport, next: RunReport) -> RunReport {
    run.usage_per_call.extend(next.usage_per_call);
    run.empty_replies_continued += next.empty_replies_continued;
    run.tools.extend(next.tools);
    run.children.extend(next.children);
    run.warnings.extend(next.warnings);
    run.audit.extend(next.audit);
    run.elapsed += next.elapsed;
    let mut usage = run.outcome.usage;
    usage.add(&next.outcome.usage);
    run.outcome = next.outcome;
    run.outcome.usage = usage;
    run
}

/// The approver of a replay: the host's approver decides each call as
/// usual, and its decision is compared with the recorded one before the call
/// can run. A call the recorded run denied is not run now, whatever the
/// host's approver says: the replay files the divergence first (and stops
/// there unless it keeps going), and answers the call as denied.
struct ReplayApprover {
    inner: Arc<dyn Approver>,
    recorded: Arc<RecordedRun>,
    log: Arc<ReplayLog>,
    /// How often each agent's call id was asked about (ids may come again
    /// in a later question).
    asked: Mutex<HashMap<(String, String), usize>>,
}

impl Approver for ReplayApprover {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        let agent = request.agent.to_string();
        let id = request.call.id().as_str();
        let nth = {
            let mut asked = self
                .asked
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            let count = asked.entry((agent.clone(), id.to_owned())).or_insert(0);
            *count += 1;
            *count - 1
        };
        let recorded = self
            .recorded
            .tools(&agent)
            .iter()
            .filter(|line| {
                line.get("id").and_then(Value::as_str) == Some(id)
                    && line.get("name").and_then(Value::as_str) == Some(request.call.name())
            })
            .nth(nth)
            .and_then(|line| line.get("decision").and_then(Value::as_str))
            .map(str::to_owned);
        let now = self.inner.decide(request);
        // A call denied now is not run either way; its result shows the
        // difference in the next request.
        if recorded.as_deref() != Some("denied") || now == Decision::Deny {
            return now;
        }
        self.log.diverged(Divergence {
            call: Some(self.log.made(&agent)),
            agent,
            difference: Difference::Tool {
                id: id.to_owned(),
                field: "decision".to_owned(),
                recorded: "denied".to_owned(),
                now: "allowed".to_owned(),
            },
        });
        // Nothing the recorded run did not run runs in its replay.
        Decision::Deny
    }
}
