//! The crate's error enums, one per boundary.
//!
//! * [`InputError`]: a conversation cannot start (empty question, zero budget).
//! * [`SubmitError`]: tool results do not match the pending calls.
//! * [`ModelFailure`]: a model request failed; the conversation finishes `model_error`.
//!   Its [`FailureKind`] says what kind of failure (overloaded, rate limited,
//!   context window exceeded, ...).
//! * [`ScriptError`]: a replay script cannot be read or parsed.
//! * [`SetupError`]: an agent cannot be assembled (registry, whitelist, workspace).

use std::path::PathBuf;

use thiserror::Error;

/// The largest `read_file` limit: 1 GiB.
pub(crate) const MAX_READ_LIMIT: usize = 1 << 30;

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

/// What kind of failure a [`ModelFailure`] is.
///
/// The kinds a host acts on have a variant each: wait and ask again
/// ([`Overloaded`](Self::Overloaded), [`RateLimited`](Self::RateLimited),
/// [`Timeout`](Self::Timeout), [`Connection`](Self::Connection)), shorten
/// the conversation ([`ContextWindow`](Self::ContextWindow)), fix the key
/// ([`Authentication`](Self::Authentication)), or stop
/// ([`Cancelled`](Self::Cancelled)); so do the API error types the
/// providers produce and the failures of this crate's own models
/// (scripts, replays). Any other error type an API names is kept, as it
/// came, in [`Api`](Self::Api). More variants may be added.
///
/// Each kind has a stable name, [`FailureKind::as_str`]: a trace's
/// `error_type`, a `chat` span's `error.type`, and the `type` a script's
/// `{"error": {"type", "message"}}` gives. [`FailureKind::from_name`]
/// reads a name back, so `FailureKind::from_name(kind.as_str()) == kind`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// `overloaded_error`: the API is overloaded for now (Anthropic's HTTP
    /// 529, or the same error inside a stream); worth asking again later.
    Overloaded,
    /// `rate_limit_error`: too many requests or tokens for the account
    /// (HTTP 429); worth asking again after the server's delay.
    RateLimited,
    /// `timeout_error`: no response in time, or a stall while reading one
    /// (the transport's timeouts; also Anthropic's HTTP 504).
    Timeout,
    /// `connection_error`: the connection could not be made or was dropped.
    Connection,
    /// `request_error`: the request could not be sent at all (a bad URL,
    /// TLS), the thread sending it died, or the model cannot answer in
    /// this kind of run (a blocking call to an async-only model).
    Request,
    /// `context_window_exceeded`: the prompt (for some servers, with the
    /// output tokens asked for) does not fit the model's context window.
    /// Asking again fails the same way; the conversation must be shorter.
    /// Recognised in every provider's own shape: Anthropic's
    /// `invalid_request_error` "prompt is too long: N tokens > M maximum",
    /// an OpenAI-compatible `context_length_exceeded` code or "maximum
    /// context length" message, llama.cpp's `exceed_context_size_error`.
    ContextWindow,
    /// `cancelled`: the request was abandoned because the run was stopped
    /// (cancelled, a deadline, a token limit) or dropped.
    Cancelled,
    /// `invalid_request_error`: the API refused the request's format or
    /// content (HTTP 400, or another 4xx with no type of its own).
    InvalidRequest,
    /// `authentication_error`: the API key is missing or was refused (HTTP 401).
    Authentication,
    /// `permission_error`: the key may not use this resource (HTTP 403).
    Permission,
    /// `not_found_error`: no such resource, often a model name the server
    /// does not serve (HTTP 404).
    NotFound,
    /// `api_error`: the API failed on its side (HTTP 500 and other 5xx).
    Server,
    /// `stream_error`: an event stream could not be read, or ended before
    /// its reply was whole.
    Stream,
    /// `invalid_response`: a response body that is not JSON, or not a reply.
    InvalidResponse,
    /// `http_error`: an error status whose body is not the provider's
    /// error shape.
    Http,
    /// `invalid_request`: the request's body could not be serialized (the
    /// API's own refusal is [`InvalidRequest`](Self::InvalidRequest)).
    Serialization,
    /// `invalid_script`: a replay script's entry is not a reply.
    InvalidScript,
    /// `script_exhausted`: a replay script has no reply left.
    ScriptExhausted,
    /// `replay_diverged`: a replayed run asked something else than the
    /// trace recorded, so the replay stopped.
    ReplayDiverged,
    /// Any other error type, named as the API (or a script, or a trace)
    /// named it: `request_too_large`, `billing_error`, a server's own
    /// `server_error`, ... [`FailureKind::from_name`] never puts a name of
    /// another variant here.
    Api(String),
}

