//! The Chat Completions protocol: the settings ([`OpenAiConfig`]), the
//! body, the headers, the token-field fallback, and the reading of replies
//! and error bodies. The clients and models speaking it are the shared
//! `http::Client` and `http::HttpModel`.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use super::reply;
use super::request::{BodySettings, MaxTokensField, write_body};
use super::stream;
use crate::core::error::FailureKind;
use crate::core::protocol::{ModelResponse, Request};
use crate::providers::failure::{api_kind, openai_code};
use crate::providers::http::Timeouts;
use crate::providers::http::protocol::{BodyCache, Protocol};
use crate::providers::http::retry::RetryPolicy;
use crate::providers::http::{self, ApiKey, ConfigError, ErrorReader, is_http_url, redact_url};

/// Settings of the client. `Debug` hides the key and the base URL's userinfo.
#[derive(Clone)]
#[non_exhaustive]
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
    /// OpenAI's endpoint, unless `OPENAI_BASE_URL` says otherwise.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";
    /// The default token limit of a reply.
    pub const DEFAULT_MAX_TOKENS: u32 = 4096;

    /// Settings for `model` at `base_url`, with no key and the defaults.
    pub fn new(model: impl Into<String>, base_url: impl Into<String>) -> Self {
        let base_url = base_url.into();
        Self {
            api_key: None,
            model: model.into(),
            max_tokens_field: MaxTokensField::for_base_url(&base_url),
            base_url,
            max_tokens: OpenAiConfig::DEFAULT_MAX_TOKENS,
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
    /// [`OpenAiConfig::DEFAULT_BASE_URL`]) and `OPENAI_MODEL` through `env`; `model` (from
    /// `--model`) wins over the environment, and one of them is required.
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        model: Option<String>,
    ) -> Result<Self, ConfigError> {
        let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let model = model
            .filter(|m| !m.trim().is_empty())
            .or_else(|| set("OPENAI_MODEL").map(|m| m.trim().to_owned()))
            .ok_or(ConfigError::MissingModel)?;
        let base_url = set("OPENAI_BASE_URL")
            .map(|url| url.trim().to_owned())
            .unwrap_or_else(|| OpenAiConfig::DEFAULT_BASE_URL.to_owned());
        if !is_http_url(&base_url) {
            return Err(ConfigError::Invalid(format!(
                "OPENAI_BASE_URL must start with http:// or https:// (got `{}`)",
                redact_url(&base_url)
            )));
        }
        let mut config = Self::new(model, base_url);
        config.api_key = set("OPENAI_API_KEY").map(|key| ApiKey::new(key.trim()));
        Ok(config)
    }
}

