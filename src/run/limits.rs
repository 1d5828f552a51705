//! Limits on a whole run (the parent and every child together), and cancellation.
//!
//! A per-conversation call budget does not bound a run: a model may ask for
//! `task` again and again. These do:
//!
//! | limit | default | past it |
//! |---|---|---|
//! | tool calls per model reply | 16 | the extra calls are answered `not executed: too many tool calls in one reply (limit N)` |
//! | delegations per run | 8 | a `task` call is answered with a report of status `delegation_limit`; no child starts |
//! | wall-clock deadline | none | no new model request or tool starts; every conversation finishes `deadline` at its next turn boundary |
//! | tokens per run (input + output, from `usage`) | none | every conversation finishes `token_limit` at its next turn boundary |
//!
//! A [`CancelHandle`] stops the run from another thread (the CLI wires it to
//! Ctrl-C): every conversation finishes `cancelled` at its next turn
//! boundary; a tool already running finishes (or meets its own timeout) and
//! its result is recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core::conversation::{Interrupt, InterruptKind};
use crate::core::protocol::Usage;

/// The run-wide limits. Fields may be added: build one from
/// [`Limits::default`] and the `with_…` methods (or set the fields).
///
/// ```
/// use std::time::Duration;
/// let limits = subloop::Limits::default()
///     .with_deadline(Duration::from_secs(60))
///     .with_max_delegations(2);
/// assert_eq!(limits.max_delegations, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Limits {
    /// Tool calls run per model reply; the rest are refused (default 16).
    pub max_tools_per_reply: usize,
    /// Subagents started per run (default 8).
    pub max_delegations: usize,
    /// Wall-clock time for the whole run (default none).
    pub deadline: Option<Duration>,
    /// Input + output tokens for the whole run (default none).
    pub max_tokens_total: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tools_per_reply: 16,
            max_delegations: 8,
            deadline: None,
            max_tokens_total: None,
        }
    }
}

impl Limits {
    /// These limits with at most `n` tool calls run per model reply.
    pub fn with_max_tools_per_reply(mut self, n: usize) -> Self {
        self.max_tools_per_reply = n;
        self
    }

    /// These limits with at most `n` subagents per run.
    pub fn with_max_delegations(mut self, n: usize) -> Self {
        self.max_delegations = n;
        self
    }

    /// These limits with a wall-clock deadline for the whole run.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// These limits with a token budget (input + output) for the whole run.
    pub fn with_max_tokens_total(mut self, tokens: u64) -> Self {
        self.max_tokens_total = Some(tokens);
        self
    }
}

/// Cancels a run from any thread; clones share the same flag.
#[derive(Debug, Clone)]
pub struct CancelHandle(Flag);

#[derive(Debug, Clone)]
enum Flag {
    Shared(Arc<AtomicBool>),
    Static(&'static AtomicBool),
}

impl Default for CancelHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelHandle {
    /// A fresh, uncancelled handle.
    pub fn new() -> Self {
        Self(Flag::Shared(Arc::new(AtomicBool::new(false))))
    }

    /// A handle over a static flag, which a signal handler may set (the CLI's Ctrl-C).
    pub fn from_static(flag: &'static AtomicBool) -> Self {
        Self(Flag::Static(flag))
    }

    fn flag(&self) -> &AtomicBool {
        match &self.0 {
            Flag::Shared(flag) => flag,
            Flag::Static(flag) => flag,
        }
    }

    /// Asks the run to stop at its next turn boundary.
    pub fn cancel(&self) {
        self.flag().store(true, Ordering::SeqCst);
    }

    /// Whether [`CancelHandle::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag().load(Ordering::SeqCst)
    }
}

/// The shared state every conversation of a run consults at its turn boundaries.
#[derive(Debug)]
pub(crate) struct RunGuard {
    limits: Limits,
    cancel: CancelHandle,
    started: OnceLock<Instant>,
    tokens: AtomicU64,
    delegations: AtomicUsize,
    /// Why a hook stopped the run (`continue: false`), once one did.
    stopped: OnceLock<String>,
}

impl RunGuard {
    pub(crate) fn new(limits: Limits, cancel: CancelHandle) -> Self {
        Self {
            limits,
            cancel,
            started: OnceLock::new(),
            tokens: AtomicU64::new(0),
            delegations: AtomicUsize::new(0),
            stopped: OnceLock::new(),
        }
    }

    /// A hook said the run is not to continue (`continue: false`): it
    /// stops at its next turn boundary, as a cancelled run does, with
    /// `reason` (the first reason given wins).
    pub(crate) fn stop(&self, reason: String) {
        let _ = self.stopped.set(reason);
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Starts the deadline's clock (the first call wins).
    pub(crate) fn start(&self) {
        self.started.get_or_init(Instant::now);
    }

    /// Counts what the earlier part of a resumed run spent: its tokens and
    /// its delegations (later delegations are numbered after them).
    pub(crate) fn charge(&self, tokens: u64, delegations: usize) {
        let _ = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_add(tokens))
            });
        let _ = self
            .delegations
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_add(delegations))
            });
    }

    /// Counts a reply's tokens (input + output).
    pub(crate) fn add_usage(&self, usage: &Usage) {
        let billed = usage.billed();
        let _ = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_add(billed))
            });
    }

    /// Tokens counted so far.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::SeqCst)
    }

    /// Reserves `count` delegations in order: each gets its 1-based number,
    /// or `None` past the limit.
    pub(crate) fn reserve_delegations(&self, count: usize) -> Vec<Option<usize>> {
        let first = self.delegations.fetch_add(count, Ordering::SeqCst);
        (first..first + count)
            .map(|index| (index < self.limits().max_delegations).then_some(index + 1))
            .collect()
    }

    /// Whether the run must stop at this turn boundary, and why.
    pub(crate) fn interrupt(&self) -> Option<Interrupt> {
        let limits = self.limits();
        if let Some(reason) = self.stopped.get() {
            return Some(Interrupt {
                kind: InterruptKind::Cancelled,
                text: format!("a hook stopped the run: {reason}"),
            });
        }
        if self.cancelled() {
            return Some(Interrupt {
                kind: InterruptKind::Cancelled,
                text: "the run was cancelled; what was done so far is kept".to_owned(),
            });
        }
        if let (Some(deadline), Some(started)) = (limits.deadline, self.started.get())
            && started.elapsed() >= deadline
        {
            return Some(Interrupt {
                kind: InterruptKind::Deadline,
                text: format!(
                    "the run's deadline of {:.1} s passed; no new model request or tool was started",
                    deadline.as_secs_f64()
                ),
            });
        }
        if let Some(max) = limits.max_tokens_total {
            let used = self.tokens();
            if used >= max {
                return Some(Interrupt {
                    kind: InterruptKind::TokenLimit,
                    text: format!("the run's token budget of {max} is spent ({used} tokens used)"),
                });
            }
        }
        None
    }
}
