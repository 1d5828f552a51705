//! The client and the model every provider shares, generic over its
//! protocol (`P`: the provider's settings) and its transport (`T`:
//! `dyn Transport`, blocking, or `dyn AsyncTransport`, feature `async`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::protocol::{BodyCache, Protocol};
use super::transport::stop_scope;
use super::transport::{Transport, UreqTransport};
use super::wire::{Sending, Sleeper};
use super::{Attempts, Secrets, StopSlot, TextSink};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{ModelResponse, Request};
use crate::core::redact::Redactor;
use crate::providers::body::ToolShelf;
use crate::run::driver::block_on;
use crate::run::limits::StopSignal;
use crate::run::model::{Model, ModelIdentity, Received};

/// The HTTP client of a provider, shared (through an `Arc`) by the
/// parent's model and every child's, and by every run that holds it: one
/// connection pool.
///
/// `P` is the provider's settings, which say how its protocol is spoken
/// (`anthropic::LiveConfig`, `openai::OpenAiConfig`); `T` the transport:
/// `dyn Transport` (the default) for a blocking client,
/// `dyn AsyncTransport` (feature `async`) for one awaited on tokio. Each
/// provider module names its clients: `anthropic::Client` is
/// `Client<LiveConfig>`, `openai::AsyncClient` is
/// `Client<OpenAiConfig, dyn AsyncTransport>`. Whatever the provider or
/// the transport, a request is sent through the same loop: the same
/// retries, waits, stop of a request in flight, failure texts, scrubbing
/// of secrets and showing of streamed text.
pub struct Client<P: Protocol, T: ?Sized = dyn Transport> {
    /// The settings.
    pub(crate) protocol: P,
    /// What the protocol keeps between requests.
    pub(crate) state: P::State,
    transport: Arc<T>,
    attempts: Attempts,
    /// Replaces the wait between attempts (tests record instead of waiting).
    sleeper: Option<Sleeper>,
    on_text: Option<TextSink>,
    /// The tool lists its requests offered, each written once.
    shelf: Arc<ToolShelf>,
}

impl<P: Protocol, T: ?Sized> std::fmt::Debug for Client<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl<P: Protocol, T: ?Sized> Client<P, T> {
    /// A client sending through `transport` as `config` says.
    fn build(config: P, transport: Arc<T>) -> Self {
        let secrets = Secrets::new(config.api_key(), config.base_url());
        let attempts = Attempts::new(config.retry(), secrets);
        Self {
            protocol: config,
            state: P::State::default(),
            transport,
            attempts,
            sleeper: None,
            on_text: None,
            shelf: Arc::default(),
        }
    }

    /// A body cache for one model of this client.
    fn body_cache(&self) -> BodyCache {
        BodyCache::new(Arc::clone(&self.shelf))
    }

    /// Calls `record` with each wait between retries instead of waiting
    /// (tests record the delays).
    pub fn with_sleeper(mut self, record: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.sleeper = Some(Arc::new(record));
        self
    }

    /// Shows streamed text as it arrives (the CLI prints it on stderr).
    /// When a reply's streamed text does not end with a newline, the sink
    /// gets one `"\n"` after it, once the stream is over.
    pub fn with_text_sink(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_text = Some(Arc::new(sink));
        self
    }

    /// The secrets this client hides from its replies and error texts (its
    /// API key, the base URL's password), for the host to hide from
    /// everything else it records or prints: give it to
    /// `AgentBuilder::redact` for the tools' results.
    pub fn redactor(&self) -> Redactor {
        self.attempts.redactor().clone()
    }

    /// The settings.
    pub fn config(&self) -> &P {
        &self.protocol
    }

    /// The exact JSON body of a request.
    pub fn request_body(&self, request: &Request<'_>) -> Value {
        self.protocol.body(&self.state, request)
    }

    /// The retry decisions and secrets this client sends with.
    fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// The bytes of a request's body, written as the protocol writes them
    /// with what `cache` kept from the model's earlier requests.
    fn body_bytes(
        &self,
        request: &Request<'_>,
        cache: &mut BodyCache,
    ) -> Result<Vec<u8>, ModelFailure> {
        let mut out = Vec::with_capacity(cache.last_len());
        match self
            .protocol
            .write_body(&self.state, request, cache, &mut out)
        {
            Ok(()) => {
                cache.wrote(out.len());
                Ok(out)
            }
            Err(err) => Err(self.attempts.fail(
                FailureKind::Serialization,
                format!("cannot serialize the request: {err}"),
            )),
        }
    }

