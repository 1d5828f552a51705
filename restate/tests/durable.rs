//! Durable runs against a real Restate server (`.ci/restate-server.sh`,
//! the npm package `@restatedev/restate-server`): a run submitted through
//! the ingress ends with the answer; a worker killed with SIGKILL while a
//! model request is in flight is replaced, and the replies recorded before
//! the kill are replayed from the journal, not asked again.
//!
//! The worker is this test binary run again with `SUBLOOP_RESTATE_WORKER`
//! set (see `worker_process`), so it can be killed outright.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use subloop::ModelResponse;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Request;
use subloop::run::model::Model;
use subloop_restate::{DurableRun, Models, RunResult};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The server, stopped on drop.
struct Server {
    process: u32,
    base: PathBuf,
    ingress: String,
    admin: String,
}

impl Server {
    /// Starts a server from the installation `.ci/restate-server.sh setup`
    /// made (`SUBLOOP_RESTATE_DIR`; `.ci/run` sets it); `None`, said on
    /// stderr, when there is none and skipping is allowed. Nothing is
    /// downloaded here.
    fn start() -> Option<Self> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let script = repo.join(".ci/restate-server.sh");
        let cache = std::env::var_os("SUBLOOP_RESTATE_DIR").map(PathBuf::from);
        let installed = cache.as_ref().is_some_and(|dir| {
            dir.join("node_modules/@restatedev/restate-server-linux-x64/bin/restate-server")
                .exists()
        });
        let Some(cache) = cache.filter(|_| installed) else {
            assert!(
                std::env::var_os("SUBLOOP_NO_SKIP").is_none(),
                "no Restate server: run `.ci/restate-server.sh setup DIR`, then set SUBLOOP_RESTATE_DIR=DIR"
            );
            eprintln!("skipped: no Restate server (SUBLOOP_RESTATE_DIR)");
            return None;
        };
        let base = std::env::temp_dir().join(format!("subloop-restate-{}", free_port()));
        let (ingress, admin, node) = (free_port(), free_port(), free_port());
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&cache)
            .arg(&base)
            .args([ingress.to_string(), admin.to_string(), node.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let process = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Some(Self {
            process,
            base,
            ingress: format!("http://127.0.0.1:{ingress}"),
            admin: format!("http://127.0.0.1:{admin}"),
        })
    }

    /// Registers a worker at `uri` (idempotent for the same URI).
    fn register(&self, uri: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = ureq::post(&format!("{}/deployments", self.admin))
                .send_json(json!({"uri": uri, "force": false}));
            match answer {
                Ok(_) => return,
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(err) => panic!("registering {uri}: {err}"),
            }
        }
    }

    /// Starts run `id` (or finds the one with that id).
    fn submit(&self, id: &str, request: &Value) {
        ureq::post(&format!("{}/DurableRun/{id}/run/send", self.ingress))
            .send_json(request)
            .expect("submitted");
    }

    /// Waits for run `id` to end and gives its result.
    fn attach(&self, id: &str) -> RunResult {
        let mut answer = ureq::get(&format!(
            "{}/restate/workflow/DurableRun/{id}/attach",
            self.ingress
        ))
        .call()
        .expect("attached");
        answer.body_mut().read_json().expect("a run result")
    }
}

impl Drop for Server {
    /// Stops the server (SIGTERM), waits until it is gone (at most 20 s),
    /// and removes its directory: nothing of it is left in `TMPDIR`.
    fn drop(&mut self) {
        let pid = i32::try_from(self.process).unwrap_or(i32::MAX);
        // SAFETY: kill(2) on the server this test started.
        unsafe {
            kill(pid, SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        // SAFETY: kill(2) with signal 0 only asks whether it is there.
        while unsafe { kill(pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

const SIGTERM: i32 = 15;

unsafe extern "C" {
    fn kill(pid: i32, signal: i32) -> i32;
}

/// A script: read `expected.txt`, then answer. Each request is counted in
/// `count` (a line per request) before it is answered; the one after the
/// tool result waits until `gate` exists, so a test can kill the worker
/// while it is in flight.
struct Counted {
    count: PathBuf,
    gate: PathBuf,
}

impl Model for Counted {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        // By the history, not by a count of its own: a replaced worker's
        // model is asked only what the journal does not hold.
        let after_the_tool = request.messages.len() > 1;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.count)
            .unwrap();
        writeln!(file, "request").unwrap();
        if after_the_tool {
            while !self.gate.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Ok(ModelResponse::answer("It prints 42."));
        }
        Ok(ModelResponse::tool_calls([(
            "t1",
            "read_file",
            json!({"path": "expected.txt"}),
        )]))
    }
}

struct CountedModels {
    count: PathBuf,
    gate: PathBuf,
}

impl Models for CountedModels {
    fn parent(&self) -> Box<dyn Model + Send> {
        Box::new(Counted {
            count: self.count.clone(),
            gate: self.gate.clone(),
        })
    }
}

/// Not a test of its own: the worker process, when this binary is run with
/// `SUBLOOP_RESTATE_WORKER=PORT COUNT GATE`.
#[test]
fn worker_process() {
    let Ok(spec) = std::env::var("SUBLOOP_RESTATE_WORKER") else {
        return;
    };
    let mut parts = spec.split('\u{1f}');
    let port: u16 = parts.next().unwrap().parse().unwrap();
    let count = PathBuf::from(parts.next().unwrap());
    let gate = PathBuf::from(parts.next().unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(subloop_restate::serve(
        DurableRun::new(CountedModels { count, gate }),
        ([127, 0, 0, 1], port).into(),
    ));
}

/// Starts a worker process on `port`.
fn worker(port: u16, count: &Path, gate: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "worker_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(
            "SUBLOOP_RESTATE_WORKER",
            format!("{port}\u{1f}{}\u{1f}{}", count.display(), gate.display()),
        )
        .spawn()
        .unwrap()
}

fn requests(count: &Path) -> usize {
    std::fs::read_to_string(count).map_or(0, |text| text.lines().count())
}

fn workspace(dir: &Path) -> PathBuf {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("expected.txt"), "42\n").unwrap();
    ws
}

#[test]
fn a_worker_killed_mid_request_is_replaced_and_recorded_replies_are_not_asked_again() {
    if std::env::var_os("SUBLOOP_RESTATE_WORKER").is_some() {
        return;
    }
    let Some(server) = Server::start() else {
        return;
    };
    let dir = server.base.join("test");
    let ws = workspace(&dir);
    let (count, gate) = (dir.join("count"), dir.join("gate"));
    let port = free_port();
    let mut first = worker(port, &count, &gate);
    let uri = format!("http://127.0.0.1:{port}");
    server.register(&uri);
    let request = json!({"question": "What does main.py print?", "calls": 4,
        "workspace": ws.display().to_string()});
    server.submit("run-1", &request);
    // The second request is in flight (the first reply is journaled).
    let deadline = Instant::now() + Duration::from_secs(60);
    while requests(&count) < 2 {
        assert!(
            Instant::now() < deadline,
            "the run did not reach its second request"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    std::fs::write(&gate, "open").unwrap();
    // A new worker at the same address; registering again is a no-op.
    let mut second = worker(port, &count, &gate);
    server.register(&uri);
    // A second submission with the same id is the same run.
    server.submit("run-1", &request);
    let result = server.attach("run-1");
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(result.status, "answered", "{result:?}");
    assert_eq!(result.text, "It prints 42.");
    assert_eq!(result.calls, 2);
    // The first request was answered once (from the journal on the replay);
    // only the one in flight at the kill was asked again.
    assert_eq!(requests(&count), 3);
}
