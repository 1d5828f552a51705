//! `run_main {}`: runs the workspace's program (`python3 main.py` by default).
//!
//! The command is split without a shell. The program runs in its own process
//! group with stdin closed; when it exits or its timeout passes, the whole
//! group is killed, so neither an endless loop nor a sleeping grandchild
//! outlives the call. (A descendant that leaves the group with `setsid` or
//! `setpgid` escapes this; its output is collected for at most 500 ms more.)
//!
//! The group does not depend on subloop staying alive to be killed. Its
//! leader is a tiny watchdog forked before the program starts: it holds the
//! read end of a pipe whose write end only subloop holds, and when that pipe
//! reaches end-of-file — subloop exited or was killed, even by `SIGKILL` —
//! it kills the group (itself included). The program joins the watchdog's
//! group, so the group exists and is watched before the program's first
//! instruction. subloop kills the group before it reaps the watchdog, so the
//! group id cannot be reused by another process in between. A host can
//! also kill the running groups itself ([`Programs`]; the CLI does on a
//! second Ctrl-C, `SIGTERM` and `SIGHUP`).
//!
//! On Linux the program starts in a sandbox ([`super::sandbox`], the
//! [`SandboxPolicy`] of [`RunMain::with_sandbox`], `workspace-write` by
//! default): the workspace and a private `TMPDIR`, the system read-only, no
//! network, no signal out, a short environment. Where the kernel cannot
//! enforce the level the program is not started (`not executed: …`).
//!
//! stdout and stderr are each capped: the bytes past the
//! cap are counted and dropped. The result is a JSON object with the exit
//! code, the captured text and the dropped byte counts.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::sandbox::{Confinement, SandboxPolicy};
use super::{Capability, Tool, ToolContext};
use crate::core::conversation::ToolOutput;
use crate::core::error::SetupError;
#[cfg(feature = "async")]
use crate::run::process::kill_group;
pub use crate::run::process::{ProcessGroups, Programs};
use crate::run::process::{Registered, Watchdog, wait_or_kill};
use crate::run::shutdown::Shutdown;
use crate::tools::read_file::workspace_root;

/// How `run_main` runs the program.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunSettings {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long the program may run before its process group is killed.
    pub timeout: Duration,
    /// How many bytes of stdout, and of stderr, are kept.
    pub output_cap: usize,
}

impl Default for RunSettings {
    fn default() -> Self {
        Self {
            command: vec!["python3".to_owned(), "main.py".to_owned()],
            timeout: Duration::from_secs(10),
            output_cap: 64 * 1024,
        }
    }
}

impl RunSettings {
    /// Runs `command` (the program and its arguments) with the default
    /// timeout and output cap.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            ..Self::default()
        }
    }

    /// These settings with the program killed after `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// These settings keeping `bytes` of stdout, and of stderr.
    #[must_use]
    pub fn with_output_cap(mut self, bytes: usize) -> Self {
        self.output_cap = bytes;
        self
    }

    /// Splits a command line into words without a shell: whitespace
    /// separates words, single quotes keep text literally, double quotes
    /// keep text with `\"` and `\\` escapes, a backslash outside quotes
    /// escapes one character.
    pub fn split_command(line: &str) -> Result<Vec<String>, SetupError> {
        split_command(line)
    }
}

/// Splits a command line into words without a shell: whitespace separates
/// words, single quotes keep text literally, double quotes keep text with
/// `\"` and `\\` escapes, a backslash outside quotes escapes one character.
pub(crate) fn split_command(line: &str) -> Result<Vec<String>, SetupError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(SetupError::RunCommand("unclosed single quote".into())),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => {
                                return Err(SetupError::RunCommand("unclosed double quote".into()));
                            }
                        },
                        Some(c) => word.push(c),
                        None => return Err(SetupError::RunCommand("unclosed double quote".into())),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err(SetupError::RunCommand("trailing backslash".into())),
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if words.is_empty() {
        return Err(SetupError::RunCommand("the command is empty".into()));
    }
    Ok(words)
}

/// The `run_main` tool.
#[derive(Debug, Clone)]
pub struct RunMain {
    workspace: PathBuf,
    settings: RunSettings,
    programs: Programs,
    sandbox: SandboxPolicy,
    shutdown: Option<Arc<Shutdown>>,
}

/// The JSON body of a `run_main` result; fields in this order.
#[derive(Debug, Serialize)]
struct RunReport {
    exit_code: Option<i32>,
    stdout: String,
    stderr: String,
    signal: Option<i32>,
    stdout_bytes_dropped: u64,
    stderr_bytes_dropped: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Protected paths the program made, removed when it ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    removed: Vec<String>,
}

