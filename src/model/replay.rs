//! A model that answers from a recorded trace, checking each request
//! against the recorded one.
//!
//! [`RecordedRun::parse`] reads a trace (see [`crate::trace`]): for every
//! agent (`parent`, `child-1`, ...) its requests in call order, each with the
//! reply the trace holds for it (`response` or `model_failed`). A
//! [`ReplayModel`] for one agent answers its `n`-th request with the recorded
//! reply to call `n`, after comparing the request it is given with the
//! recorded one ([`crate::replay::differences`]); differences go to a
//! shared [`ReplayLog`]. Without `keep_going`, the first difference stops the
//! replay: that request and every later one of any agent fails
//! (`replay_diverged`), so no further tool runs. With it, the recorded
//! replies keep coming as long as the trace has one for the request asked,
//! and each difference is filed once (a changed tool result stays in every
//! later request of the history; it is reported where it first appeared).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use thiserror::Error;

use super::{Model, ScriptedReply};
use crate::error::ModelFailure;
use crate::protocol::{ModelResponse, Request};
use crate::replay::{Difference, Divergence, differences};
use crate::subagent::ChildModels;
use crate::trace::{RebuiltRequest, check_version, rebuild_requests};

/// A trace that cannot be replayed.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// The trace file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Read {
        /// The path.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The trace is not a trace this crate can replay.
    #[error("invalid trace {path}: {message}")]
    Invalid {
        /// The path.
        path: std::path::PathBuf,
        /// What is wrong, with the line number where there is one.
        message: String,
    },
}

/// One recorded request and the reply the trace holds for it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The request as it was sent.
    pub request: RebuiltRequest,
    /// The reply; `None` when the trace ends before it.
    pub reply: Option<ScriptedReply>,
}

/// The parent's recorded `outcome` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedOutcome {
    /// The status string (`answered`, `call_limit`, ...).
    pub status: String,
    /// The final text.
    pub text: String,
}

/// A trace read for replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedRun {
    agents: BTreeMap<String, Vec<RecordedCall>>,
    tools: BTreeMap<String, Vec<Value>>,
    outcome: Option<RecordedOutcome>,
}

impl RecordedRun {
    /// Reads a trace file.
    pub fn load(path: &std::path::Path) -> Result<Self, ReplayError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ReplayError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses a trace; the error says what is wrong and on which line. A
    /// trace must hold the parent's first request; a line cut short (a
    /// crashed run) is an error, not a shorter run.
    pub fn parse(trace: &str) -> Result<Self, String> {
        let mut agents: BTreeMap<String, Vec<RecordedCall>> = BTreeMap::new();
        for request in rebuild_requests(trace)? {
            let calls = agents.entry(request.agent.clone()).or_default();
            let expected = calls.len() as u64 + 1;
            if request.call != expected {
                return Err(format!(
                    "{} request {} comes where request {expected} was expected",
                    request.agent, request.call
                ));
            }
            calls.push(RecordedCall {
                request,
                reply: None,
            });
        }
        let mut outcome = None;
        let mut tools: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (index, line) in trace.lines().enumerate() {
            let number = index + 1;
            // Every line parsed once already, in `rebuild_requests`.
            let value: Value =
                serde_json::from_str(line).map_err(|err| format!("line {number}: {err}"))?;
            if number == 1 {
                check_version(&value).map_err(|err| format!("line 1: {err}"))?;
            }
            let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
            let agent = value.get("agent").and_then(Value::as_str).unwrap_or("");
            let reply = match kind {
                "response" => {
                    let raw = value.get("response").cloned().unwrap_or(Value::Null);
                    let response = ModelResponse::from_value(raw)
                        .map_err(|err| format!("line {number}: response: {err}"))?;
                    Ok(response)
                }
                "model_failed" => {
                    let message = value
                        .get("error")
                        .and_then(Value::as_str)
                        .unwrap_or("model request failed");
                    Err(match value.get("error_type").and_then(Value::as_str) {
                        Some(kind) => ModelFailure::with_kind(kind, message),
                        None => ModelFailure::new(message),
                    })
                }
                "outcome" if agent == "parent" => {
                    let field = |name: &str| {
                        value
                            .get(name)
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                            .ok_or(format!("line {number}: outcome without `{name}`"))
                    };
                    outcome = Some(RecordedOutcome {
                        status: field("status")?,
                        text: field("text")?,
                    });
                    continue;
                }
                "tool" => {
                    tools.entry(agent.to_owned()).or_default().push(value);
                    continue;
                }
                _ => continue,
            };
            let call = value
                .get("call")
                .and_then(Value::as_u64)
                .ok_or(format!("line {number}: no call number"))?;
            let slot = agents
                .get_mut(agent)
                .and_then(|calls| calls.get_mut(usize::try_from(call).ok()?.checked_sub(1)?))
                .ok_or(format!(
                    "line {number}: a reply to {agent} call {call}, which has no request before it"
                ))?;
            if slot.reply.is_some() {
                return Err(format!(
                    "line {number}: a second reply to {agent} call {call}"
                ));
            }
            slot.reply = Some(reply);
        }
        if !agents.contains_key("parent") {
            return Err("the trace holds no request of the parent".to_owned());
        }
        Ok(Self {
            agents,
            tools,
            outcome,
        })
    }

