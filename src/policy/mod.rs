//! Who may run what: the [`permission`] gate and its approvers (one of
//! them asks on the [`terminal`]), and the [`hooks`] around every call.
//!
//! May import: [`crate::core`], [`crate::run`].

pub mod hooks;
pub mod permission;
pub mod terminal;
