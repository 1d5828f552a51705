//! The async Chat Completions client (feature `async`): the same requests,
//! retries, token-field fallback, stream assembly and failures as
//! [`super::Client`], sent through an [`AsyncTransport`] (reqwest on tokio
//! by default).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::client::{
    FieldFallback, OpenAiConfig, OpenAiError, bearer, body_for, completions_url, current_field,
    error_reader, headers, parse_body,
};
use super::request::MaxTokensField;
use super::stream::ChunkStream;
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::Request;
use crate::providers::http::async_client::{
    AsyncHttpClient, AsyncSuccess, read_stream_async, until_stopped_async,
};
use crate::providers::http::async_transport::{AsyncTransport, ReqwestTransport};
use crate::providers::http::{Secrets, StopProbe, StopSlot, TextSink};
use crate::run::model::{AsyncModel, ModelFuture, Received};

/// The async HTTP client, shared (through an `Arc`) by the parent's model
/// and every child's, and by every run that holds it: one connection pool.
pub struct AsyncClient {
    config: OpenAiConfig,
    http: AsyncHttpClient,
    on_text: Option<TextSink>,
    /// Whether the server refused the configured token field, so the other is sent.
    other_field: AtomicBool,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AsyncClient {
    /// A client over a real HTTP connection (reqwest, rustls). It is
    /// awaited on a tokio runtime.
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiError> {
        let transport = ReqwestTransport::new(config.timeouts)
            .map_err(|err| OpenAiError::Invalid(err.message))?;
        Ok(Self::with_transport(config, Arc::new(transport)))
    }

    /// A client over any async transport.
    pub fn with_transport(config: OpenAiConfig, transport: Arc<dyn AsyncTransport>) -> Self {
        let secrets = Secrets::new(config.api_key.as_ref(), &config.base_url);
        let http = AsyncHttpClient::new(transport, config.retry, secrets);
        Self {
            config,
            http,
            on_text: None,
            other_field: AtomicBool::new(false),
        }
    }

    /// Calls `record` with each wait between retries instead of waiting
    /// (tests record the delays).
    pub fn with_sleeper(mut self, record: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.http.set_sleeper(record);
        self
    }

    /// Shows streamed text as it arrives, as
    /// [`super::Client::with_text_sink`] does.
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

    /// The field the token limit goes in: the configured one, or the other
    /// once the server refused it.
    pub fn max_tokens_field(&self) -> MaxTokensField {
        current_field(&self.config, &self.other_field)
    }

    /// The exact JSON body of a request (the blocking client's).
    pub fn request_body(&self, request: &Request<'_>) -> serde_json::Value {
        body_for(&self.config, self.max_tokens_field(), request)
    }

    fn body_bytes(&self, request: &Request<'_>) -> Result<Vec<u8>, ModelFailure> {
        serde_json::to_vec(&self.request_body(request)).map_err(|err| {
            self.http.attempts().fail(
                FailureKind::Serialization,
                format!("cannot serialize the request: {err}"),
            )
        })
    }

    /// Sends one request, retrying what is worth retrying, and hands back
    /// the reply as received.
    pub async fn send_received(&self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let body = self.body_bytes(request)?;
        self.send_body(&body, None).await
    }

    /// Sends a serialized request body; no retry starts once `stop` says
    /// the run was stopped.
    pub async fn send_body(
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
        let success = match self
            .http
            .post(&url, &headers, body, stop, &read_error)
            .await
        {
            // A server that does not take this token field gets the other
            // one, once, and keeps getting it.
            Err(failure) => {
                let Some(body) = fallback.retry_body(body) else {
                    return Err(failure);
                };
                let success = self
                    .http
                    .post(&url, &headers, &body, stop, &describe)
                    .await?;
                fallback.settled(&self.config, &self.other_field);
                success
            }
            Ok(success) => success,
        };
        match success {
            AsyncSuccess::Stream(response) => {
                let attempts = self.http.attempts();
                attempts.streamed(
                    read_stream_async(
                        response,
                        self.on_text.as_ref(),
                        false,
                        attempts.redactor(),
                        ChunkStream::default(),
                    )
                    .await,
                )
            }
            AsyncSuccess::Body(text) => parse_body(self.http.attempts(), &text),
        }
    }
}

/// An [`AsyncModel`] over a shared [`AsyncClient`]: what
/// [`super::OpenAiModel`] is to a blocking run. Cloning it is cheap.
#[derive(Clone)]
pub struct AsyncOpenAiModel {
    client: Arc<AsyncClient>,
    stop: Option<StopSlot>,
}

impl std::fmt::Debug for AsyncOpenAiModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncOpenAiModel")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl AsyncOpenAiModel {
    /// A model that sends through `client`.
    pub fn new(client: Arc<AsyncClient>) -> Self {
        Self { client, stop: None }
    }

    /// A model whose requests the run can stop in flight (see
    /// [`crate::providers::anthropic::AsyncAnthropicModel::with_stop`]).
    pub fn with_stop(client: Arc<AsyncClient>, slot: StopSlot) -> Self {
        Self {
            client,
            stop: Some(slot),
        }
    }
}

impl AsyncModel for AsyncOpenAiModel {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new(
            "openai",
            Some(self.client.config().model.clone()),
        ))
    }

    fn respond_async<'a>(&'a mut self, request: &'a Request<'_>) -> ModelFuture<'a> {
        let client = Arc::clone(&self.client);
        let probe = self.stop.as_ref().and_then(|slot| slot.get()).cloned();
        let body = self.client.body_bytes(request);
        Box::pin(async move {
            let body = body?;
            let send = client.send_body(&body, probe.as_ref());
            match until_stopped_async(probe.clone(), send).await {
                Some(result) => result,
                None => Err(client.http.attempts().abandoned()),
            }
        })
    }
}
