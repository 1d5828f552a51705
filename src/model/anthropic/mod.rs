//! A client for the Anthropic Messages API, implementing [`Model`].
//!
//! Behind the `live` cargo feature (on by default). Requests are exactly the
//! Messages API body (`model`, `max_tokens`, `system`, `tools`, `messages`,
//! and `stream` when streaming), with prompt-caching breakpoints on the
//! system prompt, the last tool and the last history block, so a multi-turn
//! run re-reads its prefix from the cache. The request's attachment (the
//! plan) is a second system text block after the cached one: never a text
//! block after `tool_result` blocks, which the API documents as a cause of
//! empty `end_turn` replies. Retries happen here, in the
//! transport layer, never in the loop (see [`retry`]). Whatever finally
//! fails becomes a [`ModelFailure`] carrying the API's `error.type` and
//! `error.message`. The API key is sent only in `x-api-key` and is scrubbed
//! from every error text (when at least [`MIN_SCRUBBED_CHARS`] long); the
//! userinfo of the base URL is never printed.

pub mod retry;
pub mod sse;
pub mod transport;

use std::io::{BufReader, Read};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use thiserror::Error;

use self::retry::{RetryPolicy, retryable_status, should_retry_header};
use self::transport::{HttpResponse, Timeouts, Transport, TransportErrorKind, UreqTransport};
use super::{Model, Received};
use crate::error::ModelFailure;
use crate::protocol::{ModelResponse, Request};

/// The model used when neither `--model` nor `ANTHROPIC_MODEL` names one.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
/// The official endpoint, unless `ANTHROPIC_BASE_URL` says otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header.
pub const API_VERSION: &str = "2023-06-01";
/// The default `max_tokens` of a reply.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The largest non-streaming body read (32 MiB).
const MAX_BODY: u64 = 32 * 1024 * 1024;
/// The largest event stream read (64 MiB).
const MAX_STREAM: u64 = 64 * 1024 * 1024;
/// Secrets shorter than this many characters are not scrubbed from error
/// texts: replacing a one-letter "key" would garble every message, and so
/// short a string is no secret worth hiding.
pub const MIN_SCRUBBED_CHARS: usize = 8;

/// The userinfo (`user:password`) of a URL, if it has one: everything
/// before the last `@`. Wider than the URL grammar on purpose: a password
/// pasted with an unencoded `/`, `?` or `#` is still hidden (at worst a
/// path holding an `@` is hidden too).
fn userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.rsplit_once('@')
        .map(|(info, _)| info)
        .filter(|info| !info.is_empty())
}

/// `url` with its userinfo (`https://user:key@host`) replaced by `***`:
/// the form that may be printed.
pub fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some(info) => url.replacen(&format!("{info}@"), "***@", 1),
        None => url.to_owned(),
    }
}

/// The `error.type` and `error.message` of an API error body (or event).
pub(crate) fn api_error(body: &Value) -> (&str, &str) {
    let field = |path| body.pointer(path).and_then(Value::as_str);
    (
        field("/error/type").unwrap_or("api_error"),
        field("/error/message").unwrap_or("(no message)"),
    )
}

fn is_stream(response: &HttpResponse) -> bool {
    response
        .header("content-type")
        .is_some_and(|kind| kind.starts_with("text/event-stream"))
}

fn read_body(response: HttpResponse) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    response.body.take(MAX_BODY).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// An API key. It has no `Display`, and `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// Why a live client could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LiveError {
    /// `ANTHROPIC_API_KEY` is missing or empty.
    #[error("ANTHROPIC_API_KEY is not set; export your API key to use --live")]
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
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
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

type Sleeper = Arc<dyn Fn(Duration) + Send + Sync>;
type TextSink = Arc<dyn Fn(&str) + Send + Sync>;

/// The HTTP client, shared by the parent's model and every child's.
pub struct Client {
    config: LiveConfig,
    transport: Arc<dyn Transport>,
    sleep: Sleeper,
    on_text: Option<TextSink>,
}

