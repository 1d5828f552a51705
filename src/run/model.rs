//! The [`Model`] trait (its implementations are in the `providers` layer).
//!
//! A model turns a [`Request`] into a [`ModelResponse`] or a [`ModelFailure`].
//! The loop never retries: a failure finishes the conversation `model_error`.

use serde_json::Value;

use crate::core::error::ModelFailure;
use crate::core::protocol::{ModelResponse, Request};

/// A reply together with the JSON it was parsed from, when there was one.
///
/// The parsed [`ModelResponse`] keeps only what the loop uses; `raw` is the
/// reply as received (`id`, `model`, `stop_sequence`, every `usage` field…),
/// which the trace writes. For a stream it is the message assembled from all
/// of its events.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// The parsed reply.
    pub response: ModelResponse,
    /// The reply as received; `None` for models that have no wire form.
    pub raw: Option<Value>,
}

impl Received {
    /// A reply with no wire form (built in code).
    pub fn parsed(response: ModelResponse) -> Self {
        Self {
            response,
            raw: None,
        }
    }
}

/// Anything that answers model requests: a replay script, a built-in stub, an HTTP client.
pub trait Model {
    /// Answers one request. A failure ends the conversation as `model_error`.
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure>;

    /// Answers one request and also hands back the reply as received (what
    /// the driver calls). The default has no wire form: it wraps
    /// [`Model::respond`]. Models that read JSON override it.
    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        self.respond(request).map(Received::parsed)
    }
}

impl<M: Model + ?Sized> Model for Box<M> {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        (**self).respond(request)
    }

    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        (**self).respond_received(request)
    }
}

/// Gives each delegation its model.
pub trait ChildModels: Send + Sync {
    /// The model for the `number`-th delegation of the run (1-based).
    fn model_for(&self, number: usize) -> Box<dyn Model + Send>;
}

/// Any `Fn(number) -> model` hands out child models (e.g. one live client per child).
impl<F> ChildModels for F
where
    F: Fn(usize) -> Box<dyn Model + Send> + Send + Sync,
{
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        self(number)
    }
}
