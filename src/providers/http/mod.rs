//! The one HTTP layer of every provider: the transport (ureq, or reqwest
//! with the feature `async`; its [`Timeouts`]), the
//! retry policy ([`retry`]), the send loop that applies it, the stop of a
//! request in flight, and the scrubbing of secrets from error texts and
//! from every reply.
//!
//! A provider is its protocol: its settings say where a request goes,
//! with which headers and body, and how its reply, its event stream and
//! its error bodies read. The rest is shared: one [`Client`] and one
//! [`HttpModel`], generic over the protocol and over the transport
//! (blocking, or async with the feature `async`), send through one loop.
//! A whole body is read inside that loop (so a timeout or a reset while
//! reading it is retried like one before the headers); an event stream
//! is read by the protocol's parser, never retried once the headers
//! arrived.

#[cfg(feature = "async")]
pub(crate) mod async_transport;
mod client;
pub(crate) mod protocol;
pub mod retry;
pub(crate) mod sse;
pub(crate) mod stream;
pub(crate) mod transport;
pub(crate) mod wire;

pub use client::{Client, HttpModel};
pub use transport::Timeouts;

/// Why a provider's settings are unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `ANTHROPIC_API_KEY` is missing or empty (the Messages API needs a key).
    #[error("ANTHROPIC_API_KEY is not set; export your API key to use the Messages API")]
    MissingKey,
    /// No model is named (`OPENAI_MODEL` is not set either): an
    /// OpenAI-compatible server has no model every server knows.
    #[error(
        "the openai provider needs a model name: set OPENAI_MODEL or give one (no name is known to every server)"
    )]
    MissingModel,
    /// A setting is unusable.
    #[error("{0}")]
    Invalid(String),
}

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use self::retry::{RetryPolicy, retryable_status, should_retry_header};
use self::transport::{TransportError, TransportErrorKind};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::redact::{Redactor, StreamRedactor};
use crate::run::limits::StopSignal;
use crate::run::model::Received;

/// Secrets shorter than this many characters are not scrubbed: replacing a
/// one-letter "key" would garble every message, and so short a string is
/// no secret worth hiding.
pub(crate) const MIN_SCRUBBED_CHARS: usize = crate::core::redact::MIN_SECRET_CHARS;
/// The largest non-streaming body read (32 MiB).
pub(crate) const MAX_BODY: u64 = 32 * 1024 * 1024;
/// The largest error body read (1 MiB).
pub(crate) const MAX_ERROR_BODY: u64 = 1024 * 1024;
/// The largest event stream read (64 MiB).
pub(crate) const MAX_STREAM: u64 = 64 * 1024 * 1024;

/// The userinfo (`user:password`) of a URL, if it has one: everything
/// before the last `@`. Wider than the URL grammar on purpose: a password
/// pasted with an unencoded `/`, `?` or `#` is still hidden (at worst a
/// path holding an `@` is hidden too).
pub(crate) fn userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.rsplit_once('@')
        .map(|(info, _)| info)
        .filter(|info| !info.is_empty())
}

/// `url` with its userinfo (`https://user:key@host`) replaced by `***`:
/// the form that may be printed.
pub(crate) fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some(info) => url.replacen(&format!("{info}@"), "***@", 1),
        None => url.to_owned(),
    }
}

/// Whether `url` starts with `http://` or `https://`.
pub(crate) fn is_http_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// An API key. It has no `Display`, and `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the one header that carries it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// What is hidden from every error text and every reply: the API key (if
/// any) and the base URL's userinfo.
#[derive(Clone)]
pub(crate) struct Secrets {
    key: Option<ApiKey>,
    base_url: String,
    /// The key and the base URL's password, for texts that are not errors.
    redactor: Redactor,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets(***)")
    }
}

impl Secrets {
    /// The secrets of a provider's settings.
    pub fn new(key: Option<&ApiKey>, base_url: &str) -> Self {
        let password = userinfo(base_url)
            .and_then(|info| info.split_once(':'))
            .map(|(_, password)| password.to_owned());
        let redactor = Redactor::new(
            key.map(|key| key.expose().to_owned())
                .into_iter()
                .chain(password),
        );
        Self {
            key: key.cloned(),
            base_url: base_url.to_owned(),
            redactor,
        }
    }

