//! Where a resumed run goes on: the conversation rebuilt (by
//! `record::resume` from a trace) and what the earlier part spent.

use crate::core::conversation::{AwaitingModel, Conversation};
use crate::core::plan::Plan;
use crate::core::protocol::ToolUseId;

/// What the earlier part of the run spent, counted against the run's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Parent model calls made (and counted by the rebuilt conversation).
    pub calls: u32,
    /// Input + output tokens of every reply, parent and children.
    pub tokens: u64,
    /// Delegations made (children are numbered after them).
    pub delegations: usize,
}

/// A run rebuilt from its trace, ready to continue.
#[derive(Debug)]
pub struct ResumePoint {
    /// The parent's conversation, waiting for the next model call.
    pub conversation: Conversation<AwaitingModel>,
    /// How many of its messages the trace already holds (the next request
    /// line carries only the rest).
    pub sent: usize,
    /// What the earlier part spent.
    pub spent: Spent,
    /// The plan the last successful `todo_write` set, if any.
    pub plan: Option<Plan>,
    /// The calls answered `INTERRUPTED`, in order.
    pub interrupted: Vec<ToolUseId>,
    /// How the earlier part ended: its `outcome` status, or `interrupted`
    /// when the trace has none (the process was killed).
    pub ended: String,
    /// The follow-up question asked now, if any.
    pub follow_up: Option<String>,
}
