//! Runs on disk: the JSON Lines [`trace`] (where it may be written:
//! [`target`]; each line's shape is checked when it is read), a trace read back
//! ([`recorded`]), a replay compared with it ([`replay`]), a run resumed
//! from it ([`resume`]), the loop's [`invariants`] checked over it, the JSON
//! [`report`] of a run, the pairing rules over any agent's [`history`]
//! (subloop's or another program's), and the run shown on a terminal ([`recorded::RecordedRun::timeline`]) or as a
//! page ([`view_html`]).
//!
//! May import: every layer below: [`crate::core`], [`crate::run`],
//! [`crate::policy`], [`crate::tools`], [`crate::providers`], [`crate::agent`].

mod compare;
pub mod foreign;
pub mod history;
pub mod invariants;
pub(crate) mod lines;
pub mod recorded;
pub mod replay;
pub mod report;
pub mod resume;
pub mod target;
pub mod trace;
mod view;
pub mod view_html;
