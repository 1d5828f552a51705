//! The loop and its rules: the typestate conversation, the driver's
//! invariants, the wire protocol, call order, the last round, run-wide
//! limits, and the `testing` helpers an embedder uses. One test binary; each
//! module was a test file of its own.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../common/mod.rs"]
mod common;

mod call_order;
mod compaction;
mod conversation_rules;
mod driver_equivalence;
#[cfg(feature = "testing")]
mod embedder_testing;
mod empty_reply;
#[cfg(feature = "testing")]
mod fuzz_regressions;
mod last_round;
mod loop_properties;
mod protocol_roundtrip;
mod run_limits;
mod structured_output;
