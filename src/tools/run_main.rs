//! `run_main {}`: runs the workspace's program (`python3 main.py` by default).
//!
//! The command is split without a shell. The program runs in its own process
//! group with stdin closed; when it exits or its timeout passes, the whole
//! group is killed, so neither an endless loop nor a sleeping grandchild
//! outlives the call. (A descendant that leaves the group with `setsid`
//! escapes this; its output is collected for at most 500 ms more.) A second
//! Ctrl-C in the CLI kills running groups before exiting. stdout and stderr are each capped: the bytes past the
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
use crate::conversation::ToolOutput;
use crate::error::SetupError;
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
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }

    /// Runs the program once and reports what happened.
    pub fn execute(&self) -> ToolOutput {
        let (program, args) = match self.settings.command.split_first() {
            Some(split) => split,
            None => return ToolOutput::error("run_main: the command is empty"),
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(&self.workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return ToolOutput::error(format!(
                    "run_main: cannot start `{program}`: program not found (is it installed and on PATH?)"
                ));
            }
            Err(err) => {
                return ToolOutput::error(format!("run_main: cannot start `{program}`: {err}"));
            }
        };
        let group = libc::pid_t::try_from(child.id()).unwrap_or(0);
        let slot = register(group);
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
        // Whatever the program left behind in its group goes too, so the pipes close.
        kill_group(group);
        if let Some(slot) = slot {
            slot.store(0, Ordering::SeqCst);
        }
        let grace = Instant::now() + Duration::from_millis(500);
        let stdout = collect(stdout, grace);
        let stderr = collect(stderr, grace);

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

/// Process groups of programs running right now, so that a second Ctrl-C
/// can kill them before the process exits (see [`kill_running_groups`]).
static RUNNING: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];

/// Remembers a running group; `None` when every slot is taken (the group is
/// then still killed on exit and timeout, only not by a second Ctrl-C).
fn register(group: libc::pid_t) -> Option<&'static AtomicI32> {
    RUNNING.iter().find(|slot| {
        slot.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    })
}

/// Kills every program `run_main` is running. Async-signal-safe (atomic
/// loads and `kill`), so a signal handler may call it before `_exit`.
pub fn kill_running_groups() {
    for slot in &RUNNING {
        let group = slot.load(Ordering::SeqCst);
        if group > 0 {
            kill_group(group);
        }
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
}