    /// What the send loop needs of this client.
    fn sending(&self) -> Sending<'_, T> {
        Sending {
            wire: &*self.transport,
            attempts: &self.attempts,
            sleeper: self.sleeper.as_ref(),
            sink: self.on_text.as_ref(),
        }
    }
}

impl<P: Protocol> Client<P> {
    /// A client over a real HTTP connection (ureq, rustls).
    pub fn new(config: P) -> Self {
        let transport = Arc::new(UreqTransport::new(config.timeouts()));
        Self::with_transport(config, transport)
    }

    /// A client over any transport (tests use a fake one).
    pub(crate) fn with_transport(config: P, transport: Arc<dyn Transport>) -> Self {
        Self::build(config, transport)
    }

    /// Sends one request, retrying what is worth retrying.
    pub fn send(&self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.send_received(request)
            .map(|received| received.response)
    }

    /// Sends one request like [`Client::send`], also handing back the reply
    /// as received (for a stream: the reply assembled from its events).
    pub fn send_received(&self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let body = self.body_bytes(request, &mut self.body_cache())?;
        self.send_body(&body, None)
    }

    /// Sends a serialized request body, retrying what is worth retrying;
    /// no retry starts once `stop` says the run was stopped.
    pub(crate) fn send_body(
        &self,
        body: &[u8],
        stop: Option<&StopSignal>,
    ) -> Result<Received, ModelFailure> {
        self.send_lines(body, stop, false)
    }

    /// [`Client::send_body`]; with `whole_lines`, streamed text reaches the
    /// sink only as whole lines. The send loop's futures are complete when
    /// made, so it runs on this thread and never parks.
    fn send_lines(
        &self,
        body: &[u8],
        stop: Option<&StopSignal>,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        block_on(
            self.sending()
                .request(&self.protocol, &self.state, body, stop, whole_lines),
        )
    }
}

/// A model over a shared [`Client`]: a blocking [`Model`] over a blocking
/// client, an [`AsyncModel`](crate::run::model::AsyncModel) over an async
/// one (feature `async`). Each provider module names its models:
/// `anthropic::AnthropicModel` is `HttpModel<LiveConfig>`,
/// `openai::AsyncOpenAiModel` is
/// `HttpModel<OpenAiConfig, dyn AsyncTransport>`. Cloning it is cheap.
pub struct HttpModel<P: Protocol, T: ?Sized = dyn Transport> {
    client: Arc<Client<P, T>>,
    stop: Option<StopSlot>,
    whole_lines: bool,
    /// What this model's requests keep between them (a clone starts afresh).
    cache: BodyCache,
}

impl<P: Protocol, T: ?Sized> Clone for HttpModel<P, T> {
    fn clone(&self) -> Self {
        Self {
            client: Arc::clone(&self.client),
            stop: self.stop.clone(),
            whole_lines: self.whole_lines,
            cache: self.client.body_cache(),
        }
    }
}

impl<P: Protocol, T: ?Sized> std::fmt::Debug for HttpModel<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpModel")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl<P: Protocol, T: ?Sized> HttpModel<P, T> {
    /// A model that sends through `client`.
    pub fn new(client: Arc<Client<P, T>>) -> Self {
        Self {
            cache: client.body_cache(),
            client,
            stop: None,
            whole_lines: false,
        }
    }

    /// A model whose requests the run can stop in flight: once the run's
    /// [`StopSignal`] in `slot` says so, the request ends at once and no
    /// retry starts. A blocking request is sent on the run's own thread;
    /// the stop shuts its socket down, and the run's deadline bounds its
    /// timeout. An async one is dropped when the signal's future (or a
    /// timer at the deadline) completes first, as dropping the run's
    /// future drops it. Nothing polls. Each run gives its own slot, so a
    /// shared client carries no stop of its own.
    pub fn with_stop(client: Arc<Client<P, T>>, slot: StopSlot) -> Self {
        Self {
            cache: client.body_cache(),
            client,
            stop: Some(slot),
            whole_lines: false,
        }
    }

    /// Shows this model's streamed text by whole lines rather than as each
    /// piece arrives (the last one ended by a `"\n"` when the stream is
    /// over): for subagents, which stream beside each other, so their
    /// texts and progress lines never share a line.
    pub fn with_whole_lines(mut self) -> Self {
        self.whole_lines = true;
        self
    }

    fn model_identity(&self) -> ModelIdentity {
        ModelIdentity::new(P::NAME, Some(self.client.protocol.model().to_owned()))
    }

    /// The run's stop signal, once the run has put it in the slot.
    fn signal(&self) -> Option<StopSignal> {
        self.stop.as_ref().and_then(|slot| slot.get()).cloned()
    }
}

