//! Two small future combinators the loop needs, with no runtime: one that
//! turns a panic while polling into a result ([`CatchUnwind`]) and one
//! that runs futures side by side on the task that polls it ([`join_all`]).

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future whose panics, while polled, come out as `Err` with the panic's
/// payload (as [`std::panic::catch_unwind`] does for a closure). The
/// executor uses it so that a tool that panics in its future is answered
/// like one that panics in `run`.
pub struct CatchUnwind<F>(pub F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut *inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// Polls every future of `futures` on the task that awaits the result,
/// and gives their outputs in the order of `futures`. Nothing is spawned:
/// the futures run side by side while they wait, and one at a time while
/// they compute. Each poll polls every future not yet done, which suits the
/// handful of children of one reply.
pub fn join_all<F>(futures: Vec<F>) -> JoinAll<F>
where
    F: Future + Unpin,
{
    JoinAll {
        slots: futures.into_iter().map(Slot::Running).collect(),
    }
}

enum Slot<F: Future> {
    Running(F),
    Done(Option<F::Output>),
}

/// The future of [`join_all`].
pub struct JoinAll<F: Future> {
    slots: Vec<Slot<F>>,
}

impl<F: Future + Unpin> Unpin for JoinAll<F> {}

impl<F: Future + Unpin> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut pending = false;
        for slot in &mut self.slots {
            if let Slot::Running(future) = slot {
                match Pin::new(future).poll(cx) {
                    Poll::Ready(output) => *slot = Slot::Done(Some(output)),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        let outputs = self
            .slots
            .iter_mut()
            .filter_map(|slot| match slot {
                Slot::Done(output) => output.take(),
                Slot::Running(_) => None,
            })
            .collect();
        Poll::Ready(outputs)
    }
}
