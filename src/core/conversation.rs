//! The typestate conversation: what may happen next is written in the type.
//!
//! ```text
//!     new(question, budget) ──► Conversation<Fresh>   with_system, on_empty_reply, expect_output
//!                                       │ begin
//!              start(question, budget)  │   (start = new + begin, with the defaults)
//!                       │               │
//!                       ▼               ▼
//!           ┌──► Conversation<AwaitingModel> ── model_failed ──► Finished<ModelError>
//!           │           │ receive(reply)
//!           │           ├── end_turn + text, no tool_use ─────────► Finished<Answered>
//!           │           ├── max_tokens / refusal / pause_turn … ──► Finished<ModelStopped>
//!           │           ├── malformed / inconsistent ─────────────► Finished<ProtocolError>
//!           ├◄───────── ├── empty end_turn, policy `continue`, once in a row: + user "Please continue."
//!           │           ▼ tool_use + ≥1 well-formed call
//!           │   Conversation<AwaitingTools>
//!           │           │ answer every pending call (ids paired by the machine)
//!           │           ▼
//!           └── budget left?  no ─────────────────────────────────► Finished<CallLimit>
//! ```
//!
//! Every transition consumes `self`; a finished conversation has no transition
//! but one — an answered one takes a follow-up question
//! ([`Conversation::follow_up`]) — so "keep going after the end" does not compile:
//!
//! ```compile_fail
//! use subloop::core::conversation::Reply;
//! use subloop::{Budget, Conversation, ModelResponse};
//! let conversation = Conversation::start("hi", Budget::new(2).unwrap()).unwrap();
//! if let Reply::Answered(done) = conversation.receive(ModelResponse::answer("hello")) {
//!     done.receive(ModelResponse::answer("again")); // no `receive` on Finished
//! }
//! ```
//!
//! Tools cannot be skipped: a conversation awaiting tool results has no way to
//! ask the model again until every call is answered.
//!
//! ```compile_fail
//! use subloop::core::conversation::Reply;
//! use subloop::{Budget, Conversation, ModelResponse};
//! use serde_json::json;
//! let conversation = Conversation::start("hi", Budget::new(2).unwrap()).unwrap();
//! let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
//! if let Reply::Tools(pending) = conversation.receive(reply) {
//!     pending.receive(ModelResponse::answer("skip the tools")); // no `receive` here
//! }
//! ```
//!
//! The configuration is fixed when the conversation begins: the setters
//! exist only on [`Conversation<Fresh>`](Fresh), so the system prompt, the
//! output check or the empty-reply policy cannot be changed between rounds:
//!
//! ```
//! use subloop::core::conversation::OnEmptyReply;
//! use subloop::{Budget, Conversation};
//! let conversation = Conversation::new("hi", Budget::new(3).unwrap())
//!     .unwrap()
//!     .with_system("be brief")
//!     .on_empty_reply(OnEmptyReply::Continue)
//!     .begin();
//! assert_eq!(conversation.system(), "be brief");
//! ```
//!
//! ```compile_fail,E0599
//! use subloop::core::conversation::{AfterTools, Reply, ToolOutput};
//! use subloop::{Budget, Conversation, ModelResponse};
//! use serde_json::json;
//! let conversation = Conversation::new("hi", Budget::new(3).unwrap())
//!     .unwrap()
//!     .with_system("be brief")
//!     .begin();
//! let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
//! if let Reply::Tools(pending) = conversation.receive(reply) {
//!     if let AfterTools::Continue(next) = pending.answer_with(|_| ToolOutput::ok("x")) {
//!         next.with_system("be verbose"); // no `with_system` once it began
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0599
//! use subloop::agent::output::SchemaOutput;
//! use subloop::core::conversation::{AfterTools, Reply, ToolOutput};
//! use subloop::{Budget, Conversation, ModelResponse};
//! use serde_json::json;
//! let conversation = Conversation::start("hi", Budget::new(3).unwrap()).unwrap();
//! let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
//! if let Reply::Tools(pending) = conversation.receive(reply) {
//!     if let AfterTools::Continue(next) = pending.answer_with(|_| ToolOutput::ok("x")) {
//!         // no `expect_output` once it began (nor a retry count to reset)
//!         next.expect_output(SchemaOutput::shared(json!({"type": "integer"})), 1);
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0599
//! use subloop::core::conversation::OnEmptyReply;
//! use subloop::{Budget, Conversation};
//! let conversation = Conversation::start("hi", Budget::new(3).unwrap()).unwrap();
//! conversation.on_empty_reply(OnEmptyReply::Continue); // not after `start` either
//! ```
//!
//! And a conversation that has not begun cannot be sent to the model:
//!
//! ```compile_fail,E0599
//! use subloop::{Budget, Conversation, ModelResponse};
//! let fresh = Conversation::new("hi", Budget::new(3).unwrap()).unwrap();
//! fresh.receive(ModelResponse::answer("hello")); // `begin` first
//! ```
//!
//! And nobody outside the crate can conjure a state:
//!
//! ```compile_fail
//! let state = subloop::core::conversation::AwaitingModel { _private: () };
//! ```

use std::collections::HashSet;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::core::error::{InputError, ModelFailure, SubmitError};
use crate::core::protocol::{
    Block, Message, ModelResponse, ReplyBlock, Request, Role, StopReason, ToolDefinition,
    ToolResultContent, ToolUseId, Usage, join_text,
};
use crate::core::shared_text::SharedText;

/// How many model requests a conversation may make: at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget(NonZeroU32);

impl Budget {
    /// A budget of `max_calls` model requests; 0 is an [`InputError`], not a status.
    pub fn new(max_calls: u32) -> Result<Self, InputError> {
        NonZeroU32::new(max_calls)
            .map(Self)
            .ok_or(InputError::ZeroBudget)
    }

    /// A budget from a count that cannot be zero.
    pub const fn from_nonzero(max_calls: NonZeroU32) -> Self {
        Self(max_calls)
    }

    /// The number of model requests allowed.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

/// A tool call the model asked for, taken from a validated reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    id: ToolUseId,
    name: String,
    input: Value,
}

impl ToolCall {
    /// A call, for hosts and tests that drive tools directly.
    pub fn new(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        Self {
            id: ToolUseId::new(id),
            name: name.into(),
            input,
        }
    }

    /// The id its result must carry.
    pub fn id(&self) -> &ToolUseId {
        &self.id
    }

    /// The tool's name as the model wrote it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments as the model wrote them.
    pub fn input(&self) -> &Value {
        &self.input
    }
}

/// What a tool produced for one call; the machine attaches the call's id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The text sent back to the model, shared with the history and the
    /// call's record rather than copied into them.
    pub content: SharedText,
    /// Whether the call failed or was refused.
    pub is_error: bool,
}

