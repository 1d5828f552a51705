//! Durable subloop runs on [Restate](https://restate.dev): a run is a
//! Restate workflow keyed by its run id, and every model reply is a
//! journaled step, so a worker that dies mid-run is replaced by one that
//! replays the recorded replies (the model is not asked again) and goes on
//! from the step that was in flight.
//!
//! Work in progress: tool outputs, children and approvals are not journaled
//! yet (a replay runs `read_file` again; `run_main` is not offered).

use std::sync::{Arc, Mutex};

use restate_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use subloop::core::error::{FailureKind, ModelFailure};
use subloop::core::protocol::{Message, Request, ToolDefinition};
use subloop::policy::permission::DenyAll;
use subloop::run::BoxFuture;
use subloop::run::model::{AsyncModel, Model, Received};
use subloop::tools::ReadFile;
use subloop::{AgentBuilder, Budget, ModelResponse};

/// What a client submits: the question, the parent's call budget and the
/// workspace as the workers see it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRequest {
    /// The question.
    pub question: String,
    /// The parent's model calls.
    pub calls: u32,
    /// The workspace, as the workers see it.
    pub workspace: String,
}

/// What a run gives back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// How the run ended (`answered`, `call_limit`, …).
    pub status: String,
    /// The final text.
    pub text: String,
    /// The parent's model calls.
    pub calls: u32,
}

/// Where a worker's models come from: a fresh parent model per run.
pub trait Models: Send + Sync + 'static {
    /// The parent's model for one run.
    fn parent(&self) -> Box<dyn Model + Send>;
}

/// The service: runs, each a workflow keyed by its run id.
pub struct DurableRun {
    models: Arc<dyn Models>,
}

impl DurableRun {
    /// A service whose runs ask `models`.
    pub fn new(models: impl Models) -> Self {
        Self {
            models: Arc::new(models),
        }
    }
}

/// One journaled model step: the reply or the failure, as received.
#[derive(Debug, Serialize, Deserialize)]
enum Step {
    Reply {
        response: ModelResponse,
        raw: Option<serde_json::Value>,
    },
    Failed {
        kind: Option<String>,
        message: String,
    },
}

/// A request's parts, owned: a journaled step outlives the borrow the loop
/// hands the model.
struct OwnedRequest {
    system: String,
    tools: Vec<ToolDefinition>,
    messages: Vec<Message>,
    attachment: Option<String>,
    output: Option<serde_json::Value>,
}

impl OwnedRequest {
    fn of(request: &Request<'_>) -> Self {
        Self {
            system: request.system.to_owned(),
            tools: request.tools.to_vec(),
            messages: request.messages.to_vec(),
            attachment: request.attachment.map(str::to_owned),
            output: request.output.cloned(),
        }
    }

    fn request(&self) -> Request<'_> {
        Request {
            system: &self.system,
            tools: &self.tools,
            messages: &self.messages,
            attachment: self.attachment.as_deref(),
            output: self.output.as_ref(),
        }
    }
}

/// The parent's model, each reply a journaled step named `model-N`.
struct Journaled<'c, 'ctx> {
    ctx: &'c WorkflowContext<'ctx>,
    inner: Arc<Mutex<Box<dyn Model + Send>>>,
    calls: u32,
}

impl AsyncModel for Journaled<'_, '_> {
    fn respond_async<'a>(
        &'a mut self,
        request: &'a Request<'_>,
    ) -> BoxFuture<'a, Result<Received, ModelFailure>> {
        self.calls += 1;
        let name = format!("model-{}", self.calls);
        let owned = OwnedRequest::of(request);
        let inner = Arc::clone(&self.inner);
        let ctx = self.ctx;
        Box::pin(async move {
            let step = ctx
                .run(move || async move {
                    let answer = {
                        let mut model = inner.lock().unwrap_or_else(|poison| poison.into_inner());
                        model.respond_received(&owned.request())
                    };
                    Ok(Json(match answer {
                        Ok(received) => Step::Reply {
                            response: received.response,
                            raw: received.raw,
                        },
                        Err(failure) => Step::Failed {
                            kind: failure.kind().map(|kind| kind.as_str().to_owned()),
                            message: failure.message().to_owned(),
                        },
                    }))
                })
                .name(name)
                .await;
            match step {
                Ok(Json(Step::Reply { response, raw })) => Ok(Received::with_raw(response, raw)),
                Ok(Json(Step::Failed { kind, message })) => Err(match kind {
                    Some(kind) => ModelFailure::with_kind(FailureKind::from_name(&kind), message),
                    None => ModelFailure::new(message),
                }),
                Err(error) => Err(ModelFailure::with_kind(
                    FailureKind::Request,
                    format!("the journal refused the model step: {error}"),
                )),
            }
        })
    }
}

/// The workflow's handler. The macro generates the service's plumbing (a
/// client, the service definition), which carries no documentation of its
/// own: it stays in this private module.
#[allow(missing_docs)]
mod workflow {
    use super::*;

    #[restate_sdk::workflow]
    impl DurableRun {
        /// Runs the question of `request` to its end.
        #[handler]
        async fn run(
            &self,
            ctx: WorkflowContext<'_>,
            request: Json<RunRequest>,
        ) -> Result<Json<RunResult>, HandlerError> {
            let request = request.into_inner();
            let workspace = std::path::Path::new(&request.workspace);
            let agent = AgentBuilder::new(Arc::new(DenyAll))
                .read_only_tool(ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT)?)?
                .build();
            let mut model = Journaled {
                ctx: &ctx,
                inner: Arc::new(Mutex::new(self.models.parent())),
                calls: 0,
            };
            let budget = Budget::new(request.calls)?;
            let report = agent
                .run_async(&request.question, budget, &mut model)
                .await?;
            Ok(Json(RunResult {
                status: report.outcome.status.to_string(),
                text: report.outcome.text,
                calls: report.outcome.calls,
            }))
        }
    }
}

/// Serves `service` on `address` (HTTP/2 without TLS) until the process ends.
pub async fn serve(service: DurableRun, address: std::net::SocketAddr) {
    let endpoint = Endpoint::builder().bind(service).build();
    HttpServer::new(endpoint).listen_and_serve(address).await;
}
