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

use crate::core::shared_text::SharedText;

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
    /// Plain text (what this crate's tools produce), shared with the
    /// call's record.
    Text(SharedText),
    /// Structured content, as the API also allows.
    Blocks(Vec<Block>),
}

impl ToolResultContent {
    /// The text of the result: the string, or the text blocks joined by newlines.
    pub fn text(&self) -> String {
        match self {
            Self::Text(text) => text.to_string(),
            Self::Blocks(blocks) => join_text(blocks.iter()),
        }
    }
}

/// One content block of a message, tagged by `"type"` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
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
    /// `{"type": "compaction", "content", …}`: the Messages API's summary of
    /// the history before it (its server-side compaction, beta
    /// `compact-2026-01-12`); kept and sent back unchanged, every field of
    /// it, so the server reads the summary instead of what it replaced.
    Compaction {
        /// The summary; `None` when the server's compaction failed (the
        /// block is then a no-op, still sent back).
        #[serde(default)]
        content: Option<String>,
        /// Its other fields (`encrypted_content`, `signature`, …), as received.
        #[serde(flatten)]
        rest: serde_json::Map<String, Value>,
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
            Self::Compaction { .. } => "compaction",
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
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// `input` tokens billed at the full rate and `output` tokens, no cache.
    pub fn new(input: u64, output: u64) -> Self {
        Self {
            input_tokens: input,
            output_tokens: output,
            ..Self::default()
        }
    }

    /// These counts with `written` tokens written to the prompt cache and
    /// `read` tokens read from it.
    #[must_use]
    pub fn with_cache(mut self, written: u64, read: u64) -> Self {
        self.cache_creation_input_tokens = written;
        self.cache_read_input_tokens = read;
        self
    }

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
    /// The same as [`ReplyBlock::from_value`] of the block read as a `Value`,
    /// without building the block's own map when it is well formed.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ReplyBlockVisitor)
    }
}

struct ReplyBlockVisitor;

