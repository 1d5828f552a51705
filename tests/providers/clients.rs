//! Each provider's client as this thread's [`Driver`] asks for it: the
//! blocking client, or the async one awaited on a tokio runtime. The tests
//! of `live_api` and `openai_api` are written once against these and run
//! under both drivers (their `async_driver` twins), so both clients are
//! held to the same requests, retries, streams, failures and runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::host::{self, Models, Settings};
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Request;
use subloop::providers::http::StopSlot;
use subloop::providers::{anthropic, openai};
use subloop::run::model::{AsyncChildren, AsyncModel};
use subloop::{Budget, ModelResponse, RunReport};

use crate::common::{self, Driver};

/// Where a client's retry waits and streamed text go.
#[derive(Clone, Default)]
pub struct Taps {
    pub sleeps: Arc<Mutex<Vec<Duration>>>,
    pub shown: Option<Arc<Mutex<Vec<String>>>>,
}

impl Taps {
    pub fn showing() -> Self {
        Self {
            sleeps: Arc::default(),
            shown: Some(Arc::default()),
        }
    }

    fn record(&self) -> impl Fn(Duration) + Send + Sync + 'static {
        let sleeps = Arc::clone(&self.sleeps);
        move |delay| sleeps.lock().unwrap().push(delay)
    }

    fn sink(&self) -> Option<impl Fn(&str) + Send + Sync + 'static> {
        let shown = self.shown.clone()?;
        Some(move |text: &str| shown.lock().unwrap().push(text.to_owned()))
    }
}

/// Runs an agent built from `settings` with `model` for the parent and
/// `child` for each delegation, on a tokio runtime; the stop slot is the
/// run's, as the host gives it to the blocking clients.
fn run_async<M, C>(settings: &Settings, slot: StopSlot, mut model: M, child: C) -> RunReport
where
    M: AsyncModel + Send,
    C: Fn() -> Box<dyn AsyncModel + Send> + Send + Sync + 'static,
{
    let children = AsyncChildren(move |_number: usize| child());
    let agent = host::build_agent(settings, Arc::new(children)).expect("agent");
    let _ = slot.set(agent.stop_signal());
    let budget = Budget::new(settings.max_calls).expect("budget");
    common::runtime()
        .block_on(agent.run_async(&settings.question, budget, &mut model))
        .expect("run")
}

/// The Messages API client of this thread's driver.
#[derive(Debug, Clone)]
pub enum Anthropic {
    Blocking(Arc<anthropic::Client>),
    Async(Arc<anthropic::AsyncClient>),
}

impl Anthropic {
    /// A client over a real (loopback) connection.
    pub fn new(config: anthropic::LiveConfig, taps: &Taps) -> Self {
        match common::driver() {
            Driver::Blocking => {
                let mut client = anthropic::Client::new(config).with_sleeper(taps.record());
                if let Some(sink) = taps.sink() {
                    client = client.with_text_sink(sink);
                }
                Self::Blocking(Arc::new(client))
            }
            Driver::Async => {
                let mut client = anthropic::AsyncClient::new(config)
                    .expect("client")
                    .with_sleeper(taps.record());
                if let Some(sink) = taps.sink() {
                    client = client.with_text_sink(sink);
                }
                Self::Async(Arc::new(client))
            }
        }
    }

    /// Sends one request.
    pub fn send(&self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        match self {
            Self::Blocking(client) => client.send(request),
            Self::Async(client) => common::runtime()
                .block_on(client.send_received(request))
                .map(|received| received.response),
        }
    }

    /// Runs the agent of `settings` with this client for every model.
    pub fn run(&self, settings: &Settings) -> RunReport {
        match self {
            Self::Blocking(client) => {
                host::execute(settings, Models::Live(Arc::clone(client))).expect("run")
            }
            Self::Async(client) => {
                let slot = StopSlot::default();
                let (children, child_slot) = (Arc::clone(client), Arc::clone(&slot));
                run_async(
                    settings,
                    Arc::clone(&slot),
                    anthropic::AsyncAnthropicModel::with_stop(Arc::clone(client), slot),
                    move || {
                        Box::new(
                            anthropic::AsyncAnthropicModel::with_stop(
                                Arc::clone(&children),
                                Arc::clone(&child_slot),
                            )
                            .with_whole_lines(),
                        )
                    },
                )
            }
        }
    }
}

/// The Chat Completions client of this thread's driver.
#[derive(Debug, Clone)]
pub enum OpenAi {
    Blocking(Arc<openai::Client>),
    Async(Arc<openai::AsyncClient>),
}

impl OpenAi {
    /// A client over a real (loopback) connection.
    pub fn new(config: openai::OpenAiConfig, taps: &Taps) -> Self {
        match common::driver() {
            Driver::Blocking => {
                let mut client = openai::Client::new(config).with_sleeper(taps.record());
                if let Some(sink) = taps.sink() {
                    client = client.with_text_sink(sink);
                }
                Self::Blocking(Arc::new(client))
            }
            Driver::Async => {
                let mut client = openai::AsyncClient::new(config)
                    .expect("client")
                    .with_sleeper(taps.record());
                if let Some(sink) = taps.sink() {
                    client = client.with_text_sink(sink);
                }
                Self::Async(Arc::new(client))
            }
        }
    }

    /// Sends one request.
    pub fn send(&self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        match self {
            Self::Blocking(client) => client.send(request),
            Self::Async(client) => common::runtime()
                .block_on(client.send_received(request))
                .map(|received| received.response),
        }
    }

    /// The token field the client sends its limit in now.
    pub fn max_tokens_field(&self) -> openai::request::MaxTokensField {
        match self {
            Self::Blocking(client) => client.max_tokens_field(),
            Self::Async(client) => client.max_tokens_field(),
        }
    }

    /// Runs the agent of `settings` with this client for every model.
    pub fn run(&self, settings: &Settings) -> RunReport {
        match self {
            Self::Blocking(client) => {
                host::execute(settings, Models::OpenAi(Arc::clone(client))).expect("run")
            }
            Self::Async(client) => {
                let slot = StopSlot::default();
                let (children, child_slot) = (Arc::clone(client), Arc::clone(&slot));
                run_async(
                    settings,
                    Arc::clone(&slot),
                    openai::AsyncOpenAiModel::with_stop(Arc::clone(client), slot),
                    move || {
                        Box::new(
                            openai::AsyncOpenAiModel::with_stop(
                                Arc::clone(&children),
                                Arc::clone(&child_slot),
                            )
                            .with_whole_lines(),
                        )
                    },
                )
            }
        }
    }
}
