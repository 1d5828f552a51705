//! A real Restate server for the tests (`.ci/restate-server.sh`, the npm
//! package `@restatedev/restate-server`), on ports of its own, its state
//! under a temporary base directory removed when it stops.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use subloop_restate::{RunRequest, RunResult, client};

/// A port no other test of this process is given: taken in turn from a
/// range below the kernel's ephemeral ports (where a port just tried and
/// released would not be handed out again by `bind(0)`), skipping any in
/// use.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + u16::try_from(std::process::id() % 250).unwrap() * 40;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::SeqCst) % 10_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The server, stopped on drop.
pub struct Server {
    process: u32,
    pub base: PathBuf,
    pub ingress: String,
    pub admin: String,
    /// How it was started: the installation, the script, its three ports.
    cache: PathBuf,
    script: PathBuf,
    ports: [u16; 3],
}

impl Server {
    /// Starts a server from the installation `.ci/restate-server.sh setup`
    /// made (`SUBLOOP_RESTATE_DIR`; `.ci/run` sets it); `None`, said on
    /// stderr, when there is none and skipping is allowed. Nothing is
    /// downloaded here.
    pub fn start() -> Option<Self> {
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
        // A port another process took meanwhile makes the server exit:
        // start again on others.
        let mut attempts = 0;
        let (base, ingress, admin, node, out) = loop {
            attempts += 1;
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
            if out.status.success() {
                break (base, ingress, admin, node, out);
            }
            let _ = std::fs::remove_dir_all(&base);
            assert!(attempts < 3, "{}", String::from_utf8_lossy(&out.stderr));
        };
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
            cache,
            script,
            ports: [ingress, admin, node],
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.process
    }

    /// Stops the server (SIGTERM) and starts it again on the same ports
    /// with the same state.
    pub fn restart(&mut self) {
        self.stop();
        let [ingress, admin, node] = self.ports;
        let out = Command::new("bash")
            .arg(&self.script)
            .arg("start")
            .arg(&self.cache)
            .arg(&self.base)
            .args([ingress.to_string(), admin.to_string(), node.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.process = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    }

    /// Stops the server (SIGTERM) and waits until it is gone (at most 20 s).
    fn stop(&self) {
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
    }

    /// Registers a worker at `uri` (idempotent for the same URI), once
    /// it answers.
    pub fn register(&self, uri: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client::register(&self.admin, uri) {
                Ok(()) => return,
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(err) => panic!("registering {uri}: {err}"),
            }
        }
    }

    /// Starts run `id` (or finds the one with that id).
    pub fn submit(&self, id: &str, request: &RunRequest) {
        client::submit(&self.ingress, id, request).expect("submitted");
    }

    /// Waits for run `id` to end and gives its result.
    pub fn attach(&self, id: &str) -> RunResult {
        client::attach(&self.ingress, id).expect("a run result")
    }
}

impl Drop for Server {
    /// Stops the server (SIGTERM), waits until it is gone (at most 20 s),
    /// and removes its directory: nothing of it is left in `TMPDIR`.
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

const SIGTERM: i32 = 15;

unsafe extern "C" {
    fn kill(pid: i32, signal: i32) -> i32;
}

/// `subloop` when it was built beside `subloop-restate` (a workspace
/// `cargo test` builds both), so the forwarding is what is tested; else
/// `subloop-restate` itself.
#[cfg(test)] // the binaries' paths are known to tests only
pub fn subloop() -> PathBuf {
    let restate = PathBuf::from(env!("CARGO_BIN_EXE_subloop-restate"));
    let beside = restate.with_file_name("subloop");
    if beside.is_file() {
        beside
    } else {
        assert!(
            std::env::var_os("SUBLOOP_NO_SKIP").is_none(),
            "no subloop binary beside {}: run the workspace's `cargo test`",
            restate.display()
        );
        eprintln!("skipped: the forwarding of `subloop` (not built beside subloop-restate)");
        restate
    }
}

/// Starts a `worker` command line (`subloop worker …` or `subloop-restate
/// worker …`) and returns it once it says it serves (it has registered
/// itself); its stderr is drained from then on.
pub fn start_worker(command: &mut std::process::Command) -> std::process::Child {
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    assert!(line.contains("serving durable runs at"), "{line}");
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    child
}