    /// Hides the secrets from an error text: the API key and the password
    /// of the base URL when at least [`MIN_SCRUBBED_CHARS`] long, and the
    /// base URL's whole userinfo wherever it appears before an `@`.
    pub fn scrub(&self, mut text: String) -> String {
        let long = |secret: &str| secret.chars().count() >= MIN_SCRUBBED_CHARS;
        if let Some(key) = &self.key
            && long(key.expose())
        {
            text = text.replace(key.expose(), "***");
        }
        if let Some(info) = userinfo(&self.base_url) {
            text = text.replace(&format!("{info}@"), "***@");
            if let Some((_, password)) = info.split_once(':')
                && long(password)
            {
                text = text.replace(password, "***");
            }
        }
        text
    }
}

/// Where a run puts its [`StopSignal`] (`Agent::stop_signal`) once it
/// exists; one slot per run, given to each of its models.
pub type StopSlot = Arc<OnceLock<StopSignal>>;

/// Finds an error's kind and text (`name: message`, its name and message
/// as the server gave them) in an error body (`status`, body text); `None`
/// when the body is not the provider's error shape.
pub(crate) type ErrorReader<'a> = &'a (dyn Fn(u16, &str) -> Option<(FailureKind, String)> + Sync);

/// What every attempt of a request comes to, decided without I/O: give
/// the body to the provider, wait and send again, or give up with a
/// failure whose text has the secrets scrubbed. The one send loop
/// ([`wire`]) decides through it, blocking or async, so both retry the
/// same statuses, wait the same delays and fail with the same texts.
#[derive(Clone)]
pub(crate) struct Attempts {
    policy: RetryPolicy,
    secrets: Secrets,
}

impl std::fmt::Debug for Attempts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempts")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The kind of failure of a body that could not be read.
fn body_error_kind(err: &std::io::Error) -> FailureKind {
    match err.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => FailureKind::Timeout,
        _ => FailureKind::Connection,
    }
}

impl Attempts {
    /// Attempts under `policy`, hiding `secrets` from every failure text.
    pub fn new(policy: RetryPolicy, secrets: Secrets) -> Self {
        Self { policy, secrets }
    }

    /// A failure of `kind` whose message has the secrets scrubbed.
    pub fn fail(&self, kind: FailureKind, message: String) -> ModelFailure {
        ModelFailure::with_kind(kind, self.secrets.scrub(message))
    }

    /// The secrets as a [`Redactor`] (see [`Secrets::redactor`]).
    pub fn redactor(&self) -> &Redactor {
        &self.secrets.redactor
    }

    /// A reply with the secrets scrubbed from the parsed reply (its text,
    /// its calls' inputs) and from the reply as received: every reply
    /// passes here before the run, the trace or a span sees it.
    pub fn received(&self, mut received: Received) -> Received {
        let redactor = self.redactor();
        redactor.response(&mut received.response);
        if let Some(raw) = &mut received.raw {
            redactor.value(raw);
        }
        received
    }

    /// A stream's reply, scrubbed ([`Attempts::received`]), or its failure,
    /// its kind kept and its text scrubbed ([`Attempts::stream_failed`]).
    pub fn streamed(
        &self,
        result: Result<Received, ModelFailure>,
    ) -> Result<Received, ModelFailure> {
        match result {
            Ok(received) => Ok(self.received(received)),
            Err(failure) => Err(self.stream_failed(failure)),
        }
    }

    /// The failure of a request given up because the run was stopped.
    pub fn abandoned(&self) -> ModelFailure {
        self.fail(
            FailureKind::Cancelled,
            "the request was abandoned because the run was stopped".to_owned(),
        )
    }

    /// A provider's stream failure, its kind kept (`stream_error` if it has
    /// none) and its text scrubbed.
    pub fn stream_failed(&self, failure: ModelFailure) -> ModelFailure {
        self.fail(
            failure.kind().cloned().unwrap_or(FailureKind::Stream),
            failure.message().to_owned(),
        )
    }

    /// A whole response body read as JSON, or the `invalid_response`
    /// failure that quotes its start.
    pub fn json_body(&self, text: &str) -> Result<serde_json::Value, ModelFailure> {
        serde_json::from_str(text).map_err(|err| {
            let snippet: String = text.chars().take(200).collect();
            self.fail(
                FailureKind::InvalidResponse,
                format!("the response is not JSON ({err}): {snippet}"),
            )
        })
    }

