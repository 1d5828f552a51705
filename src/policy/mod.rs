//! Who may run what: the [`permission`] gate and its approvers (one of
//! them asks on the [`terminal`]), the [`hooks`] around every call, and
//! the [`command_hooks`] a settings file names.
//!
//! May import: [`crate::core`], [`crate::run`].

pub mod command_hooks;
pub mod hooks;
pub mod permission;
pub mod terminal;
