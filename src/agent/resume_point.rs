//! Where a resumed run goes on: the conversation rebuilt (by
//! `record::resume` from a trace) and what the earlier part spent.

use crate::core::conversation::{AwaitingModel, Conversation};
use crate::core::plan::Plan;
use crate::core::protocol::ToolUseId;

/// What the earlier part of the run spent, counted against the run's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Spent {
    /// Parent model calls made (and counted by the rebuilt conversation).
    pub(crate) calls: u32,
    /// Input + output tokens of every reply, parent and children.
    pub(crate) tokens: u64,
    /// Delegations made (children are numbered after them).
    pub(crate) delegations: usize,
}

/// A run rebuilt from its trace, ready to continue: made by
/// [`ResumePoint::rebuild`] or [`ResumePoint::follow_up`].
#[derive(Debug)]
#[non_exhaustive]
pub struct ResumePoint {
    /// The parent's conversation, waiting for the next model call.
    pub conversation: Conversation<AwaitingModel>,
    /// How many of its messages the trace already holds (the next request
    /// line carries only the rest).
    pub sent: usize,
    /// What the earlier part spent.
    pub(crate) spent: Spent,
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

impl ResumePoint {
    /// Parent model calls the earlier part made (the rebuilt conversation
    /// counts them against its budget).
    pub fn spent_calls(&self) -> u32 {
        self.spent.calls
    }

    /// Input and output tokens the earlier part's replies used, parent and
    /// children: counted against the run's token limit before anything runs.
    pub fn spent_tokens(&self) -> u64 {
        self.spent.tokens
    }

    /// Delegations the earlier part made (children are numbered after them).
    pub fn spent_delegations(&self) -> usize {
        self.spent.delegations
    }
}
