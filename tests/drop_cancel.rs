//! Cancellation by drop: an async run whose future is dropped in the middle
//! of a model request, of a program, and of a batch of children leaves
//! nothing running (no task, thread, process or file descriptor more than
//! before) and a trace whose every agent ends with its `outcome`, which
//! `view --check`'s rules accept. And cancelling a run whose live model is
//! waiting for a server that never answers ends it at once, by
//! notification: no thread is added while the request waits (the blocking
//! request is on the run's own thread), and the run ends `cancelled` well
//! before any timeout. The tests of this binary take turns (one lock): the
//! counts are of this process, which no other test shares.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Hooks;
use subloop::ModelResponse;
use subloop::agent::subagent::SubagentConfig;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Request;
use subloop::policy::permission::AllowAll;
use subloop::record::invariants::Policy;
use subloop::record::recorded::RecordedRun;
use subloop::record::trace::TraceWriter;
use subloop::run::BoxFuture;
use subloop::run::model::{AsyncModel, ChildModels, Model, Received};
use subloop::tools::{ReadFile, RunMain, RunSettings};

/// Answers its script, then never answers.
struct ThenHang(Vec<ModelResponse>);

impl AsyncModel for ThenHang {
    fn respond_async<'a>(
        &'a mut self,
        _request: &'a Request<'_>,
    ) -> BoxFuture<'a, Result<Received, ModelFailure>> {
        if self.0.is_empty() {
            return Box::pin(std::future::pending());
        }
        let reply = self.0.remove(0);
        Box::pin(std::future::ready(Ok(Received::parsed(reply))))
    }
}

/// Children whose model never answers.
struct HangingChildren;

impl ChildModels for HangingChildren {
    fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
        Box::new(subloop::providers::scripted::ScriptedModel::new(Vec::new()))
    }

    fn async_model_for(&self, _number: usize) -> Box<dyn AsyncModel + Send> {
        Box::new(ThenHang(Vec::new()))
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    threads: usize,
    fds: usize,
    children: usize,
}

fn counts() -> Counts {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let threads = status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let me = std::process::id().to_string();
    let children = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...: the fields after the last ')'.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(me.as_str())
        })
        .count();
    Counts {
        threads,
        fds,
        children,
    }
}

/// Whether no live process (zombies hold nothing) has `marker` in its
/// command line.
fn gone(marker: &str) -> bool {
    !std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            let dir = entry.path();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            after.split_whitespace().next() != Some("Z")
                && cmdline
                    .windows(marker.len())
                    .any(|window| window == marker.as_bytes())
        })
}

fn trace_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Every agent's last line is its `outcome`, status `cancelled`, and the
/// trace holds `view --check`'s rules.
fn assert_closed(path: &Path, agents: &[&str]) {
    let lines = trace_lines(path);
    for agent in agents {
        let last = lines
            .iter()
            .rev()
            .find(|line| line["agent"] == *agent)
            .unwrap_or_else(|| panic!("no line of {agent}"));
        assert_eq!(last["kind"], "outcome", "{agent}: {last}");
        assert_eq!(last["status"], "cancelled", "{agent}: {last}");
    }
    let run = RecordedRun::load(path).unwrap();
    let policy = Policy {
        parent_calls: None,
        child_calls: None,
        child_tools: vec!["read_file".to_owned()],
    };
    for verdict in policy.check(&run) {
        assert!(verdict.held(), "{:?}", verdict);
    }
}

fn tool_call(id: &str, name: &str, input: Value) -> ModelResponse {
    ModelResponse::tool_calls([(id.to_owned(), name, input)])
}