/// What a failed status says, from an error body in any of the shapes
/// servers send; a 401 also says what to do about the key.
fn error_reader(has_key: bool) -> impl Fn(u16, &str) -> Option<(FailureKind, String)> {
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

/// What a client keeps between requests: whether the server refused the
/// configured token field, so the other is sent.
#[derive(Debug, Default)]
pub struct TokenField {
    switched: AtomicBool,
}

/// The field the token limit goes in under `config`: the configured one,
/// or the other once the server refused it.
fn current_field(config: &OpenAiConfig, state: &TokenField) -> MaxTokensField {
    if state.switched.load(Ordering::Relaxed) {
        config.max_tokens_field.other()
    } else {
        config.max_tokens_field
    }
}

impl<T: ?Sized> http::Client<OpenAiConfig, T> {
    /// The field the token limit goes in: the configured one, or the other
    /// once the server refused it.
    pub fn max_tokens_field(&self) -> MaxTokensField {
        current_field(&self.protocol, &self.state)
    }
}

/// The endpoint of `config`'s server.
fn completions_url(config: &OpenAiConfig) -> String {
    format!("{}/chat/completions", config.base_url.trim_end_matches('/'))
}

/// The `Authorization` header's value, when there is a key.
fn bearer(config: &OpenAiConfig) -> Option<String> {
    config
        .api_key
        .as_ref()
        .map(|key| format!("Bearer {}", key.expose()))
}

/// What one request keeps while it is sent: its `Authorization` header's
/// value and its token-field fallback.
#[derive(Debug)]
pub struct Exchange {
    bearer: Option<String>,
    fallback: FieldFallback,
}

/// The token-field fallback of one request: whether the server refused
/// the field the limit was sent in, and the body with the other one.
#[derive(Debug)]
struct FieldFallback {
    field: MaxTokensField,
    refused: AtomicBool,
}

impl FieldFallback {
    /// A request sending its limit in `field`.
    fn new(field: MaxTokensField) -> Self {
        Self {
            field,
            refused: AtomicBool::new(false),
        }
    }

    /// Reads an error body with `describe`, noting a refusal of the field.
    fn read_error(
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
    fn retry_body(&self, body: &[u8]) -> Option<Vec<u8>> {
        if !self.refused.load(Ordering::Relaxed) {
            return None;
        }
        with_field(body, self.field, self.field.other())
    }

    /// The other field worked: the client keeps sending it.
    fn settled(&self, config: &OpenAiConfig, state: &TokenField) {
        state.switched.store(
            self.field.other() != config.max_tokens_field,
            Ordering::Relaxed,
        );
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

/// Chat Completions, as [`OpenAiConfig`] speaks it.
impl Protocol for OpenAiConfig {
    const NAME: &'static str = "openai";
    type State = TokenField;
    type Exchange = Exchange;
    type Stream = stream::ChunkStream;

    fn model(&self) -> &str {
        &self.model
    }

    fn api_key(&self) -> Option<&ApiKey> {
        self.api_key.as_ref()
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
        completions_url(self)
    }

    fn write_body(
        &self,
        state: &TokenField,
        request: &Request<'_>,
        cache: &mut BodyCache,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        let settings = BodySettings {
            model: &self.model,
            max_tokens: self.max_tokens,
            max_tokens_field: current_field(self, state),
            stream: self.stream,
        };
        write_body(request, settings, cache, out)
    }

    fn exchange(&self, state: &TokenField) -> Exchange {
        Exchange {
            bearer: bearer(self),
            fallback: FieldFallback::new(current_field(self, state)),
        }
    }

    /// The key only in `authorization`, and only when there is one.
    fn headers<'a>(&'a self, exchange: &'a Exchange) -> Vec<(&'static str, &'a str)> {
        let accept = if self.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut headers = vec![("content-type", "application/json"), ("accept", accept)];
        if let Some(bearer) = &exchange.bearer {
            headers.insert(0, ("authorization", bearer.as_str()));
        }
        headers
    }

    /// An error body in any of the shapes servers send, noting a refusal
    /// of the token field.
    fn read_error(
        &self,
        exchange: &Exchange,
        status: u16,
        text: &str,
    ) -> Option<(FailureKind, String)> {
        let describe = error_reader(exchange.bearer.is_some());
        exchange.fallback.read_error(&describe, status, text)
    }

    /// A server that does not take this token field gets the other one,
    /// once, and keeps getting it.
    fn resend(&self, exchange: &Exchange, body: &[u8]) -> Option<Vec<u8>> {
        exchange.fallback.retry_body(body)
    }

    fn resent(&self, state: &TokenField, exchange: &Exchange) {
        exchange.fallback.settled(self, state);
    }

    /// An error body is the server's failure.
    fn reply(&self, body: &Value) -> Result<ModelResponse, (FailureKind, String)> {
        if let Some((name, message)) = reply::error_parts(body) {
            let name = name.unwrap_or_else(|| "api_error".to_owned());
            let kind = api_kind(&name, openai_code(body), &message);
            return Err((kind, format!("{name}: {message}")));
        }
        reply::parse_completion(body).map_err(|reason| {
            (
                FailureKind::InvalidResponse,
                format!("the response is not a chat completion: {reason}"),
            )
        })
    }

    fn stream(&self) -> stream::ChunkStream {
        stream::ChunkStream::default()
    }
}
