//! OpenAI-compatible Chat Completions (`POST {base}/chat/completions`):
//! OpenAI itself, and the servers that speak its format (Ollama, vLLM,
//! llama.cpp's server, LM Studio, OpenRouter, …).
//!
//! The mapping between the crate's wire types and Chat Completions,
//! [`request`] and the reading of replies, is plain data and always built, so a trace's
//! `chat.completion` replies read back without an HTTP crate. Behind the
//! `live` cargo feature, the client (`Client`, `OpenAiModel`, a [`Model`])
//! and the stream assembler (`stream`) sit on the same `http` layer as the
//! Anthropic client: the same transport, retries (429 and 5xx retried,
//! 400/401/403/404 not), timeouts, stop of a request in flight and key
//! scrubbing. The API key is optional (local servers often need none):
//! without one no `Authorization` header is sent, and a 401 says to set
//! `OPENAI_API_KEY`.
//!
//! [`Model`]: crate::Model

pub(crate) mod reply;
pub mod request;
#[cfg(feature = "live")]
pub(crate) mod stream;

#[cfg(feature = "async")]
mod async_client;
#[cfg(feature = "live")]
mod client;
#[cfg(feature = "async")]
pub use async_client::{AsyncClient, AsyncOpenAiModel};
#[cfg(feature = "live")]
pub use client::{
    Client, DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS, OpenAiConfig, OpenAiError, OpenAiModel,
};