impl RunReport {
    fn to_json(&self) -> String {
        serde_json::to_string(self)
            .unwrap_or_else(|err| format!("{{\"error\": \"unserializable report: {err}\"}}"))
    }
}

/// Captured output of one stream.
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
}

impl RunMain {
    /// A runner for `workspace` (which must be a directory).
    pub fn new(workspace: &Path, settings: RunSettings) -> Result<Self, SetupError> {
        if settings.command.is_empty() {
            return Err(SetupError::RunCommand("the command is empty".into()));
        }
        Ok(Self {
            workspace: workspace_root(workspace)?,
            settings,
            programs: Programs::new(),
            sandbox: SandboxPolicy::default(),
            shutdown: None,
        })
    }

    /// Starts programs in the sandbox `policy` describes (the default is
    /// [`super::sandbox::Sandbox::WorkspaceWrite`]).
    pub fn with_sandbox(mut self, policy: SandboxPolicy) -> Self {
        self.sandbox = policy;
        self
    }

    /// The sandbox programs start in.
    pub fn sandbox(&self) -> &SandboxPolicy {
        &self.sandbox
    }

    /// Also removes a running program's private temporary directory when
    /// the host's `shutdown` runs (a signal ends the host's process).
    pub fn with_shutdown(mut self, shutdown: Arc<Shutdown>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// Keeps the process groups it runs in `programs` (a host's, which it
    /// can kill on its way out), instead of a list of its own.
    pub fn with_programs(mut self, programs: Programs) -> Self {
        self.programs = programs;
        self
    }

    /// The process groups of the programs it is running.
    pub fn programs(&self) -> &Programs {
        &self.programs
    }

    /// The settings in use.
    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }

    /// The program and its arguments, or the error of an empty command.
    fn program(&self) -> Result<(&String, &[String]), ToolOutput> {
        self.settings
            .command
            .split_first()
            .ok_or_else(|| ToolOutput::error("run_main: the command is empty"))
    }

    /// The answer when the program could not be started.
    fn not_started(&self, program: &str, err: &std::io::Error) -> ToolOutput {
        let level = self.sandbox.level();
        if err.kind() == std::io::ErrorKind::NotFound && level.confines() {
            return ToolOutput::error(format!(
                "run_main: cannot start `{program}`: program not found (No such file or directory): \
                 is it installed, on PATH, and in the workspace or the system directories? (the \
                 {level} sandbox shows the program nothing else)"
            ));
        }
        if err.kind() == std::io::ErrorKind::NotFound {
            return ToolOutput::error(format!(
                "run_main: cannot start `{program}`: program not found (is it installed and on PATH?)"
            ));
        }
        if err.kind() == std::io::ErrorKind::PermissionDenied && level.confines() {
            return ToolOutput::error(format!(
                "run_main: cannot start `{program}`: {err} (the {level} sandbox runs programs \
                 only from the workspace and the system directories)"
            ));
        }
        ToolOutput::error(format!("run_main: cannot start `{program}`: {err}"))
    }

    /// This run's sandbox, or the refusal when it cannot be had: the
    /// program is never started unconfined by a level that confines.
    fn confine(&self) -> Result<Confinement, ToolOutput> {
        match self.sandbox.confine(&self.workspace) {
            Ok(confinement) => Ok(match &self.shutdown {
                Some(shutdown) => confinement.remove_on(shutdown),
                None => confinement,
            }),
            Err(err) => Err(super::refusal(format!(
                "run_main: {err}; to run programs unconfined, the host can choose the sandbox \
                 level off"
            ))),
        }
    }

