//! The permission gate: read-only tools pass; a tool that executes runs only
//! after an [`Approver`] allows that call. A denial is answered
//! `not executed: permission denied` and the tool does not start.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Mutex;

use serde::Serialize;

use crate::agent_id::AgentId;
use crate::conversation::ToolCall;

/// The approver's answer for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run it.
    Allow,
    /// Do not run it.
    Deny,
}

/// What the approver is asked about.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalRequest<'a> {
    /// The agent asking.
    pub agent: &'a AgentId,
    /// The call.
    pub call: &'a ToolCall,
    /// A one-line description of what would happen (e.g. the command line).
    pub action: &'a str,
}

/// Decides calls of tools that need approval. Shared by the parent and every child.
pub trait Approver: Send + Sync {
    /// Allow or deny one call.
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision;
}

/// Allows every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Approver for AllowAll {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        Decision::Allow
    }
}

/// Denies every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct DenyAll;

impl Approver for DenyAll {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        Decision::Deny
    }
}

/// Asks on the terminal: a `y/N` prompt on stderr, the answer from stdin.
///
/// A stdin that is not a terminal, closed, or unreadable counts as "no",
/// and so does a stderr the prompt cannot be written to.
#[derive(Debug, Default)]
pub struct AskTerminal {
    lock: Mutex<()>,
}

impl AskTerminal {
    /// A terminal approver.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Approver for AskTerminal {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        let _guard = self
            .lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let stdin = std::io::stdin();
        let mut stderr = std::io::stderr().lock();
        if !stdin.is_terminal() {
            // Denied either way; a broken stderr only loses the explanation.
            let _ = writeln!(
                stderr,
                "[permission] {} wants to run `{}`: denied, stdin is not a terminal (use --decision allow to allow)",
                request.agent,
                crate::progress::printable(request.action)
            );
            return Decision::Deny;
        }
        // Nobody can see a prompt that cannot be written: deny without asking.
        let prompt = write!(
            stderr,
            "[permission] {} wants to run `{}` ({}). Allow? [y/N] ",
            request.agent,
            crate::progress::printable(request.action),
            crate::progress::printable(request.call.name())
        )
        .and_then(|()| stderr.flush());
        if prompt.is_err() {
            return Decision::Deny;
        }
        drop(stderr);
        let mut line = String::new();
        match stdin.lock().read_line(&mut line) {
            Ok(n) if n > 0 && matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes") => {
                Decision::Allow
            }
            _ => Decision::Deny,
        }
    }
}
