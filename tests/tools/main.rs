//! Tools and policy: the registry and its schemas, dispatch, `read_file`,
//! `run_main` and the programs it starts, the permission gate and hooks,
//! the plan, subagents (`task`) and MCP servers. One test binary; each
//! module was a test file of its own.
//!
//! `process_lifetime` and `mcp` make this process a child subreaper: orphans
//! of the other tests' programs end here as zombies, and each of those two
//! reaps only the processes it started (never `waitpid(-1)`), so no test's
//! child is reaped under it.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../common/mod.rs"]
mod common;

mod command_hooks;
mod dispatch_properties;
mod gate_and_hooks;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "mcp")]
mod mcp_real;
mod plan_attachment;
mod process_lifetime;
mod read_file_paths;
mod read_file_syscalls;
mod registry_schema;
mod run_main_process;
mod sandbox;
mod subagent;
mod typed_args;
