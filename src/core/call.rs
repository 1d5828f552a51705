//! What happened to one tool call, as hosts and observers see it
//! afterwards: how it was decided ([`CallDecision`]), its result
//! ([`ToolRecord`]), and a hook's [`Warning`].

use serde::Serialize;

use crate::core::agent_id::AgentId;
use crate::core::protocol::ToolUseId;
use crate::core::shared_text::SharedText;

/// How a call was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallDecision {
    /// The tool needs no approval and ran.
    NotRequired,
    /// The approver allowed it and it ran.
    Allowed,
    /// The approver denied it; it did not run.
    Denied,
    /// A before hook blocked it; it did not run.
    Blocked,
    /// A hook failed; the call did not run (fail closed).
    HookFailed,
    /// No such tool in this agent's registry; nothing ran.
    Unregistered,
    /// The arguments did not match the schema; nothing ran.
    Invalid,
    /// Past the run's limit of tool calls per reply; nothing ran.
    OverLimit,
    /// The run was stopped (deadline, token budget, cancellation) before it started.
    Stopped,
}

impl CallDecision {
    /// The snake_case name, as in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotRequired => "not_required",
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Blocked => "blocked",
            Self::HookFailed => "hook_failed",
            Self::Unregistered => "unregistered",
            Self::Invalid => "invalid",
            Self::OverLimit => "over_limit",
            Self::Stopped => "stopped",
        }
    }
}

/// One tool call as the host sees it afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ToolRecord {
    /// The tool name the model used.
    pub name: String,
    /// The call's id.
    pub id: ToolUseId,
    /// How it was decided.
    pub decision: CallDecision,
    /// Whether the result is an error.
    pub is_error: bool,
    /// The result's text exactly as sent to the model (after the tool's own
    /// caps and the after hooks), so the record holds every result, also of
    /// a last round no request carried.
    pub content: SharedText,
}

/// A warning of a run: raised by a hook, or added by the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Warning {
    /// The agent whose call raised it.
    pub agent: AgentId,
    /// The text.
    pub text: String,
}

impl Warning {
    /// A warning of `agent`'s saying `text` (a host adds its own to a
    /// report, such as a trace it could not write).
    pub fn new(agent: AgentId, text: impl Into<String>) -> Self {
        Self {
            agent,
            text: text.into(),
        }
    }
}
