//! A loopback model server playing the Anthropic Messages API
//! (`POST /v1/messages`) and the OpenAI Chat Completions API
//! (`POST /v1/chat/completions`) with the demo's offline models, for the
//! concurrency bench (`examples/concurrent.rs --base-url`) or any client.
//! `GET /stats` answers its counters as JSON.
//!
//! ```text
//! cargo run --release --features async --example mock_server -- --port 0 --delay-ms 100
//! ```
//!
//! The first line on stdout is `listening on 127.0.0.1:PORT`.
//!
//! Flags: `--port P` (0: any free port), `--delay-ms D` (each answer held
//! back D ms; default 100), `--status-429-every K` (every K-th request
//! refused with a 429 and `retry-after-ms: 50`), `--stall-every K` (every
//! K-th request never answered until the client gives up), `--threads T`
//! (the runtime's worker threads; default 2).

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "bench/server.rs"]
mod server;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut options = server::Options::default();
    let mut port: u16 = 0;
    let mut threads: usize = 2;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("port") => port = parser.value()?.parse()?,
            Long("delay-ms") => {
                options.delay = Duration::from_millis(parser.value()?.parse()?);
            }
            Long("status-429-every") => options.status_429_every = parser.value()?.parse()?,
            Long("stall-every") => options.stall_every = parser.value()?.parse()?,
            Long("threads") => threads = parser.value()?.parse()?,
            Long("help") | Short('h') => {
                println!(
                    "mock_server [--port P] [--delay-ms D] [--status-429-every K] [--stall-every K] [--threads T]"
                );
                return Ok(());
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let files = server::raise_nofile_limit()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(server::THREAD_NAME)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = server::listen(port)?;
        let address = listener.local_addr()?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {address}")?;
        writeln!(
            stdout,
            "delay {} ms, 429 every {}, stall every {}, {threads} worker threads, {files} open files allowed",
            options.delay.as_millis(),
            options.status_429_every,
            options.stall_every
        )?;
        stdout.flush()?;
        drop(stdout);
        server::serve(listener, options, Arc::new(server::Stats::default())).await;
        Ok(())
    })
}
