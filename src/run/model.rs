//! The [`Model`] trait (its implementations are in the `providers` layer).
//!
//! A model turns a [`Request`] into a [`ModelResponse`] or a [`ModelFailure`].
//! The loop never retries: a failure finishes the conversation `model_error`.

use serde_json::Value;

use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{ModelResponse, Request};

/// A reply together with the JSON it was parsed from, when there was one.
///
/// The parsed [`ModelResponse`] keeps only what the loop uses; `raw` is the
/// reply as received (`id`, `model`, `stop_sequence`, every `usage` field…),
/// which the trace writes. For a stream it is the message assembled from all
/// of its events.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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

    /// A reply and its wire form, as received (what a journal or a trace
    /// replays).
    pub fn with_raw(response: ModelResponse, raw: Option<Value>) -> Self {
        Self { response, raw }
    }
}

/// Who answers a model's requests, as telemetry names it: the provider
/// (`gen_ai.provider.name`: `anthropic`, `openai`, `subloop.scripted`…)
/// and the model asked for (`gen_ai.request.model`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelIdentity {
    /// The provider, as the OpenTelemetry GenAI conventions name it.
    pub provider: String,
    /// The model name sent with each request; `None` when there is none.
    pub model: Option<String>,
}

impl ModelIdentity {
    /// A provider and the model asked of it.
    pub fn new(provider: impl Into<String>, model: Option<String>) -> Self {
        Self {
            provider: provider.into(),
            model,
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

    /// The provider and model, for the spans of each request. The default
    /// is `None` (nothing is said about either).
    fn identity(&self) -> Option<ModelIdentity> {
        None
    }
}

impl<M: Model + ?Sized> Model for &mut M {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        (**self).respond(request)
    }

    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        (**self).respond_received(request)
    }

    fn identity(&self) -> Option<ModelIdentity> {
        (**self).identity()
    }
}

impl<M: Model + ?Sized> Model for Box<M> {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        (**self).respond(request)
    }

    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        (**self).respond_received(request)
    }

    fn identity(&self) -> Option<ModelIdentity> {
        (**self).identity()
    }
}

/// The future of an [`AsyncModel`]'s answer.
pub(crate) type ModelFuture<'a> = crate::run::BoxFuture<'a, Result<Received, ModelFailure>>;

/// A model answered without blocking: an async HTTP client, or anything
/// else that waits on I/O. For a run spawned on a multi-threaded runtime,
/// the model is `Send` (`&mut (dyn AsyncModel + Send)`). The agent's async entry points
/// (`Agent::run_async`) drive it; dropping the future abandons the
/// request.
///
/// Every blocking [`Model`] can be used where an `AsyncModel` is wanted
/// through [`Blocking`]: it answers on the caller's thread, which is right
/// for models that never wait (scripts, the demo) and wrong for ones that
/// do (a blocking HTTP client would hold an executor thread).
pub trait AsyncModel {
    /// Answers one request, handing back the reply as received (see
    /// [`Model::respond_received`]). A failure ends the conversation as
    /// `model_error`.
    fn respond_async<'a>(&'a mut self, request: &'a Request<'_>) -> ModelFuture<'a>;

    /// The provider and model (see [`Model::identity`]); the default is `None`.
    fn identity(&self) -> Option<ModelIdentity> {
        None
    }
}

impl<M: AsyncModel + ?Sized> AsyncModel for Box<M> {
    fn respond_async<'a>(&'a mut self, request: &'a Request<'_>) -> ModelFuture<'a> {
        (**self).respond_async(request)
    }

    fn identity(&self) -> Option<ModelIdentity> {
        (**self).identity()
    }
}

/// A blocking [`Model`] used as an [`AsyncModel`]: each request is answered
/// on the caller's thread when the request is made, and the future returned
/// is already complete. This is how the blocking entry points drive the one
/// async loop, and how a script or the demo model runs in an async run.
#[derive(Debug, Clone, Default)]
pub struct Blocking<M>(pub M);

impl<M: Model> AsyncModel for Blocking<M> {
    fn respond_async<'a>(&'a mut self, request: &'a Request<'_>) -> ModelFuture<'a> {
        let answer = self.0.respond_received(request);
        Box::pin(std::future::ready(answer))
    }

    fn identity(&self) -> Option<ModelIdentity> {
        self.0.identity()
    }
}

/// Gives each delegation its model.
pub trait ChildModels: Send + Sync {
    /// The model for the `number`-th delegation of the run (1-based).
    fn model_for(&self, number: usize) -> Box<dyn Model + Send>;

    /// The model for the `number`-th delegation of an async run
    /// (`Agent::run_async`). The default is [`ChildModels::model_for`]'s
    /// model through [`Blocking`], answered on the run's own task; a host
    /// whose children talk to a server returns an async client here.
    fn async_model_for(&self, number: usize) -> Box<dyn AsyncModel + Send> {
        Box::new(Blocking(self.model_for(number)))
    }
}

/// Child models for async runs only: each delegation of an async run gets
/// the async model `make(number)` returns (an async HTTP client, say). In a
/// blocking run, whose children must be blocking models, each child's
/// request fails with a model error that says so.
///
/// ```
/// use subloop::run::model::{AsyncChildren, AsyncModel, Blocking};
/// use subloop::ModelResponse;
/// use subloop::providers::scripted::ScriptedModel;
///
/// let children = AsyncChildren(|_number: usize| -> Box<dyn AsyncModel + Send> {
///     Box::new(Blocking(ScriptedModel::new(vec![Ok(ModelResponse::answer("done"))])))
/// });
/// # let _ = children;
/// ```
#[derive(Debug, Clone)]
pub struct AsyncChildren<F>(pub F);

/// The blocking model of [`AsyncChildren`]: every request fails.
#[derive(Debug)]
struct AsyncOnly;

impl Model for AsyncOnly {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        Err(ModelFailure::with_kind(
            FailureKind::Request,
            "this host's child models are async: a child runs only in an async run (Agent::run_async)",
        ))
    }
}

impl<F> ChildModels for AsyncChildren<F>
where
    F: Fn(usize) -> Box<dyn AsyncModel + Send> + Send + Sync,
{
    fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
        Box::new(AsyncOnly)
    }

    fn async_model_for(&self, number: usize) -> Box<dyn AsyncModel + Send> {
        (self.0)(number)
    }
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
