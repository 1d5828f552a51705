//! Durable runs against in-process runs: N demo-shaped runs through a real
//! Restate server with 1 and 2 worker processes, and the same N runs in
//! this process with the async driver, all against one loopback model
//! server answering after a fixed delay; then how a run's journal grows
//! with its model calls (docs/performance.md, "Durable runs").
//!
//! ```text
//! cargo build --release --workspace --examples
//! SUBLOOP_RESTATE_DIR=~/.cache/subloop-restate-server \
//!     target/release/examples/durable_bench --runs 1000 --delay-ms 100
//! ```
//!
//! Flags: `--runs N` (default 100), `--delay-ms D` (default 100),
//! `--workers 1,2` (the worker counts to measure), `--journal-calls
//! 10,100,1000` (model calls of the journal-growth runs; empty: none),
//! `--json` (one JSON object). The Restate server comes from
//! `.ci/restate-server.sh setup DIR` (`SUBLOOP_RESTATE_DIR=DIR`); the
//! workers are the `subloop-restate` binary beside this example's folder.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../../examples/bench/harness.rs"]
mod harness;
#[path = "../../examples/bench/server.rs"]
mod server;

use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, free_port, start_worker};
use serde_json::{Value, json};
use subloop::ModelResponse;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::{Request, Role};
use subloop::run::model::Model;
use subloop_restate::{Approvals, Models, RunRequest, Worker, WorkerSettings, client};

/// User + system CPU of process `pid` so far.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// A Restate server of this bench (the tests' harness), stopped when dropped.
fn restate() -> Server {
    Server::start().expect("SUBLOOP_RESTATE_DIR: run `.ci/restate-server.sh setup DIR` first")
}

