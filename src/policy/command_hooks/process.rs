//! Runs one hook command as `run_main` runs a program: `sh -c COMMAND` in
//! the workspace, in a process group of its own led by a watchdog (so the
//! group dies with subloop, even by `SIGKILL`), listed in the host's
//! [`Programs`] (so a signal handler can kill it), its environment cleared
//! to [`HOOK_ENV`], the input written on its stdin, stdout and stderr read
//! up to [`HOOK_OUTPUT_CAP`] each; at its timeout the whole group is killed.
//!
//! It starts hardened: pid 1 of a PID namespace of its own where the
//! machine allows one (so every process it leaves behind is killed when it
//! ends, even one that left the group with `setsid`), with no descriptor
//! but stdin, stdout and stderr, `no_new_privs` and no capability.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::run::harden::{self, PidNamespace};
use crate::run::process::{Programs, Registered, Watchdog, wait_or_kill};

/// How long, after the hook ended, its stdout and stderr may take to
/// reach end-of-file (a process it left behind may hold them open).
const GRACE: Duration = Duration::from_millis(500);

/// How many bytes of a hook's stdout, and of its stderr, are read; the
/// rest is counted and dropped, and a hook whose output was cut counts as
/// failed (its JSON is not whole).
pub(crate) const HOOK_OUTPUT_CAP: usize = 1024 * 1024;

