//! Wire types of the Anthropic Messages API, as plain serde types.
//!
//! These mirror the JSON bodies exactly: a [`Message`] is `{"role", "content"}`,
//! content is a list of [`Block`]s tagged by `"type"`, a model reply is a
//! [`ModelResponse`]. Two odd wire shapes are accepted by small custom
//! deserializers rather than by loosening the types:
//!
//! * a message whose `content` is a bare string parses as one text block;
//! * a reply block of a type this crate does not know (or a known type with
//!   broken fields) parses as [`ReplyBlock::Unsupported`], so the conversation
//!   can finish with a `protocol_error` that names it instead of failing to
//!   parse the whole reply (a reply stopped for another reason, such as
//!   `pause_turn`, finishes `model_stopped` and shows the block instead).
//!
//! Thinking blocks (`thinking`, `redacted_thinking`) are kept and sent back
//! unchanged.

use std::borrow::Borrow;
use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The id the model gives a `tool_use` block; its result must carry the same id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolUseId(String);

impl ToolUseId {
    /// Wraps a string as an id. Emptiness is checked by the conversation, not here,
    /// so that a hostile reply can be represented and rejected with a reason.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ToolUseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Borrow<str> for ToolUseId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user, or the host speaking for the tools (tool results travel as user messages).
    User,
    /// The model.
    Assistant,
}

/// The content of a `tool_result` block: a string, or a list of blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    /// Plain text (what this crate's tools produce).
    Text(String),
    /// Structured content, as the API also allows.
    Blocks(Vec<Block>),
}

impl ToolResultContent {
    /// The text of the result: the string, or the text blocks joined by newlines.
    pub fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Blocks(blocks) => join_text(blocks.iter()),
        }
    }
}

/// One content block of a message, tagged by `"type"` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// `{"type": "text", "text": ...}`
    Text {
        /// The text.
        text: String,
    },
    /// `{"type": "tool_use", "id", "name", "input"}`: the model asks for a tool.
    ToolUse {
        /// The id its result must carry.
        id: ToolUseId,
        /// The tool's name.
        name: String,
        /// The arguments, a JSON value (an object for well-formed calls). A
        /// string holds arguments that arrived as text that is not a JSON
        /// object (Chat Completions' `function.arguments`), kept to be sent
        /// back exactly as received; such a call is refused, never run.
        input: Value,
    },
    /// `{"type": "tool_result", "tool_use_id", "content", "is_error"}`: a tool's answer.
    ToolResult {
        /// The id of the call this answers.
        tool_use_id: ToolUseId,
        /// What the tool said.
        content: ToolResultContent,
        /// Whether the call failed or was refused.
        #[serde(default, skip_serializing_if = "is_false")]
        is_error: bool,
    },
    /// `{"type": "thinking", "thinking", "signature"}`: kept and sent back unchanged.
    Thinking {
        /// The model's visible reasoning.
        thinking: String,
        /// The API's signature over it.
        signature: String,
    },
    /// `{"type": "redacted_thinking", "data"}`: kept and sent back unchanged.
    RedactedThinking {
        /// Opaque encrypted reasoning.
        data: String,
    },
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Block {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// A tool_use block.
    pub fn tool_use(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        Self::ToolUse {
            id: ToolUseId::new(id),
            name: name.into(),
            input,
        }
    }

    /// The wire name of this block's type (`"text"`, `"tool_use"`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text { .. } => "text",
            Self::ToolUse { .. } => "tool_use",
            Self::ToolResult { .. } => "tool_result",
            Self::Thinking { .. } => "thinking",
            Self::RedactedThinking { .. } => "redacted_thinking",
        }
    }
}

/// One message of the history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its blocks. A bare-string `content` on the wire becomes one text block.
    pub content: Vec<Block>,
}

impl Message {
    /// A user message holding one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: vec![Block::text(text)],
        }
    }

    /// The message's text blocks joined by newlines.
    pub fn text(&self) -> String {
        join_text(self.content.iter())
    }
}

