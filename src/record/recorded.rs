//! A trace read back, and the models that answer from it in a replay.
//!
//! [`RecordedRun::parse`] reads a trace (see `record::trace`): for every
//! agent (`parent`, `child-1`, ...) its requests in call order, each with the
//! reply the trace holds for it (`response` or `model_failed`). In a replay
//! (`record::replay`) the model of one agent answers its `n`-th
//! request with the recorded reply to call `n`, after comparing the request
//! it is given with the recorded one; differences go to a log the replay's
//! models share. Without `keep_going`, the first difference stops the
//! replay: that request and every later one of any agent fails
//! (`replay_diverged`), so no further tool runs. With it, the recorded
//! replies keep coming as long as the trace has one for the request asked,
//! and each difference is filed once (a changed tool result stays in every
//! later request of the history; it is reported where it first appeared).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use thiserror::Error;

use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{Block, Message, ModelResponse, ReplyBlock, Request, ToolDefinition};
use crate::providers::scripted::ScriptedReply;
use crate::record::compare::{Difference, Divergence, differences};
use crate::record::trace::check_version;
use crate::run::model::ChildModels;
use crate::run::model::Model;

/// A trace that cannot be replayed.
#[derive(Debug, Error)]
#[non_exhaustive]
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

/// One recorded request (its end in the agent's history and its plan) and
/// the reply the trace holds for it.
#[derive(Debug, Clone, PartialEq)]
struct RecordedCall {
    /// Where its history starts in the agent's messages (after the last
    /// compaction before it).
    start: usize,
    messages: usize,
    /// Which of the agent's tool sets this request offered.
    tool_set: usize,
    attachment: Option<String>,
    reply: Option<ScriptedReply>,
    /// How many `tool` lines of the agent came before the reply.
    tools_before: usize,
}

/// One agent's part of a trace: its system prompt and tools (from its first
/// request), its whole history as sent (each request sent a prefix of it),
/// and its calls.
#[derive(Debug, Clone, Default, PartialEq)]
struct RecordedAgent {
    system: String,
    /// The tools offered: the first request's, then each set a later
    /// request carried because the offered tools changed.
    tool_sets: Vec<Vec<ToolDefinition>>,
    messages: Vec<Message>,
    calls: Vec<RecordedCall>,
    tool_lines: Vec<Value>,
    parent_tool_use_id: Option<String>,
    /// The schema its answers were checked against, if any.
    output_schema: Option<Value>,
    /// The answers sent back because they did not match it: call → why.
    invalid_answers: BTreeMap<u32, String>,
    /// Its `hook` lines, in order.
    hook_lines: Vec<Value>,
    /// Its compactions, in order. Each history it made is held in
    /// `messages` after the one it replaced.
    compactions: Vec<RecordedCompaction>,
    /// Where the current history starts in `messages`.
    start: usize,
}

/// One recorded compaction: the history it replaced (`messages[old_start..
/// old_end]`, with what was added after the last request) and the one it
/// made (`messages[start..end]`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordedCompaction {
    /// The request it came before.
    pub(crate) call: u32,
    pub(crate) trigger: crate::core::compaction::CompactTrigger,
    pub(crate) compactor: String,
    pub(crate) tokens: Option<u64>,
    /// The summary the model wrote, if it wrote one.
    pub(crate) summary: Option<RecordedSummary>,
    pub(crate) old_start: usize,
    pub(crate) old_end: usize,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// A summary a compaction asked the model for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordedSummary {
    pub(crate) text: String,
    pub(crate) usage: Option<crate::core::protocol::Usage>,
    /// How many requests it took (the ones before the last were too long).
    pub(crate) requests: u32,
}

impl RecordedAgent {
    /// Keeps the first `kept` calls, the history up to the last of them,
    /// and the compactions before them and before the next request (which
    /// a resumed run sends on the history they made).
    fn keep_calls(&mut self, kept: usize) {
        self.calls.truncate(kept);
        self.compactions
            .retain(|compaction| usize::try_from(compaction.call).is_ok_and(|c| c <= kept + 1));
        let next = self
            .compactions
            .last()
            .filter(|compaction| usize::try_from(compaction.call).is_ok_and(|c| c == kept + 1));
        let (start, held) = match (next, self.calls.last()) {
            (Some(compaction), _) => (compaction.start, compaction.end),
            (None, Some(call)) => (call.start, call.messages),
            (None, None) => (0, 0),
        };
        self.messages.truncate(held);
        self.start = start;
    }