impl ToolOutput {
    /// The text every refused call's result starts with.
    pub const NOT_EXECUTED: &'static str = "not executed:";

    /// A refused call: `not executed: <reason>`, as an error result.
    pub fn refusal(reason: impl std::fmt::Display) -> Self {
        Self::error(format!("{} {reason}", Self::NOT_EXECUTED))
    }

    /// A successful result.
    pub fn ok(content: impl Into<SharedText>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed or refused call.
    pub fn error(content: impl Into<SharedText>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}

/// A result with its id, for the raw [`Conversation::submit`] form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub tool_use_id: ToolUseId,
    /// The text sent back to the model.
    pub content: String,
    /// Whether the call failed or was refused.
    pub is_error: bool,
}

/// What made a reply unacceptable; the conversation finishes `protocol_error`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Violation {
    /// A block of an unknown type, or with broken fields.
    #[error("unsupported `{kind}` block: {reason}")]
    UnsupportedBlock {
        /// The block's type string.
        kind: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A tool_use block with an empty id.
    #[error("tool_use block {index} has an empty id")]
    EmptyId {
        /// Its position among the reply's blocks.
        index: usize,
    },
    /// A tool_use block with an empty name.
    #[error("tool_use `{id}` has an empty name")]
    EmptyName {
        /// Its id.
        id: ToolUseId,
    },
    /// Two tool_use blocks of one reply share an id.
    #[error("tool_use id `{id}` appears twice in one reply")]
    DuplicateId {
        /// The repeated id.
        id: ToolUseId,
    },
    /// `stop_reason: tool_use` but no tool_use block.
    #[error("stop_reason is tool_use but the reply holds no tool_use block")]
    ToolUseWithoutCalls,
    /// `stop_reason: end_turn` with tool_use blocks.
    #[error("stop_reason is end_turn but the reply holds {count} tool_use block(s)")]
    EndTurnWithCalls {
        /// How many calls.
        count: usize,
    },
    /// `stop_reason: end_turn` with neither calls nor text.
    #[error("stop_reason is end_turn but the reply holds no text")]
    EndTurnWithoutText,
}

mod sealed {
    pub trait Sealed {}
}

/// The erased status of a finished conversation, as written in [`Outcome`].
/// New limits may add statuses, so matches need a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusKind {
    /// The model gave an answer (not: "the program ran").
    Answered,
    /// The call budget was spent.
    CallLimit,
    /// A model request failed.
    ModelError,
    /// A reply broke the protocol.
    ProtocolError,
    /// The model stopped for another reason (`max_tokens`, `refusal`, ...).
    ModelStopped,
    /// The run's wall-clock deadline passed.
    Deadline,
    /// The run's token budget was spent.
    TokenLimit,
    /// The run was cancelled.
    Cancelled,
    /// The answer did not match the output schema the run asked for, after
    /// the retries it was given.
    InvalidOutput,
    /// A `task` call past the run's delegation limit (a report status only:
    /// no conversation ran).
    DelegationLimit,
    /// The history does not fit the model's context window and could not
    /// be compacted to fit.
    ContextOverflow,
}

impl StatusKind {
    /// The status string (`answered`, `call_limit`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::CallLimit => "call_limit",
            Self::ModelError => "model_error",
            Self::ProtocolError => "protocol_error",
            Self::ModelStopped => "model_stopped",
            Self::Deadline => "deadline",
            Self::TokenLimit => "token_limit",
            Self::Cancelled => "cancelled",
            Self::InvalidOutput => "invalid_output",
            Self::DelegationLimit => "delegation_limit",
            Self::ContextOverflow => "context_overflow",
        }
    }
}

impl fmt::Display for StatusKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A final status. Sealed: only the statuses of this module exist.
pub trait Status: sealed::Sealed {
    /// The erased kind of this status.
    const KIND: StatusKind;

    /// Why the answer did not match the output schema, for
    /// [`InvalidOutput`]; `None` for every other status.
    fn output_error(&self) -> Option<&str> {
        None
    }
}

/// The model gave an answer: `end_turn`, text, no tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    _private: (),
}

/// The answer did not match the run's output schema, after every retry the
/// run allowed: the conversation's text is the last answer.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidOutput {
    error: String,
}

impl InvalidOutput {
    /// Why the last answer does not match (`answer.verdict: expected string, got number`).
    pub fn error(&self) -> &str {
        &self.error
    }
}

/// The budget was spent after a tool round; the results are in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct CallLimit {
    _private: (),
}

/// A model request failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelError {
    failure: ModelFailure,
}

impl ModelError {
    /// What failed.
    pub fn failure(&self) -> &ModelFailure {
        &self.failure
    }
}

/// A reply broke the protocol; it was not added to the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolError {
    violation: Violation,
    reply: ModelResponse,
}

impl ProtocolError {
    /// The rule the reply broke.
    pub fn violation(&self) -> &Violation {
        &self.violation
    }

    /// The rejected reply, as received.
    pub fn reply(&self) -> &ModelResponse {
        &self.reply
    }
}

/// The model stopped for a reason other than `end_turn` or `tool_use`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelStopped {
    reason: Option<StopReason>,
    reply: ModelResponse,
}

impl ModelStopped {
    /// The stop reason, `None` when the reply had none.
    pub fn reason(&self) -> Option<&StopReason> {
        self.reason.as_ref()
    }

    /// The reply, as received (not added to the history).
    pub fn reply(&self) -> &ModelResponse {
        &self.reply
    }
}

/// The server refused a request because the history does not fit the
/// model's context window, and no compaction could make it shorter.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextOverflow {
    failure: ModelFailure,
}

impl ContextOverflow {
    /// The server's refusal.
    pub fn failure(&self) -> &ModelFailure {
        &self.failure
    }
}

/// The run's deadline passed before this conversation finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Deadline {
    _private: (),
}

/// The run's token budget was spent before this conversation finished.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLimit {
    _private: (),
}

/// The run was cancelled before this conversation finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Cancelled {
    _private: (),
}

/// Why a run stopped at a turn boundary, as decided by the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InterruptKind {
    /// The wall-clock deadline passed.
    Deadline,
    /// The token budget is spent.
    TokenLimit,
    /// Someone cancelled the run.
    Cancelled,
}

impl InterruptKind {
    /// The status a conversation stopped this way finishes with.
    pub fn status(self) -> StatusKind {
        match self {
            Self::Deadline => StatusKind::Deadline,
            Self::TokenLimit => StatusKind::TokenLimit,
            Self::Cancelled => StatusKind::Cancelled,
        }
    }
}

