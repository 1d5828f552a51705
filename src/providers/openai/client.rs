//! The Chat Completions client and its [`Model`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

use super::reply;
use super::request::{BodySettings, MaxTokensField, request_body};
use super::stream;
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{ModelResponse, Request};
use crate::providers::failure::{api_kind, openai_code};
use crate::providers::http::retry::RetryPolicy;
use crate::providers::http::transport::{Timeouts, Transport, UreqTransport};
use crate::providers::http::{
    ApiKey, Attempts, ErrorReader, HttpClient, Secrets, StopProbe, StopSlot, Success, TextSink,
    Waited, is_http_url, read_stream, redact_url, until_stopped,
};
use crate::run::model::{Model, Received};

/// OpenAI's endpoint, unless `OPENAI_BASE_URL` says otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The default token limit of a reply.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Why the client could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OpenAiError {
    /// No model is named (`OPENAI_MODEL` is not set either).
    #[error(
        "the openai provider needs a model name: set OPENAI_MODEL or give one (no name is known to every server)"
    )]
    MissingModel,
    /// A setting is unusable.
    #[error("{0}")]
    Invalid(String),
}

/// Settings of the client. `Debug` hides the key and the base URL's userinfo.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The API key, sent as `Authorization: Bearer …`; none for servers that need none.
    pub api_key: Option<ApiKey>,
    /// The model name.
    pub model: String,
    /// The base URL, up to and including `/v1` (the client adds `/chat/completions`).
    pub base_url: String,
    /// The token limit of each reply.
    pub max_tokens: u32,
    /// The field the limit is sent in.
    pub max_tokens_field: MaxTokensField,
    /// Connect, read and overall timeouts.
    pub timeouts: Timeouts,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Ask for a stream.
    pub stream: bool,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("api_key", &self.api_key)
            .field("model", &self.model)
            .field("base_url", &self.display_base_url())
            .field("max_tokens", &self.max_tokens)
            .field("max_tokens_field", &self.max_tokens_field)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .field("stream", &self.stream)
            .finish()
    }
}

impl OpenAiConfig {
    /// Settings for `model` at `base_url`, with no key and the defaults.
    pub fn new(model: impl Into<String>, base_url: impl Into<String>) -> Self {
        let base_url = base_url.into();
        Self {
            api_key: None,
            model: model.into(),
            max_tokens_field: MaxTokensField::for_base_url(&base_url),
            base_url,
            max_tokens: DEFAULT_MAX_TOKENS,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            stream: false,
        }
    }

    /// The base URL as it may be printed: without its userinfo.
    pub fn display_base_url(&self) -> String {
        redact_url(&self.base_url)
    }

    /// Reads `OPENAI_API_KEY` (optional), `OPENAI_BASE_URL` (default
    /// [`DEFAULT_BASE_URL`]) and `OPENAI_MODEL` through `env`; `model` (from
    /// `--model`) wins over the environment, and one of them is required.
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        model: Option<String>,
    ) -> Result<Self, OpenAiError> {
        let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let model = model
            .filter(|m| !m.trim().is_empty())
            .or_else(|| set("OPENAI_MODEL").map(|m| m.trim().to_owned()))
            .ok_or(OpenAiError::MissingModel)?;
        let base_url = set("OPENAI_BASE_URL")
            .map(|url| url.trim().to_owned())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        if !is_http_url(&base_url) {
            return Err(OpenAiError::Invalid(format!(
                "OPENAI_BASE_URL must start with http:// or https:// (got `{}`)",
                redact_url(&base_url)
            )));
        }
        let mut config = Self::new(model, base_url);
        config.api_key = set("OPENAI_API_KEY").map(|key| ApiKey::new(key.trim()));
        Ok(config)
    }
}

/// The HTTP client, shared by the parent's model and every child's.
pub struct Client {
    config: OpenAiConfig,
    http: HttpClient,
    on_text: Option<TextSink>,
    /// Whether the server refused the configured token field, so the other is sent.
    other_field: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a failed status says, from an error body in any of the shapes
/// servers send; a 401 also says what to do about the key.
pub(crate) fn error_reader(has_key: bool) -> impl Fn(u16, &str) -> Option<(FailureKind, String)> {
    move |status, text| {
        let body = serde_json::from_str::<Value>(text).ok();
        let parts = body.as_ref().and_then(reply::error_parts);
        let (kind, mut message) = match parts {
            Some((kind, message)) => (kind, message),
            None if status == 401 => (None, text.chars().take(200).collect()),
            None => return None,
        };
        let kind = kind.unwrap_or_else(|| {
            match status {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                429 => "rate_limit_error",
                500.. => "api_error",
                _ => "invalid_request_error",
            }
            .to_owned()
        });
        if status == 401 {
            message.push_str(if has_key {
                " (the server refused OPENAI_API_KEY; check it)"
            } else {
                " (the server wants an API key: set OPENAI_API_KEY)"
            });
        }
        let code = body.as_ref().and_then(openai_code);
        Some((
            api_kind(&kind, code, &message),
            format!("{kind}: {message}"),
        ))
    }
}

impl Client {
    /// A client over a real HTTP connection.
    pub fn new(config: OpenAiConfig) -> Self {
        let transport = Arc::new(UreqTransport::new(config.timeouts));
        Self::with_transport(config, transport)
    }

