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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
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
///
/// Cancelling wakes what waits on the run: a request in flight (its
/// socket is shut down, or its future dropped), a wait between retries,
/// a terminal prompt. Nothing polls the flag.
///
/// ```
/// let cancel = subloop::CancelHandle::new();
/// let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
/// let flag = std::sync::Arc::clone(&seen);
/// let _registration = cancel.on_cancel(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
/// cancel.cancel();
/// assert!(cancel.is_cancelled() && seen.load(std::sync::atomic::Ordering::SeqCst));
/// ```
#[derive(Debug, Clone, Default)]
pub struct CancelHandle(Arc<Notifier>);

impl CancelHandle {
    /// A fresh, uncancelled handle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop at its next turn boundary, and wakes what
    /// waits on it (the first call does; later ones change nothing).
    pub fn cancel(&self) {
        self.0.raise();
    }

    /// Whether [`CancelHandle::cancel`] was called (since the last
    /// [`CancelHandle::reset`]).
    pub fn is_cancelled(&self) -> bool {
        self.0.is_raised()
    }

    /// Makes the handle uncancelled again, for a session whose Ctrl-C
    /// cancels one question and not the next.
    pub fn reset(&self) {
        self.0.lower();
    }

    /// Calls `wake` (on the cancelling thread) each time the handle is
    /// cancelled, until the returned registration is dropped; at once when
    /// it is cancelled already. `wake` must be quick and must not block.
    pub fn on_cancel(&self, wake: impl Fn() + Send + Sync + 'static) -> OnStop {
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(wake);
        let registration = OnStop::new(&[&self.0], &Wake::Call(Arc::clone(&wake)));
        if self.is_cancelled() {
            wake();
        }
        registration
    }

    /// A future that completes once the handle is cancelled.
    pub fn cancelled(&self) -> Cancelled {
        Cancelled(Raised::new(vec![Arc::clone(&self.0)]))
    }
}

/// A flag that wakes what waits for it once raised: tasks (their wakers),
/// threads (unparked) and callbacks. Every waiter stays registered until
/// its owner removes it, so a flag lowered and raised again wakes it again.
#[derive(Default)]
pub(crate) struct Notifier {
    raised: AtomicBool,
    waiters: Mutex<Waiters>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("raised", &self.is_raised())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Waiters {
    next: u64,
    list: Vec<(u64, Wake)>,
}

/// What a [`Notifier`] wakes.
#[derive(Clone)]
enum Wake {
    Task(Waker),
    Thread(std::thread::Thread),
    Call(Arc<dyn Fn() + Send + Sync>),
}

impl Wake {
    fn wake(self) {
        match self {
            Self::Task(waker) => waker.wake(),
            Self::Thread(thread) => thread.unpark(),
            Self::Call(call) => call(),
        }
    }
}

impl Notifier {
    fn waiters(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Raises the flag and wakes every waiter (outside the lock); a flag
    /// raised already stays so and wakes no one.
    fn raise(&self) {
        if self.raised.swap(true, Ordering::SeqCst) {
            return;
        }
        let wakes: Vec<Wake> = self
            .waiters()
            .list
            .iter()
            .map(|(_, wake)| wake.clone())
            .collect();
        for wake in wakes {
            wake.wake();
        }
    }

    fn lower(&self) {
        self.raised.store(false, Ordering::SeqCst);
    }

    fn is_raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// Registers `wake`; the caller looks at the flag after this (a raise
    /// before it is seen there, one after it wakes `wake`).
    fn add(&self, wake: Wake) -> u64 {
        let mut waiters = self.waiters();
        let id = waiters.next;
        waiters.next += 1;
        waiters.list.push((id, wake));
        id
    }

    /// Replaces waiter `id`'s waker (a task polled with another one).
    fn update(&self, id: u64, waker: &Waker) {
        let mut waiters = self.waiters();
        if let Some((_, wake)) = waiters.list.iter_mut().find(|(each, _)| *each == id) {
            match wake {
                Wake::Task(old) if old.will_wake(waker) => {}
                _ => *wake = Wake::Task(waker.clone()),
            }
        }
    }

    fn remove(&self, id: u64) {
        self.waiters().list.retain(|(each, _)| *each != id);
    }
}

/// A registration made by [`CancelHandle::on_cancel`] or
/// [`StopSignal::on_stop`]: dropping it unregisters the callback.
#[must_use = "dropping the registration unregisters the callback"]
pub struct OnStop {
    registered: Vec<(Arc<Notifier>, u64)>,
}

impl std::fmt::Debug for OnStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnStop")
            .field("flags", &self.registered.len())
            .finish()
    }
}

impl OnStop {
    fn new(notifiers: &[&Arc<Notifier>], wake: &Wake) -> Self {
        Self {
            registered: notifiers
                .iter()
                .map(|notifier| (Arc::clone(notifier), notifier.add(wake.clone())))
                .collect(),
        }
    }
}

impl Drop for OnStop {
    fn drop(&mut self) {
        for (notifier, id) in &self.registered {
            notifier.remove(*id);
        }
    }
}

/// Whether a run has been stopped (cancelled, a hook's `continue: false`,
/// its token budget spent, its deadline passed), for what waits on the
/// run's behalf: a model's request in flight, a wait between retries.
/// Made by `Agent::stop_signal`;
/// clones watch the same run.
///
/// It is waited on, never polled: [`StopSignal::on_stop`] calls back,
/// [`StopSignal::stopped`] is a future, [`StopSignal::sleep`] a timed
/// wait that the stop cuts short. The deadline is a time
/// ([`StopSignal::deadline`]) for the waiter's own timer or timeout.
#[derive(Debug, Clone)]
pub struct StopSignal {
    guard: Arc<RunGuard>,
}

