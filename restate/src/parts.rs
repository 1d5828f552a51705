//! The run's parts that journal through [`Steps`]: the model (each reply a
//! step), the tools (each output a step), the approver (each answer a
//! durable promise) and the `task` tool (each child an invocation of its
//! own). They hold no engine context, only the handle.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use subloop::ModelResponse;
use subloop::StatusKind;
use subloop::agent::subagent::{TaskReport, TaskTool};
use subloop::core::conversation::ToolOutput;
use subloop::core::error::{FailureKind, ModelFailure};
use subloop::core::protocol::{Message, Request, ToolDefinition};
use subloop::policy::permission::{ApprovalRequest, Approver, Decision};
use subloop::run::BoxFuture;
use subloop::run::model::{AsyncModel, Model, Received};
use subloop::tools::{Capability, Tool, ToolContext};

use crate::steps::{ChildRequest, Steps};

/// The steps of this run that may have run more than once, by name.
pub(crate) type Repeated = Arc<Mutex<Vec<String>>>;

fn note_repeated(repeated: &Repeated, name: &str) {
    repeated
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .push(name.to_owned());
}

/// One journaled model step: the reply or the failure, as received.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Reply {
        response: ModelResponse,
        raw: Option<Value>,
    },
    Failed {
        kind: Option<String>,
        message: String,
    },
}

/// A request's parts, owned: a step may outlive the borrow the loop hands
/// the model.
struct OwnedRequest {
    system: String,
    tools: Vec<ToolDefinition>,
    messages: Vec<Message>,
    attachment: Option<String>,
    output: Option<Value>,
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

/// A model whose every reply is a journaled step named `model N`.
pub(crate) struct JournaledModel {
    pub(crate) steps: Steps,
    pub(crate) inner: Arc<Mutex<Box<dyn Model + Send>>>,
    pub(crate) calls: u32,
    pub(crate) repeated: Repeated,
}

impl AsyncModel for JournaledModel {
    fn respond_async<'a>(
        &'a mut self,
        request: &'a Request<'_>,
    ) -> BoxFuture<'a, Result<Received, ModelFailure>> {
        self.calls += 1;
        let name = format!("model {}", self.calls);
        let owned = OwnedRequest::of(request);
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            // The model is asked on a blocking thread: a live model waits
            // on the network, and the run's task must stay free to answer
            // the engine.
            let work = async move {
                let answer = tokio::task::spawn_blocking(move || {
                    let mut model = inner.lock().unwrap_or_else(|poison| poison.into_inner());
                    model.respond_received(&owned.request())
                })
                .await;
                let reply = match answer {
                    Ok(Ok(received)) => Reply::Reply {
                        response: received.response,
                        raw: received.raw,
                    },
                    Ok(Err(failure)) => Reply::Failed {
                        kind: failure.kind().map(|kind| kind.as_str().to_owned()),
                        message: failure.message().to_owned(),
                    },
                    Err(error) => Reply::Failed {
                        kind: None,
                        message: format!("the model panicked: {error}"),
                    },
                };
                serde_json::to_string(&reply).unwrap_or_default()
            };
            let recorded = self.steps.run(name.clone(), work).await.map_err(|error| {
                ModelFailure::with_kind(FailureKind::Request, error.to_string())
            })?;
            if recorded.repeated {
                note_repeated(&self.repeated, &name);
            }
            match serde_json::from_str::<Reply>(&recorded.value) {
                Ok(Reply::Reply { response, raw }) => Ok(Received::with_raw(response, raw)),
                Ok(Reply::Failed { kind, message }) => Err(match kind {
                    Some(kind) => ModelFailure::with_kind(FailureKind::from_name(&kind), message),
                    None => ModelFailure::new(message),
                }),
                Err(error) => Err(ModelFailure::with_kind(
                    FailureKind::Request,
                    format!("the journaled reply of {name} does not read: {error}"),
                )),
            }
        })
    }
}

/// A tool whose every output is a journaled step named `tool NAME ID`:
/// a call whose output is in the journal is not run again.
pub(crate) struct JournaledTool {
    pub(crate) inner: Arc<dyn Tool>,
    pub(crate) steps: Steps,
    pub(crate) repeated: Repeated,
}

impl Tool for JournaledTool {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> &str {
        self.inner.description()
    }

    fn input_schema(&self) -> Value {
        self.inner.input_schema()
    }

    fn capability(&self) -> Capability {
        self.inner.capability()
    }