/// A host's reason to stop at a turn boundary, with a readable text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Interrupt {
    /// Which limit.
    pub kind: InterruptKind,
    /// What was cut short, for the outcome's text.
    pub text: String,
}

impl Interrupt {
    /// A stop of `kind`, saying `text` (what was cut short) in the outcome.
    pub fn new(kind: InterruptKind, text: impl Into<String>) -> Self {
        Self {
            kind,
            text: text.into(),
        }
    }
}

/// A conversation stopped by an [`Interrupt`].
#[derive(Debug)]
pub enum Interrupted {
    /// By the deadline.
    Deadline(Conversation<Finished<Deadline>>),
    /// By the token budget.
    TokenLimit(Conversation<Finished<TokenLimit>>),
    /// By cancellation.
    Cancelled(Conversation<Finished<Cancelled>>),
}

impl Interrupted {
    /// The erased outcome.
    pub fn into_outcome(self) -> Outcome {
        match self {
            Self::Deadline(done) => done.into_outcome(),
            Self::TokenLimit(done) => done.into_outcome(),
            Self::Cancelled(done) => done.into_outcome(),
        }
    }
}

macro_rules! statuses {
    ($($ty:ident => $kind:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Status for $ty {
            const KIND: StatusKind = StatusKind::$kind;
        }
    )*};
}

impl sealed::Sealed for InvalidOutput {}
impl Status for InvalidOutput {
    const KIND: StatusKind = StatusKind::InvalidOutput;

    fn output_error(&self) -> Option<&str> {
        Some(&self.error)
    }
}

statuses! {
    Answered => Answered,
    CallLimit => CallLimit,
    ModelError => ModelError,
    ProtocolError => ProtocolError,
    ModelStopped => ModelStopped,
    Deadline => Deadline,
    TokenLimit => TokenLimit,
    Cancelled => Cancelled,
    ContextOverflow => ContextOverflow,
}

/// State: not started; the configuration may still be set
/// ([`Conversation::new`], then [`Conversation::begin`]).
#[derive(Debug)]
pub struct Fresh {
    _private: (),
}

/// State: the next step is a model request.
#[derive(Debug)]
pub struct AwaitingModel {
    _private: (),
}

/// State: the last reply asked for tools; every call needs exactly one result.
#[derive(Debug)]
pub struct AwaitingTools {
    calls: Vec<ToolCall>,
}

/// State: the conversation is over, with status `S` and a text.
#[derive(Debug)]
pub struct Finished<S: Status> {
    status: S,
    text: String,
    /// The answer's value, when the conversation checked its output.
    output: Option<Value>,
}

/// What a conversation does with an empty `end_turn` reply (no tool call,
/// no text), which the API documents it sometimes sends, mostly right after
/// tool results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnEmptyReply {
    /// Finish `protocol_error` (the course's rule, and the default).
    #[default]
    Stop,
    /// Answer the empty reply with a user message, [`OnEmptyReply::CONTINUE_PROMPT`], and
    /// ask again — once per turn: a second empty reply in a row is
    /// `protocol_error`. The empty reply is not stored (the API refuses
    /// empty assistant content); it counts against the budget, and with no
    /// call left it is `protocol_error`.
    Continue,
}

impl OnEmptyReply {
    /// The user message that answers an empty reply under
    /// [`OnEmptyReply::Continue`], in a new user message, as Anthropic's
    /// stop-reason documentation recommends (rather than retrying the request).
    pub const CONTINUE_PROMPT: &'static str = CONTINUE_PROMPT;

    /// Parses `stop` or `continue`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "stop" => Some(Self::Stop),
            "continue" => Some(Self::Continue),
            _ => None,
        }
    }

    /// The name, as [`OnEmptyReply::parse`] reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Continue => "continue",
        }
    }
}

/// The user message that answers an empty reply under
/// [`OnEmptyReply::Continue`], in a new user message, as Anthropic's
/// stop-reason documentation recommends (rather than retrying the request).
pub(crate) const CONTINUE_PROMPT: &str = "Please continue.";

/// Data shared by every state.
#[derive(Debug, Clone)]
struct Core {
    system: String,
    history: Vec<Message>,
    budget: Budget,
    calls: u32,
    /// Calls made before the current question (a follow-up's budget starts here).
    base: u32,
    usage: Usage,
    on_empty: OnEmptyReply,
    /// The last reply was empty and was answered with [`OnEmptyReply::CONTINUE_PROMPT`].
    continued: bool,
    /// What the answer is checked against, if anything.
    output: Option<Expected>,
}

/// Checks an answer's text against what the host asked for: the schema
/// sent with each request (so a provider can constrain the reply), and the
/// check itself, which gives the answer's value or says why there is none.
/// The `agent` layer implements it with the crate's schema validator
/// (`agent::output`); the conversation only applies it.
pub trait OutputCheck: Send + Sync + fmt::Debug {
    /// The JSON schema the answer must match.
    fn schema(&self) -> &Value;
    /// The value an answer's text holds, or why it holds none (the text
    /// the model is sent back when it may try again).
    fn check(&self, text: &str) -> Result<Value, String>;
}

/// An output check, and how many answers may fail it before the
/// conversation finishes [`InvalidOutput`].
#[derive(Debug, Clone)]
struct Expected {
    check: Arc<dyn OutputCheck>,
    retries: u32,
    /// Answers of the current question that failed the check so far.
    failed: u32,
}

/// The user message that sends an answer which failed the output check
/// back to the model.
pub(crate) fn output_retry_prompt(error: &str) -> String {
    format!(
        "Your answer does not match the required output schema: {error}. Reply again with only the JSON value, matching the schema."
    )
}

impl Core {
    /// Calls made for the current question (all of them before a follow-up).
    fn question_calls(&self) -> u32 {
        self.calls.saturating_sub(self.base)
    }
}

/// What [`Conversation::compact`] gave.
#[derive(Debug)]
#[non_exhaustive]
pub enum Compacted {
    /// The history was replaced by the compactor's.
    Shortened(Conversation<AwaitingModel>),
    /// The compactor had nothing to remove; the conversation is as it was.
    Unchanged(Conversation<AwaitingModel>),
    /// The compactor's history would have broken the protocol or lost the
    /// question; the conversation is as it was.
    Refused {
        /// The conversation, unchanged.
        conversation: Conversation<AwaitingModel>,
        /// What was wrong with the proposed history.
        reason: String,
    },
}

impl Compacted {
    /// The conversation, shortened or not.
    pub fn into_conversation(self) -> Conversation<AwaitingModel> {
        match self {
            Self::Shortened(conversation)
            | Self::Unchanged(conversation)
            | Self::Refused { conversation, .. } => conversation,
        }
    }
}

