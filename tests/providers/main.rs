//! The model providers against loopback mocks: the Messages API client
//! (`live_api`, `live_fidelity`, with `mock_api`) and the OpenAI-compatible
//! one (`openai_api`, with `mock_openai`), both against a real model
//! server (`local_model`), and many runs at once against the concurrency
//! bench's own server (`concurrent_bench`); and the key echoed by an
//! endpoint or printed by a tool, hidden from everything recorded (`secrets`).

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
#[cfg(feature = "live")]
#[path = "../mock_openai/mod.rs"]
mod mock_openai;

#[cfg(feature = "async")]
mod clients;
#[cfg(feature = "async")]
mod concurrent_bench;
#[cfg(feature = "async")]
mod context_window;
#[cfg(feature = "async")]
mod live_api;
#[cfg(feature = "live")]
mod live_fidelity;
#[cfg(feature = "async")]
mod local_model;
#[cfg(feature = "async")]
mod openai_api;
#[cfg(feature = "live")]
mod secrets;
