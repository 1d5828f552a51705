//! Many concurrent demo runs in one process against a loopback model
//! server: wall time against the floor, peak RSS, threads and CPU
//! (docs/performance.md, "Concurrent runs").
//!
//! ```text
//! cargo build --release --features async --example concurrent
//! target/release/examples/concurrent --mode async --runs 1000 --delay-ms 100
//! ```
//!
//! Flags:
//!
//! * `--mode async|blocking` (default `async`): a tokio task per run with
//!   the async clients and `Agent::run_async`, or a thread per run with the
//!   blocking clients and `Agent::run`.
//! * `--runs N` (default 100): runs started at once.
//! * `--threads T` (default 2): the async runtime's worker threads.
//! * `--provider anthropic|openai` (default `anthropic`).
//! * `--stream`: ask for event streams.
//! * `--no-stop-signal`: models without the run's stop signal (by default
//!   each model holds it, as in the CLI).
//! * `--no-bare`: skip the bare client's floor (by default, after the runs,
//!   a bare HTTP client posts the bytes one run sent, as many runs at once:
//!   reqwest on the same runtime, or ureq on a thread per run).
//! * `--tools-per-run`: each run opens its own `read_file` (a workspace
//!   directory handle per run, as separate CLI processes have); by default
//!   one is cloned into every run, sharing the handle.
//! * `--base-url URL`: a server already running (`examples/mock_server.rs`,
//!   or any server of the API: `http://127.0.0.1:PORT`, without `/v1`); its
//!   counters are read from `GET /stats` when it has them. By default one is
//!   started in this process, on a runtime of its own with
//!   `--server-threads S` (default 2) workers, and given the next flags:
//! * `--delay-ms D` (default 100), `--status-429-every K`, `--stall-every K`.
//! * `--timeout-read-ms MS`: the clients' read timeout (default 120 s).
//! * `--text`: one line per figure instead of one JSON line.
//!
//! With `--base-url`, `--delay-ms` must be the server's own delay: it sets
//! the floor. The exit code is 1 when a run did not end with the demo's answer.

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "bench/bare.rs"]
mod bare;
#[path = "bench/harness.rs"]
mod harness;
#[path = "bench/server.rs"]
mod server;

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut options = harness::Options {
        bare: Some(bare::measure),
        ..harness::Options::default()
    };
    let mut text = false;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("mode") => {
                let value = parser.value()?.string()?;
                options.mode = harness::Mode::parse(&value)
                    .ok_or_else(|| format!("--mode is blocking or async, not {value:?}"))?;
            }
            Long("provider") => {
                let value = parser.value()?.string()?;
                options.provider = harness::Provider::parse(&value)
                    .ok_or_else(|| format!("--provider is anthropic or openai, not {value:?}"))?;
            }
            Long("runs") => options.runs = parser.value()?.parse()?,
            Long("threads") => options.threads = parser.value()?.parse()?,
            Long("server-threads") => options.server_threads = parser.value()?.parse()?,
            Long("delay-ms") => options.delay = Duration::from_millis(parser.value()?.parse()?),
            Long("status-429-every") => options.status_429_every = parser.value()?.parse()?,
            Long("stall-every") => options.stall_every = parser.value()?.parse()?,
            Long("timeout-read-ms") => {
                options.read_timeout = Duration::from_millis(parser.value()?.parse()?);
            }
            Long("base-url") => options.base_url = Some(parser.value()?.string()?),
            Long("stream") => options.stream = true,
            Long("no-stop-signal") => options.stop_signal = false,
            Long("no-bare") => options.bare = None,
            Long("tools-per-run") => options.tools_per_run = true,
            Long("text") => text = true,
            Long("help") | Short('h') => {
                println!(
                    "concurrent [--mode async|blocking] [--runs N] [--threads T] [--provider anthropic|openai] [--stream] [--no-stop-signal] [--no-bare] [--tools-per-run] [--base-url URL] [--server-threads S] [--delay-ms D] [--status-429-every K] [--stall-every K] [--timeout-read-ms MS] [--text]"
                );
                return Ok(());
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let figures = harness::run(&options)?;
    if text {
        for line in figures.lines() {
            println!("{line}");
        }
    } else {
        println!("{}", figures.json());
    }
    if figures.failed_total() > 0 {
        std::process::exit(1);
    }
    Ok(())
}
