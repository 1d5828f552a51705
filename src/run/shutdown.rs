//! What must happen when the host's process is ended by a signal: a
//! [`Shutdown`] is a list of actions (the trace writes an `outcome` line for
//! every agent that had not finished; a temporary workspace or trace is
//! removed) that the host runs, last registered first, before it exits.
//!
//! The library installs no signal handler and keeps no process-wide list:
//! a host that wants these actions makes a [`Shutdown`], hands it to what
//! it runs, and calls [`Shutdown::run`] from its own signal handling (the
//! `subloop` binary does, for Ctrl-C, `SIGTERM` and `SIGHUP`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why the process is ending, as told to a shutdown action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Termination {
    /// The signal (`SIGINT` for a second Ctrl-C, `SIGTERM`, `SIGHUP`).
    pub signal: i32,
    /// The exit code the process ends with (130, 143, 129).
    pub exit_code: u8,
}

impl Termination {
    /// The termination a signal brings: exit code 128 + its number.
    pub fn by_signal(signal: i32) -> Self {
        Self {
            signal,
            exit_code: u8::try_from(128 + signal).unwrap_or(1),
        }
    }

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

type Action = Arc<dyn Fn(&Termination) + Send + Sync>;

/// The actions to run when the process is ended (see the module docs).
#[derive(Default)]
pub struct Shutdown {
    actions: Mutex<Vec<(u64, Action)>>,
    next: AtomicU64,
    /// How the process is ending (0 while it is not): bit 40 set, the exit
    /// code in bits 32–39 and the signal in bits 0–31; set by
    /// [`Shutdown::begin`] and when [`Shutdown::run`] starts.
    ending: AtomicU64,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown").finish_non_exhaustive()
    }
}

/// Keeps a shutdown action registered; dropping it removes the action.
#[must_use = "the action is removed when this is dropped"]
pub struct Registration {
    shutdown: Arc<Shutdown>,
    id: u64,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Registration").field(&self.id).finish()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shutdown
            .actions
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .retain(|(id, _)| *id != self.id);
    }
}

impl Shutdown {
    /// An empty list, to share with what a host runs.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Says the process is ending by `termination`, before the actions
    /// run: an atomic store, so a signal handler may call it.
    /// [`Shutdown::run`] says it too. The first termination told is kept.
    pub fn begin(&self, termination: &Termination) {
        let packed = (1_u64 << 40)
            | (u64::from(termination.exit_code) << 32)
            | u64::from(termination.signal.cast_unsigned());
        let _ = self
            .ending
            .compare_exchange(0, packed, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// How the process is ending, once [`Shutdown::begin`] or
    /// [`Shutdown::run`] has said so; `None` while it is not. A run that
    /// finishes after that (its programs were just killed) reports the
    /// termination rather than its own end, and what it would still write
    /// (a page drawn from its trace) is left as it was.
    pub fn ending(&self) -> Option<Termination> {
        let packed = self.ending.load(Ordering::SeqCst);
        if packed == 0 {
            return None;
        }
        let signal = (packed & 0xffff_ffff) as u32;
        Some(Termination {
            signal: signal.cast_signed(),
            exit_code: ((packed >> 32) & 0xff) as u8,
        })
    }

    /// Registers `action` until the returned registration is dropped.
    pub fn on_termination(
        self: &Arc<Self>,
        action: impl Fn(&Termination) + Send + Sync + 'static,
    ) -> Registration {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.actions
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push((id, Arc::new(action)));
        Registration {
            shutdown: Arc::clone(self),
            id,
        }
    }

    /// Runs every registered action, last registered first. Never waits
    /// long for the list (a run may be registering at that moment), and an
    /// action that panics does not stop the others.
    pub fn run(&self, termination: &Termination) {
        self.begin(termination);
        let until = Instant::now() + Duration::from_secs(2);
        let actions: Vec<Action> = loop {
            match self.actions.try_lock() {
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
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| action(termination)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal handler says the process is ending before the actions
    /// run; running them says it too.
    #[test]
    fn ending_is_told_by_begin_and_by_run() {
        let shutdown = Shutdown::new();
        assert_eq!(shutdown.ending(), None);
        shutdown.begin(&Termination::by_signal(libc::SIGINT));
        shutdown.begin(&Termination::by_signal(libc::SIGTERM));
        assert_eq!(
            shutdown.ending(),
            Some(Termination::by_signal(libc::SIGINT))
        );
        let other = Shutdown::new();
        other.run(&Termination::by_signal(libc::SIGTERM));
        assert_eq!(other.ending(), Some(Termination::by_signal(libc::SIGTERM)));
        // What is told is what is kept, whatever its fields.
        let told = Termination {
            signal: -3,
            exit_code: 0,
        };
        let third = Shutdown::new();
        third.begin(&told);
        assert_eq!(third.ending(), Some(told));
    }

    #[test]
    fn exit_codes_are_128_plus_the_signal() {
        assert_eq!(Termination::by_signal(libc::SIGINT).exit_code, 130);
        assert_eq!(Termination::by_signal(libc::SIGTERM).exit_code, 143);
        assert_eq!(Termination::by_signal(libc::SIGHUP).exit_code, 129);
    }

    #[test]
    fn actions_run_last_first_until_dropped() {
        let shutdown = Shutdown::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (a, b) = (Arc::clone(&seen), Arc::clone(&seen));
        let first = shutdown.on_termination(move |_| a.lock().expect("lock").push(1));
        let second = shutdown.on_termination(move |_| b.lock().expect("lock").push(2));
        shutdown.run(&Termination::by_signal(libc::SIGTERM));
        assert_eq!(*seen.lock().expect("lock"), [2, 1]);
        drop(second);
        drop(first);
        shutdown.run(&Termination::by_signal(libc::SIGTERM));
        assert_eq!(seen.lock().expect("lock").len(), 2);
    }
}
