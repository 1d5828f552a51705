//! The async Messages API client (feature `async`): the same requests,
//! retries, stream assembly and failures as [`super::Client`], sent
//! through an [`AsyncTransport`] (reqwest on tokio by default).

use std::sync::Arc;
use std::time::Duration;

use super::sse::StreamAssembler;
use super::{LiveConfig, LiveError, headers, messages_url, parse_body, read_error, request_body};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::Request;
use crate::providers::http::async_client::{
    AsyncHttpClient, AsyncSuccess, read_stream_async, until_stopped_async,
};
use crate::providers::http::async_transport::{AsyncTransport, ReqwestTransport};
use crate::providers::http::{Secrets, StopSlot, TextSink};
use crate::run::model::{AsyncModel, ModelFuture, Received};

/// The async HTTP client, shared (through an `Arc`) by the parent's model
/// and every child's, and by every run that holds it: one connection pool.
pub struct AsyncClient {
    config: LiveConfig,
    http: AsyncHttpClient,
    on_text: Option<TextSink>,
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
    pub fn new(config: LiveConfig) -> Result<Self, LiveError> {
        let transport = ReqwestTransport::new(config.timeouts)
            .map_err(|err| LiveError::Invalid(err.message))?;
        Ok(Self::with_transport(config, Arc::new(transport)))
    }

    /// A client over any async transport.
    pub fn with_transport(config: LiveConfig, transport: Arc<dyn AsyncTransport>) -> Self {
        let secrets = Secrets::new(Some(&config.api_key), &config.base_url);
        let http = AsyncHttpClient::new(transport, config.retry, secrets);
        Self {
            config,
            http,
            on_text: None,
        }
    }

    /// Calls `record` with each wait between retries instead of waiting
    /// (tests record the delays).
    pub fn with_sleeper(mut self, record: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.http.set_sleeper(record);
        self
    }

    /// Shows streamed text deltas as they arrive, as
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
    pub fn config(&self) -> &LiveConfig {
        &self.config
    }

    /// The exact JSON body of a request (the blocking client's).
    pub fn request_body(&self, request: &Request<'_>) -> serde_json::Value {
        request_body(&self.config, request)
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
        self.send_body(&body, None, false).await
    }

    /// Sends a serialized request body; no retry starts once `stop` says
    /// the run was stopped. With `whole_lines`, streamed text reaches the
    /// sink by whole lines.
    pub async fn send_body(
        &self,
        body: &[u8],
        stop: Option<&crate::providers::http::StopProbe>,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        let url = messages_url(&self.config);
        let headers = headers(&self.config);
        match self
            .http
            .post(&url, &headers, body, stop, &read_error)
            .await?
        {
            AsyncSuccess::Stream(response) => {
                let attempts = self.http.attempts();
                attempts.streamed(
                    read_stream_async(
                        response,
                        self.on_text.as_ref(),
                        whole_lines,
                        attempts.redactor(),
                        StreamAssembler::new(),
                    )
                    .await,
                )
            }
            AsyncSuccess::Body(text) => parse_body(self.http.attempts(), &text),
        }
    }
}

/// An [`AsyncModel`] over a shared [`AsyncClient`]: what
/// [`super::AnthropicModel`] is to a blocking run. Cloning it is cheap.
#[derive(Clone)]
pub struct AsyncAnthropicModel {
    client: Arc<AsyncClient>,
    stop: Option<StopSlot>,
    whole_lines: bool,
}

impl std::fmt::Debug for AsyncAnthropicModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncAnthropicModel")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl AsyncAnthropicModel {
    /// A model that sends through `client`.
    pub fn new(client: Arc<AsyncClient>) -> Self {
        Self {
            client,
            stop: None,
            whole_lines: false,
        }
    }

    /// A model whose requests the run can stop in flight: once the probe
    /// in `slot` says so (checked by a 20 ms timer), the request is
    /// dropped and no retry starts. Dropping the run's future does the
    /// same without a probe.
    pub fn with_stop(client: Arc<AsyncClient>, slot: StopSlot) -> Self {
        Self {
            client,
            stop: Some(slot),
            whole_lines: false,
        }
    }

    /// Shows this model's streamed text by whole lines (for subagents,
    /// which stream beside each other).
    pub fn with_whole_lines(mut self) -> Self {
        self.whole_lines = true;
        self
    }
}

impl AsyncModel for AsyncAnthropicModel {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new(
            "anthropic",
            Some(self.client.config().model.clone()),
        ))
    }

    fn respond_async<'a>(&'a mut self, request: &'a Request<'_>) -> ModelFuture<'a> {
        let client = Arc::clone(&self.client);
        let probe = self.stop.as_ref().and_then(|slot| slot.get()).cloned();
        let whole_lines = self.whole_lines;
        let body = self.client.body_bytes(request);
        Box::pin(async move {
            let body = body?;
            let send = client.send_body(&body, probe.as_ref(), whole_lines);
            match until_stopped_async(probe.clone(), send).await {
                Some(result) => result,
                None => Err(client.http.attempts().abandoned()),
            }
        })
    }
}