/// Joins the non-empty text blocks among `blocks` with newlines.
pub(crate) fn join_text<'a>(blocks: impl Iterator<Item = &'a Block>) -> String {
    let mut out = String::new();
    for block in blocks {
        // Empty text blocks say nothing; they are skipped (and not stored).
        if let Block::Text { text } = block
            && !text.is_empty()
        {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
    }
    out
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Content {
            Text(String),
            Blocks(Vec<Block>),
        }
        #[derive(Deserialize)]
        struct Wire {
            role: Role,
            content: Content,
        }
        let wire = Wire::deserialize(deserializer)?;
        let content = match wire.content {
            Content::Text(text) => vec![Block::Text { text }],
            Content::Blocks(blocks) => blocks,
        };
        Ok(Self {
            role: wire.role,
            content,
        })
    }
}

/// Why the model stopped, as the API's `stop_reason` string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// `end_turn`: the model finished its turn.
    EndTurn,
    /// `tool_use`: the model asks for tools.
    ToolUse,
    /// `max_tokens`: the reply hit the token limit.
    MaxTokens,
    /// `stop_sequence`: a stop sequence matched.
    StopSequence,
    /// `pause_turn`: a long server-side turn was paused.
    PauseTurn,
    /// `refusal`: the model declined.
    Refusal,
    /// `model_context_window_exceeded`: the context window is full.
    ModelContextWindowExceeded,
    /// Any other string, kept as sent.
    Other(String),
}

impl StopReason {
    /// The wire string.
    pub fn as_str(&self) -> &str {
        match self {
            Self::EndTurn => "end_turn",
            Self::ToolUse => "tool_use",
            Self::MaxTokens => "max_tokens",
            Self::StopSequence => "stop_sequence",
            Self::PauseTurn => "pause_turn",
            Self::Refusal => "refusal",
            Self::ModelContextWindowExceeded => "model_context_window_exceeded",
            Self::Other(other) => other,
        }
    }

    /// Parses a wire string; unknown strings become [`StopReason::Other`].
    pub fn parse(text: &str) -> Self {
        match text {
            "end_turn" => Self::EndTurn,
            "tool_use" => Self::ToolUse,
            "max_tokens" => Self::MaxTokens,
            "stop_sequence" => Self::StopSequence,
            "pause_turn" => Self::PauseTurn,
            "refusal" => Self::Refusal,
            "model_context_window_exceeded" => Self::ModelContextWindowExceeded,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for StopReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StopReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Self::parse(&text))
    }
}

/// Token counts the API reports for one reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens billed at the full rate.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default, deserialize_with = "null_as_zero")]
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default, deserialize_with = "null_as_zero")]
    pub cache_read_input_tokens: u64,
}

impl Usage {
    /// Adds `other` to these counts, saturating (a hostile reply may claim any number).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_creation_input_tokens = self
            .cache_creation_input_tokens
            .saturating_add(other.cache_creation_input_tokens);
        self.cache_read_input_tokens = self
            .cache_read_input_tokens
            .saturating_add(other.cache_read_input_tokens);
    }

    /// Input plus output tokens, saturating: what a run's token budget counts.
    pub fn billed(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

fn null_as_zero<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    Ok(Option::<u64>::deserialize(deserializer)?.unwrap_or(0))
}

/// A block of a model reply: a known [`Block`], or one this crate cannot use.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyBlock {
    /// A block of a known type with well-formed fields.
    Known(Block),
    /// A block of an unknown type, or a known type with missing or mistyped
    /// fields. The conversation rejects an `end_turn` or `tool_use` reply
    /// holding one (`protocol_error`); a reply stopped for another reason
    /// finishes `model_stopped` with the block shown in its status text.
    Unsupported {
        /// The block's `type` string (`"<missing>"` when absent or not a string).
        kind: String,
        /// Why it could not be used.
        reason: String,
        /// The block as received.
        raw: Value,
    },
}

