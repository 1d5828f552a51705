//! A client for the Anthropic Messages API, implementing [`Model`].
//!
//! Behind the `live` cargo feature (on by default). Requests are exactly the
//! Messages API body (`model`, `max_tokens`, `system`, `tools`, `messages`,
//! and `stream` when streaming), with prompt-caching breakpoints on the
//! system prompt, the last tool and the last history block, so a multi-turn
//! run re-reads its prefix from the cache. The request's attachment (the
//! plan) is a second system text block after the cached one: never a text
//! block after `tool_result` blocks, which the API documents as a cause of
//! empty `end_turn` replies. What this module holds is the protocol — the
//! settings ([`LiveConfig`]), the body, the headers, the reading of replies,
//! events and error bodies; the clients and models are the shared
//! [`http::Client`] and [`http::HttpModel`] speaking it, so sending,
//! retries, timeouts, the stop of a request in flight, streamed text and
//! key scrubbing are the [`http`] layer's; retries happen there, never in
//! the loop (see [`retry`]). Whatever finally fails becomes a
//! [`ModelFailure`](crate::core::error::ModelFailure) carrying the API's
//! `error.type` and `error.message`. The API key is sent only in
//! `x-api-key` and is scrubbed from every error text and every reply,
//! streamed text included (when it is long enough to be told from
//! ordinary text: eight characters or more);
//! the userinfo of the base URL is never printed.
//!
//! [`Model`]: crate::run::model::Model

pub(crate) mod sse;

use crate::providers::http::{self, ApiKey, ConfigError, redact_url};
use crate::providers::http::{retry, transport};

use serde::Serialize;
use serde_json::{Map, Value, json};

use self::retry::RetryPolicy;
use self::transport::Timeouts;
use crate::core::error::FailureKind;
use crate::core::protocol::{Message, ModelResponse, Request};
use crate::providers::failure::api_kind;
use crate::providers::http::is_http_url;
use crate::providers::http::protocol::{BodyCache, Protocol};

/// The HTTP client, shared by the parent's model and every child's.
pub type Client = http::Client<LiveConfig>;

/// A [`Model`](crate::run::model::Model) over a shared [`Client`].
pub type AnthropicModel = http::HttpModel<LiveConfig>;

/// The async HTTP client (feature `async`): the same requests, retries,
/// stream assembly and failures as [`Client`], sent through an
/// async transport (reqwest on
/// tokio).
#[cfg(feature = "async")]
pub type AsyncClient = http::Client<LiveConfig, dyn http::async_transport::AsyncTransport>;

/// An [`AsyncModel`](crate::run::model::AsyncModel) over a shared
/// [`AsyncClient`]: what [`AnthropicModel`] is to a blocking run.
#[cfg(feature = "async")]
pub type AsyncAnthropicModel =
    http::HttpModel<LiveConfig, dyn http::async_transport::AsyncTransport>;

/// The `error.type` and `error.message` of an API error body (or event).
pub(crate) fn api_error(body: &Value) -> (&str, &str) {
    let field = |path| body.pointer(path).and_then(Value::as_str);
    (
        field("/error/type").unwrap_or("api_error"),
        field("/error/message").unwrap_or("(no message)"),
    )
}

/// The kind and message of a Messages API error body, if it is one.
fn read_error(text: &str) -> Option<(FailureKind, String)> {
    let body: Value = serde_json::from_str(text).ok()?;
    body.pointer("/error/type")?;
    let (name, message) = api_error(&body);
    Some((api_kind(name, None, message), format!("{name}: {message}")))
}