    /// A client over any transport (tests use a fake one).
    pub fn with_transport(config: OpenAiConfig, transport: Arc<dyn Transport>) -> Self {
        let secrets = Secrets::new(config.api_key.as_ref(), &config.base_url);
        let http = HttpClient::new(transport, config.retry, secrets);
        Self {
            config,
            http,
            on_text: None,
            other_field: AtomicBool::new(false),
        }
    }

    /// Replaces how the client waits between retries (tests record instead of sleeping).
    pub fn with_sleeper(mut self, sleep: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.http.set_sleeper(sleep);
        self
    }

    /// Shows streamed text as it arrives (the CLI prints it on stderr);
    /// text that does not end a line is followed by one `"\n"` at the end.
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
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The exact JSON body of a request.
    pub fn request_body(&self, request: &Request<'_>) -> Value {
        body_for(&self.config, self.max_tokens_field(), request)
    }

    /// The field the token limit goes in: the configured one, or the other
    /// once the server refused it.
    pub fn max_tokens_field(&self) -> MaxTokensField {
        current_field(&self.config, &self.other_field)
    }

    /// Sends one request, retrying what is worth retrying.
    pub fn send(&self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.send_received(request)
            .map(|received| received.response)
    }

    /// Sends one request like [`Client::send`], also handing back the reply
    /// as received (for a stream: the `chat.completion` assembled from it).
    pub fn send_received(&self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let body = self.body_bytes(request)?;
        self.send_body(&body, None)
    }

