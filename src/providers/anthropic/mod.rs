//! A client for the Anthropic Messages API, implementing [`Model`].
//!
//! Behind the `live` cargo feature (on by default). Requests are exactly the
//! Messages API body (`model`, `max_tokens`, `system`, `tools`, `messages`,
//! and `stream` when streaming), with prompt-caching breakpoints on the
//! system prompt, the last tool and the last history block, so a multi-turn
//! run re-reads its prefix from the cache. The request's attachment (the
//! plan) is a second system text block after the cached one: never a text
//! block after `tool_result` blocks, which the API documents as a cause of
//! empty `end_turn` replies. Sending, retries, timeouts, the stop of a
//! request in flight and key scrubbing are the shared [`super::http`]
//! layer; retries happen there, never in the loop (see [`retry`]). Whatever finally
//! fails becomes a [`ModelFailure`] carrying the API's `error.type` and
//! `error.message`. The API key is sent only in `x-api-key` and is scrubbed
//! from every error text and every reply, streamed text included (when at
//! least [`MIN_SCRUBBED_CHARS`](crate::providers::http::MIN_SCRUBBED_CHARS) long); the userinfo of the base URL is
//! never printed.

#[cfg(feature = "async")]
mod async_client;
pub(crate) mod sse;

#[cfg(feature = "async")]
pub use async_client::{AsyncAnthropicModel, AsyncClient};

use crate::providers::http::{ApiKey, StopProbe, StopSlot, redact_url};
use crate::providers::http::{retry, transport};

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use thiserror::Error;

use self::retry::RetryPolicy;
use self::transport::{HttpResponse, Timeouts, Transport, UreqTransport};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{ModelResponse, Request};
use crate::providers::failure::api_kind;
use crate::providers::http::{
    Attempts, HttpClient, Secrets, Success, TextSink, Waited, is_http_url, read_stream,
    until_stopped,
};
use crate::run::model::{Model, Received};

/// The model used when neither `--model` nor `ANTHROPIC_MODEL` names one.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
/// The official endpoint, unless `ANTHROPIC_BASE_URL` says otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header.
pub const API_VERSION: &str = "2023-06-01";
/// The default `max_tokens` of a reply.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The `error.type` and `error.message` of an API error body (or event).
pub(crate) fn api_error(body: &Value) -> (&str, &str) {
    let field = |path| body.pointer(path).and_then(Value::as_str);
    (
        field("/error/type").unwrap_or("api_error"),
        field("/error/message").unwrap_or("(no message)"),
    )
}

/// The kind and message of a Messages API error body, if it is one.
fn read_error(_status: u16, text: &str) -> Option<(FailureKind, String)> {
    let body: Value = serde_json::from_str(text).ok()?;
    body.pointer("/error/type")?;
    let (name, message) = api_error(&body);
    Some((api_kind(name, None, message), format!("{name}: {message}")))
}

/// Why a live client could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LiveError {
    /// `ANTHROPIC_API_KEY` is missing or empty.
    #[error("ANTHROPIC_API_KEY is not set; export your API key to use the Messages API")]
    MissingKey,
    /// A setting is unusable.
    #[error("{0}")]
    Invalid(String),
}

/// Settings of the live client. `Debug` hides the key and the base URL's userinfo.
#[derive(Clone)]
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
            .finish()
    }
}

impl LiveConfig {
    /// The base URL as it may be printed: without its userinfo.
    pub fn display_base_url(&self) -> String {
        redact_url(&self.base_url)
    }

    /// Reads `ANTHROPIC_API_KEY`, `ANTHROPIC_MODEL` and `ANTHROPIC_BASE_URL`
    /// through `env`; `model` (from `--model`) wins over the environment.
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        model: Option<String>,
    ) -> Result<Self, LiveError> {
        let api_key = env("ANTHROPIC_API_KEY")
            .filter(|key| !key.trim().is_empty())
            .ok_or(LiveError::MissingKey)?;
        let model = model
            .or_else(|| env("ANTHROPIC_MODEL").filter(|m| !m.trim().is_empty()))
            .unwrap_or_else(|| DEFAULT_MODEL.to_owned());
        let base_url = env("ANTHROPIC_BASE_URL")
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        if !is_http_url(&base_url) {
            return Err(LiveError::Invalid(format!(
                "ANTHROPIC_BASE_URL must start with http:// or https:// (got `{}`)",
                redact_url(&base_url)
            )));
        }
        Ok(Self {
            api_key: ApiKey::new(api_key.trim()),
            model,
            base_url,
            max_tokens: DEFAULT_MAX_TOKENS,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            stream: false,
        })
    }
}