    /// The history that starts at `start` (0 or a compaction's), up to the
    /// compaction that replaced it (or the end).
    fn segment(&self, start: usize) -> &[Message] {
        let end = self
            .compactions
            .iter()
            .find(|compaction| compaction.old_start == start)
            .map_or(self.messages.len(), |compaction| compaction.old_end);
        self.messages.get(start..end).unwrap_or_default()
    }
}

/// The parent's recorded `outcome` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordedOutcome {
    /// The status.
    pub(crate) status: crate::core::conversation::StatusKind,
    /// The final text.
    pub(crate) text: String,
}

/// A trace read for replay. Each message is held once, however many
/// requests carried it, so memory grows with the trace, not with its square.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedRun {
    agents: BTreeMap<String, RecordedAgent>,
    outcome: Option<RecordedOutcome>,
    workspace: Option<String>,
    /// The names of the tools that start a child: `task` in subloop's
    /// runs; another agent's history read as a run names its own (Claude
    /// Code's `Task`).
    delegating: Vec<String>,
}

/// `bytes` without an unfinished last line (no newline after it, and not a
/// JSON value), and that line's number when it was left out.
fn without_a_cut_last_line(bytes: &[u8]) -> (&[u8], Option<usize>) {
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return (bytes, None);
    }
    let start = bytes
        .iter()
        .rposition(|&byte| byte == b'\n')
        .map_or(0, |newline| newline + 1);
    let (whole, last) = bytes.split_at(start);
    if serde_json::from_slice::<serde::de::IgnoredAny>(last).is_ok() {
        return (bytes, None);
    }
    let number = whole.iter().filter(|&&byte| byte == b'\n').count() + 1;
    (whole, Some(number))
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

    /// Reads a trace file as [`RecordedRun::load`] does, except that a last
    /// line left unfinished — no newline after it and not a JSON value, as
    /// when the run was killed while writing it — is left out rather than
    /// refused. With the run comes the number of the line left out, if one
    /// was. For looking at a run (`subloop view`); replaying and resuming
    /// read with their own rules.
    pub fn load_up_to_a_cut(path: &std::path::Path) -> Result<(Self, Option<usize>), ReplayError> {
        let read_error = |source| ReplayError::Read {
            path: path.to_owned(),
            source,
        };
        let bytes = std::fs::read(path).map_err(read_error)?;
        let (whole, cut) = without_a_cut_last_line(&bytes);
        // A kill can stop a write inside a character: only the kept lines
        // must be UTF-8.
        let text = std::str::from_utf8(whole).map_err(|_| {
            read_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            ))
        })?;
        let run = Self::parse(text).map_err(|message| ReplayError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok((run, cut))
    }

    /// Parses a trace; the error says what is wrong and on which line. A
    /// trace must hold the parent's first request; a line cut short (a
    /// crashed run) is an error, not a shorter run. Fields this reader does
    /// not use are ignored.
    pub fn parse(trace: &str) -> Result<Self, String> {
        let mut agents: BTreeMap<String, RecordedAgent> = BTreeMap::new();
        let mut outcome = None;
        let mut workspace = None;
        let workspace_of = |value: &Value| {
            value
                .get("workspace")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        for (index, line) in trace.lines().enumerate() {
            let number = index + 1;
            let value: Value =
                serde_json::from_str(line).map_err(|err| format!("line {number}: {err}"))?;
            if number == 1 {
                check_version(&value).map_err(|err| format!("line 1: {err}"))?;
            }
            let at = |err: String| format!("line {number}: {err}");
            // Every line has a known `kind` and an `agent`, of their types, from here on.
            crate::record::lines::check(&value).map_err(at)?;
            let kind = value
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let agent = value
                .get("agent")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !is_agent_name(agent) {
                return Err(at(format!(
                    "agent {} is neither `parent` nor `child-N`",
                    Value::from(agent)
                )));
            }
            if let Some(id) = value.get("parent_tool_use_id").and_then(Value::as_str) {
                agents
                    .entry(agent.to_owned())
                    .or_default()
                    .parent_tool_use_id
                    .get_or_insert_with(|| id.to_owned());
            }
            match kind {
                // A resumed run: the parent's calls after the kept ones (a
                // failed or unanswered last request) are asked again by the
                // lines that follow, and the earlier outcome no longer stands.
                "resumed" if agent == "parent" => {
                    let kept = call_count(&value).map_err(at)?;
                    let entry = agents.entry(agent.to_owned()).or_default();
                    if kept > entry.calls.len() {
                        return Err(at(format!(
                            "resumed after parent call {kept}, but the trace holds {} parent calls",
                            entry.calls.len()
                        )));
                    }
                    entry.keep_calls(kept);
                    outcome = None;
                    if let Some(path) = workspace_of(&value) {
                        workspace = Some(path);
                    }
                }
                "request" => {
                    let call = call_number(&value).map_err(at)?;
                    let entry = agents.entry(agent.to_owned()).or_default();
                    let expected = entry.calls.len() as u64 + 1;
                    if call != expected {
                        return Err(at(format!(
                            "{agent} request {call} comes where request {expected} was expected"
                        )));
                    }
                    if call == 1 && agent == "parent" {
                        workspace = workspace_of(&value);
                    }
                    if call == 1 {
                        entry.system = value
                            .get("system")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        entry.tool_sets = vec![field(&value, "tool_definitions").map_err(at)?];
                        entry.output_schema = value
                            .get("output_schema")
                            .filter(|v| v.is_object())
                            .cloned();
                    } else if value
                        .get("tool_definitions")
                        .is_some_and(|defs| !defs.is_null())
                    {
                        entry
                            .tool_sets
                            .push(field(&value, "tool_definitions").map_err(at)?);
                    }
                    let new: Vec<Message> = field(&value, "messages").map_err(at)?;
                    entry.messages.extend(new);
                    entry.calls.push(RecordedCall {
                        start: entry.start,
                        messages: entry.messages.len(),
                        tool_set: entry.tool_sets.len().saturating_sub(1),
                        attachment: value
                            .get("attachment")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        reply: None,
                        // Until its reply: none of the tool lines so far answer it.
                        tools_before: entry.tool_lines.len(),
                    });
                }
                "response" | "model_failed" => {
                    let reply = recorded_reply(kind, &value).map_err(at)?;
                    let call = call_number(&value).map_err(at)?;
                    let slot = agents
                        .get_mut(agent)
                        .and_then(|entry| {
                            let tools_before = entry.tool_lines.len();
                            let slot = entry
                                .calls
                                .get_mut(usize::try_from(call).ok()?.checked_sub(1)?)?;
                            slot.tools_before = tools_before;
                            Some(slot)
                        })
                        .ok_or_else(|| {
                            at(format!(
                                "a reply to {agent} call {call}, which has no request before it"
                            ))
                        })?;
                    if slot.reply.is_some() {
                        return Err(at(format!("a second reply to {agent} call {call}")));
                    }
                    slot.reply = Some(reply);
                }
                "compaction" => {
                    let call = call_number(&value).map_err(at)?;
                    let entry = agents.entry(agent.to_owned()).or_default();
                    let expected = entry.calls.len() as u64 + 1;
                    if call != expected || entry.calls.is_empty() {
                        return Err(at(format!(
                            "a compaction of {agent} before request {call}, where request {expected} comes next"
                        )));
                    }
                    let new: Vec<Message> = field(&value, "messages").map_err(at)?;
                    let history: Vec<Message> = field(&value, "history").map_err(at)?;
                    entry.messages.extend(new);
                    let old_end = entry.messages.len();
                    entry.messages.extend(history);
                    entry.compactions.push(RecordedCompaction {
                        call: u32::try_from(call)
                            .map_err(|_| at(format!("call {call} is out of range")))?,
                        trigger: field(&value, "trigger").map_err(at)?,
                        compactor: field(&value, "compactor").map_err(at)?,
                        tokens: value.get("tokens").and_then(Value::as_u64),
                        summary: value
                            .get("summary")
                            .filter(|v| v.is_object())
                            .map(|summary| RecordedSummary {
                                text: summary
                                    .get("text")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_owned(),
                                usage: summary
                                    .get("usage")
                                    .and_then(|usage| serde_json::from_value(usage.clone()).ok()),
                                requests: summary
                                    .get("requests")
                                    .and_then(Value::as_u64)
                                    .and_then(|n| u32::try_from(n).ok())
                                    .unwrap_or(1),
                            }),
                        old_start: entry.start,
                        old_end,
                        start: old_end,
                        end: entry.messages.len(),
                    });
                    entry.start = old_end;
                }
                "tool" => agents
                    .entry(agent.to_owned())
                    .or_default()
                    .tool_lines
                    .push(value),
                "hook" => agents
                    .entry(agent.to_owned())
                    .or_default()
                    .hook_lines
                    .push(value),
                "invalid_answer" => {
                    let call = call_number(&value).map_err(at)?;
                    let error = value
                        .get("error")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let call = u32::try_from(call)
                        .map_err(|_| at(format!("call {call} is out of range")))?;
                    agents
                        .entry(agent.to_owned())
                        .or_default()
                        .invalid_answers
                        .insert(call, error);
                }
                "outcome" if agent == "parent" => {
                    let text = |name: &str| {
                        value
                            .get(name)
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                            .ok_or_else(|| at(format!("outcome without `{name}`")))
                    };
                    let status = value
                        .get("status")
                        .cloned()
                        .and_then(|status| serde_json::from_value(status).ok())
                        .ok_or_else(|| at("outcome without a known `status`".to_owned()))?;
                    outcome = Some(RecordedOutcome {
                        status,
                        text: text("text")?,
                    });
                }
                _ => {}
            }
        }
        if agents
            .get("parent")
            .is_none_or(|parent| parent.calls.is_empty())
        {
            return Err("the trace holds no request of the parent".to_owned());
        }
        Ok(Self {
            agents,
            outcome,
            workspace,
            delegating: vec!["task".to_owned()],
        })
    }

    /// The `hook` lines of `agent`, in order: the command hooks that ran.
    pub fn hooks(&self, agent: &str) -> &[Value] {
        self.agents
            .get(agent)
            .map_or(&[], |entry| entry.hook_lines.as_slice())
    }

    /// The workspace the recorded run worked in (the last resumed part's),
    /// when the trace says: a run in a temporary copy, or one recorded
    /// before the field existed, does not.
    pub fn workspace(&self) -> Option<&str> {
        self.workspace.as_deref()
    }

    /// The question the parent was asked: the text of its first message.
    pub fn question(&self) -> Option<String> {
        Some(self.agents.get("parent")?.messages.first()?.text())
    }

    /// The recorded request `call` (1-based) of `agent`, as it was sent.
    pub fn request(&self, agent: &str, call: u32) -> Option<Request<'_>> {
        let entry = self.agents.get(agent)?;
        let recorded = entry
            .calls
            .get(usize::try_from(call).ok()?.checked_sub(1)?)?;
        Some(Request {
            system: &entry.system,
            tools: entry
                .tool_sets
                .get(recorded.tool_set)
                .map(Vec::as_slice)
                .unwrap_or_default(),
            messages: entry.messages.get(recorded.start..recorded.messages)?,
            attachment: recorded.attachment.as_deref(),
            output: entry.output_schema.as_ref(),
        })
    }

    /// Why `agent`'s answer to request `call` was sent back, when it did
    /// not match the output schema.
    pub fn invalid_answer(&self, agent: &str, call: u32) -> Option<&str> {
        self.agents
            .get(agent)?
            .invalid_answers
            .get(&call)
            .map(String::as_str)
    }

    /// The schema `agent`'s answers were checked against, when the run
    /// asked for a structured answer.
    pub fn output_schema(&self, agent: &str) -> Option<&Value> {
        self.agents.get(agent)?.output_schema.as_ref()
    }

    /// The recorded reply to request `call` of `agent`; `None` when the
    /// trace has no such request or ends before its reply.
    pub fn reply(&self, agent: &str, call: u32) -> Option<&ScriptedReply> {
        let entry = self.agents.get(agent)?;
        entry
            .calls
            .get(usize::try_from(call).ok()?.checked_sub(1)?)?
            .reply
            .as_ref()
    }

    /// The agents of the trace (`child-N` only if it made a request) with their request counts.
    pub fn agents(&self) -> impl Iterator<Item = (&str, u32)> {
        self.agents
            .iter()
            .filter(|(_, entry)| !entry.calls.is_empty())
            .map(|(agent, entry)| {
                (
                    agent.as_str(),
                    u32::try_from(entry.calls.len()).unwrap_or(u32::MAX),
                )
            })
    }

    /// The number of recorded requests of `agent`.
    pub fn calls(&self, agent: &str) -> u32 {
        self.agents.get(agent).map_or(0, |entry| {
            u32::try_from(entry.calls.len()).unwrap_or(u32::MAX)
        })
    }

    /// The recorded `tool` lines of `agent`, in order, as JSON objects
    /// (`name`, `id`, `decision`, `is_error`, `content`, ...).
    pub fn tools(&self, agent: &str) -> &[Value] {
        self.agents
            .get(agent)
            .map(|entry| entry.tool_lines.as_slice())
            .unwrap_or_default()
    }

    /// The `tool` lines of `agent` recorded after its reply to `call`: the
    /// results of the calls that reply asked for (and of later rounds).
    pub fn tools_after_reply(&self, agent: &str, call: u32) -> &[Value] {
        let Some(entry) = self.agents.get(agent) else {
            return &[];
        };
        let from = usize::try_from(call)
            .ok()
            .and_then(|call| entry.calls.get(call.checked_sub(1)?))
            .map_or(entry.tool_lines.len(), |recorded| recorded.tools_before);
        entry.tool_lines.get(from..).unwrap_or_default()
    }

    /// The `tool` lines of `agent` that answer its reply to `call`: those
    /// recorded after that reply and before the next one.
    pub fn tools_of_reply(&self, agent: &str, call: u32) -> &[Value] {
        let after = self.tools_after_reply(agent, call);
        let later = if call < self.calls(agent) {
            self.tools_after_reply(agent, call + 1).len()
        } else {
            0
        };
        after
            .get(..after.len().saturating_sub(later))
            .unwrap_or_default()
    }

    /// Requests of all agents together.
    pub fn request_count(&self) -> usize {
        self.agents.values().map(|entry| entry.calls.len()).sum()
    }

    /// The run as it stood after the parent's first `calls` requests and
    /// their replies (its children's lines are kept): a recorded question
    /// with the follow-ups after it cut off, for `record::resume`.
    pub fn parent_prefix(&self, calls: u32) -> Self {
        let mut prefix = self.clone();
        if let Some(parent) = prefix.agents.get_mut("parent") {
            let kept = usize::try_from(calls).unwrap_or(usize::MAX);
            // The tool lines of later rounds go with their calls.
            if let Some(RecordedCall {
                reply: Some(_),
                tools_before,
                ..
            }) = parent.calls.get(kept)
            {
                parent.tool_lines.truncate(*tools_before);
            }
            parent.keep_calls(kept);
        }
        // And so do the children that later task calls started.
        let later: Vec<String> = prefix
            .agents
            .keys()
            .filter(|agent| {
                prefix.started_by(agent).is_some() && prefix.delegation(agent).is_none()
            })
            .cloned()
            .collect();
        for agent in later {
            prefix.agents.remove(&agent);
        }
        prefix.outcome = None;
        prefix
    }

    /// The recorded history of `agent` since its last compaction (its
    /// whole history when it was never compacted), as its requests carried
    /// it, with what was added after the last of them.
    pub fn messages(&self, agent: &str) -> &[Message] {
        self.agents
            .get(agent)
            .map(|entry| entry.segment(entry.start))
            .unwrap_or_default()
    }

    /// The history request `call` (1-based) of `agent` was part of, from
    /// its start (the question, or the compaction before it) to the
    /// compaction that replaced it, or to the end: the request's messages
    /// and what the next round added to them.
    pub fn history_of(&self, agent: &str, call: u32) -> &[Message] {
        let Some(entry) = self.agents.get(agent) else {
            return &[];
        };
        usize::try_from(call)
            .ok()
            .and_then(|call| call.checked_sub(1))
            .and_then(|index| entry.calls.get(index))
            .map_or(&[], |recorded| entry.segment(recorded.start))
    }

    /// Every history `agent` had, in order: the first, then the one each
    /// compaction made (each with what was added to it before the next).
    pub fn histories(&self, agent: &str) -> Vec<&[Message]> {
        let Some(entry) = self.agents.get(agent) else {
            return Vec::new();
        };
        std::iter::once(0)
            .chain(entry.compactions.iter().map(|compaction| compaction.start))
            .map(|start| entry.segment(start))
            .collect()
    }

    /// The compactions of `agent` that came right before its request
    /// `call`, in order, each with the history it made.
    pub(crate) fn compactions_before(
        &self,
        agent: &str,
        call: u32,
    ) -> Vec<(&RecordedCompaction, &[Message], &[Message])> {
        let Some(entry) = self.agents.get(agent) else {
            return Vec::new();
        };
        entry
            .compactions
            .iter()
            .filter(|compaction| compaction.call == call)
            .map(|compaction| {
                let replaced = entry
                    .messages
                    .get(compaction.old_start..compaction.old_end)
                    .unwrap_or_default();
                let history = entry
                    .messages
                    .get(compaction.start..compaction.end)
                    .unwrap_or_default();
                (compaction, replaced, history)
            })
            .collect()
    }

    /// How many compactions `agent`'s history went through.
    pub fn compaction_count(&self, agent: &str) -> usize {
        self.agents
            .get(agent)
            .map_or(0, |entry| entry.compactions.len())
    }

    /// Input + output tokens of every recorded reply, parent and children.
    pub fn spent_tokens(&self) -> u64 {
        self.agents
            .values()
            .flat_map(|entry| &entry.calls)
            .filter_map(|call| call.reply.as_ref()?.as_ref().ok()?.usage.as_ref())
            .chain(
                self.agents
                    .values()
                    .flat_map(|entry| &entry.compactions)
                    .filter_map(|compaction| compaction.summary.as_ref()?.usage.as_ref()),
            )
            .fold(0, |total: u64, usage| total.saturating_add(usage.billed()))
    }

    /// The summaries `agent`'s compactions asked the model for, in order.
    pub(crate) fn summaries(&self, agent: &str) -> Vec<&RecordedSummary> {
        self.agents.get(agent).map_or_else(Vec::new, |entry| {
            entry
                .compactions
                .iter()
                .filter_map(|compaction| compaction.summary.as_ref())
                .collect()
        })
    }

    /// The delegations the trace shows: the highest child number in it.
    pub fn delegations(&self) -> usize {
        self.agents
            .keys()
            .filter_map(|agent| agent.strip_prefix("child-")?.parse::<usize>().ok())
            .max()
            .unwrap_or(0)
    }

    /// Whether a call of the tool `name` starts a child (`task`, or the
    /// tool another agent's history starts its subagents with).
    pub fn delegates(&self, name: &str) -> bool {
        self.delegating.iter().any(|tool| tool == name)
    }

    /// The tools whose calls start a child.
    pub(crate) fn delegating(&self) -> &[String] {
        &self.delegating
    }

    /// Counts calls of `name` as delegations too.
    pub(crate) fn delegate_with(&mut self, name: &str) {
        if !self.delegates(name) {
            self.delegating.push(name.to_owned());
        }
    }

    /// The id of the parent's `task` call that started the child `agent`.
    pub fn started_by(&self, agent: &str) -> Option<&str> {
        self.agents.get(agent)?.parent_tool_use_id.as_deref()
    }

    /// The parent's `task` call that started the child `agent`: the
    /// parent's model call whose reply holds it, and its input. Children are
    /// paired with `task` calls in order, so a `tool_use` id used again in
    /// a later question (as some providers do) still finds its own child.
    pub fn delegation(&self, agent: &str) -> Option<(u32, &Value)> {
        self.started_by(agent)?;
        let mut uses: Vec<(u32, &str, &Value)> = Vec::new();
        for call in 1..=self.calls("parent") {
            if let Some(Ok(reply)) = self.reply("parent", call) {
                for block in &reply.content {
                    if let ReplyBlock::Known(Block::ToolUse { id, name, input }) = block
                        && self.delegates(name)
                    {
                        uses.push((call, id.as_str(), input));
                    }
                }
            }
        }
        let mut children: Vec<(u64, &str)> = self
            .agents
            .keys()
            .filter_map(|name| Some((name.strip_prefix("child-")?.parse().ok()?, name.as_str())))
            .collect();
        children.sort_unstable();
        let mut taken = vec![false; uses.len()];
        let mut from = 0;
        for (_, child) in children {
            let Some(wanted) = self.started_by(child) else {
                continue;
            };
            let found = (from..uses.len()).chain(0..from).find(|&at| {
                taken.get(at) == Some(&false) && uses.get(at).is_some_and(|u| u.1 == wanted)
            });
            match found.and_then(|at| Some((at, uses.get(at)?))) {
                Some((at, &(call, _, input))) => {
                    if let Some(slot) = taken.get_mut(at) {
                        *slot = true;
                    }
                    from = at + 1;
                    if child == agent {
                        return Some((call, input));
                    }
                }
                None if child == agent => return None,
                None => {}
            }
        }
        None
    }

    /// The model calls of the child started by the `task` call `id`.
    pub fn child_calls(&self, id: &str) -> usize {
        self.agents
            .values()
            .find(|entry| entry.parent_tool_use_id.as_deref() == Some(id))
            .map_or(0, |entry| entry.calls.len())
    }

    /// The parent's recorded outcome, when the trace has one: its status
    /// and its final text.
    pub fn outcome(&self) -> Option<(crate::core::conversation::StatusKind, &str)> {
        self.outcome
            .as_ref()
            .map(|outcome| (outcome.status, outcome.text.as_str()))
    }

    /// [`RecordedRun::outcome`], whole.
    pub(crate) fn recorded_outcome(&self) -> Option<&RecordedOutcome> {
        self.outcome.as_ref()
    }
}