    /// The question the parent was asked: the text of its first message.
    pub fn question(&self) -> Option<String> {
        let first = self.agents.get("parent")?.first()?;
        Some(first.request.messages.first()?.text())
    }

    /// The recorded calls of `agent`, in order.
    pub fn calls(&self, agent: &str) -> &[RecordedCall] {
        self.agents
            .get(agent)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The agents of the trace with their request counts.
    pub fn agents(&self) -> impl Iterator<Item = (&str, u32)> {
        self.agents.iter().map(|(agent, calls)| {
            (
                agent.as_str(),
                u32::try_from(calls.len()).unwrap_or(u32::MAX),
            )
        })
    }

    /// The recorded `tool` lines of `agent`, in order, as JSON objects
    /// (`name`, `id`, `decision`, `is_error`, `content`, ...).
    pub fn tools(&self, agent: &str) -> &[Value] {
        self.tools.get(agent).map(Vec::as_slice).unwrap_or_default()
    }

    /// Requests of all agents together.
    pub fn request_count(&self) -> usize {
        self.agents.values().map(Vec::len).sum()
    }

    /// The parent's recorded outcome, when the trace has one.
    pub fn outcome(&self) -> Option<&RecordedOutcome> {
        self.outcome.as_ref()
    }
}

/// What every [`ReplayModel`] of one replay shares: the divergences found and
/// the requests each agent made.
#[derive(Debug, Default)]
pub struct ReplayLog {
    keep_going: bool,
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    divergences: Vec<Divergence>,
    halted: bool,
    made: HashMap<String, u32>,
}

impl ReplayLog {
    /// A log; with `keep_going`, a divergence does not stop the replay.
    pub fn new(keep_going: bool) -> Self {
        Self {
            keep_going,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Every divergence found so far, in order.
    pub fn divergences(&self) -> Vec<Divergence> {
        self.state().divergences.clone()
    }

    /// Whether the replay was stopped (a divergence without `keep_going`, or
    /// a request the trace cannot answer).
    pub fn halted(&self) -> bool {
        self.state().halted
    }

    /// Requests `agent` made in this replay.
    pub fn made(&self, agent: &str) -> u32 {
        self.state().made.get(agent).copied().unwrap_or(0)
    }

    /// Files a divergence found after the run.
    pub fn push(&self, divergence: Divergence) {
        self.state().divergences.push(divergence);
    }
}

/// Answers one agent's requests from its recorded calls.
#[derive(Debug)]
pub struct ReplayModel {
    agent: String,
    calls: Vec<RecordedCall>,
    log: Arc<ReplayLog>,
}

impl ReplayModel {
    /// The model of `agent` (`parent`, `child-N`) in `run`, reporting to `log`.
    pub fn new(run: &RecordedRun, agent: &str, log: Arc<ReplayLog>) -> Self {
        Self {
            agent: agent.to_owned(),
            calls: run.calls(agent).to_vec(),
            log,
        }
    }
}

fn stopped(divergence: &Divergence) -> ModelFailure {
    ModelFailure::with_kind("replay_diverged", format!("replay stopped: {divergence}"))
}

impl Model for ReplayModel {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        let mut state = self.log.state();
        let made = state.made.entry(self.agent.clone()).or_insert(0);
        *made = made.saturating_add(1);
        let call = *made;
        if state.halted {
            return Err(ModelFailure::with_kind(
                "replay_diverged",
                "replay stopped: an earlier request diverged",
            ));
        }
        let divergence = |difference| Divergence {
            agent: self.agent.clone(),
            call: Some(call),
            difference,
        };
        let recorded = usize::try_from(call)
            .ok()
            .and_then(|call| call.checked_sub(1))
            .and_then(|index| self.calls.get(index));
        let Some(recorded) = recorded else {
            let found = divergence(Difference::Unrecorded {
                recorded_calls: u32::try_from(self.calls.len()).unwrap_or(u32::MAX),
            });
            let failure = stopped(&found);
            state.divergences.push(found);
            state.halted = true;
            return Err(failure);
        };
        for difference in differences(&recorded.request, request) {
            let seen = state
                .divergences
                .iter()
                .any(|earlier| earlier.agent == self.agent && earlier.difference == difference);
            if seen {
                continue;
            }
            let found = divergence(difference);
            if !self.log.keep_going {
                let failure = stopped(&found);
                state.divergences.push(found);
                state.halted = true;
                return Err(failure);
            }
            state.divergences.push(found);
        }
        match &recorded.reply {
            Some(reply) => reply.clone(),
            None => {
                let found = divergence(Difference::NoReply);
                let failure = stopped(&found);
                state.divergences.push(found);
                state.halted = true;
                Err(failure)
            }
        }
    }
}

/// Child models of a replay: delegation `n` replays `child-n`'s recorded calls.
#[derive(Debug)]
pub struct ReplayChildren {
    run: RecordedRun,
    log: Arc<ReplayLog>,
}

impl ReplayChildren {
    /// The children of `run`, reporting to `log`.
    pub fn new(run: RecordedRun, log: Arc<ReplayLog>) -> Self {
        Self { run, log }
    }
}

impl ChildModels for ReplayChildren {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        Box::new(ReplayModel::new(
            &self.run,
            &format!("child-{number}"),
            Arc::clone(&self.log),
        ))
    }
}