/// The tests of this binary count this process's threads: one at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_dropped_run_leaves_nothing_running_and_a_closed_trace() {
    let _alone = ALONE.lock().unwrap_or_else(|poison| poison.into_inner());
    let dir = std::env::temp_dir().join(format!("subloop-drop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), "alpha").unwrap();
    // Idle threads of the runtime's blocking pool (where a program's
    // sandbox is prepared and its watchdog reaped) go after 50 ms, not the
    // default 10 s: the count below is of what the run left running.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(Duration::from_millis(50))
        .enable_all()
        .build()
        .unwrap();
    // Warm the runtime (its workers, its signal driver) before counting.
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(10)).await });
    let before = counts();

    let agent = |trace: &Path, program: &[&str]| {
        AgentBuilder::new(Arc::new(AllowAll))
            .read_only_tool(ReadFile::new(&dir, ReadFile::DEFAULT_LIMIT).unwrap())
            .unwrap()
            .tool(
                RunMain::new(
                    &dir,
                    RunSettings::new(program.iter().map(|arg| (*arg).to_owned()).collect()),
                )
                .unwrap(),
            )
            .unwrap()
            .subagents(SubagentConfig::new(
                Arc::new(HangingChildren),
                Hooks::none(),
            ))
            .unwrap()
            .monitor(TraceWriter::create(trace).unwrap())
            .build()
    };

    // 1. In the middle of a model request, after a round of read_file.
    let trace = dir.join("request.jsonl");
    let run = agent(&trace, &["true"]);
    let mut model = ThenHang(vec![tool_call("r1", "read_file", json!({"path": "a.txt"}))]);
    let dropped = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(100),
            run.run_async("q", Budget::new(4).unwrap(), &mut model),
        )
        .await
    });
    assert!(dropped.is_err(), "the run was still waiting");
    assert_closed(&trace, &["parent"]);
    let lines = trace_lines(&trace);
    let failed = lines
        .iter()
        .find(|line| line["kind"] == "model_failed")
        .unwrap();
    assert_eq!(failed["error_type"], "cancelled");

    // 2. In the middle of a program: its whole group is killed.
    let trace = dir.join("program.jsonl");
    let pid_file = dir.join("pid");
    // An unusual duration marks the grandchild: in the sandbox's PID
    // namespace `$!` is not its pid out here.
    let script = format!("sleep 30.7391 & echo $! > {}; wait", pid_file.display());
    let run = agent(&trace, &["sh", "-c", &script]);
    let mut model = ThenHang(vec![tool_call("m1", "run_main", json!({}))]);
    let dropped = runtime.block_on(async {
        let run = run.run_async("q", Budget::new(4).unwrap(), &mut model);
        tokio::time::timeout(Duration::from_millis(500), run).await
    });
    assert!(dropped.is_err());
    let pid = "30.7391";
    assert!(std::fs::read_to_string(&pid_file).is_ok());
    assert_closed(&trace, &["parent"]);
    let tool = trace_lines(&trace)
        .into_iter()
        .find(|line| line["kind"] == "tool")
        .unwrap();
    assert_eq!(tool["id"], "m1");
    assert_eq!(tool["is_error"], true);
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("abandoned while it ran"),
        "{tool}"
    );

    // 3. In the middle of a batch of children.
    let trace = dir.join("batch.jsonl");
    let run = agent(&trace, &["true"]);
    let mut model = ThenHang(vec![ModelResponse::tool_calls([
        ("t1".to_owned(), "task", json!({"task": "one"})),
        ("t2".to_owned(), "task", json!({"task": "two"})),
    ])]);
    let dropped = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(100),
            run.run_async("q", Budget::new(4).unwrap(), &mut model),
        )
        .await
    });
    assert!(dropped.is_err());
    assert_closed(&trace, &["parent", "child-1", "child-2"]);

    // Nothing left: no task on the runtime, no process, thread or descriptor.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !(gone(pid) && counts() == before) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(pid), "the program's grandchild {pid} outlived the run");
    assert_eq!(runtime.metrics().num_alive_tasks(), 0);
    assert_eq!(counts(), before);
    drop(runtime);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that reads each request and never answers: each time one
/// has come in whole (its headers read), it says so on `arrived`; the
/// connections stay open until the process ends.
fn silent_server() -> (String, std::sync::mpsc::Receiver<()>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (arrived, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut seen = Vec::new();
            let mut chunk = [0u8; 4096];
            while !seen.windows(4).any(|window| window == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = arrived.send(());
            held.push(stream);
        }
    });
    (url, receiver)
}

/// The ids of this process's threads.
fn tids() -> std::collections::HashSet<libc::pid_t> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn live_config(url: &str) -> subloop::providers::anthropic::LiveConfig {
    let mut config = subloop::providers::anthropic::LiveConfig::new(
        subloop::providers::http::ApiKey::new("test-key-not-secret"),
        url,
    );
    config.model = "test".to_owned();
    // Far longer than the test waits: only the stop can end the request.
    config.timeouts.read = Duration::from_secs(60);
    config.timeouts.overall = Duration::from_secs(120);
    config
}