/// The exact JSON body of a request under `config`.
pub(crate) fn request_body(config: &LiveConfig, request: &Request<'_>) -> Value {
    let cache = json!({"type": "ephemeral"});
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("max_tokens".into(), json!(config.max_tokens));
    // The static system prompt carries the breakpoint; the attachment (the
    // plan) follows it as a second block, so tools + system stay cached
    // when the plan changes, and no text ever follows tool results.
    let mut system = Vec::new();
    if !request.system.is_empty() {
        system.push(json!({"type": "text", "text": request.system, "cache_control": cache}));
    }
    if let Some(text) = request.attachment.filter(|text| !text.is_empty()) {
        system.push(json!({"type": "text", "text": text}));
    }
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    if !request.tools.is_empty() {
        let mut tools = json!(request.tools);
        if let Some(last) = tools
            .as_array_mut()
            .and_then(|tools| tools.last_mut())
            .and_then(Value::as_object_mut)
        {
            last.insert("cache_control".into(), cache.clone());
        }
        body.insert("tools".into(), tools);
    }
    let mut messages = json!(request.messages);
    if let Some(block) = messages
        .as_array_mut()
        .and_then(|m| m.last_mut())
        .and_then(|last| last.get_mut("content"))
        .and_then(Value::as_array_mut)
        .and_then(|c| c.last_mut())
        .and_then(Value::as_object_mut)
    {
        block.insert("cache_control".into(), cache);
    }
    body.insert("messages".into(), messages);
    if config.stream {
        body.insert("stream".into(), json!(true));
    }
    if let Some(schema) = request.output {
        body.insert(
            "output_config".into(),
            json!({"format": {
                "type": "json_schema",
                "schema": output_schema(schema),
            }}),
        );
    }
    Value::Object(body)
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
pub fn output_schema(schema: &Value) -> Value {
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

/// The HTTP client, shared by the parent's model and every child's.
pub struct Client {
    config: LiveConfig,
    http: HttpClient,
    on_text: Option<TextSink>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client over a real HTTP connection.
    pub fn new(config: LiveConfig) -> Self {
        let transport = Arc::new(UreqTransport::new(config.timeouts));
        Self::with_transport(config, transport)
    }

    /// A client over any transport (tests use a fake one).
    pub fn with_transport(config: LiveConfig, transport: Arc<dyn Transport>) -> Self {
        let secrets = Secrets::new(Some(&config.api_key), &config.base_url);
        let http = HttpClient::new(transport, config.retry, secrets);
        Self {
            config,
            http,
            on_text: None,
        }
    }

    /// Replaces how the client waits between retries (tests record instead of sleeping).
    pub fn with_sleeper(mut self, sleep: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.http.set_sleeper(sleep);
        self
    }

    /// Shows streamed text deltas as they arrive (the CLI prints them on
    /// stderr). When a reply's streamed text does not end with a newline,
    /// the sink gets one `"\n"` after it, once the stream is over.
    pub fn with_text_sink(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_text = Some(Arc::new(sink));
        self
    }

    /// The secrets this client hides from its replies and error texts (its
    /// API key, the base URL's password), for the host to hide from
    /// everything else it records or prints: give it to
    /// `AgentBuilder::redact` for the tools' results.
    pub fn redactor(&self) -> crate::core::redact::Redactor {
        self.http.attempts().redactor().clone()
    }

    /// The settings.
    pub fn config(&self) -> &LiveConfig {
        &self.config
    }

    /// The exact JSON body of a request.
    pub fn request_body(&self, request: &Request<'_>) -> Value {
        request_body(&self.config, request)
    }

    fn fail(&self, kind: FailureKind, message: String) -> ModelFailure {
        self.http.fail(kind, message)
    }

    /// Sends one request, retrying what is worth retrying.
    pub fn send(&self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.send_received(request)
            .map(|received| received.response)
    }

    /// Sends one request like [`Client::send`], also handing back the reply
    /// as received (for a stream: the message assembled from its events).
    pub fn send_received(&self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let body = self.body_bytes(request)?;
        self.send_body(&body, None)
    }

    /// [`Client::send_received`], showing streamed text by whole lines.
    fn send_received_lines(
        &self,
        request: &Request<'_>,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        let body = self.body_bytes(request)?;
        self.send_body_lines(&body, None, whole_lines)
    }

    fn body_bytes(&self, request: &Request<'_>) -> Result<Vec<u8>, ModelFailure> {
        serde_json::to_vec(&self.request_body(request)).map_err(|err| {
            self.fail(
                FailureKind::Serialization,
                format!("cannot serialize the request: {err}"),
            )
        })
    }

    /// Sends a serialized request body, retrying what is worth retrying;
    /// no retry starts once `stop` says the run was stopped.
    pub fn send_body(
        &self,
        body: &[u8],
        stop: Option<&StopProbe>,
    ) -> Result<Received, ModelFailure> {
        self.send_body_lines(body, stop, false)
    }

    /// [`Client::send_body`]; with `whole_lines`, streamed text reaches the
    /// sink only as whole lines (the last one ended by a `"\n"` when the
    /// stream is over), so a stream running beside others never leaves a
    /// line open for their text or progress lines to join.
    fn send_body_lines(
        &self,
        body: &[u8],
        stop: Option<&StopProbe>,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        let url = messages_url(&self.config);
        let headers = headers(&self.config);
        match self.http.post(&url, &headers, body, stop, &read_error)? {
            Success::Stream(response) => self.read_stream(response, whole_lines),
            Success::Body(text) => self.parse_body(&text),
        }
    }

    fn read_stream(
        &self,
        response: HttpResponse,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        let attempts = self.http.attempts();
        attempts.streamed(read_stream(
            response,
            self.on_text.as_ref(),
            whole_lines,
            attempts.redactor(),
            sse::StreamAssembler::new(),
        ))
    }

    fn parse_body(&self, text: &str) -> Result<Received, ModelFailure> {
        parse_body(self.http.attempts(), text)
    }
}

/// The endpoint of `config`'s server.
pub(crate) fn messages_url(config: &LiveConfig) -> String {
    format!("{}/v1/messages", config.base_url.trim_end_matches('/'))
}

/// The headers of every request (the key only in `x-api-key`).
pub(crate) fn headers(config: &LiveConfig) -> [(&'static str, &str); 4] {
    let accept = if config.stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    [
        ("x-api-key", config.api_key.expose()),
        ("anthropic-version", API_VERSION),
        ("content-type", "application/json"),
        ("accept", accept),
    ]
}

/// A whole (non-streamed) response body read as a reply, the secrets
/// scrubbed from it ([`Attempts::received`]); an `error` body is the API's
/// failure.
pub(crate) fn parse_body(attempts: &Attempts, text: &str) -> Result<Received, ModelFailure> {
    let value = attempts.json_body(text)?;
    if value.get("type").and_then(Value::as_str) == Some("error") {
        let (name, message) = api_error(&value);
        let kind = api_kind(name, None, message);
        return Err(attempts.fail(kind, format!("{name}: {message}")));
    }
    match ModelResponse::from_value(value.clone()) {
        Ok(response) => Ok(attempts.received(Received {
            response,
            raw: Some(value),
        })),
        Err(err) => Err(attempts.fail(
            FailureKind::InvalidResponse,
            format!("the response is not a message: {err}"),
        )),
    }
}

/// A [`Model`] over a shared [`Client`].
#[derive(Clone)]
pub struct AnthropicModel {
    client: Arc<Client>,
    stop: Option<StopSlot>,
    whole_lines: bool,
}

impl std::fmt::Debug for AnthropicModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicModel")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl AnthropicModel {
    /// A model that sends through `client`.
    pub fn new(client: Arc<Client>) -> Self {
        Self {
            client,
            stop: None,
            whole_lines: false,
        }
    }

    /// A model whose requests the run can stop in flight: once the probe in
    /// `slot` says so, the model gives up waiting (the connection is left to
    /// its own timeout on a worker thread) and no retry starts. Each run
    /// gives its own slot, so a shared client carries no stop of its own.
    pub fn with_stop(client: Arc<Client>, slot: StopSlot) -> Self {
        Self {
            client,
            stop: Some(slot),
            whole_lines: false,
        }
    }

    /// Shows this model's streamed text by whole lines rather than as each
    /// delta arrives: for subagents, which stream beside each other, so
    /// their texts and progress lines never share a line.
    pub fn with_whole_lines(mut self) -> Self {
        self.whole_lines = true;
        self
    }
}

impl Model for AnthropicModel {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new(
            "anthropic",
            Some(self.client.config().model.clone()),
        ))
    }

    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    /// Without a stop probe, sends on this thread. With one, the request
    /// runs on a worker thread while this one checks the probe every 20 ms,
    /// so cancelling or a deadline does not wait for the HTTP timeouts.
    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let Some(probe) = self.stop.as_ref().and_then(|slot| slot.get()).cloned() else {
            return self.client.send_received_lines(request, self.whole_lines);
        };
        let body = self.client.body_bytes(request)?;
        let client = Arc::clone(&self.client);
        let worker_probe = Arc::clone(&probe);
        let whole_lines = self.whole_lines;
        match until_stopped(&probe, move || {
            client.send_body_lines(&body, Some(&worker_probe), whole_lines)
        }) {
            Waited::Done(result) => result,
            Waited::Stopped => Err(self.client.http.abandoned()),
            Waited::Died => Err(self.client.fail(
                FailureKind::Request,
                "the request's worker thread died".to_owned(),
            )),
        }
    }
}