impl From<Block> for ReplyBlock {
    fn from(block: Block) -> Self {
        Self::Known(block)
    }
}

impl Serialize for ReplyBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Known(block) => block.serialize(serializer),
            Self::Unsupported { raw, .. } => raw.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ReplyBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(deserializer)?;
        Ok(Self::from_value(raw))
    }
}

impl ReplyBlock {
    /// Classifies a raw JSON block. Never fails: what cannot be used is `Unsupported`.
    pub fn from_value(raw: Value) -> Self {
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
            .to_owned();
        match kind.as_str() {
            // `tool_result` is a user-side block: a model may not send one.
            "text" | "tool_use" | "thinking" | "redacted_thinking" => {
                match serde_json::from_value::<Block>(raw.clone()) {
                    Ok(block) => Self::Known(block),
                    Err(err) => Self::Unsupported {
                        kind,
                        reason: format!("malformed block: {err}"),
                        raw,
                    },
                }
            }
            "tool_result" => Self::Unsupported {
                kind,
                reason: "a model reply may not contain tool results".to_owned(),
                raw,
            },
            _ => Self::Unsupported {
                kind,
                reason: "block type not supported".to_owned(),
                raw,
            },
        }
    }
}

/// One reply of the model, as the Messages API returns it.
///
/// Other response fields (`id`, `model`, `type`, `role`, `stop_sequence`) are
/// accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The reply's blocks.
    pub content: Vec<ReplyBlock>,
    /// Why the model stopped; `None` when the field is absent or null.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// Token counts, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ModelResponse {
    /// A final answer: one text block, `end_turn`.
    pub fn answer(text: impl Into<String>) -> Self {
        Self {
            content: vec![Block::text(text).into()],
            stop_reason: Some(StopReason::EndTurn),
            usage: None,
        }
    }

    /// A reply asking for tools: the given `(id, name, input)` calls, `tool_use`.
    pub fn tool_calls<I, S1, S2>(calls: I) -> Self
    where
        I: IntoIterator<Item = (S1, S2, Value)>,
        S1: Into<String>,
        S2: Into<String>,
    {
        Self {
            content: calls
                .into_iter()
                .map(|(id, name, input)| Block::tool_use(id, name, input).into())
                .collect(),
            stop_reason: Some(StopReason::ToolUse),
            usage: None,
        }
    }

    /// Parses a reply from a JSON value; an error means "not a message".
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        if !value.is_object() {
            return Err(serde_json::Error::custom("a reply must be a JSON object"));
        }
        serde_json::from_value(value)
    }
}

/// What a tool definition looks like in a request's `tools` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON schema of its input.
    pub input_schema: Value,
}

/// Everything one model request needs, borrowed from the conversation and its host.
///
/// The history is borrowed, never copied: building a request costs the same on
/// the first turn and the thousandth.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The system prompt.
    pub system: &'a str,
    /// The tools offered (the same list the host dispatches with).
    pub tools: &'a [ToolDefinition],
    /// The history, oldest first; it always ends with a user message.
    pub messages: &'a [Message],
    /// A system attachment: extra system text for this request only (the
    /// current plan), sent after the system prompt; it is not part of the
    /// history. It never goes into a message: text after `tool_result`
    /// blocks is a documented cause of empty `end_turn` replies.
    pub attachment: Option<&'a str>,
}

impl Request<'_> {
    /// The system text blocks as they go on the wire, in order: the system
    /// prompt (the stable, cacheable part), then the attachment; empty ones
    /// are left out.
    pub fn system_blocks(&self) -> Vec<&str> {
        [Some(self.system), self.attachment]
            .into_iter()
            .flatten()
            .filter(|text| !text.is_empty())
            .collect()
    }

    /// The names of the tools offered, in order.
    pub fn tool_names(&self) -> Vec<&str> {
        self.tools.iter().map(|tool| tool.name.as_str()).collect()
    }
}
