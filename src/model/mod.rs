//! The [`Model`] trait and its implementations.
//!
//! A model turns a [`Request`] into a [`ModelResponse`] or a [`ModelFailure`].
//! The loop never retries: a failure finishes the conversation `model_error`.

#[cfg(feature = "live")]
pub mod anthropic;
pub mod demo;
mod script_reader;
mod scripted;

pub use scripted::{Script, ScriptedModel, ScriptedReply};

use crate::error::ModelFailure;
use crate::protocol::{ModelResponse, Request};

/// Anything that answers model requests: a replay script, a built-in stub, an HTTP client.
pub trait Model {
    /// Answers one request. A failure ends the conversation as `model_error`.
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure>;
}

impl<M: Model + ?Sized> Model for Box<M> {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        (**self).respond(request)
    }
}
