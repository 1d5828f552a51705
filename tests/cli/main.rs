//! The binary as its user meets it: `demo`, `run --script`, `chat`, help
//! and usage errors, its output channels, and the README and manual telling
//! the truth about it. One test binary; each module was a test file of its
//! own.

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

mod chat;
mod cli_run;
mod cli_usage;
mod demo_runs;
mod otel;
mod output_safety;
mod readme;