/// Settings of the live client. `Debug` hides the key and the base URL's userinfo.
#[derive(Clone)]
#[non_exhaustive]
pub struct LiveConfig {
    /// The API key (sent as `x-api-key`).
    pub api_key: ApiKey,
    /// The model name.
    pub model: String,
    /// The API's base URL (without `/v1/messages`).
    pub base_url: String,
    /// `max_tokens` of each reply.
    pub max_tokens: u32,
    /// Connect, read and overall timeouts.
    pub timeouts: Timeouts,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Use the SSE event stream.
    pub stream: bool,
    /// The API's own tool-result clearing (context editing), when asked
    /// for: old tool results are cleared on the server before the prompt
    /// reaches the model, the history kept here stays whole, and each
    /// reply says what was cleared (`context_management.applied_edits`,
    /// kept in the trace's `response` line).
    pub clear_tool_uses: Option<ClearToolUses>,
    /// The API's own compaction, when asked for: past its trigger the
    /// server summarizes the history, the reply begins with a `compaction`
    /// block (`core::protocol::Block::Compaction`) that is kept in the
    /// history and sent back, and the server reads the summary instead of
    /// what it replaced.
    pub server_compaction: Option<ServerCompaction>,
}

/// The settings of the Messages API's server-side compaction
/// (`compact_20260112`, beta `compact-2026-01-12`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerCompaction {
    /// Compact once the prompt holds more input tokens than this (`None`:
    /// the API's default, 150,000).
    pub trigger_tokens: Option<u64>,
}

impl ServerCompaction {
    /// The edit's type.
    pub const TYPE: &'static str = "compact_20260112";
    /// The beta header value that enables it.
    pub const BETA: &'static str = "compact-2026-01-12";

    /// Compacts past `trigger_tokens` (the API's default when `None`).
    pub fn new(trigger_tokens: Option<u64>) -> Self {
        Self { trigger_tokens }
    }

    /// Its entry in `context_management.edits`.
    fn edit(&self) -> Value {
        Value::Object(edit_of(Self::TYPE, self.trigger_tokens))
    }
}

/// A `context_management` edit of `kind`, with its input-token trigger
/// when there is one.
fn edit_of(kind: &str, trigger_tokens: Option<u64>) -> Map<String, Value> {
    let mut edit = Map::new();
    edit.insert("type".into(), json!(kind));
    if let Some(tokens) = trigger_tokens {
        edit.insert(
            "trigger".into(),
            json!({"type": "input_tokens", "value": tokens}),
        );
    }
    edit
}

/// The `anthropic-beta` header with both context-management betas.
const BOTH_BETAS: &str = "context-management-2025-06-27,compact-2026-01-12";

/// The request's `context_management` field for `config`'s edits, if it
/// asks for any: tool-result clearing first, then compaction.
fn context_management(config: &LiveConfig) -> Option<Value> {
    let edits: Vec<Value> = config
        .clear_tool_uses
        .as_ref()
        .map(ClearToolUses::edit)
        .into_iter()
        .chain(
            config
                .server_compaction
                .as_ref()
                .map(ServerCompaction::edit),
        )
        .collect();
    (!edits.is_empty()).then(|| json!({"edits": edits}))
}

/// The settings of the Messages API's tool-result clearing
/// (`clear_tool_uses_20250919`, beta `context-management-2025-06-27`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClearToolUses {
    /// Clear once the prompt holds more input tokens than this (`None`:
    /// the API's default, 100,000).
    pub trigger_tokens: Option<u64>,
    /// The most recent tool uses kept whole (the API's default is 3).
    pub keep_tool_uses: u32,
    /// Tools whose results are never cleared (a child's bounded report).
    pub exclude_tools: Vec<String>,
}

impl ClearToolUses {
    /// The edit's type.
    pub const TYPE: &'static str = "clear_tool_uses_20250919";
    /// The beta header value that enables it.
    pub const BETA: &'static str = "context-management-2025-06-27";

    /// Clears past `trigger_tokens` (the API's default when `None`),
    /// keeping the last 3 tool uses and every `task` report.
    pub fn new(trigger_tokens: Option<u64>) -> Self {
        Self {
            trigger_tokens,
            keep_tool_uses: 3,
            exclude_tools: vec!["task".to_owned()],
        }
    }

