//! Work that blocks, awaited without holding an async worker: it runs on
//! tokio's blocking pool when a tokio runtime is current, else on a thread
//! of its own, and the awaiting task is woken when it is done.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// What the worker hands back: the value, or the panic it raised.
type Outcome<T> = std::thread::Result<T>;

struct Slot<T> {
    state: Mutex<(Option<Outcome<T>>, Option<Waker>)>,
}

impl<T> Slot<T> {
    fn fill(&self, outcome: Outcome<T>) {
        let waker = {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            state.0 = Some(outcome);
            state.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The future [`off_worker`] awaits.
struct Done<T>(Arc<Slot<T>>);

impl<T> Future for Done<T> {
    type Output = Outcome<T>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Outcome<T>> {
        let mut state = self
            .0
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match state.0.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => {
                state.1 = Some(context.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Runs `work` off the async worker and awaits it: on tokio's blocking
/// pool inside a tokio runtime, else on a thread of its own (or here, if
/// no thread can be started). A panic in `work` is raised again here, as
/// if `work` had run inline.
pub(crate) async fn off_worker<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let slot = Arc::new(Slot {
        state: Mutex::new((None, None)),
    });
    let filled = Arc::clone(&slot);
    let job = move || filled.fill(catch_unwind(AssertUnwindSafe(work)));
    if let Err(job) = spawn_on_runtime(job) {
        let job = Arc::new(Mutex::new(Some(job)));
        let on_thread = Arc::clone(&job);
        let started = std::thread::Builder::new()
            .name("subloop-blocking".to_owned())
            .spawn(move || {
                let job = on_thread.lock().ok().and_then(|mut job| job.take());
                if let Some(job) = job {
                    job();
                }
            });
        if started.is_err() {
            let job = job.lock().ok().and_then(|mut job| job.take());
            if let Some(job) = job {
                job();
            }
        }
    }
    match Done(slot).await {
        Ok(value) => value,
        Err(payload) => resume_unwind(payload),
    }
}

/// Hands `job` to the current tokio runtime's blocking pool; gives it
/// back when there is no such runtime.
#[cfg(any(feature = "mcp", feature = "async"))]
fn spawn_on_runtime<F: FnOnce() + Send + 'static>(job: F) -> Result<(), F> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            drop(runtime.spawn_blocking(job));
            Ok(())
        }
        Err(_) => Err(job),
    }
}

#[cfg(not(any(feature = "mcp", feature = "async")))]
fn spawn_on_runtime<F: FnOnce() + Send + 'static>(job: F) -> Result<(), F> {
    Err(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_elsewhere_and_its_value_comes_back() {
        let here = std::thread::current().id();
        let there = crate::run::driver::block_on(off_worker(move || std::thread::current().id()));
        assert_ne!(here, there);
    }

    #[test]
    fn a_panic_is_raised_where_it_is_awaited() {
        let caught = catch_unwind(|| {
            crate::run::driver::block_on(off_worker(|| -> u8 { panic!("in the work") }))
        });
        assert!(caught.is_err());
    }
}