/// A `resumed` line's `calls`.
fn call_count(value: &Value) -> Result<usize, String> {
    value
        .get("calls")
        .and_then(Value::as_u64)
        .and_then(|calls| usize::try_from(calls).ok())
        .ok_or_else(|| "a `resumed` line without `calls`".to_owned())
}

/// `parent` or `child-N` with N a positive number.
fn is_agent_name(name: &str) -> bool {
    name == "parent"
        || name
            .strip_prefix("child-")
            .and_then(|number| number.parse::<u64>().ok())
            .is_some_and(|number| number > 0 && !name.contains('+'))
}

fn call_number(value: &Value) -> Result<u64, String> {
    value
        .get("call")
        .and_then(Value::as_u64)
        .ok_or_else(|| "no call number".to_owned())
}

fn field<T: serde::de::DeserializeOwned>(value: &Value, name: &str) -> Result<T, String> {
    let raw = value.get(name).cloned().unwrap_or(Value::Null);
    serde_json::from_value(raw).map_err(|err| format!("{name}: {err}"))
}

/// The reply of a `response` or `model_failed` line.
fn recorded_reply(kind: &str, value: &Value) -> Result<ScriptedReply, String> {
    if kind == "response" {
        let raw = value.get("response").cloned().unwrap_or(Value::Null);
        // A Chat Completions reply (`--provider openai`) is read the way its
        // client read it; any other is a Messages API reply.
        if raw.get("choices").is_some() {
            return crate::providers::openai::reply::parse_completion(&raw)
                .map(Ok)
                .map_err(|err| format!("response: {err}"));
        }
        return ModelResponse::from_value(raw)
            .map(Ok)
            .map_err(|err| format!("response: {err}"));
    }
    let message = value
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("model request failed");
    Ok(Err(match value.get("error_type").and_then(Value::as_str) {
        Some(kind) => ModelFailure::with_kind(FailureKind::from_name(kind), message),
        None => ModelFailure::new(message),
    }))
}

