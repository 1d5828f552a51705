//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use subloop::Model;
use subloop::ModelResponse;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::Request;
use subloop::core::protocol::ToolDefinition;

/// One scripted reply: a response, or the failure the model gives.
pub type ScriptedReply = Result<subloop::ModelResponse, subloop::core::error::ModelFailure>;

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "subloop-test-{tag}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes a file (creating parent directories) and returns its path.
    pub fn write(&self, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent");
        }
        std::fs::write(&path, content).expect("write file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A request as a model saw it, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenRequest {
    pub system: String,
    pub tools: Vec<ToolDefinition>,
    /// The history as stored (without the attachment).
    pub messages: Vec<Message>,
    pub attachment: Option<String>,
    /// The output schema the request carried.
    pub output: Option<serde_json::Value>,
}

/// A model replaying `replies` and recording every request; clones share the log.
#[derive(Clone)]
pub struct RecordingModel {
    replies: Arc<Mutex<std::vec::IntoIter<ScriptedReply>>>,
    pub seen: Arc<Mutex<Vec<SeenRequest>>>,
}

impl RecordingModel {
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self {
            replies: Arc::new(Mutex::new(replies.into_iter())),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.lock().unwrap().clone()
    }
}

impl Model for RecordingModel {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.seen.lock().unwrap().push(SeenRequest {
            system: request.system.to_owned(),
            tools: request.tools.to_vec(),
            messages: request.messages.to_vec(),
            attachment: request.attachment.map(str::to_owned),
            output: request.output.cloned(),
        });
        self.replies
            .lock()
            .unwrap()
            .next()
            .unwrap_or_else(|| Err(ModelFailure::new("recording model: no reply left")))
    }
}

/// The path of the built `subloop` binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_subloop")
}

/// Makes `command` start with the default action for `SIGINT`, `SIGTERM`
/// and `SIGHUP`, so that tests which signal subloop do not depend on how the
/// test runner was started (signals ignored at start stay ignored in subloop).
pub fn default_signals(command: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) in the forked child before exec; async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}

/// The repository's example directory.
pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// Every tool_result block of a history, in order: (id, text, is_error).
pub fn tool_results(messages: &[Message]) -> Vec<(String, String, bool)> {
    messages
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => Some((tool_use_id.to_string(), content.text(), *is_error)),
            _ => None,
        })
        .collect()
}