impl StopSignal {
    pub(crate) fn new(guard: Arc<RunGuard>) -> Self {
        Self { guard }
    }

    /// Whether the run must stop now (any reason, the deadline included).
    pub fn is_stopped(&self) -> bool {
        self.guard.interrupt().is_some()
    }

    /// When the run's deadline passes, once its clock has started.
    pub fn deadline(&self) -> Option<Instant> {
        self.guard.deadline_at()
    }

    fn notifiers(&self) -> [&Arc<Notifier>; 2] {
        [&self.guard.cancel.0, &self.guard.halt]
    }

    /// Whether a notifier (not the clock) says the run stopped.
    fn raised(&self) -> bool {
        self.notifiers().iter().any(|notifier| notifier.is_raised())
    }

    /// Calls `wake` (on the stopping thread) when the run is cancelled or
    /// stopped by a hook or its token budget, until the returned
    /// registration is dropped; at once when it is stopped already. The
    /// deadline does not call it: wait with [`StopSignal::deadline`] as a
    /// timeout. `wake` must be quick and must not block.
    pub fn on_stop(&self, wake: impl Fn() + Send + Sync + 'static) -> OnStop {
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(wake);
        let registration = OnStop::new(&self.notifiers(), &Wake::Call(Arc::clone(&wake)));
        if self.raised() {
            wake();
        }
        registration
    }

    /// A future that completes when the run is cancelled or stopped by a
    /// hook or its token budget (not at the deadline: race it with a
    /// timer at [`StopSignal::deadline`]).
    pub fn stopped(&self) -> Stopped {
        Stopped(Raised::new(
            self.notifiers().into_iter().map(Arc::clone).collect(),
        ))
    }

    /// Waits `duration` on this thread, or less when the run stops first
    /// (its deadline included); true when it stopped.
    pub fn sleep(&self, duration: Duration) -> bool {
        let mut until = Instant::now() + duration;
        if let Some(deadline) = self.deadline() {
            until = until.min(deadline);
        }
        let _registration = OnStop::new(&self.notifiers(), &Wake::Thread(std::thread::current()));
        loop {
            if self.is_stopped() {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return self.is_stopped();
            }
            // Woken by a stop, or at the time; a spurious wake-up loops.
            std::thread::park_timeout(left);
        }
    }
}

/// Completes once any of its flags is raised.
struct Raised {
    notifiers: Vec<Arc<Notifier>>,
    /// Its waker's registration with each flag, once polled.
    ids: Vec<u64>,
}

impl Raised {
    fn new(notifiers: Vec<Arc<Notifier>>) -> Self {
        Self {
            notifiers,
            ids: Vec::new(),
        }
    }

    fn raised(&self) -> bool {
        self.notifiers.iter().any(|notifier| notifier.is_raised())
    }
}

impl Future for Raised {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.raised() {
            return Poll::Ready(());
        }
        if self.ids.is_empty() {
            let wake = Wake::Task(context.waker().clone());
            let ids = self
                .notifiers
                .iter()
                .map(|notifier| notifier.add(wake.clone()))
                .collect();
            self.ids = ids;
        } else {
            for (notifier, id) in self.notifiers.iter().zip(&self.ids) {
                notifier.update(*id, context.waker());
            }
        }
        // A raise between the first look and the registration is seen here.
        if self.raised() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        for (notifier, id) in self.notifiers.iter().zip(&self.ids) {
            notifier.remove(*id);
        }
    }
}

/// The future [`StopSignal::stopped`] returns: woken by the stop, not polled.
#[must_use = "a future does nothing unless awaited"]
pub struct Stopped(Raised);

impl std::fmt::Debug for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopped").finish_non_exhaustive()
    }
}

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(context)
    }
}

/// The future [`CancelHandle::cancelled`] returns: woken by the cancel, not polled.
#[must_use = "a future does nothing unless awaited"]
pub struct Cancelled(Raised);

impl std::fmt::Debug for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancelled").finish_non_exhaustive()
    }
}

impl Future for Cancelled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(context)
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
    /// Raised when a hook stops the run or its token budget is spent.
    halt: Arc<Notifier>,
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
            halt: Arc::default(),
        }
    }

    /// A hook said the run is not to continue (`continue: false`): it
    /// stops at its next turn boundary, as a cancelled run does, with
    /// `reason` (the first reason given wins).
    pub(crate) fn stop(&self, reason: String) {
        let _ = self.stopped.set(reason);
        self.halt.raise();
    }

    /// Raises the halt when the tokens counted reach the budget.
    fn check_tokens(&self) {
        if self
            .limits
            .max_tokens_total
            .is_some_and(|max| self.tokens() >= max)
        {
            self.halt.raise();
        }
    }

    /// When the deadline passes, once the clock has started.
    pub(crate) fn deadline_at(&self) -> Option<Instant> {
        let started = self.started.get()?;
        started.checked_add(self.limits.deadline?)
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
        self.check_tokens();
    }

    /// Counts a reply's tokens (input + output).
    pub(crate) fn add_usage(&self, usage: &Usage) {
        let billed = usage.billed();
        let _ = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_add(billed))
            });
        self.check_tokens();
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
