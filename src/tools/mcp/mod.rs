//! MCP tool servers: any Model Context Protocol server's tools in the loop,
//! under the same gate (behind the `mcp` feature, on by default).
//!
//! - [`config`] reads the `{"mcpServers": {NAME: {command, args, env}}}` file
//!   other agents use and the command-line forms, and names tools
//!   `mcp__NAME__TOOL` under the API's tool-name rule;
//! - [`server`] starts a server (in a process group that dies with
//!   subloop) and talks to it with the official Rust SDK, `rmcp`, on a
//!   runtime of its own, so everything outside this module stays synchronous;
//! - [`tool`] makes each listed tool a [`crate::tools::Tool`]: `executes`
//!   (it passes the permission gate) unless the host marked it read-only;
//! - `content` turns a result into the text the model gets.

//!
//! Without the feature only [`config`] is built (a run
//! given servers is then refused with a clear message).

pub mod config;
#[cfg(feature = "mcp")]
mod content;
#[cfg(feature = "mcp")]
pub mod server;
#[cfg(feature = "mcp")]
pub mod tool;
