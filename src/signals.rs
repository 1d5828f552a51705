//! How the process ends when it is asked to: Ctrl-C, `SIGTERM` and `SIGHUP`.
//!
//! [`install`] (the CLI calls it through [`CancelHandle::on_ctrl_c`]) sets
//! handlers that do only async-signal-safe work — set a flag, kill the
//! process groups `run_main` is running, write one byte to a pipe — and a
//! watcher thread that does the rest:
//!
//! | signal | what happens |
//! |---|---|
//! | first Ctrl-C (`SIGINT`) | the run is cancelled at its next turn boundary; one line on stderr names the tool it waits for |
//! | Ctrl-C at an approval prompt | the call is denied (it never started) and the run is cancelled; the line says so |
//! | Ctrl-C at `subloop chat`'s own prompt | nothing is running: one line says how to leave; it cancels nothing and does not count toward a second one |
//! | second Ctrl-C | every running program's group is killed, the termination actions run, exit 130 |
//! | `SIGTERM`, `SIGHUP` | like a second Ctrl-C; exit 143 and 129 |
//! | any of them while the actions run | exit at once with that code |
//!
//! A signal that was ignored when the process started (`nohup subloop …`,
//! a background job of a non-interactive shell) stays ignored.
//!
//! Termination actions are registered with [`on_termination`] and run last
//! registered first: the trace writes an `outcome` line with status
//! `cancelled` for every agent that had not finished, and a temporary demo
//! workspace is removed. `SIGKILL` cannot be caught; `run_main`'s watchdog
//! (see [`crate::tools::RunMain`]) covers it.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::agent_id::AgentId;
use crate::driver::Event;
use crate::limits::CancelHandle;
use crate::monitor::Monitor;

/// Why the process is ending, as told to a termination action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// The signal (`SIGINT` for a second Ctrl-C, `SIGTERM`, `SIGHUP`).
    pub signal: i32,
    /// The exit code the process ends with (130, 143, 129).
    pub exit_code: u8,
}

impl Termination {
    /// What ended the run, for texts: `a second Ctrl-C`, `SIGTERM`, `SIGHUP`.
    pub fn cause(&self) -> &'static str {
        match self.signal {
            libc::SIGINT => "a second Ctrl-C",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "a signal",
        }
    }
}

/// The exit code for a terminating signal: 128 + its number.
fn exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(1)
}

type Action = Arc<dyn Fn(&Termination) + Send + Sync>;

/// Registered termination actions, with their registration numbers.
static ACTIONS: Mutex<Vec<(u64, Action)>> = Mutex::new(Vec::new());
static NEXT_ACTION: AtomicU64 = AtomicU64::new(1);

/// Keeps a termination action registered; dropping it removes the action.
#[derive(Debug)]
#[must_use = "the action is removed when this is dropped"]
pub struct Registration(u64);

/// Registers `action` to run when a terminating signal ends the process
/// (actions run last registered first, on the watcher thread, before exit).
pub fn on_termination(action: impl Fn(&Termination) + Send + Sync + 'static) -> Registration {
    let id = NEXT_ACTION.fetch_add(1, Ordering::SeqCst);
    ACTIONS
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .push((id, Arc::new(action)));
    Registration(id)
}

impl Drop for Registration {
    fn drop(&mut self) {
        ACTIONS
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .retain(|(id, _)| *id != self.0);
    }
}

/// The tools running right now, by agent, in start order (for the first Ctrl-C's line).
static RUNNING_TOOLS: Mutex<Vec<(AgentId, String)>> = Mutex::new(Vec::new());

/// A [`Monitor`] that keeps track of which tools are running, so that the
/// first Ctrl-C can say what the run is waiting for.
#[derive(Debug, Default, Clone, Copy)]
pub struct ToolWatch;

impl Monitor for ToolWatch {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        let mut running = RUNNING_TOOLS
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match event {
            Event::ToolRequested { call } => running.push((agent.clone(), call.name().to_owned())),
            Event::ToolFinished { call, .. } => {
                if let Some(index) = running
                    .iter()
                    .rposition(|(who, name)| who == agent && name == call.name())
                {
                    running.remove(index);
                }
            }
            Event::Finished { .. } => running.retain(|(who, _)| who != agent),
            _ => {}
        }
    }
}

/// What a person is being asked at the terminal right now: nothing (a run
/// may be going on), `subloop chat`'s own prompt (no question is running),
/// or an approval prompt (its tool, in [`PROMPT_TOOL`], has not started).
const NOTHING: u8 = 0;
const CHAT: u8 = 1;
const APPROVAL: u8 = 2;