/// The variables of subloop's environment a hook gets (when set); every
/// other one (API keys among them) is left out. `CLAUDE_PROJECT_DIR` and
/// `SUBLOOP_WORKSPACE` are set to the workspace.
pub(crate) const HOOK_ENV: [&str; 10] = [
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
    /// Its stdout had not reached end-of-file when the grace after its end
    /// was over (a process it left behind held it open): `stdout` is what
    /// had been read by then.
    pub(crate) stdout_open: bool,
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
    let namespace = if PidNamespace::available() {
        match PidNamespace::prepare(0) {
            Ok(namespace) => Some(namespace),
            Err(err) => {
                watchdog.finish();
                ran.error = Some(format!("cannot prepare its PID namespace: {err}"));
                ran.duration = started.elapsed();
                return ran;
            }
        }
    } else {
        None
    };
    let highest_fd = harden::highest_fd();
    let mut shell = Command::new("/bin/sh");
    shell
        .arg("-c")
        .arg(command)
        .current_dir(workspace)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(group);
    // SAFETY: the closure runs in the forked child before the exec and
    // makes only async-signal-safe calls (`PidNamespace::enter`,
    // `close_inherited_fds`, `drop_privileges`); the namespace was
    // prepared (allocated) before the fork.
    unsafe {
        shell.pre_exec(move || {
            if let Some(namespace) = &namespace {
                namespace.enter()?;
            }
            harden::close_inherited_fds(highest_fd);
            harden::drop_privileges()
        });
    }
    let mut child = match shell.spawn() {
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
    let (status, timed_out) = wait_or_kill(&mut child, group, started + timeout);
    ran.timed_out = timed_out;
    drop(slot);
    // What the hook left behind in its group goes too, so the pipes close.
    watchdog.finish();
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    let grace = Instant::now() + GRACE;
    let stdout = collect(stdout, grace);
    let stderr = collect(stderr, grace);
    (ran.stdout, ran.stdout_dropped, ran.stdout_open) =
        (stdout.kept, stdout.dropped, !stdout.closed);
    (ran.stderr, ran.stderr_dropped) = (stderr.kept, stderr.dropped);
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

/// What was read from a pipe.
#[derive(Debug, Default)]
struct Captured {
    /// Up to [`HOOK_OUTPUT_CAP`] bytes.
    kept: Vec<u8>,
    /// How many more were read and dropped.
    dropped: u64,
    /// It reached end-of-file (or failed to read): nothing more can come.
    closed: bool,
}

/// A pipe being read on a thread of its own; see [`capture`].
struct Capture {
    result: mpsc::Receiver<Captured>,
    /// Dropped to tell the thread to stop reading (the grace is over):
    /// the thread waits on the other end of this pipe too.
    stop: Option<std::io::PipeWriter>,
}

/// A pipe read on its own thread up to [`HOOK_OUTPUT_CAP`]; the rest is
/// read, counted and dropped. The result comes once the pipe closes, or
/// once the thread is told to stop, with what was read by then (the thread
/// does not outlive the run, whoever holds the pipe open). The thread
/// waits on both the pipe and the stop, with no timeout: nothing polls.
fn capture(mut pipe: impl Read + AsRawFd + Send + 'static) -> Capture {
    let (sender, result) = mpsc::channel();
    let Ok((told, stop)) = std::io::pipe() else {
        // No descriptor left for the stop: the output is not read (the
        // pipe closes, and the hook's output counts as cut short).
        drop(pipe);
        let _ = sender.send(Captured::default());
        return Capture { result, stop: None };
    };
    std::thread::spawn(move || {
        let mut captured = Captured::default();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut draining = false;
        loop {
            let mut polls = [
                libc::pollfd {
                    fd: pipe.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: told.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let count = if draining { 1 } else { 2 };
            // SAFETY: poll(2) on descriptors we own, for the duration of the call.
            let ready =
                unsafe { libc::poll(polls.as_mut_ptr(), count, if draining { 0 } else { -1 }) };
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                captured.closed = true;
                break;
            }
            let [output, stopped] = polls;
            if !draining && stopped.revents != 0 {
                // One last pass over what is in the pipe now, without waiting.
                draining = true;
                continue;
            }
            if output.revents == 0 {
                if draining {
                    break;
                }
                continue;
            }
            match pipe.read(&mut chunk) {
                Ok(0) => {
                    captured.closed = true;
                    break;
                }
                Ok(n) => {
                    let read = chunk.get(..n).unwrap_or_default();
                    let room = HOOK_OUTPUT_CAP
                        .saturating_sub(captured.kept.len())
                        .min(read.len());
                    captured
                        .kept
                        .extend_from_slice(read.get(..room).unwrap_or_default());
                    captured.dropped += (read.len() - room) as u64;
                    if draining && captured.dropped > 0 {
                        // Cut already: no need to count the rest.
                        break;
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    captured.closed = true;
                    break;
                }
            }
        }
        let _ = sender.send(captured);
    });
    Capture {
        result,
        stop: Some(stop),
    }
}

/// What a pipe gave, waiting for it to close until `grace` (a descendant
/// that left the group may hold it open); past it, what had been read,
/// not `closed`.
fn collect(capture: Option<Capture>, grace: Instant) -> Captured {
    let Some(capture) = capture else {
        return Captured {
            closed: true,
            ..Captured::default()
        };
    };
    if let Ok(captured) = capture
        .result
        .recv_timeout(grace.saturating_duration_since(Instant::now()))
    {
        return captured;
    }
    drop(capture.stop);
    capture.result.recv().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_held_open_gives_what_was_read_by_the_grace_marked_open() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        writer
            .write_all(b"{\"decision\": \"block\"}\n")
            .expect("write");
        let started = Instant::now();
        let captured = collect(
            Some(capture(reader)),
            Instant::now() + Duration::from_millis(200),
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(captured.kept, b"{\"decision\": \"block\"}\n");
        assert!(!captured.closed);
        drop(writer);
    }

    #[test]
    fn a_closed_pipe_gives_everything_marked_closed() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        writer.write_all(b"done").expect("write");
        drop(writer);
        let captured = collect(Some(capture(reader)), Instant::now() + GRACE);
        assert_eq!(
            (captured.kept.as_slice(), captured.closed),
            (&b"done"[..], true)
        );
    }

    #[test]
    fn a_hook_that_leaves_a_process_holding_its_stdout_keeps_its_decision() {
        let deny = r#"{"hookSpecificOutput": {"permissionDecision": "deny"}}"#;
        let ran = run(
            &format!("echo '{deny}'; setsid sleep 3 & exit 0"),
            Vec::new(),
            Path::new("/"),
            &environment(Path::new("/")),
            Duration::from_secs(10),
            &Programs::new(),
        );
        assert_eq!(ran.exit_code, Some(0), "{ran:?}");
        assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), deny);
        // In a PID namespace the sleep dies with the hook and the pipe closes.
        if PidNamespace::available() {
            assert!(!ran.stdout_open, "{ran:?}");
            assert!(ran.duration < Duration::from_secs(2), "{ran:?}");
        }
    }
}
