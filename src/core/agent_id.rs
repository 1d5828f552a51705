//! Which agent of a run is acting: the parent or one of its children.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::core::protocol::ToolUseId;

/// `parent`, or `child-N` with the id of the parent's `task` call that started it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AgentId {
    /// The top-level agent.
    Parent,
    /// The `number`-th subagent of the run (1-based).
    Child {
        /// 1-based delegation number.
        number: usize,
        /// The parent's `task` call this child answers.
        parent_tool_use_id: ToolUseId,
    },
}

impl AgentId {
    /// The parent's `task` call id, for a child.
    pub fn parent_tool_use_id(&self) -> Option<&ToolUseId> {
        match self {
            Self::Parent => None,
            Self::Child {
                parent_tool_use_id, ..
            } => Some(parent_tool_use_id),
        }
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parent => f.write_str("parent"),
            Self::Child { number, .. } => write!(f, "child-{number}"),
        }
    }
}

impl Serialize for AgentId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