/// What a request refused for its length led to
/// ([`Conversation::overflowed`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Overflow {
    /// The history was compacted: ask the model again.
    Compacted(Conversation<AwaitingModel>),
    /// It could not be: finished `context_overflow`.
    Overflowed(Conversation<Finished<ContextOverflow>>),
}

/// A conversation in state `S`: [`Fresh`], [`AwaitingModel`], [`AwaitingTools`] or [`Finished`].
#[derive(Debug)]
pub struct Conversation<S> {
    core: Core,
    state: S,
}

/// What a reply led to, decided at run time.
#[derive(Debug)]
pub enum Reply {
    /// The model asked for tools.
    Tools(Conversation<AwaitingTools>),
    /// The model answered.
    Answered(Conversation<Finished<Answered>>),
    /// The model stopped for another reason.
    ModelStopped(Conversation<Finished<ModelStopped>>),
    /// The reply broke the protocol.
    ProtocolError(Conversation<Finished<ProtocolError>>),
    /// The reply was an empty `end_turn` and the policy is
    /// [`OnEmptyReply::Continue`]: the reply was dropped, [`OnEmptyReply::CONTINUE_PROMPT`]
    /// was appended as a user message, and the model is asked again.
    Continued(Conversation<AwaitingModel>),
    /// The answer failed the output check ([`Conversation::expect_output`])
    /// and a retry is left: the answer is in the history, followed by
    /// a user message naming `error` and asking for the JSON value alone,
    /// and the model is asked again.
    InvalidAnswer {
        /// The conversation, waiting for the model.
        next: Conversation<AwaitingModel>,
        /// Why the answer failed.
        error: String,
    },
    /// The answer failed the output check and no retry is left.
    InvalidOutput(Conversation<Finished<InvalidOutput>>),
}

/// What answering the tools led to.
#[derive(Debug)]
pub enum AfterTools {
    /// Budget left: ask the model again.
    Continue(Conversation<AwaitingModel>),
    /// Budget spent: finished with the results in the history.
    CallLimit(Conversation<Finished<CallLimit>>),
}

/// What answering a whole round led to ([`Conversation::answer_round`]).
#[derive(Debug)]
pub enum AfterRound {
    /// Budget left: ask the model again (a stop during the round ends the
    /// run at the next boundary).
    Continue(Conversation<AwaitingModel>),
    /// Budget spent: finished with the results in the history.
    CallLimit(Conversation<Finished<CallLimit>>),
    /// The run was stopped during its last round: finished with the stop's
    /// status, the round's results in the history.
    Stopped(Interrupted),
}

/// Results were refused ([`Conversation::submit`],
/// [`Conversation::answer_round`]); the unchanged state is handed back.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejected<C> {
    /// The conversation, as it was before the call.
    pub conversation: C,
    /// Why the results were refused.
    pub error: SubmitError,
}

/// The erased, serializable view of a finished conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Outcome {
    /// How it finished.
    pub status: StatusKind,
    /// The answer, or what stopped it.
    pub text: String,
    /// Model requests made.
    pub calls: u32,
    /// The whole history.
    pub messages: Vec<Message>,
    /// Token counts summed over every reply that reported them.
    #[serde(default)]
    pub usage: Usage,
    /// The answer's value, when the run checked its output against a schema
    /// and the answer matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Why the last answer did not match the output schema
    /// ([`StatusKind::InvalidOutput`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_error: Option<String>,
}

impl<S> Conversation<S> {
    /// The history so far: the question, replies and tool results.
    pub fn history(&self) -> &[Message] {
        &self.core.history
    }

    /// The system prompt.
    pub fn system(&self) -> &str {
        &self.core.system
    }

    /// Model requests made so far (including a failed one).
    pub fn calls_made(&self) -> u32 {
        self.core.calls
    }

    /// The call budget.
    pub fn budget(&self) -> Budget {
        self.core.budget
    }

    /// Token counts summed over the replies so far.
    pub fn usage(&self) -> Usage {
        self.core.usage
    }

    /// Finishes with the status and text of `interrupt`.
    fn stopped_by(self, interrupt: Interrupt) -> Interrupted {
        let text = interrupt.text;
        match interrupt.kind {
            InterruptKind::Deadline => {
                Interrupted::Deadline(self.finish(Deadline { _private: () }, text))
            }
            InterruptKind::TokenLimit => {
                Interrupted::TokenLimit(self.finish(TokenLimit { _private: () }, text))
            }
            InterruptKind::Cancelled => {
                Interrupted::Cancelled(self.finish(Cancelled { _private: () }, text))
            }
        }
    }

    fn finish<T: Status>(self, status: T, text: String) -> Conversation<Finished<T>> {
        Conversation {
            core: self.core,
            state: Finished {
                status,
                text,
                output: None,
            },
        }
    }
}

impl Conversation<Fresh> {
    /// A conversation not yet started, whose history is one user message,
    /// `question`: its configuration (system prompt, empty-reply policy,
    /// output check) is set here, then [`Conversation::begin`] starts it.
    /// [`Conversation::start`] does both with the defaults.
    pub fn new(question: &str, budget: Budget) -> Result<Self, InputError> {
        if question.trim().is_empty() {
            return Err(InputError::EmptyQuestion);
        }
        Ok(Self {
            core: Core {
                system: String::new(),
                history: vec![Message::user_text(question)],
                budget,
                calls: 0,
                base: 0,
                usage: Usage::default(),
                on_empty: OnEmptyReply::Stop,
                continued: false,
                output: None,
            },
            state: Fresh { _private: () },
        })
    }

    /// Sets the system prompt sent with every request (default: none).
    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.core.system = system.into();
        self
    }

    /// Sets what an empty `end_turn` reply leads to (default: [`OnEmptyReply::Stop`]).
    pub fn on_empty_reply(mut self, policy: OnEmptyReply) -> Self {
        self.core.on_empty = policy;
        self
    }

    /// Checks every answer with `check`: an answer whose text it refuses is
    /// sent back to the model with the reason, as a user message, up to
    /// `retries` times per question while
    /// calls are left ([`Reply::InvalidAnswer`]); after that the
    /// conversation finishes [`InvalidOutput`]. An answer it accepts
    /// finishes [`Answered`] with the value
    /// ([`Conversation::<Finished<Answered>>::output`]). Default: no check.
    pub fn expect_output(mut self, check: Arc<dyn OutputCheck>, retries: u32) -> Self {
        self.core.output = Some(Expected {
            check,
            retries,
            failed: 0,
        });
        self
    }

    /// Starts the conversation: it waits for the model, and its
    /// configuration is fixed from here on.
    pub fn begin(self) -> Conversation<AwaitingModel> {
        Conversation {
            core: self.core,
            state: AwaitingModel { _private: () },
        }
    }
}