/// `(name, decision)` of every tool call of the parent in a `--json` object.
pub fn tools(value: &serde_json::Value) -> Vec<(String, String)> {
    value["tools"]
        .as_array()
        .expect("tools is an array")
        .iter()
        .map(|tool| {
            (
                tool["name"].as_str().unwrap_or_default().to_owned(),
                tool["decision"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Owned `(a, b)` pairs, to compare with [`tools`].
pub fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// The file a marker workspace's main.py leaves when it runs.
pub const MARKER: &str = "marker.txt";

/// A copy of the demo workspace whose main.py also leaves [`MARKER`].
pub fn marker_workspace() -> TempDir {
    let dir = TempDir::new("marker");
    dir.write(
        "main.py",
        format!("open('{MARKER}', 'w').write('ran')\nprint(6 * 7)\n"),
    );
    dir.write("expected.txt", "42\n");
    dir
}

/// A test that cannot run here (a missing tool or kernel feature) says so on
/// stderr — and fails instead when `SUBLOOP_NO_SKIP` is set, as `.ci/run`
/// does, so that a CI run cannot pass by skipping.
pub fn skipped(reason: impl std::fmt::Display) {
    if std::env::var_os("SUBLOOP_NO_SKIP").is_some() {
        panic!("skipped: {reason} (SUBLOOP_NO_SKIP is set: install what this test needs)");
    }
    eprintln!("skipped: {reason}");
}

/// How a test drives an agent: the blocking entry points ([`Agent::run`]),
/// or the async ones ([`Agent::run_async`]) awaited on a tokio runtime.
/// Agent-level tests are written once and run with both: a test body
/// calls [`RunDriven::run_driven`], and [`async_twins!`] makes, for each
/// named test, a twin that runs it under [`Driver::Async`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Blocking,
    Async,
}

thread_local! {
    static DRIVER: std::cell::Cell<Driver> = const { std::cell::Cell::new(Driver::Blocking) };
}

/// The driver of this thread's test.
pub fn driver() -> Driver {
    DRIVER.with(std::cell::Cell::get)
}

/// Runs `body` with `driver` as this thread's driver.
pub fn with_driver<R>(driver: Driver, body: impl FnOnce() -> R) -> R {
    let before = DRIVER.with(|cell| cell.replace(driver));
    let result = body();
    DRIVER.with(|cell| cell.set(before));
    result
}

/// A current-thread tokio runtime with its timers and I/O, as a service would have.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs an agent with this thread's [`Driver`].
pub trait RunDriven {
    fn run_driven(
        self,
        question: &str,
        budget: subloop::Budget,
        model: &mut dyn Model,
    ) -> Result<subloop::RunReport, subloop::core::error::InputError>;

    fn resume_driven(
        self,
        point: subloop::agent::ResumePoint,
        model: &mut dyn Model,
    ) -> subloop::RunReport;
}

impl RunDriven for subloop::Agent {
    fn run_driven(
        self,
        question: &str,
        budget: subloop::Budget,
        model: &mut dyn Model,
    ) -> Result<subloop::RunReport, subloop::core::error::InputError> {
        match driver() {
            Driver::Blocking => self.run(question, budget, model),
            Driver::Async => {
                let mut model = subloop::run::model::Blocking(model);
                runtime().block_on(self.run_async(question, budget, &mut model))
            }
        }
    }

    fn resume_driven(
        self,
        point: subloop::agent::ResumePoint,
        model: &mut dyn Model,
    ) -> subloop::RunReport {
        match driver() {
            Driver::Blocking => self.resume(point, model),
            Driver::Async => {
                let mut model = subloop::run::model::Blocking(model);
                runtime().block_on(self.resume_async(point, &mut model))
            }
        }
    }
}

/// For each named test of the module, a test `async_driver::<name>` that
/// runs it with [`Driver::Async`].
#[macro_export]
macro_rules! async_twins {
    ($($name:ident),* $(,)?) => {
        mod async_driver {
            $(
                #[test]
                fn $name() {
                    $crate::common::with_driver($crate::common::Driver::Async, super::$name)
                }
            )*
        }
    };
}

/// The processes descended from `ancestor`, as this process sees them
/// (host pids, whatever PID namespace they run in): `(pid, pgid, comm)`.
/// A sandboxed program cannot tell its own host pid or group, so tests
/// find them from outside.
pub fn descendants(ancestor: libc::pid_t) -> Vec<(libc::pid_t, libc::pid_t, String)> {
    let mut all: Vec<(libc::pid_t, libc::pid_t, libc::pid_t, String)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head
            .split_once('(')
            .map(|(_, c)| c.to_owned())
            .unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // state ppid pgrp ...
        let (Some(state), Some(ppid), Some(pgrp)) = (fields.first(), fields.get(1), fields.get(2))
        else {
            continue;
        };
        if *state == "Z" {
            continue;
        }
        let (Ok(ppid), Ok(pgrp)) = (ppid.parse(), pgrp.parse()) else {
            continue;
        };
        all.push((pid, ppid, pgrp, comm));
    }
    let mut found: Vec<libc::pid_t> = vec![ancestor];
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid, _, _) in &all {
            if found.contains(ppid) && !found.contains(pid) {
                found.push(*pid);
                grew = true;
            }
        }
    }
    all.into_iter()
        .filter(|(pid, _, _, _)| *pid != ancestor && found.contains(pid))
        .map(|(pid, _, pgrp, comm)| (pid, pgrp, comm))
        .collect()
}

/// Whether no live process's command line contains `marker`, within 2 s
/// (a sandboxed program's pids are its namespace's: tests mark the
/// processes they want to see gone instead).
pub fn marked_gone_soon(marker: &str) -> bool {
    let alive = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let dir = entry.path();
                let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
                let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
                let zombie = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next())
                    == Some('Z');
                !zombie
                    && cmdline
                        .windows(marker.len().max(1))
                        .any(|window| window == marker.as_bytes())
            })
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while alive() {
        if std::time::Instant::now() > until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// What a process subloop started (a hook, an MCP server) wrote about
/// itself: `fds` the listing of `/proc/self/fd` by `ls` (only 0, 1, 2 and
/// `ls`'s own 3), `status` its `CapEff`, `CapPrm` and `NoNewPrivs` lines
/// (no capability, no new privileges); `outside` the file subloop held
/// open on a descriptor it inherited, which nothing reached.
pub fn assert_started_hardened(fds: &Path, outside: &Path, status: &Path) {
    let listed = std::fs::read_to_string(fds).expect("fds.txt");
    let mut listed: Vec<&str> = listed.split_whitespace().collect();
    listed.sort_unstable();
    // `ls` holds the directory it lists open: 3.
    assert_eq!(listed, ["0", "1", "2", "3"]);
    assert_eq!(std::fs::read_to_string(outside).expect("outside.txt"), "");
    let status = std::fs::read_to_string(status).expect("status.txt");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("CapPrm:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
}

/// The pairing rule as the Messages API states it, written apart from the
/// library's own check: every `tool_use` is answered by a `tool_result` in
/// the next message, every `tool_result` answers a `tool_use` of the message
/// right before it, the history starts and ends with a user message.
pub fn keeps_the_protocol(history: &[subloop::core::protocol::Message]) -> Result<(), String> {
    let ids = |message: &subloop::core::protocol::Message, results: bool| -> Vec<String> {
        message
            .content
            .iter()
            .filter_map(|block| match (block, results) {
                (subloop::core::protocol::Block::ToolUse { id, .. }, false) => Some(id.to_string()),
                (subloop::core::protocol::Block::ToolResult { tool_use_id, .. }, true) => {
                    Some(tool_use_id.to_string())
                }
                _ => None,
            })
            .collect()
    };
    if history.first().map(|m| m.role) != Some(subloop::core::protocol::Role::User) {
        return Err("not user first".into());
    }
    if history.last().map(|m| m.role) != Some(subloop::core::protocol::Role::User) {
        return Err("not user last".into());
    }
    for (index, message) in history.iter().enumerate() {
        let calls = ids(message, false);
        let next = history
            .get(index + 1)
            .map(|m| ids(m, true))
            .unwrap_or_default();
        if calls.iter().any(|call| !next.contains(call)) {
            return Err(format!("message {index}: a call without its result next"));
        }
        let results = ids(message, true);
        let before = index
            .checked_sub(1)
            .and_then(|i| history.get(i))
            .map(|m| ids(m, false))
            .unwrap_or_default();
        if results.iter().any(|result| !before.contains(result)) {
            return Err(format!("message {index}: an orphan result"));
        }
    }
    Ok(())
}

/// A proptest configuration of `cases` cases whose failures are kept in
/// `file` (`proptest-regressions/NAME.txt`), replayed first on each run.
pub fn proptest_config(cases: u32, file: &'static str) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(file),
        )),
        ..proptest::test_runner::Config::default()
    }
}