/// Bytes and entries of every journal the server at `admin` holds, per
/// service key.
fn journals(restate: &Server) -> Vec<(String, u64, u64)> {
    let query = "SELECT i.target_service_key AS run, sum(j.raw_length) AS bytes, count(*) AS entries \
         FROM sys_journal j JOIN sys_invocation i ON j.id = i.id \
         GROUP BY i.target_service_key";
    let answer: Value = ureq::post(&format!("{}/query", restate.admin))
        .header("accept", "application/json")
        .send_json(json!({ "query": query }))
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["run"].as_str().unwrap_or_default().to_owned(),
                row["bytes"].as_u64().unwrap_or_default(),
                row["entries"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

/// Worker processes (`subloop-restate worker`) sharing one address.
struct Workers(Vec<Child>);

impl Workers {
    fn start(count: usize, restate: &Server, model_url: &str) -> Self {
        let exe = std::env::current_exe().unwrap();
        let binary = exe
            .parent()
            .and_then(Path::parent)
            .map(|dir| dir.join("subloop-restate"))
            .filter(|path| path.is_file())
            .expect("the subloop-restate binary: cargo build --release --workspace");
        let port = free_port();
        let children = (0..count)
            .map(|_| {
                start_worker(
                    Command::new(&binary)
                        .args(["worker", "--restate-admin", &restate.admin])
                        .args(["--listen", &format!("127.0.0.1:{port}")])
                        .args(["--live", "--provider", "anthropic", "--decision", "deny"])
                        .env("ANTHROPIC_BASE_URL", model_url)
                        .env("ANTHROPIC_API_KEY", "bench-key-not-secret")
                        .env("ANTHROPIC_MODEL", "bench"),
                )
            })
            .collect();
        Self(children)
    }

    fn cpu(&self) -> Duration {
        self.0.iter().map(|child| cpu_of(child.id())).sum()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// N demo runs through Restate with `workers` workers: wall time, model
/// requests, journal bytes per run, CPU of the workers and the server.
fn durable(runs: usize, workers: usize, delay: Duration, workspace: &Path) -> Value {
    let model = server::Running::start(
        server::Options {
            delay,
            ..server::Options::default()
        },
        2,
    )
    .unwrap();
    let restate = restate();
    let pool = Workers::start(workers, &restate, &model.url);
    let before = model.stats.snapshot();
    let (server_cpu, worker_cpu) = (cpu_of(restate.pid()), pool.cpu());
    let started = Instant::now();
    let request = RunRequest {
        question: "Check main.py against expected.txt.".to_owned(),
        calls: 8,
        workspace: workspace.display().to_string(),
    };
    for i in 0..runs {
        client::submit(&restate.ingress, &format!("run-{i}"), &request).unwrap();
    }
    let threads = 32.min(runs.max(1));
    let answered: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ingress = restate.ingress.clone();
                scope.spawn(move || {
                    (t..runs)
                        .step_by(threads)
                        .filter(|i| {
                            client::attach(&ingress, &format!("run-{i}"))
                                .is_ok_and(|result| result.status == "answered")
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let wall = started.elapsed();
    let requests = model.stats.snapshot().since(&before).answered;
    let journals = journals(&restate);
    let bytes: u64 = journals.iter().map(|(_, bytes, _)| bytes).sum();
    let entries: u64 = journals.iter().map(|(_, _, entries)| entries).sum();
    json!({
        "workers": workers,
        "runs": runs,
        "answered": answered,
        "wall_s": wall.as_secs_f64(),
        "requests": requests,
        "journal_bytes_per_run": bytes as f64 / runs.max(1) as f64,
        "journal_entries_per_run": entries as f64 / runs.max(1) as f64,
        "worker_cpu_s": (pool.cpu() - worker_cpu).as_secs_f64(),
        "restate_cpu_s": (cpu_of(restate.pid()) - server_cpu).as_secs_f64(),
    })
}

/// The same runs in this process with the async driver.
fn in_process(runs: usize, delay: Duration) -> Value {
    let options = harness::Options {
        mode: harness::Mode::Async,
        runs,
        delay,
        ..harness::Options::default()
    };
    let figures = harness::run(&options).unwrap();
    json!({
        "runs": runs,
        "answered": figures.ok,
        "wall_s": figures.wall.as_secs_f64(),
        "requests": figures.requests,
        "cpu_s": figures.cpu.as_secs_f64(),
    })
}

/// A parent that reads `expected.txt` until it has made `calls` requests,
/// then answers: by the history, as a replaced worker's model must.
struct Reader {
    calls: usize,
}

impl Model for Reader {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        if turn + 1 >= self.calls {
            return Ok(ModelResponse::answer("It holds 42."));
        }
        Ok(ModelResponse::tool_calls([(
            format!("t{turn}"),
            "read_file",
            json!({"path": "expected.txt"}),
        )]))
    }
}

struct ReaderModels(usize);

impl Models for ReaderModels {
    fn parent(&self) -> Box<dyn Model + Send> {
        Box::new(Reader { calls: self.0 })
    }

    fn child(&self, _number: usize) -> Box<dyn Model + Send> {
        Box::new(Reader { calls: 1 })
    }
}

/// One run of `calls` model calls (each reading a file) through an
/// in-process worker: its journal's bytes and entries.
fn journal_growth(calls: usize, workspace: &Path) -> Value {
    let restate = restate();
    let port = free_port();
    let mut settings = WorkerSettings::new();
    settings.approvals = Approvals::Deny;
    settings.run_main = None;
    settings.child_calls = 0;
    let worker = Worker::new(ReaderModels(calls), settings);
    let runtime = Arc::new(tokio::runtime::Runtime::new().unwrap());
    let serving = runtime.spawn(subloop_restate::serve(
        worker,
        ([127, 0, 0, 1], port).into(),
    ));
    let uri = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while client::register(&restate.admin, &uri).is_err() {
        assert!(Instant::now() < deadline, "the worker did not register");
        std::thread::sleep(Duration::from_millis(100));
    }
    let request = RunRequest {
        question: "What does expected.txt hold?".to_owned(),
        calls: u32::try_from(calls).unwrap(),
        workspace: workspace.display().to_string(),
    };
    let started = Instant::now();
    client::submit(&restate.ingress, "grow", &request).unwrap();
    let result = client::attach(&restate.ingress, "grow").unwrap();
    let wall = started.elapsed();
    serving.abort();
    let (_, bytes, entries) = journals(&restate)
        .into_iter()
        .find(|(run, ..)| run == "grow")
        .unwrap_or_default();
    json!({
        "model_calls": result.calls,
        "status": result.status,
        "journal_bytes": bytes,
        "journal_entries": entries,
        "bytes_per_call": bytes as f64 / calls.max(1) as f64,
        "wall_s": wall.as_secs_f64(),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let (mut runs, mut delay, mut json_out) = (100usize, Duration::from_millis(100), false);
    let mut workers = vec![1usize, 2];
    let mut growth = vec![10usize, 100, 1000];
    let list = |text: String| -> Result<Vec<usize>, Box<dyn std::error::Error>> {
        text.split(',')
            .filter(|part| !part.is_empty())
            .map(|part| part.parse().map_err(Into::into))
            .collect()
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("runs") => runs = parser.value()?.parse()?,
            Long("delay-ms") => delay = Duration::from_millis(parser.value()?.parse()?),
            Long("workers") => workers = list(parser.value()?.string()?)?,
            Long("journal-calls") => growth = list(parser.value()?.string()?)?,
            Long("json") => json_out = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    let _ = server::raise_nofile_limit();
    let workspace = harness::Workspace::new()?;
    let baseline = in_process(runs, delay);
    let durable: Vec<serde_json::Value> = workers
        .iter()
        .map(|count| {
            let mut figures = durable(runs, *count, delay, &workspace.0);
            let ratio = figures["wall_s"].as_f64().unwrap_or_default()
                / baseline["wall_s"].as_f64().unwrap_or(1.0).max(1e-9);
            figures["wall_vs_in_process"] = json!(ratio);
            figures
        })
        .collect();
    let growth: Vec<serde_json::Value> = growth
        .iter()
        .map(|calls| journal_growth(*calls, &workspace.0))
        .collect();
    let all = json!({
        "delay_ms": delay.as_millis() as u64,
        "in_process": baseline,
        "durable": durable,
        "journal_growth": growth,
    });
    if json_out {
        println!("{all}");
    } else {
        println!("in-process (async driver): {}", all["in_process"]);
        for figures in all["durable"].as_array().unwrap() {
            println!("durable: {figures}");
        }
        for figures in all["journal_growth"].as_array().unwrap() {
            println!("journal: {figures}");
        }
    }
    Ok(())
}