impl Conversation<AwaitingModel> {
    /// Starts a conversation whose history is one user message, `question`,
    /// with the default configuration: no system prompt,
    /// [`OnEmptyReply::Stop`], no output check. To set any of them, start
    /// with [`Conversation::new`] instead.
    pub fn start(question: &str, budget: Budget) -> Result<Self, InputError> {
        Conversation::new(question, budget).map(Conversation::begin)
    }

    /// A rebuilt conversation (a resumed run's, rebuilt from its trace with
    /// the configuration the trace implies) configured again by the run
    /// that resumes it: its history and counts are kept, and what the
    /// resuming run sets replaces what the rebuild set (an output check set
    /// again starts its failures at zero).
    pub(crate) fn reopen(self) -> Conversation<Fresh> {
        Conversation {
            core: self.core,
            state: Fresh { _private: () },
        }
    }

    /// Gives the current question the call budget `budget` (a resumed run:
    /// its history was rebuilt without one). The calls this question already
    /// made count; when they use it all, they are handed back as the error.
    pub(crate) fn rebudget(mut self, budget: Budget) -> Result<Self, u32> {
        let made = self.core.question_calls();
        if made >= budget.get() {
            return Err(made);
        }
        self.core.budget = budget;
        Ok(self)
    }

    /// The next request, borrowing the history (nothing is copied).
    pub fn request<'a>(
        &'a self,
        tools: &'a [ToolDefinition],
        attachment: Option<&'a str>,
    ) -> Request<'a> {
        Request {
            system: &self.core.system,
            tools,
            messages: &self.core.history,
            attachment,
            output: self
                .core
                .output
                .as_ref()
                .map(|expected| expected.check.schema()),
        }
    }

    /// Makes the history shorter with `compactor`
    /// ([`crate::core::compaction`]). Only a conversation waiting for the
    /// model has this transition, so no call can be split from its result.
    /// The proposed history is taken only if it keeps the protocol (it
    /// starts and ends with a user message, every call is answered in the
    /// next message, no result answers a call that is not right before it)
    /// and keeps the question (the first block of the first message) and
    /// the current question (a follow-up's); otherwise the conversation comes back
    /// unchanged with the reason. The calls made, the budget and the usage
    /// are kept.
    ///
    /// ```
    /// use subloop::core::compaction::ClearToolResults;
    /// use subloop::core::conversation::{AfterTools, Compacted, Reply, ToolOutput};
    /// use subloop::{Budget, Conversation, ModelResponse};
    /// use serde_json::json;
    /// let conversation = Conversation::start("hi", Budget::new(4).unwrap()).unwrap();
    /// let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
    /// let Reply::Tools(pending) = conversation.receive(reply) else { unreachable!() };
    /// let AfterTools::Continue(next) = pending.answer_with(|_| ToolOutput::ok("a long file")) else {
    ///     unreachable!()
    /// };
    /// let Compacted::Shortened(next) = next.compact(&ClearToolResults::new(0)) else { unreachable!() };
    /// assert_eq!(next.history().len(), 3); // the call and its (cleared) result stay paired
    /// ```
    pub fn compact(self, compactor: &dyn crate::core::compaction::Compactor) -> Compacted {
        use crate::core::compaction::check;
        let Some(history) = compactor.compact(&self.core.history) else {
            return Compacted::Unchanged(self);
        };
        // The question stays first, and the current question (a
        // follow-up's) stays too.
        let first_kept = match (self.core.history.first(), history.first()) {
            (Some(before), Some(after)) => {
                !after.content.is_empty() && after.content.first() == before.content.first()
            }
            _ => false,
        };
        let current = crate::core::compaction::current_question(&self.core.history)
            .and_then(|index| self.core.history.get(index))
            .and_then(|message| message.content.first());
        let current_kept = current.is_none_or(|block| {
            history
                .iter()
                .any(|message| message.role == Role::User && message.content.first() == Some(block))
        });
        let question_kept = first_kept && current_kept;
        let verdict = check(&history).and_then(|()| {
            if question_kept {
                Ok(())
            } else {
                Err("the question is not kept".to_owned())
            }
        });
        match verdict {
            Ok(()) => {
                let mut next = self;
                next.core.history = history;
                Compacted::Shortened(next)
            }
            Err(reason) => Compacted::Refused {
                reason: format!(
                    "{} proposed a history that breaks the protocol: {reason}",
                    compactor.name()
                ),
                conversation: self,
            },
        }
    }

    /// Adds what a request outside the conversation's own turns spent (a
    /// summary for a compaction) to its usage.
    pub(crate) fn spent(mut self, usage: Option<Usage>) -> Self {
        if let Some(usage) = &usage {
            self.core.usage.add(usage);
        }
        self
    }

    /// Stops at this turn boundary, before the next model request, for a
    /// run-wide reason (deadline, token budget, cancellation).
    pub fn interrupt(self, interrupt: Interrupt) -> Interrupted {
        self.stopped_by(interrupt)
    }

    /// The request in flight was abandoned (or failed) while the run was
    /// being stopped: finish with the stop's status; the request counts.
    pub fn interrupt_in_flight(mut self, interrupt: Interrupt) -> Interrupted {
        self.core.calls += 1;
        self.interrupt(interrupt)
    }

    /// The request was refused because the history does not fit the
    /// model's context window (`failure`, of kind
    /// [`FailureKind::ContextWindow`](crate::core::error::FailureKind::ContextWindow)):
    /// the refused request counts, and the only way on is a compaction
    /// that shortens the history. With a `compactor` (`Err`: why there is
    /// none — compaction is off, a hook blocked it) and budget left for
    /// another request, the
    /// history is compacted ([`Conversation::compact`]) and the model is
    /// asked again; otherwise, or when the history cannot be made shorter,
    /// the conversation finishes `context_overflow` — never a loop of
    /// refused requests.
    pub fn overflowed(
        mut self,
        failure: ModelFailure,
        compactor: Result<&dyn crate::core::compaction::Compactor, &str>,
    ) -> Overflow {
        self.core.calls += 1;
        let why = match compactor {
            Err(why) => why.to_owned(),
            Ok(_) if self.core.question_calls() >= self.core.budget.get() => {
                "no call is left to ask again after compacting".to_owned()
            }
            Ok(compactor) => match self.compact(compactor) {
                Compacted::Shortened(next) => return Overflow::Compacted(next),
                Compacted::Unchanged(same) => {
                    self = same;
                    format!("{} cannot make it shorter", compactor.name())
                }
                Compacted::Refused {
                    conversation,
                    reason,
                } => {
                    self = conversation;
                    reason
                }
            },
        };
        let text =
            format!("the history does not fit the model's context window ({why}): {failure}");
        Overflow::Overflowed(self.finish(ContextOverflow { failure }, text))
    }

    /// The request failed: finish `model_error`. The failed request counts against the budget.
    pub fn model_failed(mut self, failure: ModelFailure) -> Conversation<Finished<ModelError>> {
        self.core.calls += 1;
        let text = format!("model request failed: {failure}");
        self.finish(ModelError { failure }, text)
    }

    /// Takes the model's reply and decides what comes next.
    ///
    /// The reply is checked once, here: every block of a known type, tool_use
    /// ids non-empty and unique, stop reason and content in agreement. A
    /// reply stopped for another reason (`max_tokens`, `pause_turn`,
    /// `refusal`, …) finishes `model_stopped` even when it holds blocks of
    /// types this crate does not model; those are shown in the status text.
    /// An empty `end_turn` is `protocol_error`, unless the policy is
    /// [`OnEmptyReply::Continue`] (see [`Reply::Continued`]). An accepted
    /// reply is appended to the history before any tool runs; a rejected one
    /// is kept in the final status, not in the history.
    pub fn receive(mut self, reply: ModelResponse) -> Reply {
        self.core.calls += 1;
        if let Some(usage) = &reply.usage {
            self.core.usage.add(usage);
        }
        // Checked by reference first: a rejected reply is kept whole in its status.
        // A reply that stops for another reason (max_tokens, pause_turn,
        // refusal, …) finishes model_stopped whatever blocks it holds: its
        // unknown blocks are shown in the status text, not judged.
        if !stops_otherwise(reply.stop_reason.as_ref())
            && let Err(violation) = check_blocks(&reply)
        {
            return self.reject(violation, reply);
        }
        let count = match check_calls(&reply) {
            Ok(count) => count,
            Err(violation) => return self.reject(violation, reply),
        };
        let text = || join_text(reply.content.iter().filter_map(known));
        match reply.stop_reason {
            Some(StopReason::EndTurn) => {
                let text = text();
                if count > 0 {
                    self.reject(Violation::EndTurnWithCalls { count }, reply)
                } else if text.trim().is_empty() {
                    self.empty_reply(reply)
                } else {
                    self.core.continued = false;
                    self.core.history.push(assistant(into_blocks(reply)));
                    self.answered(text)
                }
            }
            Some(StopReason::ToolUse) => {
                if count == 0 {
                    return self.reject(Violation::ToolUseWithoutCalls, reply);
                }
                self.core.continued = false;
                let message = assistant(into_blocks(reply));
                let calls = message
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        Block::ToolUse { id, name, input } => Some(ToolCall {
                            id: id.clone(),
                            name: name.clone(),
                            input: input.clone(),
                        }),
                        _ => None,
                    })
                    .collect();
                self.core.history.push(message);
                Reply::Tools(Conversation {
                    core: self.core,
                    state: AwaitingTools { calls },
                })
            }
            ref other => {
                let text = text();
                let reason = other.clone();
                let mut message = match &reason {
                    Some(reason) => format!("model stopped: {reason}"),
                    None => "model stopped without a stop reason".to_owned(),
                };
                if !text.trim().is_empty() {
                    message.push('\n');
                    message.push_str(&text);
                }
                for block in &reply.content {
                    if let ReplyBlock::Unsupported { kind, raw, .. } = block {
                        message.push_str(&format!("\n[unsupported `{kind}` block: {raw}]"));
                    }
                }
                // Calls in a reply that stopped for another reason (one cut by
                // max_tokens in the middle of a call, say) are not run: say so.
                let dropped: Vec<String> = reply
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ReplyBlock::Known(Block::ToolUse { id, name, .. }) => {
                            Some(format!("{name} ({id})"))
                        }
                        _ => None,
                    })
                    .collect();
                if !dropped.is_empty() {
                    message.push_str(&format!(
                        "\n[{} tool call(s) in this reply did not run, since it stopped before it was finished: {}]",
                        dropped.len(),
                        dropped.join(", ")
                    ));
                }
                Reply::ModelStopped(self.finish(ModelStopped { reason, reply }, message))
            }
        }
    }

    /// An answer (already in the history), checked against the expected
    /// output if there is one.
    fn answered(mut self, text: String) -> Reply {
        let calls_left = self.core.question_calls() < self.core.budget.get();
        let Some(expected) = &mut self.core.output else {
            return Reply::Answered(self.finish(Answered { _private: () }, text));
        };
        match expected.check.check(&text) {
            Ok(value) => {
                let mut done = self.finish(Answered { _private: () }, text);
                done.state.output = Some(value);
                Reply::Answered(done)
            }
            Err(error) if expected.failed < expected.retries && calls_left => {
                expected.failed += 1;
                self.core
                    .history
                    .push(Message::user_text(output_retry_prompt(&error)));
                Reply::InvalidAnswer {
                    next: Conversation {
                        core: self.core,
                        state: AwaitingModel { _private: () },
                    },
                    error,
                }
            }
            Err(error) => Reply::InvalidOutput(self.finish(InvalidOutput { error }, text)),
        }
    }

    /// An empty `end_turn`: answered with [`OnEmptyReply::CONTINUE_PROMPT`] once in a row
    /// when the policy says so and a call is left, else `protocol_error`.
    fn empty_reply(mut self, reply: ModelResponse) -> Reply {
        let allowed = self.core.on_empty == OnEmptyReply::Continue;
        if allowed && !self.core.continued && self.core.question_calls() < self.core.budget.get() {
            self.core.continued = true;
            self.core.history.push(Message::user_text(CONTINUE_PROMPT));
            return Reply::Continued(Conversation {
                core: self.core,
                state: AwaitingModel { _private: () },
            });
        }
        let mut done = self.reject(Violation::EndTurnWithoutText, reply);
        if let Reply::ProtocolError(finished) = &mut done
            && allowed
        {
            finished.state.text.push_str(if finished.core.continued {
                SECOND_EMPTY_REPLY_NOTE
            } else {
                NO_CALL_TO_CONTINUE_NOTE
            });
        }
        done
    }

    fn reject(self, violation: Violation, reply: ModelResponse) -> Reply {
        let text = format!("protocol error: {violation}");
        Reply::ProtocolError(self.finish(ProtocolError { violation, reply }, text))
    }
}