/// What every [`ReplayModel`] of one replay shares: the divergences found and
/// the requests each agent made.
#[derive(Debug, Default)]
pub(crate) struct ReplayLog {
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

    /// Files a divergence found during the run: like one a request showed,
    /// it stops the replay unless the log keeps going.
    pub fn diverged(&self, divergence: Divergence) {
        let mut state = self.state();
        state.divergences.push(divergence);
        if !self.keep_going {
            state.halted = true;
        }
    }
}

/// Answers one agent's requests from its recorded calls.
#[derive(Debug)]
pub(crate) struct ReplayModel {
    agent: String,
    run: Arc<RecordedRun>,
    log: Arc<ReplayLog>,
    /// Messages of the history already compared (a history only grows).
    checked: usize,
    /// Summary requests answered so far.
    summary_requests: usize,
}

impl ReplayModel {
    /// The model of `agent` (`parent`, `child-N`) in `run`, reporting to `log`.
    pub fn new(run: Arc<RecordedRun>, agent: &str, log: Arc<ReplayLog>) -> Self {
        Self {
            agent: agent.to_owned(),
            run,
            log,
            checked: 0,
            summary_requests: 0,
        }
    }

    /// A summary request, answered as recorded: the recorded summaries'
    /// requests in order, those before each one's last refused for length.
    fn summary(&mut self) -> Result<ModelResponse, ModelFailure> {
        let mut left = self.summary_requests;
        self.summary_requests += 1;
        for summary in self.run.summaries(&self.agent) {
            let requests = usize::try_from(summary.requests).unwrap_or(1).max(1);
            if left + 1 < requests {
                return Err(ModelFailure::with_kind(
                    FailureKind::ContextWindow,
                    "the recorded summary request was too long for the context window",
                ));
            }
            if left + 1 == requests {
                let mut reply = ModelResponse::answer(summary.text.clone());
                reply.usage = summary.usage;
                return Ok(reply);
            }
            left -= requests;
        }
        let found = Divergence {
            agent: self.agent.clone(),
            call: None,
            difference: Difference::UnrecordedSummary,
        };
        let failure = stopped(&found);
        let mut state = self.log.state();
        state.divergences.push(found);
        state.halted = true;
        Err(failure)
    }
}

