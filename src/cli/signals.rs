//! How the process ends when it is asked to: Ctrl-C, `SIGTERM` and `SIGHUP`.
//!
//! The library installs no handler and keeps no process-wide state: it hands
//! out handles ([`CancelHandle`], [`Shutdown`], [`Programs`], watchers of
//! events and prompts) that this module, the binary's only process-wide
//! state, wires to the signals. [`install`] sets handlers that do only
//! async-signal-safe work — set a flag, kill the process groups `run_main`
//! is running, write one byte to a pipe — and a watcher thread that does the
//! rest:
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
//! Termination actions are registered with the [`shutdown`] list and run last
//! registered first: the trace writes an `outcome` line with status
//! `cancelled` for every agent that had not finished, and a temporary demo
//! workspace is removed. `SIGKILL` cannot be caught; `run_main`'s watchdog
//! (see [`subloop::tools::RunMain`]) covers it.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::host::chat::Moment;
use crate::host::{ApprovalWatch, EventWatch, Watch};
use subloop::core::agent_id::AgentId;
use subloop::run::limits::CancelHandle;
use subloop::run::monitor::Event;
use subloop::run::shutdown::{Shutdown, Termination};
use subloop::tools::{ProcessGroups, Programs};

/// The shutdown actions of this process (the trace's last lines, removing
/// temporary files), run when a signal ends it.
pub fn shutdown() -> Arc<Shutdown> {
    Arc::clone(SHUTDOWN.get_or_init(Shutdown::new))
}

/// The process's shutdown list, once made.
static SHUTDOWN: OnceLock<Arc<Shutdown>> = OnceLock::new();

/// The process groups `run_main` is running, killed from the handler.
static PROGRAMS: ProcessGroups = ProcessGroups::new();

/// Where `run_main` keeps its process groups, so a signal can kill them.
pub fn programs() -> Programs {
    Programs::from_static(&PROGRAMS)
}

/// The tools running right now, by agent, in start order (for the first Ctrl-C's line).
static RUNNING_TOOLS: Mutex<Vec<(AgentId, String)>> = Mutex::new(Vec::new());

/// A watcher of the run's events that keeps track of which tools are
/// running, so that the first Ctrl-C can say what the run is waiting for.
pub fn tool_watch() -> EventWatch {
    Watch(Arc::new(watch_tools))
}

fn watch_tools(agent: &AgentId, event: &Event<'_>) {
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

/// Told by the approval prompt when it opens and closes: a first Ctrl-C
/// meanwhile says the call will not run (it has not started).
pub fn prompt_watch() -> ApprovalWatch {
    Watch(Arc::new(|tool: Option<&str>| match tool {
        Some(tool) => {
            tool.clone_into(
                &mut PROMPT_TOOL
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner()),
            );
            PROMPT.store(APPROVAL, Ordering::SeqCst);
        }
        None => PROMPT.store(NOTHING, Ordering::SeqCst),
    }))
}

/// Told by `subloop chat` where the session is: at its own prompt a first
/// Ctrl-C has nothing to cancel, says how to leave, and does not count
/// toward a second one; each question starts with a fresh count.
pub fn chat_moment(moment: Moment) {
    match moment {
        Moment::Waiting => PROMPT.store(CHAT, Ordering::SeqCst),
        Moment::Read => PROMPT.store(NOTHING, Ordering::SeqCst),
        Moment::Asking | Moment::Asked => rearm(),
    }
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
                .map(|tool| subloop::core::text::printable(&tool))
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
                let shown = subloop::core::text::printable(name);
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
/// Set by the handler when a signal cancels the run; the watcher thread
/// then cancels [`HANDLE`], which wakes what waits on the run (a handler
/// may not take the locks that waking needs).
static CANCEL: AtomicBool = AtomicBool::new(false);
/// The cancel handle the CLI's run watches.
static HANDLE: OnceLock<CancelHandle> = OnceLock::new();

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
    // The process is ending: a run finishing now (its programs are about
    // to be killed) reports this termination, and what it would still
    // write (its page) is left alone. An atomic load and store.
    let termination = Termination::by_signal(signal);
    if let Some(shutdown) = SHUTDOWN.get() {
        shutdown.begin(&termination);
    }
    PROGRAMS.kill_all();
    let code = termination.exit_code;
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
    HANDLE.get_or_init(CancelHandle::new).clone()
}

/// The watcher's part of a signal: cancels the run when the handler said so.
fn cancel_if_asked() {
    if CANCEL.load(Ordering::SeqCst) {
        HANDLE.get_or_init(CancelHandle::new).cancel();
    }
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
                let read = reader.read(&mut byte);
                cancel_if_asked();
                match read {
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
        if let Some(handle) = HANDLE.get() {
            handle.reset();
        }
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

/// Runs the shutdown actions and exits with the signal's code.
fn terminate(signal: i32) -> ! {
    let termination = Termination::by_signal(signal);
    // The groups were killed in the handler already; once more costs nothing.
    PROGRAMS.kill_all();
    shutdown().run(&termination);
    // SAFETY: ends the process without running other threads' destructors,
    // which may be in the middle of the run.
    unsafe { libc::_exit(i32::from(termination.exit_code)) }
}