/// What the text of an empty reply's `protocol_error` ends with under
/// [`OnEmptyReply::Continue`] when it is the second empty reply in a row.
pub(crate) const SECOND_EMPTY_REPLY_NOTE: &str =
    " (a second empty reply in a row, after asking the model to continue)";

/// What the text of an empty reply's `protocol_error` ends with under
/// [`OnEmptyReply::Continue`] when no model call was left to ask again.
pub(crate) const NO_CALL_TO_CONTINUE_NOTE: &str =
    " (no model call left to ask the model to continue)";

/// The stored form of an accepted reply. Empty text blocks are dropped: the
/// API refuses them when the history is sent back, and they say nothing.
fn assistant(mut content: Vec<Block>) -> Message {
    content.retain(|block| !matches!(block, Block::Text { text } if text.is_empty()));
    Message {
        role: Role::Assistant,
        content,
    }
}

fn known(block: &ReplyBlock) -> Option<&Block> {
    match block {
        ReplyBlock::Known(block) => Some(block),
        ReplyBlock::Unsupported { .. } => None,
    }
}

/// Whether `reason` finishes the conversation `model_stopped`: a stop reason
/// other than `end_turn` and `tool_use` (a missing one is judged like those).
fn stops_otherwise(reason: Option<&StopReason>) -> bool {
    !matches!(
        reason,
        None | Some(StopReason::EndTurn | StopReason::ToolUse)
    )
}

