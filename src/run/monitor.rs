//! What a host watches during a run: driver events, tool records and warnings
//! of the parent and every child, each tagged with its agent.

use std::sync::{Arc, Mutex};

use crate::core::agent_id::AgentId;
use crate::core::call::ToolRecord;
use crate::core::compaction::CompactTrigger;
use crate::core::hook::HookRecord;
use crate::core::protocol::Usage;
use serde_json::Value;

use crate::core::conversation::{Outcome, ToolCall, ToolOutput};
use crate::core::error::ModelFailure;
use crate::core::protocol::{Message, ModelResponse, Request};
use crate::run::limits::RunGuard;

/// A progress event of one conversation. New capabilities may add events,
/// so matches outside the crate need a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// Model request number `call` is about to be sent.
    Request {
        /// 1-based request number.
        call: u32,
        /// The request.
        request: &'a Request<'a>,
        /// The messages appended to the history since this conversation's previous request.
        new_messages: &'a [Message],
    },
    /// The model replied.
    Response {
        /// 1-based request number.
        call: u32,
        /// The reply, as parsed.
        response: &'a ModelResponse,
        /// The reply as received on the wire, when the model has a wire form
        /// (the trace writes it in preference to `response`).
        raw: Option<&'a Value>,
    },
    /// The reply to request `call` was an empty `end_turn`; under
    /// [`crate::core::conversation::OnEmptyReply::Continue`] it was dropped and answered with
    /// `prompt` as a new user message (sent with the next request).
    EmptyReplyContinued {
        /// 1-based request number of the empty reply.
        call: u32,
        /// The user message's text ([`crate::core::conversation::OnEmptyReply::CONTINUE_PROMPT`]).
        prompt: &'a str,
    },
    /// The answer to request `call` failed the run's output check and was
    /// sent back to the model with `error` (in a user message, sent with
    /// the next request).
    InvalidAnswer {
        /// 1-based request number of the answer.
        call: u32,
        /// Why the answer failed.
        error: &'a str,
    },
    /// The history was compacted before request `call`: `history` replaced
    /// it.
    Compacted {
        /// 1-based number of the request the compaction came before.
        call: u32,
        /// What set it off.
        trigger: CompactTrigger,
        /// The compactor's name.
        compactor: &'a str,
        /// The estimated input tokens of the history it replaced.
        tokens: u64,
        /// The messages appended to the history since this conversation's
        /// previous request (they were part of what was replaced).
        new_messages: &'a [Message],
        /// How many messages the replaced history held.
        replaced: usize,
        /// The history from now on.
        history: &'a [Message],
        /// The summary the model wrote, when the compactor asked for one
        /// ([`crate::core::compaction::Summarize`]).
        summary: Option<&'a str>,
        /// What the summary requests spent.
        summary_usage: Option<Usage>,
        /// How many summary requests were made (0 without a summary).
        summary_requests: u32,
    },
    /// The model request failed.
    ModelFailed {
        /// 1-based request number.
        call: u32,
        /// What failed.
        failure: &'a ModelFailure,
    },
    /// A tool call is about to be executed.
    ToolRequested {
        /// The call.
        call: &'a ToolCall,
    },
    /// A tool call produced its output.
    ToolFinished {
        /// The call.
        call: &'a ToolCall,
        /// What it produced.
        output: &'a ToolOutput,
    },
    /// The conversation finished.
    Finished {
        /// Its outcome.
        outcome: &'a Outcome,
    },
}

/// Receives everything that happens in a run. Children may run on other
/// threads; calls are serialized by a lock.
pub trait Monitor: Send {
    /// A driver event of `agent`.
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        let _ = (agent, event);
    }

    /// A tool call of `agent` was decided and answered.
    fn tool(&mut self, agent: &AgentId, record: &ToolRecord) {
        let _ = (agent, record);
    }

    /// A warning about `agent`'s run: a hook's, or the driver's (an executor
    /// whose round did not match its calls).
    fn warning(&mut self, agent: &AgentId, warning: &str) {
        let _ = (agent, warning);
    }

    /// A command hook of `agent` ran.
    fn hook(&mut self, agent: &AgentId, record: &HookRecord) {
        let _ = (agent, record);
    }
}

/// A monitor that ignores everything: `&mut ()`.
impl Monitor for () {}

/// A list of monitors, shared by the parent and its children; every call goes to each.
#[derive(Clone, Default)]
pub(crate) struct SharedMonitor(Arc<Mutex<Vec<Box<dyn Monitor>>>>);

impl std::fmt::Debug for SharedMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedMonitor")
    }
}

impl SharedMonitor {
    /// Adds a monitor.
    pub fn add(&self, monitor: impl Monitor + 'static) {
        self.with(|list| list.push(Box::new(monitor)));
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<Box<dyn Monitor>>) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        f(&mut guard)
    }

    /// Forwards an event.
    pub fn event(&self, agent: &AgentId, event: &Event<'_>) {
        self.with(|list| list.iter_mut().for_each(|m| m.event(agent, event)));
    }

    /// Forwards a tool record.
    pub fn tool(&self, agent: &AgentId, record: &ToolRecord) {
        self.with(|list| list.iter_mut().for_each(|m| m.tool(agent, record)));
    }

    /// Forwards a warning.
    pub fn warning(&self, agent: &AgentId, warning: &str) {
        self.with(|list| list.iter_mut().for_each(|m| m.warning(agent, warning)));
    }

    /// Forwards a command hook's record.
    pub fn hook(&self, agent: &AgentId, record: &HookRecord) {
        self.with(|list| list.iter_mut().for_each(|m| m.hook(agent, record)));
    }
}

/// The monitor the driver is given for one agent of an agent run: keeps
/// the token usage of each reply (and counts it against the run's budget),
/// then forwards everything to the run's monitors.
#[derive(Debug)]
pub(crate) struct AgentMonitor<'a> {
    monitor: &'a SharedMonitor,
    guard: &'a RunGuard,
    per_call: Vec<Usage>,
    continued: u32,
}

impl<'a> AgentMonitor<'a> {
    pub(crate) fn new(monitor: &'a SharedMonitor, guard: &'a RunGuard) -> Self {
        Self {
            monitor,
            guard,
            per_call: Vec::new(),
            continued: 0,
        }
    }

    /// How many empty replies were answered with a request to continue.
    pub(crate) fn continued(&self) -> u32 {
        self.continued
    }

    /// The usage of each reply, in order (zero where a reply reported none).
    pub(crate) fn into_usage(self) -> Vec<Usage> {
        self.per_call
    }
}

impl Monitor for AgentMonitor<'_> {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        if let Event::Response { response, .. } = event {
            let usage = response.usage.unwrap_or_default();
            self.guard.add_usage(&usage);
            self.per_call.push(usage);
        }
        if let Event::EmptyReplyContinued { .. } = event {
            self.continued += 1;
        }
        // A summary's tokens count against the run's budget.
        if let Event::Compacted {
            summary_usage: Some(usage),
            ..
        } = event
        {
            self.guard.add_usage(usage);
        }
        self.monitor.event(agent, event);
    }

    fn tool(&mut self, agent: &AgentId, record: &ToolRecord) {
        self.monitor.tool(agent, record);
    }

    fn warning(&mut self, agent: &AgentId, warning: &str) {
        self.monitor.warning(agent, warning);
    }

    fn hook(&mut self, agent: &AgentId, record: &HookRecord) {
        self.monitor.hook(agent, record);
    }
}