    fn action(&self, input: &Value) -> String {
        self.inner.action(input)
    }

    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        ToolOutput::error("a durable run's tools run in an async run only")
    }

    fn run_async<'a>(
        &'a self,
        input: &'a Value,
        context: &'a ToolContext<'a>,
    ) -> BoxFuture<'a, ToolOutput> {
        let name = format!("tool {} {}", self.inner.name(), context.call.id());
        Box::pin(async move {
            let work = async {
                let output = self.inner.run_async(input, context).await;
                serde_json::to_string(&output).unwrap_or_default()
            };
            match self.steps.run(name.clone(), work).await {
                Ok(recorded) => {
                    if recorded.repeated {
                        note_repeated(&self.repeated, &name);
                    }
                    serde_json::from_str(&recorded.value).unwrap_or_else(|error| {
                        ToolOutput::error(format!(
                            "the journaled output of {name} does not read: {error}"
                        ))
                    })
                }
                Err(error) => ToolOutput::error(format!("{} failed: {error}", self.inner.name())),
            }
        })
    }
}

/// An approver whose answers are durable promises: the run waits, holding
/// no process, until someone answers (`subloop approve`).
pub(crate) struct PromiseApprover {
    pub(crate) steps: Steps,
}

impl Approver for PromiseApprover {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        // A durable run is async; a blocking run has no journal to wait on.
        Decision::Deny
    }

    fn decide_async<'a>(&'a self, request: &'a ApprovalRequest<'a>) -> BoxFuture<'a, Decision> {
        let call = request.call.id().to_string();
        let action = request.action.to_owned();
        Box::pin(async move {
            match self.steps.approval(call, action).await.as_deref() {
                Ok("allow") => Decision::Allow,
                _ => Decision::Deny,
            }
        })
    }
}

/// The `task` tool of a durable run: each delegation is an invocation of
/// its own ([`crate::DurableChild`]), which any worker may run; its report
/// comes back under the call's id. Consecutive `task` calls of a reply run
/// together, and their reports come back in call order.
pub(crate) struct DurableTask {
    /// The library's `task` tool, for its name, description and schema.
    pub(crate) definition: Arc<dyn Tool>,
    pub(crate) steps: Steps,
    pub(crate) run: String,
    pub(crate) workspace: String,
    pub(crate) delegations: Mutex<usize>,
    /// The run's delegation limit, as `Limits::max_delegations`.
    pub(crate) max_delegations: usize,
    pub(crate) repeated: Repeated,
}

impl Tool for DurableTask {
    fn name(&self) -> &str {
        TaskTool::NAME
    }

    fn description(&self) -> &str {
        self.definition.description()
    }

    fn input_schema(&self) -> Value {
        self.definition.input_schema()
    }

    fn capability(&self) -> Capability {
        Capability::Delegates
    }

    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        ToolOutput::error("a durable run's children run in an async run only")
    }

    fn run_async<'a>(
        &'a self,
        _input: &'a Value,
        context: &'a ToolContext<'a>,
    ) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let mut outputs = self.run_batch_async(std::slice::from_ref(context)).await;
            outputs
                .pop()
                .unwrap_or_else(|| ToolOutput::error("the subagent gave no answer"))
        })
    }

    fn run_batch_async<'a>(
        &'a self,
        calls: &'a [ToolContext<'a>],
    ) -> BoxFuture<'a, Vec<ToolOutput>> {
        Box::pin(async move {
            let mut outputs: Vec<Option<ToolOutput>> = Vec::with_capacity(calls.len());
            let mut requests = Vec::new();
            for context in calls {
                let planned = TaskTool::task_text(context.call.input()).and_then(|task| {
                    let mut count = self
                        .delegations
                        .lock()
                        .unwrap_or_else(|poison| poison.into_inner());
                    if *count >= self.max_delegations {
                        return Err(TaskReport::delegation_limit(self.max_delegations).to_output());
                    }
                    *count += 1;
                    Ok((task.to_owned(), *count))
                });
                match planned {
                    Ok((task, number)) => {
                        requests.push(ChildRequest {
                            run: self.run.clone(),
                            call: context.call.id().to_string(),
                            number,
                            task,
                            workspace: self.workspace.clone(),
                        });
                        outputs.push(None);
                    }
                    Err(refusal) => outputs.push(Some(refusal)),
                }
            }
            let mut answers = self.steps.children(requests).await.into_iter();
            outputs
                .into_iter()
                .map(|output| {
                    output.unwrap_or_else(|| match answers.next() {
                        Some(Ok(child)) => {
                            let mut repeated = self
                                .repeated
                                .lock()
                                .unwrap_or_else(|poison| poison.into_inner());
                            repeated.extend(child.repeated);
                            ToolOutput {
                                content: child.content.into(),
                                is_error: child.is_error,
                            }
                        }
                        Some(Err(error)) => TaskReport::not_started(
                            StatusKind::ModelError,
                            format!("the subagent's invocation failed: {error}"),
                        )
                        .to_output(),
                        None => ToolOutput::error("the subagent gave no answer"),
                    })
                })
                .collect()
        })
    }
}
