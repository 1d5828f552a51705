//! What a command hook did, as hosts and observers see it afterwards: the
//! [`HookEvent`] it ran for and its [`HookRecord`] (command, exit, decision,
//! duration). The hooks themselves live in `policy::command_hooks`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use crate::core::protocol::ToolUseId;

/// A point of a run where command hooks run, named as Claude Code names it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HookEvent {
    /// Before a permitted tool call runs; may deny it, or ask the approver.
    PreToolUse,
    /// After a tool call ran; may add to its result.
    PostToolUse,
    /// Before a run's question is asked; may block it or add context.
    UserPromptSubmit,
    /// The parent answered; may send it on with a reason.
    Stop,
    /// A subagent is about to start; may add context to its task.
    SubagentStart,
    /// A subagent answered; may send it on with a reason.
    SubagentStop,
    /// A run starts (`startup`) or goes on from its trace (`resume`).
    SessionStart,
    /// A run ended (its status is the `reason`).
    SessionEnd,
    /// An agent's history is about to be compacted (`trigger`: `auto`, or
    /// `manual`); may block it.
    PreCompact,
}

impl HookEvent {
    /// Every event, in the order a run meets them.
    pub const ALL: [Self; 9] = [
        Self::SessionStart,
        Self::UserPromptSubmit,
        Self::PreCompact,
        Self::PreToolUse,
        Self::PostToolUse,
        Self::SubagentStart,
        Self::SubagentStop,
        Self::Stop,
        Self::SessionEnd,
    ];

    /// The name, as in a settings file and `hook_event_name`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreToolUse => "PreToolUse",
            Self::PostToolUse => "PostToolUse",
            Self::UserPromptSubmit => "UserPromptSubmit",
            Self::Stop => "Stop",
            Self::SubagentStart => "SubagentStart",
            Self::SubagentStop => "SubagentStop",
            Self::SessionStart => "SessionStart",
            Self::SessionEnd => "SessionEnd",
            Self::PreCompact => "PreCompact",
        }
    }

    /// The event named `name`, if subloop runs it.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|event| event.as_str() == name)
    }
}

impl fmt::Display for HookEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one hook's run decided.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookDecision {
    /// No decision: the run goes on as it would have.
    None,
    /// `permissionDecision: "allow"` (it cannot run a call the gate denied).
    Allow,
    /// `permissionDecision: "ask"`: the approver decides the call.
    Ask,
    /// `permissionDecision: "deny"`, or exit 2, before a tool call: not executed.
    Deny,
    /// `decision: "block"` or exit 2 at another event (a Stop hook's block
    /// sends the agent on).
    Block,
    /// `continue: false`: the run stops.
    Stop,
    /// The hook failed (exit other than 0 and 2, a timeout, a crash, output
    /// that is not what it must be) where a failure blocks: fail closed.
    Failed,
    /// The hook failed where a failure is only a warning (or it opted into
    /// failing open).
    Warned,
}

impl HookDecision {
    /// The snake_case name, as in the trace.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
            Self::Block => "block",
            Self::Stop => "stop",
            Self::Failed => "failed",
            Self::Warned => "warned",
        }
    }
}

/// One run of one command hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HookRecord {
    /// The event it ran for.
    pub event: HookEvent,
    /// The command, as written in the settings.
    pub command: String,
    /// The tool call it ran for (`PreToolUse`, `PostToolUse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<ToolUseId>,
    /// The tool's name (`PreToolUse`, `PostToolUse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The model request whose answer it judged (`Stop`, `SubagentStop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<u32>,
    /// The exit code; `None` when it was killed or never started.
    pub exit_code: Option<i32>,
    /// Whether it was killed at its timeout.
    pub timed_out: bool,
    /// What it decided.
    pub decision: HookDecision,
    /// Why: the reason it gave, or what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long it ran.
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
}

fn millis<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}
