//! What a provider is: its protocol. Everything else — the transport, the
//! retries, the stop of a request in flight, the scrubbing of secrets, the
//! showing of streamed text, blocking or async — is the shared
//! [`Client`](super::Client) and [`HttpModel`](super::HttpModel).
//!
//! The trait is sealed: it is public in a private module, so the
//! providers' settings (`anthropic::LiveConfig`, `openai::OpenAiConfig`)
//! implement it and nothing outside the crate can, nor name it.

use serde_json::Value;

use super::ApiKey;
use super::retry::RetryPolicy;
use super::stream::StreamParser;
use super::transport::Timeouts;
use crate::core::error::FailureKind;
use crate::core::protocol::{ModelResponse, Request};
pub use crate::providers::body::BodyCache;

/// A provider's protocol, implemented by its settings: where a request
/// goes, with which headers and body, and how its reply, its event stream
/// and its error bodies read.
pub trait Protocol: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The provider's name in a model's identity (`anthropic`, `openai`).
    const NAME: &'static str;
    /// What a client keeps between requests (the OpenAI-compatible
    /// protocol: which token field the server takes).
    type State: Default + Send + Sync;
    /// What one request keeps while it is sent: the values its headers
    /// borrow, what its error bodies said.
    type Exchange: Send + Sync;
    /// The protocol's event stream, assembled into a reply.
    type Stream: StreamParser + Send;

    /// The model name.
    fn model(&self) -> &str;
    /// The API key, if any; hidden from every error text and reply.
    fn api_key(&self) -> Option<&ApiKey>;
    /// The base URL; its userinfo is hidden from every error text and reply.
    fn base_url(&self) -> &str;
    /// The transport's timeouts.
    fn timeouts(&self) -> Timeouts;
    /// The retry policy.
    fn retry(&self) -> RetryPolicy;

    /// The endpoint.
    fn url(&self) -> String;
    /// The exact JSON body of `request`, written into `out` without a
    /// value tree, with what `cache` kept from the model's earlier requests
    /// (its tools and history messages, each written once).
    fn write_body(
        &self,
        state: &Self::State,
        request: &Request<'_>,
        cache: &mut BodyCache,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error>;
    /// The body [`Protocol::write_body`] writes, read back as a value (for
    /// a host that inspects a request; the client sends the written bytes).
    fn body(&self, state: &Self::State, request: &Request<'_>) -> Value {
        let mut out = Vec::new();
        match self.write_body(state, request, &mut BodyCache::default(), &mut out) {
            Ok(()) => serde_json::from_slice(&out).unwrap_or(Value::Null),
            // Values and strings always serialize; nothing to show otherwise.
            Err(_) => Value::Null,
        }
    }
    /// What one request keeps while it is sent.
    fn exchange(&self, state: &Self::State) -> Self::Exchange;
    /// The headers of a request (the key only in the one that carries it).
    fn headers<'a>(&'a self, exchange: &'a Self::Exchange) -> Vec<(&'static str, &'a str)>;
    /// The kind and message of an error body (`status`, body text); `None`
    /// when the body is not in the protocol's error shape.
    fn read_error(
        &self,
        exchange: &Self::Exchange,
        status: u16,
        text: &str,
    ) -> Option<(FailureKind, String)>;
    /// The body to send once more when the request failed, if what the
    /// server said calls for another body (not a retry of the same one).
    fn resend(&self, _exchange: &Self::Exchange, _body: &[u8]) -> Option<Vec<u8>> {
        None
    }
    /// The body [`Protocol::resend`] gave was taken.
    fn resent(&self, _state: &Self::State, _exchange: &Self::Exchange) {}
    /// A whole (non-streamed) JSON response body read as a reply, or the
    /// kind and message of its failure (an error body, another shape).
    fn reply(&self, body: &Value) -> Result<ModelResponse, (FailureKind, String)>;
    /// A parser for the protocol's event stream.
    fn stream(&self) -> Self::Stream;
}