/// An agent with no tools, the handle that cancels it, and the slot that
/// gives its stop signal to a model.
fn cancellable_agent() -> (
    subloop::Agent,
    subloop::CancelHandle,
    subloop::providers::http::StopSlot,
) {
    let cancel = subloop::CancelHandle::new();
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .limits(subloop::Limits::default(), cancel.clone())
        .build();
    let slot = subloop::providers::http::StopSlot::default();
    let _ = slot.set(agent.stop_signal());
    (agent, cancel, slot)
}

/// The threads this process has that it did not have `before`.
fn added_since(before: &std::collections::HashSet<libc::pid_t>) -> Vec<libc::pid_t> {
    tids().difference(before).copied().collect()
}

/// How long after `cancel()` the run ended, and how it ended.
struct Ended {
    after_cancel: Duration,
    status: subloop::StatusKind,
    text: String,
}

#[test]
fn cancelling_a_request_in_flight_wakes_it_without_a_thread_or_a_poll() {
    use subloop::providers::anthropic::{self, AnthropicModel, AsyncAnthropicModel};
    let _alone = ALONE.lock().unwrap_or_else(|poison| poison.into_inner());
    let (url, arrived) = silent_server();

    // Blocking: the run on a thread of its own, its request on that thread.
    let client = Arc::new(anthropic::Client::new(live_config(&url)));
    let (agent, cancel, slot) = cancellable_agent();
    let mut model = AnthropicModel::with_stop(Arc::clone(&client), slot);
    let before = tids();
    let (ended, finished) = std::sync::mpsc::channel();
    let (tid, run_tid) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || {
        // SAFETY: gettid(2) has no preconditions.
        let _ = tid.send(unsafe { libc::gettid() });
        let report = agent.run("q", Budget::new(2).unwrap(), &mut model).unwrap();
        let at = std::time::Instant::now();
        let _ = ended.send((at, report.outcome.status, report.outcome.text.clone()));
    });
    arrived.recv_timeout(Duration::from_secs(30)).unwrap();
    // The run's thread and nothing more: no worker waits for the request.
    let run_tid = run_tid.recv().unwrap();
    let added = added_since(&before);
    assert_eq!(added, [run_tid], "threads added while the request waits");
    let cancelled = std::time::Instant::now();
    cancel.cancel();
    let (at, status, text) = finished.recv_timeout(Duration::from_secs(30)).unwrap();
    run.join().unwrap();
    let blocking = Ended {
        after_cancel: at.duration_since(cancelled),
        status,
        text,
    };

    // Async: one worker thread, the run a task on it.
    let client = Arc::new(anthropic::AsyncClient::new(live_config(&url)).unwrap());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (agent, cancel, slot) = cancellable_agent();
    let mut model = AsyncAnthropicModel::with_stop(client, slot);
    let before = tids();
    let canceller = std::thread::spawn(move || {
        arrived.recv_timeout(Duration::from_secs(30)).unwrap();
        let added = added_since(&before);
        // SAFETY: gettid(2) has no preconditions.
        let me = unsafe { libc::gettid() };
        let cancelled = std::time::Instant::now();
        cancel.cancel();
        (added, me, cancelled)
    });
    let report = runtime
        .block_on(agent.run_async("q", Budget::new(2).unwrap(), &mut model))
        .unwrap();
    let at = std::time::Instant::now();
    let (added, canceller, cancelled) = canceller.join().unwrap();
    // The canceller's thread and nothing more (the runtime is this thread).
    assert_eq!(added, [canceller], "threads added while the request waits");
    let not_blocking = Ended {
        after_cancel: at.duration_since(cancelled),
        status: report.outcome.status,
        text: report.outcome.text,
    };

    for (mode, ended) in [("blocking", blocking), ("async", not_blocking)] {
        assert_eq!(
            ended.status,
            subloop::StatusKind::Cancelled,
            "{mode}: {}",
            ended.text
        );
        assert!(ended.text.contains("abandoned"), "{mode}: {}", ended.text);
        // Woken, not found by a timer: milliseconds (measured well under
        // 10), bounded here loosely for a loaded machine.
        assert!(
            ended.after_cancel < Duration::from_millis(500),
            "{mode}: the run ended {:?} after the cancel",
            ended.after_cancel
        );
        eprintln!("{mode}: ended {:?} after cancel()", ended.after_cancel);
    }
}
