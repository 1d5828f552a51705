//! Runs one hook command as `run_main` runs a program: `sh -c COMMAND` in
//! the workspace, in a process group of its own led by a watchdog (so the
//! group dies with subloop, even by `SIGKILL`), listed in the host's
//! [`Programs`] (so a signal handler can kill it), its environment cleared
//! to [`HOOK_ENV`], the input written on its stdin, stdout and stderr read
//! up to [`HOOK_OUTPUT_CAP`] each; at its timeout the whole group is killed.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::run::process::{Programs, Registered, Watchdog, kill_group};

/// How many bytes of a hook's stdout, and of its stderr, are read; the
/// rest is counted and dropped, and a hook whose output was cut counts as
/// failed (its JSON is not whole).
pub const HOOK_OUTPUT_CAP: usize = 1024 * 1024;

/// The variables of subloop's environment a hook gets (when set); every
/// other one (API keys among them) is left out. `CLAUDE_PROJECT_DIR` and
/// `SUBLOOP_WORKSPACE` are set to the workspace.
pub const HOOK_ENV: [&str; 10] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

/// What became of one run of a command.
#[derive(Debug, Default)]
pub(crate) struct Ran {
    pub(crate) exit_code: Option<i32>,
    pub(crate) signal: Option<i32>,
    pub(crate) timed_out: bool,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stdout_dropped: u64,
    pub(crate) stderr: Vec<u8>,
    pub(crate) stderr_dropped: u64,
    /// It could not be started, or not waited for.
    pub(crate) error: Option<String>,
    pub(crate) duration: Duration,
}

/// The environment of a hook run in `workspace`.
pub(crate) fn environment(workspace: &Path) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = HOOK_ENV
        .iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (OsString::from(name), value)))
        .collect();
    if !env.iter().any(|(name, _)| name == "PATH") {
        env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
    }
    env.push((
        "CLAUDE_PROJECT_DIR".into(),
        workspace.as_os_str().to_owned(),
    ));
    env.push(("SUBLOOP_WORKSPACE".into(), workspace.as_os_str().to_owned()));
    env
}

/// Runs `command` once with `input` on its stdin.
pub(crate) fn run(
    command: &str,
    input: Vec<u8>,
    workspace: &Path,
    env: &[(OsString, OsString)],
    timeout: Duration,
    programs: &Programs,
) -> Ran {
    let started = Instant::now();
    let mut ran = Ran::default();
    let watchdog = match Watchdog::spawn() {
        Ok(watchdog) => watchdog,
        Err(err) => {
            ran.error = Some(format!("cannot start the watchdog: {err}"));
            ran.duration = started.elapsed();
            return ran;
        }
    };
    let group = watchdog.group();
    let mut child = match Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .current_dir(workspace)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(group)
        .spawn()
    {
        Ok(child) => child,
        Err(err) => {
            watchdog.finish();
            ran.error = Some(format!("cannot start `sh -c`: {err}"));
            ran.duration = started.elapsed();
            return ran;
        }
    };
    let slot = Registered(programs.groups().register(group));
    // The input goes in on a thread of its own: a hook that never reads it
    // cannot stall the run (the write fails once the group is killed).
    let writer = child.stdin.take().map(|mut stdin| {
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        })
    });
    let stdout = child.stdout.take().map(capture);
    let stderr = child.stderr.take().map(capture);
    let deadline = started + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() >= deadline => {
                ran.timed_out = true;
                kill_group(group);
                break child.wait();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(err) => {
                kill_group(group);
                let _ = child.wait();
                break Err(err);
            }
        }
    };
    drop(slot);
    // What the hook left behind in its group goes too, so the pipes close.
    watchdog.finish();
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    let grace = Instant::now() + Duration::from_millis(500);
    (ran.stdout, ran.stdout_dropped) = collect(stdout, grace);
    (ran.stderr, ran.stderr_dropped) = collect(stderr, grace);
    match status {
        Ok(status) => {
            ran.exit_code = status.code();
            ran.signal = status.signal();
        }
        Err(err) => ran.error = Some(format!("waiting for it failed: {err}")),
    }
    ran.duration = started.elapsed();
    ran
}

/// A pipe read on its own thread up to [`HOOK_OUTPUT_CAP`]; the rest is
/// read, counted and dropped. The result comes once the pipe closes.
fn capture(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<(Vec<u8>, u64)> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut dropped = 0u64;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    let read = chunk.get(..n).unwrap_or_default();
                    let room = HOOK_OUTPUT_CAP.saturating_sub(kept.len()).min(read.len());
                    kept.extend_from_slice(read.get(..room).unwrap_or_default());
                    dropped += (read.len() - room) as u64;
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = sender.send((kept, dropped));
    });
    receiver
}

/// What a pipe gave, waiting for it to close until `grace` (a descendant
/// that left the group may hold it open).
fn collect(capture: Option<mpsc::Receiver<(Vec<u8>, u64)>>, grace: Instant) -> (Vec<u8>, u64) {
    capture
        .and_then(|receiver| {
            receiver
                .recv_timeout(grace.saturating_duration_since(Instant::now()))
                .ok()
        })
        .unwrap_or_default()
}
