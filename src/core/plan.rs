//! The plan: an in-memory todo list, replaced whole by `todo_write`.
//!
//! The current plan is attached to every parent request as a short system
//! text block (after the system prompt, so it never follows tool results)
//! that is not stored in the history.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// At most this many items.
pub(crate) const MAX_ITEMS: usize = 20;
/// Item text length bounds, in characters.
pub(crate) const MAX_TEXT_CHARS: usize = 200;
/// The longest item id, in characters.
pub(crate) const MAX_ID_CHARS: usize = 64;

/// The state of one plan item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Not started.
    Pending,
    /// Being worked on (at most one item).
    InProgress,
    /// Done.
    Completed,
}

/// One item of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanItem {
    /// A unique id.
    pub id: String,
    /// What to do, 1 to 200 characters.
    pub text: String,
    /// Its state.
    pub status: ItemStatus,
}

/// Why a plan was refused; the old plan stays.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// More than [`Plan::MAX_ITEMS`] items.
    #[error("a plan holds at most {MAX_ITEMS} items (got {0})")]
    TooManyItems(usize),
    /// An empty id, or one over [`Plan::MAX_ID_CHARS`].
    #[error("item {0}: the id must be 1 to {MAX_ID_CHARS} characters")]
    EmptyId(usize),
    /// Control characters (newlines included) in an id or a text.
    #[error("item {0}: ids and texts may not hold control characters or line breaks")]
    ControlCharacters(usize),
    /// An item text outside 1..=200 characters.
    #[error("item `{id}`: text must be 1 to {MAX_TEXT_CHARS} characters (got {chars})")]
    TextLength {
        /// The item's id.
        id: String,
        /// Its length in characters.
        chars: usize,
    },
    /// Two items share an id.
    #[error("item id `{0}` is used twice")]
    DuplicateId(String),
    /// More than one item in progress.
    #[error("at most one item may be in_progress (got {0})")]
    SeveralInProgress(usize),
}

/// A validated plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    items: Vec<PlanItem>,
}

impl Plan {
    /// At most this many items.
    pub const MAX_ITEMS: usize = MAX_ITEMS;
    /// Item text length bounds, in characters.
    pub const MAX_TEXT_CHARS: usize = MAX_TEXT_CHARS;
    /// The longest item id, in characters.
    pub const MAX_ID_CHARS: usize = MAX_ID_CHARS;

    /// Checks `items` and builds a plan from them.
    pub fn new(items: Vec<PlanItem>) -> Result<Self, PlanError> {
        if items.len() > MAX_ITEMS {
            return Err(PlanError::TooManyItems(items.len()));
        }
        let mut ids = HashSet::new();
        for (index, item) in items.iter().enumerate() {
            if item.id.is_empty() || item.id.chars().count() > MAX_ID_CHARS {
                return Err(PlanError::EmptyId(index));
            }
            if item
                .id
                .chars()
                .chain(item.text.chars())
                .any(char::is_control)
            {
                return Err(PlanError::ControlCharacters(index));
            }
            let chars = item.text.chars().count();
            if chars == 0 || chars > MAX_TEXT_CHARS || item.text.trim().is_empty() {
                return Err(PlanError::TextLength {
                    id: item.id.clone(),
                    chars,
                });
            }
            if !ids.insert(item.id.as_str()) {
                return Err(PlanError::DuplicateId(item.id.clone()));
            }
        }
        let in_progress = items
            .iter()
            .filter(|item| item.status == ItemStatus::InProgress)
            .count();
        if in_progress > 1 {
            return Err(PlanError::SeveralInProgress(in_progress));
        }
        Ok(Self { items })
    }

    /// The items, in order.
    pub fn items(&self) -> &[PlanItem] {
        &self.items
    }

    /// The short text attached to requests.
    pub fn render(&self) -> String {
        if self.items.is_empty() {
            return "Current plan: none yet (todo_write sets one).".to_owned();
        }
        let mut text = String::from("Current plan:");
        for item in &self.items {
            let mark = match item.status {
                ItemStatus::Pending => "[ ]",
                ItemStatus::InProgress => "[>]",
                ItemStatus::Completed => "[x]",
            };
            text.push_str(&format!("\n{mark} {}: {}", item.id, item.text));
        }
        text
    }
}

/// A plan shared between the `todo_write` tool and the agent that attaches it.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedPlan(Arc<Mutex<Plan>>);

impl SharedPlan {
    /// An empty shared plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the current plan.
    #[cfg(feature = "testing")]
    pub fn current(&self) -> Plan {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    /// The text attached to the next request.
    pub fn render(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .render()
    }

    /// Replaces the plan with a checked one.
    pub fn replace(&self, plan: Plan) {
        *self.0.lock().unwrap_or_else(|poison| poison.into_inner()) = plan;
    }
}
