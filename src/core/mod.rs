//! The core: wire types and the conversation typestate. No I/O, no
//! threads, no clock: one loop can be driven by blocking or async code, and
//! the protocol's guarantees do not depend on how.
//!
//! May import: nothing of this crate outside `core`.

pub mod agent_id;
pub mod call;
pub mod compaction;
pub mod conversation;
pub mod error;
pub mod hook;
pub mod plan;
pub mod protocol;
pub mod redact;
pub mod shared_text;
pub mod text;
