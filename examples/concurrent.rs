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
//! * `--mode blocking|async` (default `blocking`): a thread per run with the
//!   blocking clients and `Agent::run`, or a tokio task per run with the
//!   async clients and `Agent::run_async`.
//! * `--runs N` (default 100): runs started at once.
//! * `--threads T` (default 2): the async runtime's worker threads.
//! * `--provider anthropic|openai` (default `anthropic`).
//! * `--stream`: ask for event streams.
//! * `--no-stop-probe`: blocking mode, models without the run's stop probe
//!   (by default each request waits on a worker thread while the run's
//!   thread watches the probe, as in the CLI).
//! * `--tools-per-run`: each run opens its own `read_file` (a workspace
//!   directory handle per run, as separate CLI processes have); by default
//!   one is cloned into every run, sharing the handle.
//! * `--base-url URL`: a server already running (`examples/mock_server.rs`,
//!   `http://127.0.0.1:PORT`, without `/v1`); by default one is started in
//!   this process, on a runtime of its own with `--server-threads S`
//!   (default 2) workers, and given the next flags:
//! * `--delay-ms D` (default 100), `--status-429-every K`, `--stall-every K`.
//! * `--timeout-read-ms MS`: the clients' read timeout (default 120 s).
//! * `--json`: the figures as one JSON object instead of one line each.
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

#[path = "bench/harness.rs"]
mod harness;
#[path = "bench/server.rs"]
mod server;

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut options = harness::Options::default();
    let mut json = false;
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
            Long("no-stop-probe") => options.stop_probe = false,
            Long("tools-per-run") => options.tools_per_run = true,
            Long("json") => json = true,
            Long("help") | Short('h') => {
                println!(
                    "concurrent [--mode blocking|async] [--runs N] [--threads T] [--provider anthropic|openai] [--stream] [--no-stop-probe] [--tools-per-run] [--base-url URL] [--server-threads S] [--delay-ms D] [--status-429-every K] [--stall-every K] [--timeout-read-ms MS] [--json]"
                );
                return Ok(());
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let figures = harness::run(&options)?;
    if json {
        println!("{}", figures.json());
    } else {
        for line in figures.lines() {
            println!("{line}");
        }
    }
    if figures.failed_total() > 0 {
        std::process::exit(1);
    }
    Ok(())
}