/// Says whether the run was stopped (cancelled, deadline passed, tokens spent).
pub type StopProbe = Arc<dyn Fn() -> bool + Send + Sync>;

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
        Self {
            config,
            transport,
            sleep: Arc::new(std::thread::sleep),
            on_text: None,
        }
    }

    /// Replaces how the client waits between retries (tests record instead of sleeping).
    pub fn with_sleeper(mut self, sleep: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.sleep = Arc::new(sleep);
        self
    }

    /// Shows streamed text deltas as they arrive (the CLI prints them on
    /// stderr). When a reply's streamed text does not end with a newline,
    /// the sink gets one `"\n"` after it, once the stream is over.
    pub fn with_text_sink(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_text = Some(Arc::new(sink));
        self
    }

    /// The settings.
    pub fn config(&self) -> &LiveConfig {
        &self.config
    }

    /// The exact JSON body of a request.
    pub fn request_body(&self, request: &Request<'_>) -> Value {
        let cache = json!({"type": "ephemeral"});
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": self.config.max_tokens,
        });
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
            body["system"] = Value::Array(system);
        }
        if !request.tools.is_empty() {
            let mut tools = json!(request.tools);
            if let Some(last) = tools.as_array_mut().and_then(|tools| tools.last_mut()) {
                last["cache_control"] = cache.clone();
            }
            body["tools"] = tools;
        }
        let mut messages = json!(request.messages);
        if let Some(block) = messages
            .as_array_mut()
            .and_then(|m| m.last_mut())
            .and_then(|last| last["content"].as_array_mut())
            .and_then(|c| c.last_mut())
        {
            block["cache_control"] = cache;
        }
        body["messages"] = messages;
        if self.config.stream {
            body["stream"] = json!(true);
        }
        body
    }

    /// Hides the secrets from an error text: the API key and the password
    /// of the base URL when at least [`MIN_SCRUBBED_CHARS`] long, and the
    /// base URL's whole userinfo wherever it appears before an `@`.
    fn scrub(&self, mut text: String) -> String {
        let long = |secret: &str| secret.chars().count() >= MIN_SCRUBBED_CHARS;
        let key = self.config.api_key.expose();
        if long(key) {
            text = text.replace(key, "***");
        }
        if let Some(info) = userinfo(&self.config.base_url) {
            text = text.replace(&format!("{info}@"), "***@");
            if let Some((_, password)) = info.split_once(':')
                && long(password)
            {
                text = text.replace(password, "***");
            }
        }
        text
    }

    fn fail(&self, kind: &str, message: String) -> ModelFailure {
        ModelFailure::with_kind(kind, self.scrub(message))
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
                "invalid_request",
                format!("cannot serialize the request: {err}"),
            )
        })
    }

    fn abandoned(&self) -> ModelFailure {
        self.fail(
            "cancelled",
            "the request was abandoned because the run was stopped".to_owned(),
        )
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
        let url = format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'));
        let accept = if self.config.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let headers = [
            ("x-api-key", self.config.api_key.expose()),
            ("anthropic-version", API_VERSION),
            ("content-type", "application/json"),
            ("accept", accept),
        ];
        let policy = self.config.retry;
        let mut retry = 0;
        loop {
            let delay = match self.transport.post(&url, &headers, body) {
                Ok(response) if (200..300).contains(&response.status) => {
                    if is_stream(&response) {
                        return self.read_stream(response, whole_lines);
                    }
                    // The body is read inside the loop: a timeout or a reset
                    // while reading it is retried like one before the headers.
                    match read_body(response) {
                        Ok(text) => return self.parse_body(&text),
                        Err(err) => {
                            let kind = match err.kind() {
                                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                                    "timeout_error"
                                }
                                _ => "connection_error",
                            };
                            if retry >= policy.max_retries {
                                let attempts = retry + 1;
                                return Err(self.fail(
                                    kind,
                                    format!("{kind}: reading the response failed: {err} (after {attempts} attempt(s))"),
                                ));
                            }
                            policy.delay(retry, None, None, SystemTime::now())
                        }
                    }
                }
                Ok(mut response) => {
                    let failure = self.error_response(&mut response, retry);
                    let wanted = should_retry_header(response.header("x-should-retry"))
                        .unwrap_or_else(|| retryable_status(response.status));
                    if !wanted || retry >= policy.max_retries {
                        return Err(failure);
                    }
                    policy.delay(
                        retry,
                        response.header("retry-after-ms"),
                        response.header("retry-after"),
                        SystemTime::now(),
                    )
                }
                Err(err) => {
                    let kind = match err.kind {
                        TransportErrorKind::Timeout => "timeout_error",
                        TransportErrorKind::Connection => "connection_error",
                        TransportErrorKind::Other => "request_error",
                    };
                    if err.kind == TransportErrorKind::Other || retry >= policy.max_retries {
                        let attempts = retry + 1;
                        return Err(
                            self.fail(kind, format!("{kind}: {err} (after {attempts} attempt(s))"))
                        );
                    }
                    policy.delay(retry, None, None, SystemTime::now())
                }
            };
            if stop.is_some_and(|probe| probe()) {
                return Err(self.abandoned());
            }
            (self.sleep)(delay);
            retry += 1;
        }
    }

    fn error_response(&self, response: &mut HttpResponse, retry: u32) -> ModelFailure {
        let mut text = String::new();
        let _ = (&mut response.body)
            .take(1024 * 1024)
            .read_to_string(&mut text);
        let attempts = retry + 1;
        let status = response.status;
        match serde_json::from_str::<Value>(&text) {
            Ok(body) if body.pointer("/error/type").is_some() => {
                let (kind, message) = api_error(&body);
                self.fail(
                    kind,
                    format!("HTTP {status} {kind}: {message} (after {attempts} attempt(s))"),
                )
            }
            _ => {
                let snippet: String = text.chars().take(200).collect();
                self.fail(
                    "http_error",
                    format!("HTTP {status}: {snippet} (after {attempts} attempt(s))"),
                )
            }
        }
    }

    fn read_stream(
        &self,
        response: HttpResponse,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        let sink = self.on_text.clone();
        // Whether the text shown so far ends in the middle of a line.
        let mut open_line = false;
        // With `whole_lines`, the text of the line not yet ended.
        let mut pending = String::new();
        let mut on_text = |text: &str| {
            if let Some(sink) = &sink
                && !text.is_empty()
            {
                if whole_lines {
                    pending.push_str(text);
                    if let Some(end) = pending.rfind('\n') {
                        let rest = pending.split_off(end + 1);
                        sink(&std::mem::replace(&mut pending, rest));
                    }
                } else {
                    open_line = !text.ends_with('\n');
                    sink(text);
                }
            }
        };
        // A hostile stream cannot grow without bound: past the cap it just ends.
        let body = BufReader::new(response.body.take(MAX_STREAM));
        let result = sse::read_stream(body, &mut on_text);
        // The streamed text ends its line, so what is printed next (a
        // progress line, an error) starts on a line of its own.
        if let Some(sink) = &sink {
            if !pending.is_empty() {
                pending.push('\n');
                sink(&pending);
            } else if open_line {
                sink("\n");
            }
        }
        result.map_err(|failure| {
            self.fail(
                failure.kind.as_deref().unwrap_or("stream_error"),
                failure.message,
            )
        })
    }

    fn parse_body(&self, text: &str) -> Result<Received, ModelFailure> {
        let value: Value = serde_json::from_str(text).map_err(|err| {
            let snippet: String = text.chars().take(200).collect();
            self.fail(
                "invalid_response",
                format!("the response is not JSON ({err}): {snippet}"),
            )
        })?;
        if value.get("type").and_then(Value::as_str) == Some("error") {
            let (kind, message) = api_error(&value);
            return Err(self.fail(kind, format!("{kind}: {message}")));
        }
        match ModelResponse::from_value(value.clone()) {
            Ok(response) => Ok(Received {
                response,
                raw: Some(value),
            }),
            Err(err) => Err(self.fail(
                "invalid_response",
                format!("the response is not a message: {err}"),
            )),
        }
    }
}

/// Where a run puts its [`StopProbe`] once it exists; one slot per run.
pub type StopSlot = Arc<OnceLock<StopProbe>>;

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
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(client.send_body_lines(&body, Some(&worker_probe), whole_lines));
        });
        loop {
            match receiver.recv_timeout(Duration::from_millis(20)) {
                Ok(result) => return result,
                Err(mpsc::RecvTimeoutError::Timeout) if probe() => {
                    return Err(self.client.abandoned());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.client.fail(
                        "request_error",
                        "the request's worker thread died".to_owned(),
                    ));
                }
            }
        }
    }
}
