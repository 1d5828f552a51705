//! What a host watches during a run: driver events, tool records and warnings
//! of the parent and every child, each tagged with its agent.

use std::sync::{Arc, Mutex};

use crate::core::agent_id::AgentId;
use crate::core::call::ToolRecord;
use crate::core::protocol::Usage;
use crate::run::driver::{Event, Observer};
use crate::run::limits::RunGuard;

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

    /// A hook of `agent` raised a warning.
    fn warning(&mut self, agent: &AgentId, warning: &str) {
        let _ = (agent, warning);
    }
}

/// A list of monitors, shared by the parent and its children; every call goes to each.
#[derive(Clone, Default)]
pub struct SharedMonitor(Arc<Mutex<Vec<Box<dyn Monitor>>>>);

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
}

/// The driver's [`Observer`] for one agent: tags events and forwards them,
/// and keeps the token usage of each reply.
#[derive(Debug)]
pub(crate) struct AgentObserver<'a> {
    agent: &'a AgentId,
    monitor: &'a SharedMonitor,
    guard: &'a RunGuard,
    per_call: Vec<Usage>,
    continued: u32,
}

impl<'a> AgentObserver<'a> {
    pub(crate) fn new(agent: &'a AgentId, monitor: &'a SharedMonitor, guard: &'a RunGuard) -> Self {
        Self {
            agent,
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

impl Observer for AgentObserver<'_> {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Event::Response { response, .. } = event {
            let usage = response.usage.unwrap_or_default();
            self.guard.add_usage(&usage);
            self.per_call.push(usage);
        }
        if let Event::EmptyReplyContinued { .. } = event {
            self.continued += 1;
        }
        self.monitor.event(self.agent, event);
    }
}