    /// Runs the program once and reports what happened.
    pub fn execute(&self) -> ToolOutput {
        let (program, args) = match self.program() {
            Ok(split) => split,
            Err(answer) => return answer,
        };
        // Dropped last: the private TMPDIR goes once the group is gone.
        let confinement = match self.confine() {
            Ok(confinement) => confinement,
            Err(answer) => return answer,
        };
        let watchdog = match confinement.private_dir() {
            Some(temp) => Watchdog::spawn_removing(temp),
            None => Watchdog::spawn(),
        };
        let watchdog = match watchdog {
            Ok(watchdog) => watchdog,
            Err(err) => {
                return ToolOutput::error(format!("run_main: cannot start the watchdog: {err}"));
            }
        };
        let group = watchdog.group();
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(&self.workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(group);
        confinement.apply(&mut command);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => {
                watchdog.finish();
                return self.not_started(program, &err);
            }
        };
        let slot = Registered(self.programs.groups().register(group));
        let cap = self.settings.output_cap;
        let stdout = child.stdout.take().map(|pipe| spawn_capture(pipe, cap));
        let stderr = child.stderr.take().map(|pipe| spawn_capture(pipe, cap));

        let deadline = Instant::now() + self.settings.timeout;
        let (status, timed_out) = wait_or_kill(&mut child, group, deadline);
        drop(slot);
        // Whatever the program left behind in its group goes too, so the
        // pipes close; then the watchdog, the group's leader, is reaped.
        watchdog.finish();
        let grace = Instant::now() + Duration::from_millis(500);
        let stdout = collect(stdout, grace);
        let stderr = collect(stderr, grace);
        self.report(
            status,
            &stdout,
            &stderr,
            timed_out,
            confinement.remove_planted(),
        )
    }

    /// Runs the program once, as [`RunMain::execute`] does, waiting for it
    /// and reading its output on the tokio runtime that polls the future:
    /// no thread waits for it. Dropping the future kills the program's
    /// whole group (the watchdog's `Drop`, as on every other path out).
    #[cfg(feature = "async")]
    pub async fn execute_async(&self) -> ToolOutput {
        let (program, args) = match self.program() {
            Ok(split) => split,
            Err(answer) => return answer,
        };
        // The sandbox is prepared and the watchdog forked off the runtime's
        // worker (file system and process work). The confinement is
        // dropped last: the private TMPDIR goes once the group is gone.
        let runner = self.clone();
        let prepared = crate::run::offload::off_worker(move || {
            let confinement = runner.confine()?;
            let watchdog = match confinement.private_dir() {
                Some(temp) => Watchdog::spawn_removing(temp),
                None => Watchdog::spawn(),
            };
            match watchdog {
                Ok(watchdog) => Ok((confinement, watchdog)),
                Err(err) => Err(ToolOutput::error(format!(
                    "run_main: cannot start the watchdog: {err}"
                ))),
            }
        })
        .await;
        let (confinement, watchdog) = match prepared {
            Ok(prepared) => prepared,
            Err(answer) => return answer,
        };
        let group = watchdog.group();
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(&self.workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(group)
            .kill_on_drop(true);
        confinement.apply(command.as_std_mut());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => {
                watchdog.finish();
                return self.not_started(program, &err);
            }
        };
        let slot = Registered(self.programs.groups().register(group));
        let cap = self.settings.output_cap;
        let mut stdout = AsyncCapture::new(child.stdout.take(), cap);
        let mut stderr = AsyncCapture::new(child.stderr.take(), cap);
        let mut timed_out = false;
        let status = {
            let wait = async {
                match tokio::time::timeout(self.settings.timeout, child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        timed_out = true;
                        kill_group(group);
                        child.wait().await
                    }
                }
            };
            let mut wait = std::pin::pin!(wait);
            // The pipes are read while the program runs, so a full pipe
            // never stalls it.
            loop {
                tokio::select! {
                    status = &mut wait => break status,
                    () = stdout.read_some(), if stdout.open() => {}
                    () = stderr.read_some(), if stderr.open() => {}
                }
            }
        };
        drop(slot);
        // Reaping the watchdog waits for it to kill the group and remove
        // the private TMPDIR: off the worker too.
        crate::run::offload::off_worker(move || watchdog.finish()).await;
        // What is left in the pipes, for at most 500 ms (a descendant that
        // left the group may hold them open).
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            while stdout.open() || stderr.open() {
                tokio::select! {
                    () = stdout.read_some(), if stdout.open() => {}
                    () = stderr.read_some(), if stderr.open() => {}
                }
            }
        })
        .await;
        self.report(
            status,
            &stdout.captured,
            &stderr.captured,
            timed_out,
            confinement.remove_planted(),
        )
    }

    /// The answer for a program that ran: its report, an error when it
    /// failed, timed out or could not be waited for.
    fn report(
        &self,
        status: std::io::Result<std::process::ExitStatus>,
        stdout: &Captured,
        stderr: &Captured,
        timed_out: bool,
        removed: Vec<std::path::PathBuf>,
    ) -> ToolOutput {
        let status = match status {
            Ok(status) => status,
            Err(err) => {
                return ToolOutput::error(format!(
                    "run_main: waiting for the program failed: {err}"
                ));
            }
        };
        let mut report = RunReport {
            exit_code: status.code(),
            stdout: String::from_utf8_lossy(&stdout.bytes).into_owned(),
            stderr: String::from_utf8_lossy(&stderr.bytes).into_owned(),
            signal: status.signal(),
            stdout_bytes_dropped: stdout.dropped,
            stderr_bytes_dropped: stderr.dropped,
            error: None,
            removed: removed
                .iter()
                .map(|path| {
                    path.strip_prefix(&self.workspace)
                        .unwrap_or(path)
                        .display()
                        .to_string()
                })
                .collect(),
        };
        if timed_out {
            let secs = self.settings.timeout.as_secs_f64();
            report.error = Some(format!(
                "timed out after {secs} s; the program's process group was killed"
            ));
            return ToolOutput::error(format!(
                "run_main: timed out after {secs} s\n{}",
                report.to_json()
            ));
        }
        let content = report.to_json();
        if status.success() {
            ToolOutput::ok(content)
        } else {
            ToolOutput::error(content)
        }
    }
}

