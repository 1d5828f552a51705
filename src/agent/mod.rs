//! The agent: a parent and its children assembled from tools, a gate,
//! hooks, limits and a plan ([`AgentBuilder`]); the gated executor every
//! call goes through; and [`subagent`]s, the `task` tool.
//!
//! May import: [`crate::core`], [`crate::run`], [`crate::policy`],
//! [`crate::tools`], [`crate::providers`].

mod builder;
mod executor;
pub mod output;
mod resume_point;
pub mod subagent;

pub use builder::*;
pub use resume_point::ResumePoint;
pub(crate) use resume_point::Spent;
