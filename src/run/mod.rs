//! The one loop: the [`driver`] that takes a conversation from question to
//! finish, the [`model::Model`] it asks, the [`limits`] of a run and its
//! cancellation, the [`monitor::Monitor`] that watches it, the
//! process groups the programs subloop starts run in (the tools layer's
//! `Programs`), and the [`telemetry`] spans it opens.
//!
//! May import: [`crate::core`].

pub mod driver;
pub(crate) mod harden;
pub(crate) mod join;
pub mod limits;
pub mod model;
pub mod monitor;
pub(crate) mod process;
pub mod shutdown;
pub mod telemetry;