static PROMPT: AtomicU8 = AtomicU8::new(NOTHING);
/// The tool of the last approval prompt.
static PROMPT_TOOL: Mutex<String> = Mutex::new(String::new());
/// [`PROMPT`] as it was when the first Ctrl-C came, taken by the handler:
/// the prompt may be over (the approval gave up) by the time the watcher
/// says what the Ctrl-C did.
static PROMPT_AT_SIGNAL: AtomicU8 = AtomicU8::new(NOTHING);

/// Puts the previous prompt back when dropped.
#[derive(Debug)]
#[must_use = "the prompt is over when this is dropped"]
pub struct PromptGuard(u8);

impl Drop for PromptGuard {
    fn drop(&mut self) {
        PROMPT.store(self.0, Ordering::SeqCst);
    }
}

/// Marks an approval prompt for `tool` as open until the guard is dropped:
/// a first Ctrl-C meanwhile says the tool will not run (it has not started).
pub fn asking_about(tool: &str) -> PromptGuard {
    tool.clone_into(
        &mut PROMPT_TOOL
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()),
    );
    PromptGuard(PROMPT.swap(APPROVAL, Ordering::SeqCst))
}

/// Marks `subloop chat`'s own prompt as open until the guard is dropped: a
/// first Ctrl-C meanwhile has nothing to cancel, says how to leave, and
/// does not count toward a second one.
pub fn at_chat_prompt() -> PromptGuard {
    PromptGuard(PROMPT.swap(CHAT, Ordering::SeqCst))
}

/// The line the first Ctrl-C prints, for what is going on now.
pub fn cancelling_line() -> String {
    line_for(PROMPT.load(Ordering::SeqCst))
}

/// The line the first Ctrl-C prints when it came at `prompt`.
fn line_for(prompt: u8) -> String {
    match prompt {
        CHAT => {
            return "nothing is running: /exit or the end of input (Ctrl-D) leaves the session"
                .to_owned();
        }
        APPROVAL => {
            let tool = PROMPT_TOOL
                .try_lock()
                .map(|tool| crate::progress::printable(&tool))
                .unwrap_or_else(|_| "the call".to_owned());
            return format!(
                "cancelling: {tool} will not run; the run stops at its next step (Ctrl-C again to stop it now)"
            );
        }
        _ => {}
    }
    let names: Vec<String> = match RUNNING_TOOLS.try_lock() {
        Ok(running) => {
            let mut names: Vec<String> = Vec::new();
            // The parent's tools first: they are what the run waits for.
            let parent_first = running
                .iter()
                .filter(|(who, _)| *who == AgentId::Parent)
                .chain(running.iter().filter(|(who, _)| *who != AgentId::Parent));
            for (_, name) in parent_first {
                let shown = crate::progress::printable(name);
                if !names.contains(&shown) {
                    names.push(shown);
                }
            }
            names
        }
        Err(_) => Vec::new(),
    };
    if names.is_empty() {
        "cancelling: the run stops at its next step (Ctrl-C again to stop it now)".to_owned()
    } else {
        format!(
            "cancelling: waiting for {} to finish (Ctrl-C again to stop it now)",
            names.join(", ")
        )
    }
}

/// Set by the first terminating signal; a later one exits at once.
static TERMINATING: AtomicBool = AtomicBool::new(false);
/// Ctrl-Cs received.
static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
/// The write end of the watcher's pipe, or -1 without a watcher.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// The cancel flag the CLI's run watches.
static CANCEL: AtomicBool = AtomicBool::new(false);

/// The byte the handler sends for a first Ctrl-C; others send the signal number.
const FIRST_CTRL_C: u8 = 0;

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe work here: atomics, kill, write and _exit.
    if signal == libc::SIGINT
        && PROMPT.load(Ordering::SeqCst) == CHAT
        && !TERMINATING.load(Ordering::SeqCst)
    {
        // At chat's own prompt nothing runs: this Ctrl-C cancels nothing
        // and does not count toward a second one.
        PROMPT_AT_SIGNAL.store(CHAT, Ordering::SeqCst);
        wake(FIRST_CTRL_C);
        return;
    }
    CANCEL.store(true, Ordering::SeqCst);
    if signal == libc::SIGINT && INTERRUPTS.fetch_add(1, Ordering::SeqCst) == 0 {
        PROMPT_AT_SIGNAL.store(PROMPT.load(Ordering::SeqCst), Ordering::SeqCst);
        wake(FIRST_CTRL_C);
        return;
    }
    crate::tools::kill_running_groups();
    let code = exit_code(signal);
    if TERMINATING.swap(true, Ordering::SeqCst) || !wake(u8::try_from(signal).unwrap_or(0)) {
        // SAFETY: _exit is async-signal-safe and ends the process.
        unsafe { libc::_exit(i32::from(code)) }
    }
}