    /// Attempt `retry` (0-based) got a 2xx status whose body could not be
    /// read: the wait before the next attempt, or the failure. A timeout or
    /// a reset while reading is retried like one before the headers.
    pub fn body_failed(&self, retry: u32, err: &std::io::Error) -> Result<Duration, ModelFailure> {
        let kind = body_error_kind(err);
        if retry >= self.policy.max_retries {
            let attempts = retry + 1;
            return Err(self.fail(
                kind.clone(),
                format!("{kind}: reading the response failed: {err} (after {attempts} attempt(s))"),
            ));
        }
        Ok(self.policy.delay(retry, None, None, SystemTime::now()))
    }

    /// Attempt `retry` got an error `status` with `headers` and the body
    /// `text`: the wait before the next attempt, or the failure, whose text
    /// holds what `read_error` finds in the body (else its first 200
    /// characters).
    pub fn status_failed(
        &self,
        retry: u32,
        status: u16,
        headers: &[(String, String)],
        text: &str,
        read_error: ErrorReader<'_>,
    ) -> Result<Duration, ModelFailure> {
        let header = |name: &str| find_header(headers, name);
        let attempts = retry + 1;
        let failure = match read_error(status, text) {
            Some((kind, said)) => self.fail(
                kind,
                format!("HTTP {status} {said} (after {attempts} attempt(s))"),
            ),
            None => {
                let snippet: String = text.chars().take(200).collect();
                self.fail(
                    FailureKind::Http,
                    format!("HTTP {status}: {snippet} (after {attempts} attempt(s))"),
                )
            }
        };
        let wanted = should_retry_header(header("x-should-retry"))
            .unwrap_or_else(|| retryable_status(status));
        if !wanted || retry >= self.policy.max_retries {
            return Err(failure);
        }
        Ok(self.policy.delay(
            retry,
            header("retry-after-ms"),
            header("retry-after"),
            SystemTime::now(),
        ))
    }

    /// Attempt `retry` got no HTTP response: the wait before the next
    /// attempt, or the failure. A response that did not come in time is
    /// never asked again (the server may still be generating it), nor is a
    /// failure of another kind (a bad URL, TLS).
    pub fn transport_failed(
        &self,
        retry: u32,
        err: &TransportError,
    ) -> Result<Duration, ModelFailure> {
        let attempts = retry + 1;
        if err.kind == TransportErrorKind::ResponseTimeout {
            // The server may still be generating the reply: asking
            // again would only start a second generation.
            return Err(self.fail(
                FailureKind::Timeout,
                format!(
                    "timeout_error: no response in time: {err} (after {attempts} attempt(s)); not sent again, since the server may still be working on it; for a slow server (a local model), stream the reply, ask for fewer tokens, or allow a longer read timeout"
                ),
            ));
        }
        let kind = match err.kind {
            TransportErrorKind::Timeout | TransportErrorKind::ResponseTimeout => {
                FailureKind::Timeout
            }
            TransportErrorKind::Connection => FailureKind::Connection,
            TransportErrorKind::Other => FailureKind::Request,
        };
        if err.kind == TransportErrorKind::Other || retry >= self.policy.max_retries {
            let message = format!("{kind}: {err} (after {attempts} attempt(s))");
            return Err(self.fail(kind, message));
        }
        Ok(self.policy.delay(retry, None, None, SystemTime::now()))
    }
}

/// The first value of header `name` (case-insensitive) among `headers`.
pub(crate) fn find_header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

/// Whether `headers` announce an event stream (`content-type: text/event-stream`).
pub(crate) fn is_event_stream(headers: &[(String, String)]) -> bool {
    find_header(headers, "content-type").is_some_and(|kind| kind.starts_with("text/event-stream"))
}

/// Where streamed text is shown as it arrives (the CLI prints it on stderr).
pub(crate) type TextSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How streamed text reaches a [`TextSink`]: as it arrives, or by whole
/// lines, and in both cases ending its line once the stream is over.
pub(crate) struct Shown<'s> {
    sink: Option<&'s TextSink>,
    /// Hides the secrets, holding back what may be the start of one.
    redact: StreamRedactor,
    whole_lines: bool,
    /// Whether the text shown so far ends in the middle of a line.
    open_line: bool,
    /// With `whole_lines`, the text of the line not yet ended.
    pending: String,
}

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shown")
            .field("whole_lines", &self.whole_lines)
            .finish_non_exhaustive()
    }
}