/// A key of a block, borrowed from the input when it can be.
struct BlockKey<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for BlockKey<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = BlockKey<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                key: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(BlockKey(key.into()))
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
                Ok(BlockKey(key.to_owned().into()))
            }
            fn visit_string<E: serde::de::Error>(self, key: String) -> Result<Self::Value, E> {
                Ok(BlockKey(key.into()))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> serde::de::Visitor<'de> for ReplyBlockVisitor {
    type Value = ReplyBlock;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a content block")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::Null))
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::Bool(v)))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::from(v)))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::from(v)))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::from(v)))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::String(v.to_owned())))
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<ReplyBlock, E> {
        Ok(ReplyBlock::from_value(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<ReplyBlock, D::Error> {
        ReplyBlock::deserialize(deserializer)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<ReplyBlock, A::Error> {
        let value = Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
        Ok(ReplyBlock::from_value(value))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ReplyBlock, A::Error> {
        let mut entries: Vec<(BlockKey<'de>, Value)> = Vec::new();
        while let Some(entry) = map.next_entry::<BlockKey<'de>, Value>()? {
            entries.push(entry);
        }
        if let Some(block) = take_known(&mut Entries(&mut entries)) {
            return Ok(ReplyBlock::Known(block));
        }
        // Not a well-formed known block: the map as a `Value` map would hold
        // it (a repeated key keeps its last value), for the reason and `raw`.
        let fields: serde_json::Map<String, Value> = entries
            .into_iter()
            .map(|(key, value)| (key.0.into_owned(), value))
            .collect();
        Ok(ReplyBlock::from_value(Value::Object(fields)))
    }
}

/// Field access for [`take_known`]: a JSON map, or a block's entries as read.
trait Fields {
    fn get(&self, key: &str) -> Option<&Value>;
    fn take(&mut self, key: &str) -> Option<Value>;
}

impl Fields for serde_json::Map<String, Value> {
    fn get(&self, key: &str) -> Option<&Value> {
        serde_json::Map::get(self, key)
    }
    fn take(&mut self, key: &str) -> Option<Value> {
        self.remove(key)
    }
}

/// Entries in the order read; as in a JSON map, the last of a repeated key counts.
struct Entries<'a, 'de>(&'a mut Vec<(BlockKey<'de>, Value)>);

impl Fields for Entries<'_, '_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0
            .iter()
            .rev()
            .find(|(name, _)| name.0 == key)
            .map(|(_, value)| value)
    }
    fn take(&mut self, key: &str) -> Option<Value> {
        self.0
            .iter_mut()
            .rev()
            .find(|(name, _)| name.0 == key)
            .map(|(_, value)| std::mem::take(value))
    }
}

impl ReplyBlock {
    /// Classifies a raw JSON block. Never fails: what cannot be used is `Unsupported`.
    pub fn from_value(mut raw: Value) -> Self {
        if let Value::Object(fields) = &mut raw
            && let Some(block) = take_known(fields)
        {
            return Self::Known(block);
        }
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
            .to_owned();
        match kind.as_str() {
            // `tool_result` is a user-side block: a model may not send one.
            "text" | "tool_use" | "thinking" | "redacted_thinking" | "compaction" => {
                // Read from a borrow: only the block's own fields are copied, not the whole value.
                match Block::deserialize(&raw) {
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

/// A well-formed block of a known model-side type, its fields moved out of
/// `raw` (no copy); `None`, with `raw` untouched, when any field it needs is
/// missing or mistyped, for serde to name the reason. Other fields are
/// ignored, as serde ignores them.
fn take_known(fields: &mut impl Fields) -> Option<Block> {
    #[derive(Clone, Copy)]
    enum Kind {
        Text,
        ToolUse,
        Thinking,
        RedactedThinking,
    }
    let kind = match fields.get("type").and_then(Value::as_str)? {
        "text" => Kind::Text,
        "tool_use" => Kind::ToolUse,
        "thinking" => Kind::Thinking,
        "redacted_thinking" => Kind::RedactedThinking,
        _ => return None,
    };
    let string = |fields: &dyn Fields, key: &str| matches!(fields.get(key), Some(Value::String(_)));
    let well_formed = match kind {
        Kind::Text => string(fields, "text"),
        Kind::ToolUse => {
            string(fields, "id") && string(fields, "name") && fields.get("input").is_some()
        }
        Kind::Thinking => string(fields, "thinking") && string(fields, "signature"),
        Kind::RedactedThinking => string(fields, "data"),
    };
    if !well_formed {
        return None;
    }
    let mut take = |key: &str| match fields.take(key) {
        Some(Value::String(text)) => text,
        _ => String::new(),
    };
    Some(match kind {
        Kind::Text => Block::Text { text: take("text") },
        Kind::ToolUse => {
            let id = ToolUseId(take("id"));
            let name = take("name");
            Block::ToolUse {
                id,
                name,
                input: fields.take("input").unwrap_or(Value::Null),
            }
        }
        Kind::Thinking => Block::Thinking {
            thinking: take("thinking"),
            signature: take("signature"),
        },
        Kind::RedactedThinking => Block::RedactedThinking { data: take("data") },
    })
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
        Self::read(&value)
    }

    /// [`ModelResponse::from_value`] read from a borrow: only what the
    /// reply keeps is copied.
    pub(crate) fn read(value: &Value) -> Result<Self, serde_json::Error> {
        if !value.is_object() {
            return Err(serde_json::Error::custom("a reply must be a JSON object"));
        }
        Self::deserialize(value)
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
    /// The JSON schema the answer must match, when the run asked for a
    /// structured answer: a provider with a native mechanism sends it
    /// (`output_config.format`, `response_format`); every answer is also
    /// checked locally.
    pub output: Option<&'a serde_json::Value>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Classification by serde alone (what `from_value` did before it took
    /// well-formed blocks apart by hand): the oracle for the fast path.
    fn by_serde(raw: Value) -> ReplyBlock {
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
            .to_owned();
        match kind.as_str() {
            "text" | "tool_use" | "thinking" | "redacted_thinking" | "compaction" => {
                match serde_json::from_value::<Block>(raw.clone()) {
                    Ok(block) => ReplyBlock::Known(block),
                    Err(err) => ReplyBlock::Unsupported {
                        kind,
                        reason: format!("malformed block: {err}"),
                        raw,
                    },
                }
            }
            "tool_result" => ReplyBlock::Unsupported {
                kind,
                reason: "a model reply may not contain tool results".to_owned(),
                raw,
            },
            _ => ReplyBlock::Unsupported {
                kind,
                reason: "block type not supported".to_owned(),
                raw,
            },
        }
    }

    fn field_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            Just(Value::from(7)),
            Just(Value::from("text")),
            Just(serde_json::json!({"path": "a"})),
            Just(serde_json::json!(["x"])),
        ]
    }

    fn block() -> impl Strategy<Value = Value> {
        let kind = prop_oneof![
            Just(Value::from("text")),
            Just(Value::from("tool_use")),
            Just(Value::from("thinking")),
            Just(Value::from("redacted_thinking")),
            Just(Value::from("tool_result")),
            Just(Value::from("image")),
            Just(Value::from(3)),
        ];
        let key = prop_oneof![
            Just("text"),
            Just("id"),
            Just("name"),
            Just("input"),
            Just("thinking"),
            Just("signature"),
            Just("data"),
            Just("citations"),
        ];
        (
            prop::option::of(kind),
            prop::collection::vec((key, field_value()), 0..6),
        )
            .prop_map(|(kind, fields)| {
                let mut object = serde_json::Map::new();
                for (key, value) in fields {
                    object.insert(key.to_owned(), value);
                }
                if let Some(kind) = kind {
                    object.insert("type".to_owned(), kind);
                }
                Value::Object(object)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]
        #[test]
        fn blocks_classify_as_serde_alone_would(raw in block()) {
            // Read from text (no map built for a well-formed block) and from a value.
            let read: ReplyBlock = serde_json::from_str(&raw.to_string()).expect("any JSON is a block");
            prop_assert_eq!(&read, &by_serde(raw.clone()));
            prop_assert_eq!(ReplyBlock::from_value(raw.clone()), by_serde(raw));
        }
    }

    #[test]
    fn blocks_read_from_text_match_blocks_read_as_values() {
        for text in [
            r#"{"type": "text", "text": "a", "text": "b"}"#,
            r#"{"type": "text", "text": 5, "text": "b"}"#,
            r#"{"type": "text", "text": "b", "text": 5}"#,
            r#"{"type": "image", "type": "text", "text": "x"}"#,
            r#"{"type": "text", "type": "image", "text": "x"}"#,
            r#"{"type": "tool_use", "id": "t", "name": "x", "input": {"a": [1, {"b": null}]}}"#,
            r#"{"type": "tool_use", "id": "t", "name": "x"}"#,
            r#"{"type": "thinking", "thinking": "t", "signature": "s", "signature": null}"#,
            r#"{}"#,
            r#"[1, {"type": "text"}]"#,
            r#""text""#,
            "null",
            "-1.5",
        ] {
            let value: Value = serde_json::from_str(text).expect("JSON");
            let read: ReplyBlock = serde_json::from_str(text).expect("a block");
            assert_eq!(read, by_serde(value.clone()), "{text}");
            assert_eq!(read, ReplyBlock::from_value(value), "{text}");
        }
    }

    #[test]
    fn well_formed_blocks_of_every_known_type_are_known() {
        for raw in [
            serde_json::json!({"type": "text", "text": "hi", "citations": null}),
            serde_json::json!({"type": "tool_use", "id": "t", "name": "read_file", "input": {"path": "a"}}),
            serde_json::json!({"type": "tool_use", "id": "t", "name": "x", "input": null}),
            serde_json::json!({"type": "thinking", "thinking": "hmm", "signature": "sig"}),
            serde_json::json!({"type": "redacted_thinking", "data": "opaque"}),
        ] {
            let block = ReplyBlock::from_value(raw.clone());
            assert!(matches!(block, ReplyBlock::Known(_)), "{raw}");
            assert_eq!(block, by_serde(raw));
        }
    }
}