    /// Its entry in `context_management.edits`.
    fn edit(&self) -> Value {
        let mut edit = edit_of(Self::TYPE, self.trigger_tokens);
        edit.insert(
            "keep".into(),
            json!({"type": "tool_uses", "value": self.keep_tool_uses}),
        );
        if !self.exclude_tools.is_empty() {
            edit.insert("exclude_tools".into(), json!(self.exclude_tools));
        }
        Value::Object(edit)
    }
}

impl std::fmt::Debug for LiveConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveConfig")
            .field("api_key", &self.api_key)
            .field("model", &self.model)
            .field("base_url", &self.display_base_url())
            .field("max_tokens", &self.max_tokens)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .field("stream", &self.stream)
            .field("clear_tool_uses", &self.clear_tool_uses)
            .field("server_compaction", &self.server_compaction)
            .finish()
    }
}

impl LiveConfig {
    /// The model used when neither `--model` nor `ANTHROPIC_MODEL` names one.
    pub const DEFAULT_MODEL: &'static str = "claude-sonnet-4-5";
    /// The official endpoint, unless `ANTHROPIC_BASE_URL` says otherwise.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";
    /// The `anthropic-version` header.
    pub const API_VERSION: &'static str = "2023-06-01";
    /// The default `max_tokens` of a reply.
    pub const DEFAULT_MAX_TOKENS: u32 = 4096;

    /// The base URL as it may be printed: without its userinfo.
    pub fn display_base_url(&self) -> String {
        redact_url(&self.base_url)
    }

    /// Reads `ANTHROPIC_API_KEY`, `ANTHROPIC_MODEL` and `ANTHROPIC_BASE_URL`
    /// through `env`; `model` (from `--model`) wins over the environment.
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        model: Option<String>,
    ) -> Result<Self, ConfigError> {
        let api_key = env("ANTHROPIC_API_KEY")
            .filter(|key| !key.trim().is_empty())
            .ok_or(ConfigError::MissingKey)?;
        let model = model
            .or_else(|| env("ANTHROPIC_MODEL").filter(|m| !m.trim().is_empty()))
            .unwrap_or_else(|| LiveConfig::DEFAULT_MODEL.to_owned());
        let base_url = env("ANTHROPIC_BASE_URL")
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| LiveConfig::DEFAULT_BASE_URL.to_owned());
        if !is_http_url(&base_url) {
            return Err(ConfigError::Invalid(format!(
                "ANTHROPIC_BASE_URL must start with http:// or https:// (got `{}`)",
                redact_url(&base_url)
            )));
        }
        let mut config = Self::new(ApiKey::new(api_key.trim()), base_url);
        config.model = model;
        Ok(config)
    }

    /// Settings for `api_key` at `base_url`, with the defaults: the default
    /// model and reply size, the default timeouts and retries, no stream.
    pub fn new(api_key: ApiKey, base_url: impl Into<String>) -> Self {
        Self {
            api_key,
            model: LiveConfig::DEFAULT_MODEL.to_owned(),
            base_url: base_url.into(),
            max_tokens: LiveConfig::DEFAULT_MAX_TOKENS,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            stream: false,
            clear_tool_uses: None,
            server_compaction: None,
        }
    }
}

/// `{"type": "ephemeral"}`: the prompt-cache breakpoint.
#[derive(Serialize)]
struct Ephemeral {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: Ephemeral = Ephemeral { kind: "ephemeral" };

/// A value that serializes as a map, with `cache_control` added.
#[derive(Serialize)]
struct Marked<'a, T: Serialize> {
    #[serde(flatten)]
    inner: &'a T,
    cache_control: Ephemeral,
}

/// A list whose last item carries the cache breakpoint.
struct MarkLast<'a, T>(&'a [T]);

impl<T: Serialize> Serialize for MarkLast<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        if let Some((last, rest)) = self.0.split_last() {
            for item in rest {
                seq.serialize_element(item)?;
            }
            seq.serialize_element(&Marked {
                inner: last,
                cache_control: EPHEMERAL,
            })?;
        }
        seq.end()
    }
}

