//! Hooks: observers around every tool call, and the audit log.
//!
//! A `before` hook sees the agent, the call id, the tool name and the input,
//! and may block the call (answered `not executed: blocked by hook <name>:
//! <reason>`). An `after` hook sees the result. Both may add warnings, which
//! the run reports. A hook that returns an error or panics fails closed: a
//! failing `before` hook stops the call; a failing `after` hook marks the
//! result as an error. The permission gate is consulted first, so a denial
//! always wins over any hook.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::core::agent_id::AgentId;
use crate::core::call::CallDecision;
use crate::core::conversation::{ToolCall, ToolOutput};
use crate::core::hook::HookRecord;
use crate::core::protocol::ToolUseId;

/// A hook failed; the call is treated as blocked (or its result as an error).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// What a hook sees of a call.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct HookCall<'a> {
    /// The agent making the call; for a child it carries the parent's `task` id.
    pub agent: &'a AgentId,
    /// The call: id, tool name, input.
    pub call: &'a ToolCall,
}

impl HookCall<'_> {
    /// The call's id.
    pub fn id(&self) -> &ToolUseId {
        self.call.id()
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        self.call.name()
    }

    /// The arguments.
    pub fn input(&self) -> &Value {
        self.call.input()
    }
}

/// A `before` hook's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Let the call run.
    Continue,
    /// Block it, with a reason for the model.
    Block(String),
}

/// An observer around tool calls.
pub trait Hook: Send + Sync {
    /// The hook's name, used in refusals and reports.
    fn name(&self) -> &str;

    /// Runs before a permitted call; may block it or add warnings.
    fn before(
        &self,
        call: &HookCall<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<Verdict, HookError> {
        let _ = (call, warnings);
        Ok(Verdict::Continue)
    }

    /// Runs after a call produced its result; may add warnings.
    fn after(
        &self,
        call: &HookCall<'_>,
        output: &ToolOutput,
        warnings: &mut Vec<String>,
    ) -> Result<(), HookError> {
        let _ = (call, output, warnings);
        Ok(())
    }
}

/// A set of hooks, run in order. Parent and children each get their own set.
#[derive(Clone, Default)]
pub struct Hooks(Vec<Arc<dyn Hook>>);

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|hook| hook.name().to_owned()))
            .finish()
    }
}

impl Hooks {
    /// No hooks.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds a hook.
    pub fn with(mut self, hook: impl Hook + 'static) -> Self {
        self.0.push(Arc::new(hook));
        self
    }

    /// Adds a shared hook.
    pub fn with_shared(mut self, hook: Arc<dyn Hook>) -> Self {
        self.0.push(hook);
        self
    }

    /// The hooks, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Hook>> {
        self.0.iter()
    }
}

/// Before or after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the tool runs (or is refused).
    Before,
    /// After the result is known.
    After,
    /// A command hook ran (its record is in [`AuditEntry::hook`]); for an
    /// event that is not about a call (`Stop`, `SessionStart`, …) the
    /// call id and tool are empty.
    Hook,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// The agent.
    pub agent: AgentId,
    /// The call's id.
    pub call_id: ToolUseId,
    /// The tool's name.
    pub tool: String,
    /// Before or after.
    pub phase: Phase,
    /// After only: how the call was decided (`allowed`, `denied`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<CallDecision>,
    /// After only: whether the result is an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// Hook only: the command hook's event, command, exit, decision and duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookRecord>,
}

/// The audit log of a run, shared by the parent and its children.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditLog(Arc<Mutex<Vec<AuditEntry>>>);

impl AuditLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an entry.
    pub fn record(&self, entry: AuditEntry) {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(entry);
    }

    /// Takes every entry out, leaving the log empty (the end of a run: no copy).
    pub(crate) fn take(&self) -> Vec<AuditEntry> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|poison| poison.into_inner()))
    }
}