/// Every block must be of a known type with well-formed fields.
fn check_blocks(reply: &ModelResponse) -> Result<(), Violation> {
    match reply.content.iter().find_map(|block| match block {
        ReplyBlock::Unsupported { kind, reason, .. } => Some((kind, reason)),
        ReplyBlock::Known(_) => None,
    }) {
        Some((kind, reason)) => Err(Violation::UnsupportedBlock {
            kind: kind.clone(),
            reason: reason.clone(),
        }),
        None => Ok(()),
    }
}

/// Every tool_use needs a non-empty id, unique within the reply, and a name;
/// returns how many there are.
fn check_calls(reply: &ModelResponse) -> Result<usize, Violation> {
    let mut seen: Vec<&str> = Vec::new();
    let mut set: HashSet<&str> = HashSet::new();
    for (index, block) in reply.content.iter().enumerate() {
        if let Some(Block::ToolUse { id, name, .. }) = known(block) {
            if id.as_str().is_empty() {
                return Err(Violation::EmptyId { index });
            }
            // A short list is scanned; a long one goes through a set.
            let repeated = if seen.len() < 16 {
                seen.contains(&id.as_str())
            } else {
                if set.is_empty() {
                    set.extend(seen.iter().copied());
                }
                !set.insert(id.as_str())
            };
            if repeated {
                return Err(Violation::DuplicateId { id: id.clone() });
            }
            seen.push(id.as_str());
            if name.is_empty() {
                return Err(Violation::EmptyName { id: id.clone() });
            }
        }
    }
    Ok(seen.len())
}

/// The blocks of a checked reply, moved out of it.
fn into_blocks(reply: ModelResponse) -> Vec<Block> {
    reply
        .content
        .into_iter()
        .filter_map(|block| match block {
            ReplyBlock::Known(block) => Some(block),
            ReplyBlock::Unsupported { .. } => None,
        })
        .collect()
}

impl Conversation<AwaitingTools> {
    /// The pending calls, in the order the model wrote them.
    pub fn calls(&self) -> &[ToolCall] {
        &self.state.calls
    }

    /// Answers every pending call, in order, with `answer`. The machine pairs
    /// each output with its call's id, so a mismatch cannot be written.
    pub fn answer_with(self, mut answer: impl FnMut(&ToolCall) -> ToolOutput) -> AfterTools {
        let blocks = self
            .state
            .calls
            .iter()
            .map(|call| {
                let output = answer(call);
                result_block(call.id.clone(), output.content, output.is_error)
            })
            .collect();
        self.after_results(blocks)
    }

    /// Answers a whole round with `outputs`, one per call in call order (a
    /// call without one is answered as an error saying so), for an executor
    /// that ran the round itself (the driver's `Executor::execute_round`).
    /// `stopped` is the interrupt that stopped the round, if one did: when
    /// the round also spent the last call of the budget, the conversation
    /// finishes with the interrupt's status rather than `call_limit`, since
    /// the stop, not the budget, ended it; with budget left it goes on, and
    /// the stop ends it at the next boundary.
    ///
    /// More outputs than pending calls are refused
    /// ([`SubmitError::TooMany`]) and the unchanged conversation is handed
    /// back, as [`Conversation::submit`] refuses a mismatch: which output
    /// answers which call is then unknown, so none is stored.
    ///
    /// ```
    /// use subloop::core::conversation::{Reply, ToolOutput};
    /// use subloop::core::error::SubmitError;
    /// use subloop::{Budget, Conversation, ModelResponse};
    /// use serde_json::json;
    /// let conversation = Conversation::start("hi", Budget::new(2).unwrap()).unwrap();
    /// let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
    /// let Reply::Tools(pending) = conversation.receive(reply) else { unreachable!() };
    /// let outputs = vec![ToolOutput::ok("a"), ToolOutput::ok("b")];
    /// let rejected = pending.answer_round(outputs, None).unwrap_err();
    /// assert_eq!(rejected.error, SubmitError::TooMany { calls: 1, outputs: 2 });
    /// assert_eq!(rejected.conversation.calls().len(), 1); // still waiting for its result
    /// ```
    // The state is handed back by value, as `submit` does.
    #[allow(clippy::result_large_err)]
    pub fn answer_round(
        self,
        outputs: Vec<ToolOutput>,
        stopped: Option<Interrupt>,
    ) -> Result<AfterRound, Rejected<Self>> {
        if outputs.len() > self.state.calls.len() {
            return Err(Rejected {
                error: SubmitError::TooMany {
                    calls: self.state.calls.len(),
                    outputs: outputs.len(),
                },
                conversation: self,
            });
        }
        let mut outputs = outputs.into_iter();
        let after = self.answer_with(|call| {
            outputs.next().unwrap_or_else(|| {
                ToolOutput::error(format!(
                    "{} failed: the round gave no result for this call",
                    call.name()
                ))
            })
        });
        Ok(match (after, stopped) {
            (AfterTools::Continue(next), _) => AfterRound::Continue(next),
            (AfterTools::CallLimit(done), None) => AfterRound::CallLimit(done),
            (AfterTools::CallLimit(done), Some(interrupt)) => {
                AfterRound::Stopped(done.stopped_by(interrupt))
            }
        })
    }

