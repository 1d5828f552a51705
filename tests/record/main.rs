//! Traces and sessions: the JSON Lines trace, `replay`, `--resume`, the
//! invariants over recorded runs, and `view` (in a terminal and in a
//! browser). One test binary; each module was a test file of its own.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../common/mod.rs"]
mod common;
// The CLI's host (the binary's, not the library's): runs configured as
// the CLI configures them.
#[allow(dead_code, unused_imports)]
#[path = "../../src/host/mod.rs"]
mod host;
#[cfg(feature = "live")]
#[path = "../mock_api/mod.rs"]
mod mock_api;

mod compaction;
mod foreign;
mod history;
mod invariants;
mod repair;
mod replay;
mod resume;
mod resume_properties;
mod trace_crash;
mod trace_rebuild;
mod trace_response;
mod view;
mod view_browser;