impl<'s> Shown<'s> {
    /// Text shown on `sink` (if any) with `redactor`'s secrets hidden (a
    /// piece that may start one waits for the next); with `whole_lines`,
    /// only whole lines reach it, so a stream running beside others never
    /// leaves a line open for their text or progress lines to join.
    pub fn new(sink: Option<&'s TextSink>, whole_lines: bool, redactor: &Redactor) -> Self {
        Self {
            sink,
            redact: StreamRedactor::new(redactor.clone()),
            whole_lines,
            open_line: false,
            pending: String::new(),
        }
    }

    /// Shows a piece of streamed text.
    pub fn text(&mut self, text: &str) {
        if self.sink.is_none() || text.is_empty() {
            return;
        }
        let shown = self.redact.push(text);
        self.show(&shown);
    }

    fn show(&mut self, text: &str) {
        let Some(sink) = self.sink else { return };
        if text.is_empty() {
            return;
        }
        if self.whole_lines {
            self.pending.push_str(text);
            if let Some(end) = self.pending.rfind('\n') {
                let rest = self.pending.split_off(end + 1);
                sink(&std::mem::replace(&mut self.pending, rest));
            }
        } else {
            self.open_line = !text.ends_with('\n');
            sink(text);
        }
    }

    /// The stream is over: the text shown ends its line, so what is
    /// printed next (a progress line, an error) starts on a line of its own.
    pub fn end(mut self) {
        let Some(sink) = self.sink else { return };
        let held = self.redact.finish();
        self.show(&held);
        if !self.pending.is_empty() {
            self.pending.push('\n');
            sink(&self.pending);
        } else if self.open_line {
            sink("\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed_when_long_enough() {
        let key = ApiKey::new("sk-very-secret-1234");
        let secrets = Secrets::new(Some(&key), "https://user:hunter2hunter2@host/v1");
        let text = secrets.scrub(
            "sk-very-secret-1234 at https://user:hunter2hunter2@host and hunter2hunter2".into(),
        );
        assert_eq!(text, "*** at https://***@host and ***");
        let none = Secrets::new(None, "http://localhost:8080/v1");
        assert_eq!(none.scrub("plain".into()), "plain");
        let short = Secrets::new(Some(&ApiKey::new("k")), "http://h");
        assert_eq!(short.scrub("keep k".into()), "keep k");
    }

    /// A transport's own error text (a TLS or proxy failure may quote the
    /// URL or a header) reaches the run without the key.
    #[test]
    fn a_transport_error_loses_the_key() {
        let key = ApiKey::new("sk-very-secret-1234");
        let attempts = Attempts::new(
            RetryPolicy::default(),
            Secrets::new(Some(&key), "https://host/v1"),
        );
        let error = TransportError {
            kind: TransportErrorKind::Other,
            message: "tls failed for sk-very-secret-1234".to_owned(),
        };
        let Err(failure) = attempts.transport_failed(0, &error) else {
            panic!("an error of kind Other is not retried");
        };
        assert!(
            !failure.message().contains("sk-very-secret-1234"),
            "{failure}"
        );
        assert!(failure.message().contains("***"), "{failure}");
    }

    #[test]
    fn replies_and_streamed_text_lose_the_key() {
        use crate::core::protocol::ModelResponse;
        let key = ApiKey::new("sk-very-secret-1234");
        let secrets = Secrets::new(Some(&key), "https://user:hunter2hunter2@host/v1");
        let attempts = Attempts::new(RetryPolicy::default(), secrets);
        let response = ModelResponse::answer("sk-very-secret-1234 and hunter2hunter2");
        let raw = serde_json::json!({"content": [{"type": "text", "text": "sk-very-secret-1234"}]});
        let received = attempts.received(Received {
            response,
            raw: Some(raw),
        });
        let text = serde_json::to_string(&received.response).expect("json");
        assert!(text.contains("*** and ***"), "{text}");
        assert_eq!(
            received.raw,
            Some(serde_json::json!({"content": [{"type": "text", "text": "***"}]}))
        );
        // Streamed text: the key cut in two pieces is still hidden.
        let seen = Arc::new(std::sync::Mutex::new(String::new()));
        let into = Arc::clone(&seen);
        let sink: TextSink = Arc::new(move |text: &str| {
            into.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_str(text);
        });
        let mut shown = Shown::new(Some(&sink), false, attempts.redactor());
        shown.text("key: sk-very-se");
        shown.text("cret-1234 done");
        shown.end();
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(seen, "key: *** done\n");
    }
}