/// The history's last message, the last of its blocks carrying the breakpoint.
struct LastMessage<'a>(&'a Message);

impl Serialize for LastMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut message = serializer.serialize_struct("Message", 2)?;
        message.serialize_field("role", &self.0.role)?;
        message.serialize_field("content", &MarkLast(&self.0.content))?;
        message.end()
    }
}

/// A text block of the system prompt.
#[derive(Serialize)]
struct SystemText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Ephemeral>,
}

/// The exact JSON body of a request under `config`, written into `out`
/// without a value tree; the tools and the history's earlier messages
/// come from `cache` when it wrote them before.
fn write_body(
    config: &LiveConfig,
    request: &Request<'_>,
    cache: &mut BodyCache,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    use crate::providers::body::write_field as field;
    // The static system prompt carries the breakpoint; the attachment (the
    // plan) follows it as a second block, so tools + system stay cached
    // when the plan changes, and no text ever follows tool results.
    let mut system = Vec::new();
    if !request.system.is_empty() {
        system.push(SystemText {
            kind: "text",
            text: request.system,
            cache_control: Some(EPHEMERAL),
        });
    }
    if let Some(text) = request.attachment.filter(|text| !text.is_empty()) {
        system.push(SystemText {
            kind: "text",
            text,
            cache_control: None,
        });
    }
    field(out, true, "model", &config.model)?;
    field(out, false, "max_tokens", &config.max_tokens)?;
    if !system.is_empty() {
        field(out, false, "system", &system)?;
    }
    if !request.tools.is_empty() {
        let tools = cache.tools(request.tools, |bytes| {
            serde_json::to_writer(bytes, &MarkLast(request.tools))
        })?;
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(tools);
    }
    // The messages before the last are written once per model and kept;
    // the last carries the cache breakpoint, so it is written each time.
    out.extend_from_slice(b",\"messages\":[");
    let (last, earlier) = match request.messages.split_last() {
        Some((last, earlier)) => (Some(last), earlier),
        None => (None, request.messages),
    };
    let wrote = cache.history(earlier, out, |message, bytes| {
        serde_json::to_writer(bytes, message)
    })?;
    if let Some(last) = last {
        if wrote {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, &LastMessage(last))?;
    }
    out.push(b']');
    if config.stream {
        field(out, false, "stream", &true)?;
    }
    if let Some(value) = context_management(config) {
        field(out, false, "context_management", &value)?;
    }
    if let Some(schema) = request.output {
        let format = json!({"format": {
            "type": "json_schema",
            "schema": output_schema(schema),
        }});
        field(out, false, "output_config", &format)?;
    }
    out.push(b'}');
    Ok(())
}

/// String formats the Messages API's structured outputs take.
const OUTPUT_FORMATS: [&str; 10] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "uri",
    "ipv4",
    "ipv6",
    "uuid",
];

