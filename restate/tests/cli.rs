//! The command line of durable runs, against a real Restate server: `subloop
//! worker` serves and registers itself, `subloop submit` prints the report
//! `subloop run --json` prints, `subloop pending` and `subloop approve`
//! answer an approval the run waits for while no worker is running, and a
//! server that is down is a clear error with its own exit code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{Server, free_port, start_worker, subloop};

fn run(args: &[&str]) -> Output {
    Command::new(subloop())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A worker started by the command line; killed (SIGKILL) when dropped.
struct Worker(Child);

impl Worker {
    fn start(server: &Server, port: u16) -> Self {
        Self(start_worker(
            Command::new(subloop())
                .args(["worker", "--restate-admin", &server.admin])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--decision", "ask", "--sandbox", "off"]),
        ))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn demo_workspace(dir: &Path) -> String {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workspace");
    for name in ["main.py", "expected.txt"] {
        std::fs::copy(examples.join(name), ws.join(name)).unwrap();
    }
    ws.display().to_string()
}

#[test]
fn the_demo_runs_through_the_command_line_with_an_approval_answered_after_a_worker_died() {
    let Some(server) = Server::start() else {
        return;
    };
    let ws = demo_workspace(&server.base.join("cli"));
    let port = free_port();
    let worker = Worker::start(&server, port);
    let submit = {
        let (ingress, ws) = (server.ingress.clone(), ws.clone());
        std::thread::spawn(move || {
            Command::new(subloop())
                .args(["submit", "--restate", &ingress, "--run-id", "demo-1"])
                .args(["--workspace", &ws, "--json"])
                .args(["--question", "Check main.py against expected.txt."])
                .output()
                .unwrap()
        })
    };
    // The run reaches run_main and waits for its approval.
    let deadline = Instant::now() + Duration::from_secs(60);
    let call = loop {
        let out = run(&["pending", "--restate", &server.ingress, "demo-1"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(line) = text.lines().next() {
            let (call, action) = line.split_once('\t').unwrap();
            assert!(action.contains("main.py"), "{line}");
            break call.to_owned();
        }
        assert!(Instant::now() < deadline, "no approval pending");
        std::thread::sleep(Duration::from_millis(100));
    };
    // No worker runs while the approval waits; a new one takes the run.
    drop(worker);
    std::thread::sleep(Duration::from_millis(300));
    let _worker = Worker::start(&server, port);
    let out = run(&[
        "approve",
        "--restate",
        &server.ingress,
        "demo-1",
        &call,
        "allow",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = submit.join().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "answered", "{report}");
    assert_eq!(report["run_id"], "demo-1");
    assert!(report["text"].as_str().unwrap().contains("42"), "{report}");
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["task", "read_file", "run_main"], "{report}");
    assert_eq!(report["tools"][2]["decision"], "allowed", "{report}");
    // The same id again: the first run's report, at once.
    let out = run(&[
        "submit",
        "--restate",
        &server.ingress,
        "--run-id",
        "demo-1",
        "--workspace",
        &ws,
        "--question",
        "Another question",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("42"));
}

#[test]
fn a_server_that_is_down_or_a_bad_flag_is_a_clear_error() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let out = run(&[
        "submit",
        "--restate",
        &url,
        "--run-id",
        "r",
        "--workspace",
        "/tmp",
        "--question",
        "q",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be reached"), "{stderr}");
    let out = run(&["approve", "--restate", &url, "r", "t1", "maybe"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("allow or deny"));
    let out = run(&["worker", "--listen", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--restate-admin"));
    let out = run(&[
        "worker",
        "--restate-admin",
        &url,
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    assert_eq!(out.status.code(), Some(3));
}