impl<P: Protocol> Model for HttpModel<P> {
    fn identity(&self) -> Option<ModelIdentity> {
        Some(self.model_identity())
    }

    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    /// Sends on this thread. With the run's stop signal, the request's
    /// sockets are shut down when the run stops, and its deadline bounds
    /// the request, so cancelling or a deadline does not wait for the
    /// HTTP timeouts.
    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let body = self.client.body_bytes(request, &mut self.cache)?;
        let whole_lines = self.whole_lines;
        let Some(signal) = self.signal() else {
            return self.client.send_lines(&body, None, whole_lines);
        };
        if signal.is_stopped() {
            return Err(self.client.attempts().abandoned());
        }
        let _scope = stop_scope(&signal);
        self.client.send_lines(&body, Some(&signal), whole_lines)
    }
}

#[cfg(feature = "async")]
mod remote {
    use std::future::Future;
    use std::sync::Arc;

    use super::super::async_transport::{AsyncTransport, ReqwestTransport};
    use super::super::protocol::Protocol;
    use super::{Client, HttpModel};
    use crate::core::error::ModelFailure;
    use crate::core::protocol::Request;
    use crate::run::limits::StopSignal;
    use crate::run::model::{AsyncModel, ModelFuture, ModelIdentity, Received};

    impl<P: Protocol> Client<P, dyn AsyncTransport> {
        /// A client over a real HTTP connection (reqwest, rustls). It is
        /// awaited on a tokio runtime.
        pub fn new(config: P) -> Result<Self, crate::providers::http::ConfigError> {
            let transport = ReqwestTransport::new(config.timeouts())
                .map_err(|err| crate::providers::http::ConfigError::Invalid(err.message))?;
            Ok(Self::with_transport(config, Arc::new(transport)))
        }

        /// A client over any async transport.
        pub(crate) fn with_transport(config: P, transport: Arc<dyn AsyncTransport>) -> Self {
            Self::build(config, transport)
        }

        /// Sends one request, retrying what is worth retrying, and hands back
        /// the reply as received.
        pub async fn send_received(&self, request: &Request<'_>) -> Result<Received, ModelFailure> {
            let body = self.body_bytes(request, &mut self.body_cache())?;
            self.send_body(&body, None).await
        }

        /// Sends a serialized request body; no retry starts once `stop` says
        /// the run was stopped. Dropping the future abandons the request.
        pub(crate) async fn send_body(
            &self,
            body: &[u8],
            stop: Option<&StopSignal>,
        ) -> Result<Received, ModelFailure> {
            self.send_lines(body, stop, false).await
        }

        /// [`Client::send_body`]; with `whole_lines`, streamed text reaches
        /// the sink only as whole lines.
        async fn send_lines(
            &self,
            body: &[u8],
            stop: Option<&StopSignal>,
            whole_lines: bool,
        ) -> Result<Received, ModelFailure> {
            self.sending()
                .request(&self.protocol, &self.state, body, stop, whole_lines)
                .await
        }
    }

    impl<P: Protocol> AsyncModel for HttpModel<P, dyn AsyncTransport> {
        fn identity(&self) -> Option<ModelIdentity> {
            Some(self.model_identity())
        }

        fn respond_async<'a>(&'a mut self, request: &'a Request<'_>) -> ModelFuture<'a> {
            let client = Arc::clone(&self.client);
            let signal = self.signal();
            let whole_lines = self.whole_lines;
            let body = self.client.body_bytes(request, &mut self.cache);
            Box::pin(async move {
                let body = body?;
                let send = client.send_lines(&body, signal.as_ref(), whole_lines);
                match until_stopped(signal.as_ref(), send).await {
                    Some(result) => result,
                    None => Err(client.attempts().abandoned()),
                }
            })
        }
    }

    /// Awaits `work`, giving up when `signal` says the run was stopped:
    /// its future wakes this one, and one timer waits for the deadline
    /// (when the run has one). Nothing polls. `None` when it gave up.
    async fn until_stopped<T>(
        signal: Option<&StopSignal>,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        let Some(signal) = signal else {
            return Some(work.await);
        };
        if signal.is_stopped() {
            return None;
        }
        let deadline = async {
            match signal.deadline() {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = signal.stopped() => None,
            () = deadline => None,
            out = work => Some(out),
        }
    }
}