/// Tells the watcher; false when there is none (or the pipe is full).
fn wake(byte: u8) -> bool {
    let fd = WAKE.load(Ordering::SeqCst);
    if fd < 0 {
        return false;
    }
    // SAFETY: write(2) of one byte from a valid stack address; async-signal-safe.
    unsafe { libc::write(fd, (&raw const byte).cast(), 1) == 1 }
}

/// Installs the handlers for `SIGINT`, `SIGTERM` and `SIGHUP` and starts the
/// watcher thread (once per process; later calls return the same handle).
/// The handle is cancelled by any of the three signals.
pub fn install() -> CancelHandle {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        start_watcher();
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction with an empty mask is valid; the handler
            // only does async-signal-safe work.
            unsafe {
                // A signal ignored when the process started (`nohup`, a
                // background job of a non-interactive shell) stays ignored.
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
    CancelHandle::from_static(&CANCEL)
}

/// Starts the thread that acts on what the handler reports. Without it (no
/// pipe or no thread), a terminating signal kills the groups and exits at once.
fn start_watcher() {
    let Ok((mut reader, writer)) = std::io::pipe() else {
        return;
    };
    let fd = writer.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; a full pipe must not block the handler.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return;
        }
    }
    let spawned = std::thread::Builder::new()
        .name("subloop-signals".into())
        .spawn(move || {
            let mut byte = [0u8; 1];
            loop {
                match reader.read(&mut byte) {
                    Ok(1) if byte[0] == FIRST_CTRL_C => {
                        let prompt = PROMPT_AT_SIGNAL.load(Ordering::SeqCst);
                        let _ = writeln!(std::io::stderr(), "{}", line_for(prompt));
                    }
                    Ok(1) => terminate(i32::from(byte[0])),
                    Ok(_) => return,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
    if spawned.is_ok() {
        // The write end lives as long as the process: the handler writes to it.
        WAKE.store(writer.into_raw_fd(), Ordering::SeqCst);
    }
}

/// Makes the next Ctrl-C a first one again (`subloop chat`: a Ctrl-C
/// cancels the question it came in, not the session). Does nothing once a
/// terminating signal arrived.
pub fn rearm() {
    if !TERMINATING.load(Ordering::SeqCst) {
        INTERRUPTS.store(0, Ordering::SeqCst);
        CANCEL.store(false, Ordering::SeqCst);
    }
}

/// Called by a host on its way out: if a terminating signal arrived, its
/// termination (trace `outcome` lines, clean-up, exit 143 / 129 / 130) is
/// under way on the watcher thread, and the process must end with it rather
/// than with the run's own exit code — a run whose program the signal killed
/// may finish first. Waits (at most a few seconds) for that exit; returns at
/// once when no such signal came.
pub fn wait_if_terminating() {
    let until = Instant::now() + Duration::from_secs(5);
    while TERMINATING.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs the termination actions and exits with the signal's code.
fn terminate(signal: i32) -> ! {
    let termination = Termination {
        signal,
        exit_code: exit_code(signal),
    };
    // The groups were killed in the handler already; once more costs nothing.
    crate::tools::kill_running_groups();
    // Never wait long for the registry: the exit must happen.
    let until = Instant::now() + Duration::from_secs(2);
    let actions: Vec<Action> = loop {
        match ACTIONS.try_lock() {
            Ok(actions) => break actions.iter().map(|(_, a)| Arc::clone(a)).collect(),
            Err(std::sync::TryLockError::Poisoned(poison)) => {
                break poison
                    .into_inner()
                    .iter()
                    .map(|(_, a)| Arc::clone(a))
                    .collect();
            }
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::sync::TryLockError::WouldBlock) => break Vec::new(),
        }
    };
    for action in actions.iter().rev() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| action(&termination)));
    }
    // SAFETY: ends the process without running other threads' destructors,
    // which may be in the middle of the run.
    unsafe { libc::_exit(i32::from(termination.exit_code)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_128_plus_the_signal() {
        assert_eq!(exit_code(libc::SIGINT), 130);
        assert_eq!(exit_code(libc::SIGTERM), 143);
        assert_eq!(exit_code(libc::SIGHUP), 129);
    }

    #[test]
    fn registrations_are_removed_on_drop() {
        let registered = |id: u64| {
            ACTIONS
                .lock()
                .map(|actions| actions.iter().any(|(each, _)| *each == id))
                .unwrap_or(false)
        };
        let registration = on_termination(|_| {});
        let id = registration.0;
        assert!(registered(id));
        drop(registration);
        assert!(!registered(id));
    }
}
