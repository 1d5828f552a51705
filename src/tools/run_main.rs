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
//! stdout and stderr are each capped: the bytes past the
//! cap are counted and dropped. The result is a JSON object with the exit
//! code, the captured text and the dropped byte counts.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::{Capability, Tool, ToolContext};
use crate::core::conversation::ToolOutput;
use crate::core::error::SetupError;
use crate::tools::read_file::workspace_root;

/// How `run_main` runs the program.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Splits a command line into words without a shell: whitespace separates
/// words, single quotes keep text literally, double quotes keep text with
/// `\"` and `\\` escapes, a backslash outside quotes escapes one character.
pub fn split_command(line: &str) -> Result<Vec<String>, SetupError> {
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
        })
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
    fn not_started(program: &str, err: &std::io::Error) -> ToolOutput {
        if err.kind() == std::io::ErrorKind::NotFound {
            return ToolOutput::error(format!(
                "run_main: cannot start `{program}`: program not found (is it installed and on PATH?)"
            ));
        }
        ToolOutput::error(format!("run_main: cannot start `{program}`: {err}"))
    }

    /// Runs the program once and reports what happened.
    pub fn execute(&self) -> ToolOutput {
        let (program, args) = match self.program() {
            Ok(split) => split,
            Err(answer) => return answer,
        };
        let watchdog = match Watchdog::spawn() {
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
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => {
                watchdog.finish();
                return Self::not_started(program, &err);
            }
        };
        let slot = Registered(self.programs.groups().register(group));
        let cap = self.settings.output_cap;
        let stdout = child.stdout.take().map(|pipe| spawn_capture(pipe, cap));
        let stderr = child.stderr.take().map(|pipe| spawn_capture(pipe, cap));

        let deadline = Instant::now() + self.settings.timeout;
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) if Instant::now() >= deadline => {
                    timed_out = true;
                    kill_group(group);
                    break child.wait();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(err) => {
                    kill_group(group);
                    let _ = child.wait();
                    break Err(err);
                }
            }
        };
        drop(slot);
        // Whatever the program left behind in its group goes too, so the
        // pipes close; then the watchdog, the group's leader, is reaped.
        watchdog.finish();
        let grace = Instant::now() + Duration::from_millis(500);
        let stdout = collect(stdout, grace);
        let stderr = collect(stderr, grace);
        self.report(status, &stdout, &stderr, timed_out)
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
        let watchdog = match Watchdog::spawn() {
            Ok(watchdog) => watchdog,
            Err(err) => {
                return ToolOutput::error(format!("run_main: cannot start the watchdog: {err}"));
            }
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
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => {
                watchdog.finish();
                return Self::not_started(program, &err);
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
        watchdog.finish();
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
        self.report(status, &stdout.captured, &stderr.captured, timed_out)
    }

    /// The answer for a program that ran: its report, an error when it
    /// failed, timed out or could not be waited for.
    fn report(
        &self,
        status: std::io::Result<std::process::ExitStatus>,
        stdout: &Captured,
        stderr: &Captured,
        timed_out: bool,
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

/// A group's slot in [`ProcessGroups`], cleared when the program is done
/// or its run dropped.
struct Registered<'a>(Option<&'a AtomicI32>);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            slot.store(0, Ordering::SeqCst);
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

/// The process groups of the programs running right now, so that a host
/// can kill them before its process exits — from a signal handler too:
/// [`ProcessGroups::kill_all`] is async-signal-safe (atomic loads and
/// `kill`). A host that wants that makes one (a `static`, for a handler)
/// and gives it to [`RunMain::with_programs`] through [`Programs`].
#[derive(Debug)]
pub struct ProcessGroups([AtomicI32; 64]);

impl Default for ProcessGroups {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessGroups {
    /// No group yet.
    pub const fn new() -> Self {
        Self([const { AtomicI32::new(0) }; 64])
    }

    /// Remembers a running group; `None` when every slot is taken (the
    /// group is then still killed on exit and timeout, only not by
    /// [`ProcessGroups::kill_all`]).
    fn register(&self, group: libc::pid_t) -> Option<&AtomicI32> {
        self.0.iter().find(|slot| {
            slot.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    /// Kills every program running now. Async-signal-safe.
    pub fn kill_all(&self) {
        for slot in &self.0 {
            let group = slot.load(Ordering::SeqCst);
            if group > 0 {
                kill_group(group);
            }
        }
    }
}

/// Where a [`RunMain`] keeps the groups it runs: its own, or a host's
/// (a `static` its signal handler can reach).
#[derive(Debug, Clone)]
pub struct Programs(Groups);

#[derive(Debug, Clone)]
enum Groups {
    Own(Arc<ProcessGroups>),
    Static(&'static ProcessGroups),
}

impl Default for Programs {
    fn default() -> Self {
        Self::new()
    }
}

impl Programs {
    /// A list of its own.
    pub fn new() -> Self {
        Self(Groups::Own(Arc::new(ProcessGroups::new())))
    }

    /// The host's list.
    pub fn from_static(groups: &'static ProcessGroups) -> Self {
        Self(Groups::Static(groups))
    }

    /// The groups.
    pub fn groups(&self) -> &ProcessGroups {
        match &self.0 {
            Groups::Own(groups) => groups,
            Groups::Static(groups) => groups,
        }
    }

    /// Kills every program running now.
    pub fn kill_all(&self) {
        self.groups().kill_all();
    }
}

fn kill_group(group: libc::pid_t) {
    if group > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}

/// The leader of a program's process group: a forked process that kills
/// the group once the pipe it reads reaches end-of-file, that is, once
/// subloop has closed the write end or is gone.
pub(crate) struct Watchdog {
    pid: libc::pid_t,
    /// Held only by subloop (close-on-exec, so the program never gets it).
    alive: Option<std::io::PipeWriter>,
}

impl Watchdog {
    /// Forks the watchdog as the leader of a new, empty process group.
    pub(crate) fn spawn() -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let (reader, writer) = std::io::pipe()?;
        let read_fd = reader.as_raw_fd();
        let highest_fd = highest_fd();
        // SAFETY: fork(2); the child only makes async-signal-safe calls
        // (see `watch`) and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the forked child, with descriptors valid in it.
            unsafe { watch(read_fd, highest_fd) }
        }
        drop(reader);
        // The child makes itself a group leader too; doing it here as well
        // means the group exists before the program is spawned into it.
        // SAFETY: setpgid(2) on our own child.
        unsafe {
            libc::setpgid(pid, pid);
        }
        Ok(Self {
            pid,
            alive: Some(writer),
        })
    }

    /// The process group the program joins.
    pub(crate) fn group(&self) -> libc::pid_t {
        self.pid
    }

    /// Kills the whole group (the watchdog with it), then reaps the watchdog.
    fn finish(self) {
        drop(self);
    }
}

impl Drop for Watchdog {
    /// On every path out of a run, an unwinding one included: the group is
    /// killed first, then its leader is reaped, so the id is not reused in between.
    fn drop(&mut self) {
        kill_group(self.pid);
        self.alive = None;
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child; retried when interrupted.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
    }
}

/// The highest descriptor a forked watchdog may have inherited (computed
/// before the fork: the child must not allocate).
fn highest_fd() -> libc::c_int {
    // SAFETY: sysconf(3) has no preconditions.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    libc::c_int::try_from(max.clamp(64, 65_536)).unwrap_or(65_536)
}

/// The watchdog's whole life, in the forked child: only async-signal-safe
/// calls (no allocation, no locks). Holds nothing but the pipe's read end;
/// ignores the terminal's and supervisors' polite signals; when the pipe
/// reaches end-of-file (or fails), kills its group, itself included.
unsafe fn watch(read_fd: libc::c_int, highest_fd: libc::c_int) -> ! {
    // SAFETY: plain system calls on this process, as documented above.
    unsafe {
        libc::setpgid(0, 0);
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        for signal in [
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGTERM,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        if read_fd != 0 {
            libc::dup2(read_fd, 0);
        }
        close_from(1, highest_fd);
        let mut byte = 0u8;
        loop {
            let n = libc::read(0, (&raw mut byte).cast(), 1);
            if n > 0 {
                continue;
            }
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // End-of-file: subloop is gone (or done). The group goes.
            libc::kill(-libc::getpid(), libc::SIGKILL);
            libc::_exit(0);
        }
    }
}

/// Closes every descriptor from `first` on (async-signal-safe).
unsafe fn close_from(first: libc::c_int, highest_fd: libc::c_int) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: close_range(2) only closes descriptors of this process.
        let done = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                libc::c_uint::try_from(first).unwrap_or(1),
                libc::c_uint::MAX,
                0 as libc::c_uint,
            )
        } == 0;
        if done {
            return;
        }
    }
    for fd in first..=highest_fd {
        // SAFETY: closing a descriptor number of this process; EBADF is harmless.
        unsafe {
            libc::close(fd);
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