    fn body_bytes(&self, request: &Request<'_>) -> Result<Vec<u8>, ModelFailure> {
        serde_json::to_vec(&self.request_body(request)).map_err(|err| {
            self.http.fail(
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
        let url = completions_url(&self.config);
        let bearer = bearer(&self.config);
        let headers = headers(&self.config, bearer.as_deref());
        let describe = error_reader(bearer.is_some());
        let fallback = FieldFallback::new(self.max_tokens_field());
        let read_error = |status: u16, text: &str| fallback.read_error(&describe, status, text);
        let success = match self.http.post(&url, &headers, body, stop, &read_error) {
            // A server that does not take this token field gets the other
            // one, once, and keeps getting it.
            Err(failure) => {
                let Some(body) = fallback.retry_body(body) else {
                    return Err(failure);
                };
                let success = self.http.post(&url, &headers, &body, stop, &describe)?;
                fallback.settled(&self.config, &self.other_field);
                success
            }
            Ok(success) => success,
        };
        match success {
            Success::Stream(response) => {
                let attempts = self.http.attempts();
                attempts.streamed(read_stream(
                    response,
                    self.on_text.as_ref(),
                    false,
                    attempts.redactor(),
                    stream::ChunkStream::default(),
                ))
            }
            Success::Body(text) => parse_body(self.http.attempts(), &text),
        }
    }
}

/// The field the token limit goes in under `config`: the configured one,
/// or the other once the server refused it (`switched`).
pub(crate) fn current_field(config: &OpenAiConfig, switched: &AtomicBool) -> MaxTokensField {
    if switched.load(Ordering::Relaxed) {
        config.max_tokens_field.other()
    } else {
        config.max_tokens_field
    }
}

/// The exact JSON body of `request` under `config`, the limit in `field`.
pub(crate) fn body_for(
    config: &OpenAiConfig,
    field: MaxTokensField,
    request: &Request<'_>,
) -> Value {
    request_body(
        request,
        BodySettings {
            model: &config.model,
            max_tokens: config.max_tokens,
            max_tokens_field: field,
            stream: config.stream,
        },
    )
}

/// The endpoint of `config`'s server.
pub(crate) fn completions_url(config: &OpenAiConfig) -> String {
    format!("{}/chat/completions", config.base_url.trim_end_matches('/'))
}

/// The `Authorization` header's value, when there is a key.
pub(crate) fn bearer(config: &OpenAiConfig) -> Option<String> {
    config
        .api_key
        .as_ref()
        .map(|key| format!("Bearer {}", key.expose()))
}

/// The headers of every request (the key only in `authorization`).
pub(crate) fn headers<'a>(
    config: &OpenAiConfig,
    bearer: Option<&'a str>,
) -> Vec<(&'static str, &'a str)> {
    let accept = if config.stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut headers = vec![("content-type", "application/json"), ("accept", accept)];
    if let Some(bearer) = bearer {
        headers.insert(0, ("authorization", bearer));
    }
    headers
}

/// The token-field fallback of one request: whether the server refused
/// the field the limit was sent in, and the body with the other one.
pub(crate) struct FieldFallback {
    field: MaxTokensField,
    refused: AtomicBool,
}

impl FieldFallback {
    /// A request sending its limit in `field`.
    pub(crate) fn new(field: MaxTokensField) -> Self {
        Self {
            field,
            refused: AtomicBool::new(false),
        }
    }

    /// Reads an error body with `describe`, noting a refusal of the field.
    pub(crate) fn read_error(
        &self,
        describe: ErrorReader<'_>,
        status: u16,
        text: &str,
    ) -> Option<(FailureKind, String)> {
        if status == 400 && self.field.refused_by(text) {
            self.refused.store(true, Ordering::Relaxed);
        }
        describe(status, text)
    }

    /// The body to send once more, with the other field, if the server
    /// refused this one.
    pub(crate) fn retry_body(&self, body: &[u8]) -> Option<Vec<u8>> {
        if !self.refused.load(Ordering::Relaxed) {
            return None;
        }
        with_field(body, self.field, self.field.other())
    }

    /// The other field worked: the client keeps sending it.
    pub(crate) fn settled(&self, config: &OpenAiConfig, other_field: &AtomicBool) {
        other_field.store(
            self.field.other() != config.max_tokens_field,
            Ordering::Relaxed,
        );
    }
}

/// A whole (non-streamed) response body read as a reply, the secrets
/// scrubbed from it ([`Attempts::received`]); an error body is the
/// server's failure.
pub(crate) fn parse_body(attempts: &Attempts, text: &str) -> Result<Received, ModelFailure> {
    let value = attempts.json_body(text)?;
    if let Some((name, message)) = reply::error_parts(&value) {
        let name = name.unwrap_or_else(|| "api_error".to_owned());
        let kind = api_kind(&name, openai_code(&value), &message);
        return Err(attempts.fail(kind, format!("{name}: {message}")));
    }
    match reply::parse_completion(&value) {
        Ok(response) => Ok(attempts.received(Received {
            response,
            raw: Some(value),
        })),
        Err(reason) => Err(attempts.fail(
            FailureKind::InvalidResponse,
            format!("the response is not a chat completion: {reason}"),
        )),
    }
}

/// `body` with its token limit moved from field `from` to field `to`.
fn with_field(body: &[u8], from: MaxTokensField, to: MaxTokensField) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object_mut()?;
    let limit = object.remove(from.as_str())?;
    object.insert(to.as_str().to_owned(), limit);
    serde_json::to_vec(&value).ok()
}

/// A [`Model`] over a shared [`Client`].
#[derive(Clone)]
pub struct OpenAiModel {
    client: Arc<Client>,
    stop: Option<StopSlot>,
}

impl std::fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl OpenAiModel {
    /// A model that sends through `client`.
    pub fn new(client: Arc<Client>) -> Self {
        Self { client, stop: None }
    }

    /// A model whose requests the run can stop in flight (see
    /// [`crate::providers::anthropic::AnthropicModel::with_stop`]).
    pub fn with_stop(client: Arc<Client>, slot: StopSlot) -> Self {
        Self {
            client,
            stop: Some(slot),
        }
    }
}

impl Model for OpenAiModel {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new(
            "openai",
            Some(self.client.config().model.clone()),
        ))
    }

    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    /// Without a stop probe, sends on this thread; with one, on a worker
    /// thread while this one watches the probe.
    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let Some(probe) = self.stop.as_ref().and_then(|slot| slot.get()).cloned() else {
            return self.client.send_received(request);
        };
        let body = self.client.body_bytes(request)?;
        let client = Arc::clone(&self.client);
        let worker_probe = Arc::clone(&probe);
        match until_stopped(&probe, move || client.send_body(&body, Some(&worker_probe))) {
            Waited::Done(result) => result,
            Waited::Stopped => Err(self.client.http.abandoned()),
            Waited::Died => Err(self.client.http.fail(
                FailureKind::Request,
                "the request's worker thread died".to_owned(),
            )),
        }
    }
}
