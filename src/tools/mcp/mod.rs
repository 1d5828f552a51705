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

/// Why MCP servers cannot be used: a configuration that cannot be used
/// (a file, a server's command-line form, a read-only list), or a server
/// that could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The file is not JSON of the expected shape.
    #[error("MCP config {source_name}: {message}")]
    Invalid {
        /// The file (or flag) it came from.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// A server name that cannot be part of a tool name.
    #[error(
        "MCP server name {0:?} is not usable: use 1 to 40 letters, digits, `_` or `-`, without `__` and not ending in `_`"
    )]
    BadName(String),
    /// Two servers with one name.
    #[error("MCP server {0} is configured twice")]
    Duplicate(String),
    /// A server spec without `NAME=COMMAND`.
    #[error("MCP server {0:?}: expected NAME=COMMAND ARGS…")]
    BadServerFlag(String),
    /// A server spec whose command line cannot be split (a quote left open).
    #[error("MCP server {value:?}: {reason}")]
    BadServerCommand {
        /// The value given.
        value: String,
        /// Why it cannot be split.
        reason: String,
    },
    /// A read-only list without `NAME:TOOL`.
    #[error("read-only MCP tools {0:?}: expected NAME:TOOL,… (a configured server, tool names)")]
    BadReadOnlyFlag(String),
    /// The program could not be started.
    #[error("MCP server {name}: cannot start `{command}`: {source}")]
    Spawn {
        /// The server.
        name: String,
        /// Its command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// It did not finish the handshake and the tool listing in time.
    #[error("MCP server {name} did not start within {secs} s{stderr}")]
    Timeout {
        /// The server.
        name: String,
        /// The start timeout.
        secs: f64,
        /// Its last stderr lines, if any.
        stderr: String,
    },
    /// The handshake or the listing failed.
    #[error("MCP server {name} failed to start: {message}{stderr}")]
    Failed {
        /// The server.
        name: String,
        /// What went wrong.
        message: String,
        /// Its last stderr lines, if any.
        stderr: String,
    },
}