    /// The raw form, for hosts and fuzzers: results in any order, one per
    /// pending id. Missing, foreign or duplicate ids are refused and the
    /// unchanged conversation is handed back. Accepted results are stored in
    /// call order.
    // The state is handed back by value on purpose (as ureq-proto does): no
    // allocation on the happy path, and the caller keeps ownership.
    #[allow(clippy::result_large_err)]
    pub fn submit(self, results: Vec<ToolResult>) -> Result<AfterTools, Rejected<Self>> {
        match order_results(&self.state.calls, results) {
            Ok(blocks) => Ok(self.after_results(blocks)),
            Err(error) => Err(Rejected {
                conversation: self,
                error,
            }),
        }
    }

    fn after_results(mut self, blocks: Vec<Block>) -> AfterTools {
        self.core.history.push(Message {
            role: Role::User,
            content: blocks,
        });
        if self.core.question_calls() >= self.core.budget.get() {
            let text = format!(
                "call limit reached: {} model request(s) used; the last tool results are in the history",
                self.core.question_calls()
            );
            AfterTools::CallLimit(self.finish(CallLimit { _private: () }, text))
        } else {
            AfterTools::Continue(Conversation {
                core: self.core,
                state: AwaitingModel { _private: () },
            })
        }
    }
}

fn result_block(tool_use_id: ToolUseId, content: impl Into<SharedText>, is_error: bool) -> Block {
    Block::ToolResult {
        tool_use_id,
        content: ToolResultContent::Text(content.into()),
        is_error,
    }
}

fn order_results(calls: &[ToolCall], results: Vec<ToolResult>) -> Result<Vec<Block>, SubmitError> {
    let mut slots: Vec<Option<ToolResult>> = vec![None; calls.len()];
    for result in results {
        let index = calls
            .iter()
            .position(|call| call.id == result.tool_use_id)
            .ok_or_else(|| SubmitError::Foreign(result.tool_use_id.clone()))?;
        let slot = slots
            .get_mut(index)
            .ok_or_else(|| SubmitError::Foreign(result.tool_use_id.clone()))?;
        if slot.is_some() {
            return Err(SubmitError::Duplicate(result.tool_use_id));
        }
        *slot = Some(result);
    }
    calls
        .iter()
        .zip(slots)
        .map(|(call, slot)| {
            slot.map(|result| result_block(result.tool_use_id, result.content, result.is_error))
                .ok_or_else(|| SubmitError::Missing(call.id.clone()))
        })
        .collect()
}

impl<S: Status> Conversation<Finished<S>> {
    /// The erased status.
    pub fn status_kind(&self) -> StatusKind {
        S::KIND
    }

    /// The typed status, with its details.
    pub fn status(&self) -> &S {
        &self.state.status
    }

    /// The answer, or what stopped the conversation.
    pub fn text(&self) -> &str {
        &self.state.text
    }

    /// The erased, serializable view.
    pub fn into_outcome(self) -> Outcome {
        let output_error = self.state.status.output_error().map(str::to_owned);
        Outcome {
            status: S::KIND,
            text: self.state.text,
            calls: self.core.calls,
            messages: self.core.history,
            usage: self.core.usage,
            output: self.state.output,
            output_error,
        }
    }
}

impl Conversation<Finished<Answered>> {
    /// The answer's value, when the conversation checked its output
    /// ([`Conversation::expect_output`]).
    pub fn output(&self) -> Option<&Value> {
        self.state.output.as_ref()
    }
}

impl Conversation<Finished<Answered>> {
    /// Whether the current question has a model call left (so that
    /// [`Conversation::keep_going`] can go on).
    pub fn calls_left(&self) -> bool {
        self.core.question_calls() < self.core.budget.get()
    }

    /// The answer is not taken as the end (a `Stop` hook blocked it):
    /// `message` is appended as a user message and the model is asked
    /// again, within the current question's budget — unlike
    /// [`Conversation::follow_up`], which gives a new question a budget of
    /// its own. With no call left, or an empty message, the answered
    /// conversation is handed back unchanged.
    // The conversation is handed back by value, as `submit` does.
    #[allow(clippy::result_large_err)]
    pub fn keep_going(self, message: &str) -> Result<Conversation<AwaitingModel>, Self> {
        if message.trim().is_empty() || !self.calls_left() {
            return Err(self);
        }
        let mut core = self.core;
        core.history.push(Message::user_text(message));
        core.continued = false;
        Ok(Conversation {
            core,
            state: AwaitingModel { _private: () },
        })
    }
}

impl Conversation<Finished<Answered>> {
    /// Asks a follow-up question: the answered history with `question`
    /// appended as a user message, waiting for the model. The call `budget`
    /// is the new question's own; [`Conversation::calls_made`] and the token
    /// counts go on from the earlier questions. Only an answered
    /// conversation takes one — a conversation stopped for any other reason
    /// has no such transition:
    ///
    /// ```compile_fail
    /// use subloop::core::conversation::{AfterTools, Reply, ToolOutput};
    /// use subloop::{Budget, Conversation, ModelResponse};
    /// use serde_json::json;
    /// let budget = Budget::new(1).unwrap();
    /// let conversation = Conversation::start("hi", budget).unwrap();
    /// let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
    /// if let Reply::Tools(waiting) = conversation.receive(reply) {
    ///     if let AfterTools::CallLimit(done) = waiting.answer_with(|_| ToolOutput::ok("x")) {
    ///         done.follow_up("and now?", budget); // no `follow_up` on Finished<CallLimit>
    ///     }
    /// }
    /// ```
    ///
    /// An empty question is refused and the answered conversation handed back.
    // The conversation is handed back by value, as `submit` does.
    #[allow(clippy::result_large_err)]
    pub fn follow_up(
        self,
        question: &str,
        budget: Budget,
    ) -> Result<Conversation<AwaitingModel>, (Self, InputError)> {
        if question.trim().is_empty() {
            return Err((self, InputError::EmptyQuestion));
        }
        let mut core = self.core;
        core.history.push(Message::user_text(question));
        core.budget = budget;
        core.base = core.calls;
        core.continued = false;
        if let Some(expected) = &mut core.output {
            expected.failed = 0;
        }
        Ok(Conversation {
            core,
            state: AwaitingModel { _private: () },
        })
    }
}

impl Reply {
    /// The erased outcome if the reply finished the conversation, else the
    /// reply itself ([`Reply::Tools`] or [`Reply::Continued`]).
    // The reply is handed back by value, as `submit` does.
    #[allow(clippy::result_large_err)]
    pub fn finished(self) -> Result<Outcome, Self> {
        match self {
            Self::Tools(_) | Self::Continued(_) | Self::InvalidAnswer { .. } => Err(self),
            Self::Answered(done) => Ok(done.into_outcome()),
            Self::InvalidOutput(done) => Ok(done.into_outcome()),
            Self::ModelStopped(done) => Ok(done.into_outcome()),
            Self::ProtocolError(done) => Ok(done.into_outcome()),
        }
    }
}
