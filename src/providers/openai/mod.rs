//! OpenAI-compatible Chat Completions (`POST {base}/chat/completions`):
//! OpenAI itself, and the servers that speak its format (Ollama, vLLM,
//! llama.cpp's server, LM Studio, OpenRouter, …).
//!
//! The mapping between the crate's wire types and Chat Completions,
//! [`request`] and the reading of replies, is plain data and always built, so a trace's
//! `chat.completion` replies read back without an HTTP crate. Behind the
//! `live` cargo feature, the protocol's settings (`OpenAiConfig`) and its
//! stream assembler (`stream`) make the shared `http::Client` and
//! `http::HttpModel` speak Chat Completions (`Client`, `OpenAiModel`, a
//! [`Model`]): the same transport, retries (429 and 5xx retried,
//! 400/401/403/404 not), timeouts, stop of a request in flight, streamed
//! text and key scrubbing as the Anthropic client. The API key is optional (local servers often need none):
//! without one no `Authorization` header is sent, and a 401 says to set
//! `OPENAI_API_KEY`.
//!
//! [`Model`]: crate::Model

pub(crate) mod reply;
pub mod request;
#[cfg(feature = "live")]
pub(crate) mod stream;

#[cfg(feature = "live")]
mod client;
#[cfg(feature = "live")]
pub use client::OpenAiConfig;

#[cfg(feature = "live")]
use crate::providers::http;

/// The HTTP client, shared by the parent's model and every child's.
#[cfg(feature = "live")]
pub type Client = http::Client<OpenAiConfig>;

/// A [`Model`](crate::run::model::Model) over a shared [`Client`].
#[cfg(feature = "live")]
pub type OpenAiModel = http::HttpModel<OpenAiConfig>;

/// The async HTTP client (feature `async`): the same requests, retries,
/// token-field fallback, stream assembly and failures as [`Client`], sent
/// through an async transport
/// (reqwest on tokio by default).
#[cfg(feature = "async")]
pub type AsyncClient = http::Client<OpenAiConfig, dyn http::async_transport::AsyncTransport>;

/// An [`AsyncModel`](crate::run::model::AsyncModel) over a shared
/// [`AsyncClient`]: what [`OpenAiModel`] is to a blocking run.
#[cfg(feature = "async")]
pub type AsyncOpenAiModel =
    http::HttpModel<OpenAiConfig, dyn http::async_transport::AsyncTransport>;
