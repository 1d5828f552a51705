//! The crate's error enums, one per boundary.
//!
//! * [`InputError`]: a conversation cannot start (empty question, zero budget).
//! * [`SubmitError`]: tool results do not match the pending calls.
//! * [`ModelFailure`]: a model request failed; the conversation finishes `model_error`.
//! * [`ScriptError`]: a replay script cannot be read or parsed.
//! * [`SetupError`]: an agent cannot be assembled (registry, whitelist, workspace).

use std::path::PathBuf;

use thiserror::Error;

/// The largest `read_file` limit: 1 GiB.
pub const MAX_READ_LIMIT: usize = 1 << 30;

use crate::core::protocol::ToolUseId;

/// A conversation could not start.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InputError {
    /// The call budget was 0; a conversation needs at least one model request.
    #[error("the call budget must be at least 1 model request (got 0)")]
    ZeroBudget,
    /// The question was empty or only whitespace.
    #[error("the question is empty")]
    EmptyQuestion,
    /// A `UserPromptSubmit` hook blocked the question (exit 2, `decision:
    /// "block"` or `continue: false`), with its reason.
    #[error("a UserPromptSubmit hook blocked the question: {0}")]
    PromptBlocked(String),
}

/// Tool results handed to `Conversation::submit` or
/// `Conversation::answer_round` did not match the pending calls.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// A pending call got no result.
    #[error("no result for tool_use id `{0}`")]
    Missing(ToolUseId),
    /// A result names an id that is not pending.
    #[error("result for unknown tool_use id `{0}`")]
    Foreign(ToolUseId),
    /// Two results name the same id.
    #[error("two results for tool_use id `{0}`")]
    Duplicate(ToolUseId),
    /// A round gave more outputs than there are pending calls.
    #[error("{outputs} outputs for {calls} pending call(s)")]
    TooMany {
        /// The pending calls.
        calls: usize,
        /// The outputs given.
        outputs: usize,
    },
}

/// A model request failed (network, API error, exhausted script, ...).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct ModelFailure {
    /// A machine-readable kind when known (the API's `error.type`, `script_exhausted`, ...).
    pub kind: Option<String>,
    /// A readable message.
    pub message: String,
}

impl ModelFailure {
    /// A failure with a message and no kind.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            kind: None,
            message: message.into(),
        }
    }

    /// A failure with a kind and a message.
    pub fn with_kind(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: Some(kind.into()),
            message: message.into(),
        }
    }
}

/// A replay script could not be loaded.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {source}")]
    Read {
        /// The script's path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid script.
    #[error(
        "invalid script {path}: {message} (expected {{\"parent\": [REPLY, ...], \"children\": [[REPLY, ...], ...]}})"
    )]
    Invalid {
        /// The script's path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// An agent could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SetupError {
    /// Two tools share a name.
    #[error("two tools are named `{0}`")]
    DuplicateTool(String),
    /// A whitelist names a tool the parent registry does not have.
    #[error("the child whitelist names `{0}`, which the parent registry does not have")]
    UnknownTool(String),
    /// A whitelist names a tool a child may not hold.
    #[error(
        "the child whitelist names `{0}`, which is not a read-only tool; a child may only hold read-only tools"
    )]
    NotReadOnly(String),
    /// The workspace is not a readable directory.
    #[error("workspace {path}: {message}")]
    Workspace {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// `read_file`'s limit is outside 1 byte to 1 GiB.
    #[error("the read limit must be 1 to {max} bytes (1 GiB), got {0}", max = MAX_READ_LIMIT)]
    ReadLimit(usize),
    /// The child budget is outside 1..=8.
    #[error("the child call budget must be 1 to 8 model requests (got {0})")]
    ChildBudget(u32),
    /// A command line for `run_main` is empty or badly quoted.
    #[error("run command: {0}")]
    RunCommand(String),
    /// A tool source could not list its tools.
    #[error("{0}")]
    ToolSource(String),
}