fn stopped(divergence: &Divergence) -> ModelFailure {
    ModelFailure::with_kind(
        FailureKind::ReplayDiverged,
        format!("replay stopped: {divergence}"),
    )
}

impl Model for ReplayModel {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        if request.system == crate::core::compaction::Summarize::SYSTEM && request.tools.is_empty()
        {
            return self.summary();
        }
        let mut state = self.log.state();
        let made = state.made.entry(self.agent.clone()).or_insert(0);
        *made = made.saturating_add(1);
        let call = *made;
        if state.halted {
            return Err(ModelFailure::with_kind(
                FailureKind::ReplayDiverged,
                "replay stopped: an earlier request diverged",
            ));
        }
        let divergence = |difference| Divergence {
            agent: self.agent.clone(),
            call: Some(call),
            difference,
        };
        let Some(recorded) = self.run.request(&self.agent, call) else {
            let found = divergence(Difference::Unrecorded {
                recorded_calls: self.run.calls(&self.agent),
            });
            let failure = stopped(&found);
            state.divergences.push(found);
            state.halted = true;
            return Err(failure);
        };
        // A compaction replaced the history: it is compared from its start.
        let compacted = !self.run.compactions_before(&self.agent, call).is_empty();
        let from = if compacted { 0 } else { self.checked };
        self.checked = recorded.messages.len().min(request.messages.len());
        for difference in differences(&recorded, request, from) {
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
        match self.run.reply(&self.agent, call) {
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
pub(crate) struct ReplayChildren {
    run: Arc<RecordedRun>,
    log: Arc<ReplayLog>,
}

impl ReplayChildren {
    /// The children of `run`, reporting to `log`.
    pub fn new(run: Arc<RecordedRun>, log: Arc<ReplayLog>) -> Self {
        Self { run, log }
    }
}

impl ChildModels for ReplayChildren {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        Box::new(ReplayModel::new(
            Arc::clone(&self.run),
            &format!("child-{number}"),
            Arc::clone(&self.log),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(value: Value) -> String {
        format!("{value}\n")
    }

    fn request(call: u64, messages: Value) -> String {
        line(
            json!({"agent": "parent", "kind": "request", "call": call, "tools": [],
            "messages": messages, "attachment": null, "system": "sys", "tool_definitions": []}),
        )
    }

    fn response(call: u64) -> String {
        line(json!({"agent": "parent", "kind": "response", "call": call,
            "response": {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}}))
    }

    #[test]
    fn each_message_is_held_once_and_requests_are_prefixes_of_the_history() {
        let user = |text: &str| json!([{"role": "user", "content": text}]);
        let pair = json!([{"role": "assistant", "content": [{"type": "text", "text": "a"}]},
            {"role": "user", "content": "b"}]);
        let trace = [
            request(1, user("q")),
            response(1),
            request(2, pair.clone()),
            response(2),
            request(3, pair),
        ]
        .concat();
        let run = RecordedRun::parse(&trace).expect("valid");
        assert_eq!(run.agents["parent"].messages.len(), 5);
        let lengths: Vec<usize> = (1..=3)
            .map(|call| {
                run.request("parent", call)
                    .expect("recorded")
                    .messages
                    .len()
            })
            .collect();
        assert_eq!(lengths, [1, 3, 5]);
        assert!(run.reply("parent", 2).is_some());
        assert!(run.reply("parent", 3).is_none(), "the trace ends before it");
        assert!(run.request("parent", 4).is_none());
        assert_eq!(run.question().as_deref(), Some("q"));
    }

    #[test]
    fn replies_out_of_place_and_requests_out_of_order_are_errors_naming_the_line() {
        let q = json!([{"role": "user", "content": "q"}]);
        let orphan = [request(1, q.clone()), response(2)].concat();
        let err = RecordedRun::parse(&orphan).expect_err("no request 2");
        assert!(err.starts_with("line 2: a reply to parent call 2"), "{err}");
        let twice = [request(1, q.clone()), response(1), response(1)].concat();
        let err = RecordedRun::parse(&twice).expect_err("two replies");
        assert!(err.starts_with("line 3: a second reply"), "{err}");
        let skipped = [request(1, q.clone()), request(3, json!([]))].concat();
        let err = RecordedRun::parse(&skipped).expect_err("request 2 missing");
        assert!(err.contains("request 3 comes where request 2"), "{err}");
        assert!(RecordedRun::parse("").is_err());
        let odd = request(1, q).replace("\"parent\"", "\"boss\\nx\"");
        let err = RecordedRun::parse(&odd).expect_err("odd agent");
        assert!(
            !err.contains('\n') && err.contains("neither `parent`"),
            "{err}"
        );
    }
}
