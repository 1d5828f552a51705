//! The one loop: the [`driver`] that takes a conversation from question to
//! finish, the [`model::Model`] it asks, the [`limits`] of a run and its
//! cancellation, the [`monitor::Monitor`] that watches it, the
//! process groups the programs subloop starts run in (the tools layer's
//! `Programs`), and the [`telemetry`] spans it opens.
//!
//! May import: [`crate::core`].

/// A boxed, `Send` future borrowing for `'a`: what the async methods of
/// [`model::AsyncModel`], [`driver::Executor`] and the tools' trait return
/// (an answer, a round of tool calls, a tool's output), so that models,
/// executors and tools stay object-safe and run on any executor.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

pub mod driver;
pub(crate) mod harden;
pub(crate) mod join;
pub mod limits;
pub mod model;
pub mod monitor;
pub(crate) mod offload;
pub(crate) mod process;
pub mod shutdown;
pub mod telemetry;