impl FailureKind {
    /// The kind's stable name, as traces, spans and the CLI's JSON write
    /// it (`overloaded_error`, `script_exhausted`, ...); for
    /// [`Api`](Self::Api), the name it holds.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Overloaded => "overloaded_error",
            Self::RateLimited => "rate_limit_error",
            Self::Timeout => "timeout_error",
            Self::Connection => "connection_error",
            Self::Request => "request_error",
            Self::ContextWindow => "context_window_exceeded",
            Self::Cancelled => "cancelled",
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::Permission => "permission_error",
            Self::NotFound => "not_found_error",
            Self::Server => "api_error",
            Self::Stream => "stream_error",
            Self::InvalidResponse => "invalid_response",
            Self::Http => "http_error",
            Self::Serialization => "invalid_request",
            Self::InvalidScript => "invalid_script",
            Self::ScriptExhausted => "script_exhausted",
            Self::ReplayDiverged => "replay_diverged",
            Self::Api(name) => name,
        }
    }

    /// The kind named `name` ([`FailureKind::as_str`] read back): its
    /// variant, or [`Api`](Self::Api) holding `name`.
    pub fn from_name(name: &str) -> Self {
        match name {
            "overloaded_error" => Self::Overloaded,
            "rate_limit_error" => Self::RateLimited,
            "timeout_error" => Self::Timeout,
            "connection_error" => Self::Connection,
            "request_error" => Self::Request,
            "context_window_exceeded" => Self::ContextWindow,
            "cancelled" => Self::Cancelled,
            "invalid_request_error" => Self::InvalidRequest,
            "authentication_error" => Self::Authentication,
            "permission_error" => Self::Permission,
            "not_found_error" => Self::NotFound,
            "api_error" => Self::Server,
            "stream_error" => Self::Stream,
            "invalid_response" => Self::InvalidResponse,
            "http_error" => Self::Http,
            "invalid_request" => Self::Serialization,
            "invalid_script" => Self::InvalidScript,
            "script_exhausted" => Self::ScriptExhausted,
            "replay_diverged" => Self::ReplayDiverged,
            other => Self::Api(other.to_owned()),
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FailureKind {
    type Err = std::convert::Infallible;

    /// [`FailureKind::from_name`]: every name is a kind.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Ok(Self::from_name(name))
    }
}

/// A model request failed (network, API error, exhausted script, ...).
///
/// Its [`kind`](Self::kind) says what to do about it, its
/// [`message`](Self::message) (also its `Display`) says what happened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct ModelFailure {
    kind: Option<FailureKind>,
    message: String,
}

impl ModelFailure {
    /// A failure with a message and no kind.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            kind: None,
            message: message.into(),
        }
    }

    /// A failure of `kind` with a message.
    pub fn with_kind(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind: Some(kind),
            message: message.into(),
        }
    }

    /// What kind of failure it is, when known.
    pub fn kind(&self) -> Option<&FailureKind> {
        self.kind.as_ref()
    }

    /// What happened, readable.
    pub fn message(&self) -> &str {
        &self.message
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant but `Api`.
    const NAMED: [FailureKind; 19] = [
        FailureKind::Overloaded,
        FailureKind::RateLimited,
        FailureKind::Timeout,
        FailureKind::Connection,
        FailureKind::Request,
        FailureKind::ContextWindow,
        FailureKind::Cancelled,
        FailureKind::InvalidRequest,
        FailureKind::Authentication,
        FailureKind::Permission,
        FailureKind::NotFound,
        FailureKind::Server,
        FailureKind::Stream,
        FailureKind::InvalidResponse,
        FailureKind::Http,
        FailureKind::Serialization,
        FailureKind::InvalidScript,
        FailureKind::ScriptExhausted,
        FailureKind::ReplayDiverged,
    ];

    #[test]
    fn every_kind_reads_back_from_its_name() {
        let mut names = std::collections::HashSet::new();
        for kind in NAMED {
            assert_eq!(FailureKind::from_name(kind.as_str()), kind);
            assert_eq!(kind.to_string(), kind.as_str());
            assert_eq!(kind.as_str().parse(), Ok(kind.clone()));
            assert!(names.insert(kind.as_str().to_owned()), "{kind} twice");
        }
        // The names traces and scripts already hold keep their meaning.
        assert_eq!(
            FailureKind::from_name("overloaded_error"),
            FailureKind::Overloaded
        );
        assert_eq!(
            FailureKind::from_name("script_exhausted"),
            FailureKind::ScriptExhausted
        );
    }

    #[test]
    fn other_names_are_kept_as_they_came() {
        for name in ["request_too_large", "server_error", "BadRequestError", ""] {
            let kind = FailureKind::from_name(name);
            assert_eq!(kind, FailureKind::Api(name.to_owned()));
            assert_eq!(kind.as_str(), name);
        }
    }

    #[test]
    fn a_failure_shows_its_message() {
        let failure = ModelFailure::with_kind(FailureKind::Overloaded, "busy");
        assert_eq!(failure.kind(), Some(&FailureKind::Overloaded));
        assert_eq!(failure.message(), "busy");
        assert_eq!(failure.to_string(), "busy");
        assert_eq!(ModelFailure::new("x").kind(), None);
    }
}