/// A pipe read on the runtime, up to a cap.
#[cfg(feature = "async")]
struct AsyncCapture<R> {
    pipe: Option<R>,
    captured: Captured,
    cap: usize,
    chunk: Vec<u8>,
}

#[cfg(feature = "async")]
impl<R: tokio::io::AsyncRead + Unpin> AsyncCapture<R> {
    fn new(pipe: Option<R>, cap: usize) -> Self {
        Self {
            pipe,
            captured: Captured::default(),
            cap,
            chunk: vec![0; 64 * 1024],
        }
    }

    fn open(&self) -> bool {
        self.pipe.is_some()
    }

    /// Reads what is there; at the end (or an error) the pipe is closed.
    /// Cancel-safe: a read that did not complete took nothing.
    async fn read_some(&mut self) {
        use tokio::io::AsyncReadExt;
        let Some(pipe) = &mut self.pipe else {
            return std::future::pending().await;
        };
        match pipe.read(&mut self.chunk).await {
            Ok(0) | Err(_) => self.pipe = None,
            Ok(n) => {
                let read = self.chunk.get(..n).unwrap_or_default();
                let out = &mut self.captured;
                let room = self.cap.saturating_sub(out.bytes.len()).min(read.len());
                out.bytes
                    .extend_from_slice(read.get(..room).unwrap_or_default());
                out.dropped += (read.len() - room) as u64;
            }
        }
    }
}

/// A stream being captured: what was read so far, and a signal when the stream closed.
struct Capture {
    captured: Arc<Mutex<Captured>>,
    closed: mpsc::Receiver<()>,
}

fn spawn_capture(mut pipe: impl Read + Send + 'static, cap: usize) -> Capture {
    let captured = Arc::new(Mutex::new(Captured::default()));
    let (sender, closed) = mpsc::channel();
    let sink = Arc::clone(&captured);
    std::thread::spawn(move || {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    let read = chunk.get(..n).unwrap_or_default();
                    let mut out = sink.lock().unwrap_or_else(|poison| poison.into_inner());
                    let room = cap.saturating_sub(out.bytes.len()).min(read.len());
                    out.bytes
                        .extend_from_slice(read.get(..room).unwrap_or_default());
                    out.dropped += (read.len() - room) as u64;
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = sender.send(());
    });
    Capture { captured, closed }
}

/// Waits for a stream to close until `grace`; a stream held open by an
/// escaped process is given up, keeping what was read so far.
fn collect(capture: Option<Capture>, grace: Instant) -> Captured {
    match capture {
        Some(capture) => {
            let _ = capture
                .closed
                .recv_timeout(grace.saturating_duration_since(Instant::now()));
            std::mem::take(
                &mut *capture
                    .captured
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner()),
            )
        }
        None => Captured::default(),
    }
}

impl Tool for RunMain {
    fn name(&self) -> &str {
        "run_main"
    }

    fn description(&self) -> &str {
        "Run the workspace's program (main.py) and return its exit code, stdout and stderr. Needs the user's approval."
    }

    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }

    fn action(&self, _input: &Value) -> String {
        self.settings.command.join(" ")
    }

    fn capability(&self) -> Capability {
        Capability::Executes
    }

    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        self.execute()
    }

    /// With the `async` feature, the program is awaited on the tokio
    /// runtime ([`RunMain::execute_async`]); without it, the default runs
    /// [`RunMain::execute`] on the run's task.
    #[cfg(feature = "async")]
    fn run_async<'a>(
        &'a self,
        _input: &'a Value,
        _context: &'a ToolContext<'a>,
    ) -> super::ToolFuture<'a> {
        Box::pin(self.execute_async())
    }
}