/// `schema` as the Messages API's structured outputs take it, as the
/// official SDKs transform it: every object closed
/// (`additionalProperties: false`), `oneOf` read as `anyOf`, and the
/// constraints it does not support left out (numeric and length bounds,
/// `minItems` above 1, `maxItems`, unknown string formats, `$schema`). The
/// answer is still checked against the whole schema locally.
pub(crate) fn output_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(keywords) => {
            let mut out = serde_json::Map::new();
            for (key, value) in keywords {
                match key.as_str() {
                    "$schema" | "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum"
                    | "multipleOf" | "minLength" | "maxLength" | "maxItems" | "minProperties"
                    | "maxProperties" => {}
                    "minItems" if value.as_u64().is_some_and(|n| n > 1) => {}
                    "format" if !value.as_str().is_some_and(|f| OUTPUT_FORMATS.contains(&f)) => {}
                    "oneOf" => {
                        out.insert("anyOf".to_owned(), output_schema(value));
                    }
                    "additionalProperties" => {}
                    // A property named like a keyword is a name, not a keyword.
                    "properties" | "$defs" | "definitions" => {
                        let fields = value
                            .as_object()
                            .map(|fields| {
                                fields
                                    .iter()
                                    .map(|(name, field)| (name.clone(), output_schema(field)))
                                    .collect()
                            })
                            .unwrap_or_default();
                        out.insert(key.clone(), Value::Object(fields));
                    }
                    _ => {
                        out.insert(key.clone(), output_schema(value));
                    }
                }
            }
            let is_object =
                out.get("type") == Some(&json!("object")) || out.contains_key("properties");
            if is_object {
                out.insert("additionalProperties".to_owned(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(output_schema).collect()),
        other => other.clone(),
    }
}

/// The endpoint of `config`'s server.
fn messages_url(config: &LiveConfig) -> String {
    format!("{}/v1/messages", config.base_url.trim_end_matches('/'))
}

/// The Messages API, as [`LiveConfig`] speaks it.
impl Protocol for LiveConfig {
    const NAME: &'static str = "anthropic";
    type State = ();
    type Exchange = ();
    type Stream = sse::StreamAssembler;

    fn model(&self) -> &str {
        &self.model
    }

    fn api_key(&self) -> Option<&ApiKey> {
        Some(&self.api_key)
    }

    fn base_url(&self) -> &str {
        &self.base_url
    }

    fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    fn retry(&self) -> RetryPolicy {
        self.retry
    }

    fn url(&self) -> String {
        messages_url(self)
    }

    fn write_body(
        &self,
        _state: &(),
        request: &Request<'_>,
        cache: &mut BodyCache,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        write_body(self, request, cache, out)
    }

    fn exchange(&self, _state: &()) {}

    /// The key only in `x-api-key`.
    fn headers<'a>(&'a self, _exchange: &'a ()) -> Vec<(&'static str, &'a str)> {
        let accept = if self.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut headers = vec![
            ("x-api-key", self.api_key.expose()),
            ("anthropic-version", LiveConfig::API_VERSION),
            ("content-type", "application/json"),
            ("accept", accept),
        ];
        let beta = match (&self.clear_tool_uses, &self.server_compaction) {
            (Some(_), Some(_)) => Some(BOTH_BETAS),
            (Some(_), None) => Some(ClearToolUses::BETA),
            (None, Some(_)) => Some(ServerCompaction::BETA),
            (None, None) => None,
        };
        if let Some(beta) = beta {
            headers.push(("anthropic-beta", beta));
        }
        headers
    }

    fn read_error(
        &self,
        _exchange: &(),
        _status: u16,
        text: &str,
    ) -> Option<(FailureKind, String)> {
        read_error(text)
    }

    /// An `error` body is the API's failure.
    fn reply(&self, body: &Value) -> Result<ModelResponse, (FailureKind, String)> {
        if body.get("type").and_then(Value::as_str) == Some("error") {
            let (name, message) = api_error(body);
            return Err((api_kind(name, None, message), format!("{name}: {message}")));
        }
        ModelResponse::read(body).map_err(|err| {
            (
                FailureKind::InvalidResponse,
                format!("the response is not a message: {err}"),
            )
        })
    }

    fn stream(&self) -> sse::StreamAssembler {
        sse::StreamAssembler::new()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::providers::arbitrary::{cached_is_afresh, parts};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A model's next body, written with what its cache kept from the
        /// bodies before (tools, history messages), is byte for byte the
        /// body written afresh, whatever the history did in between.
        #[test]
        fn a_cached_body_is_the_body_written_afresh(
            parts in parts(),
            stream in any::<bool>(),
            clear in any::<bool>(),
        ) {
            let mut config = LiveConfig::new(ApiKey::new("k"), "http://localhost:1");
            config.stream = stream;
            if clear {
                config.clear_tool_uses = Some(ClearToolUses::new(Some(1000)));
            }
            cached_is_afresh(&parts, &|request, cache, out| write_body(&config, request, cache, out))?;
        }
    }
}
