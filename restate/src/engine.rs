//! The Restate side of a run: the workflow and the child service, and the
//! pump that turns the run's orders ([`crate::steps::Order`]) into
//! journaled steps. The only module that names Restate's context.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use restate_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::steps::{ChildRequest, ChildResult, Order, Recorded, Steps};
use crate::{RunError, RunRequest, RunResult, Worker, child_result};

/// The workflow state key of the approvals a run waits for.
const PENDING: &str = "pending";

/// An approval a run waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The call's id.
    pub call: String,
    /// What the call would do.
    pub action: String,
    /// The durable promise that answers it.
    pub key: String,
}

/// An answer to a pending approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The call's id.
    pub call: String,
    /// `allow` or `deny`.
    pub decision: String,
}

/// The runs: a Restate workflow keyed by run id. Its handlers: `run` (the
/// run itself, once per id), `approve` and `pending` (shared).
#[derive(Clone)]
pub struct DurableRun {
    worker: Worker,
}

/// The children: a Restate service; each `task` call is one invocation of
/// its `run` handler, which any worker may take.
#[derive(Clone)]
pub struct DurableChild {
    worker: Worker,
}

/// Journals a step's result: from the journal if it is there; else the
/// work is asked for (`go`) and its result (`result`) recorded. A `start`
/// step before it tells a replay that an earlier attempt had begun the
/// work. (A macro: the two context types share no trait this can be
/// generic over.)
macro_rules! record {
    ($ctx:expr, $name:expr, $go:expr, $result:expr) => {{
        let (name, go, result): (String, oneshot::Sender<()>, oneshot::Receiver<String>) =
            ($name, $go, $result);
        let started_now = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&started_now);
        let start = $ctx
            .run(move || async move {
                flag.store(true, Ordering::SeqCst);
                Ok(Json(true))
            })
            .name(format!("start {name}"))
            .await;
        match start {
            Err(error) => Err(RunError::Engine(error.to_string())),
            Ok(_) => $ctx
                .run(move || async move {
                    // Asked for the work in this attempt, but the start was
                    // journaled by an earlier one: it may have run before.
                    let repeated = !started_now.load(Ordering::SeqCst);
                    let _ = go.send(());
                    match result.await {
                        Ok(value) => Ok(Json(Recorded { value, repeated })),
                        Err(_) => Err(HandlerError::from("the step was abandoned")),
                    }
                })
                .name(name)
                .await
                .map(Json::into_inner)
                .map_err(|error| RunError::Engine(error.to_string())),
        }
    }};
}

/// Serves a parent's orders until the run lets go of its handle.
async fn parent_pump(ctx: &WorkflowContext<'_>, mut orders: mpsc::UnboundedReceiver<Order>) {
    let mut approvals = 0usize;
    while let Some(order) = orders.recv().await {
        match order {
            Order::Run {
                name,
                go,
                result,
                done,
            } => {
                let _ = done.send(record!(ctx, name, go, result));
            }
            Order::Approval { call, action, done } => {
                approvals += 1;
                let key = format!("approval {approvals}");
                ctx.set(
                    PENDING,
                    Json(vec![Pending {
                        call,
                        action,
                        key: key.clone(),
                    }]),
                );
                let answer = {
                    let ctx: &WorkflowContext<'_> = ctx;
                    ctx.promise::<String>(&key).await
                };
                ctx.clear(PENDING);
                let _ = done.send(answer.map_err(|error| RunError::Engine(error.to_string())));
            }
            Order::Children { requests, done } => {
                // Every call is made (and journaled) in call order before
                // any is awaited, so the children run together.
                let calls: Vec<_> = requests
                    .into_iter()
                    .map(|request| {
                        ctx.service_client::<handlers::DurableChildClient<'_>>()
                            .run(Json(request))
                            .call()
                    })
                    .collect();
                let mut answers = Vec::with_capacity(calls.len());
                for call in calls {
                    answers.push(
                        call.await
                            .map(Json::into_inner)
                            .map_err(|error| RunError::Engine(error.to_string())),
                    );
                }
                let _ = done.send(answers);
            }
        }
    }
}

/// Serves a child's orders: steps only (a child asks no approval and
/// delegates nothing).
async fn child_pump(ctx: &Context<'_>, mut orders: mpsc::UnboundedReceiver<Order>) {
    while let Some(order) = orders.recv().await {
        match order {
            Order::Run {
                name,
                go,
                result,
                done,
            } => {
                let _ = done.send(record!(ctx, name, go, result));
            }
            Order::Approval { done, .. } => {
                let _ = done.send(Ok("deny".to_owned()));
            }
            Order::Children { requests, done } => {
                let _ = done.send(
                    requests
                        .iter()
                        .map(|_| Err(RunError::Engine("a child delegates nothing".into())))
                        .collect(),
                );
            }
        }
    }
}

/// Runs `agent` on `question` with its journaled `model`, beside `pump`,
/// which journals the run's steps until the run lets go of its handles
/// (the agent, dropped when it finishes, and the model, dropped here).
async fn drive(
    agent: subloop::Agent,
    question: &str,
    budget: subloop::Budget,
    mut model: crate::parts::JournaledModel,
    pump: impl std::future::Future<Output = ()>,
) -> Result<subloop::RunReport, HandlerError> {
    let driven = async move {
        let report = agent.run_async(question, budget, &mut model).await;
        drop(model);
        report
    };
    let (report, ()) = tokio::join!(driven, pump);
    report.map_err(terminal)
}

/// The steps of a run that may have run more than once, as noted so far.
fn taken(repeated: &crate::Repeated) -> Vec<String> {
    repeated
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .clone()
}

fn terminal(error: impl std::fmt::Display) -> HandlerError {
    TerminalError::new(error.to_string()).into()
}

/// The handlers. The macros generate the services' plumbing (clients,
/// definitions), which carries no documentation of its own: it stays in
/// this private module.
#[allow(missing_docs)]
mod handlers {
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
            let run = ctx.key().to_owned();
            // The journal's first step: the settings it was written with.
            let now = self.worker.settings.fingerprint(&request);
            let sent = now.clone();
            let recorded = ctx
                .run(move || async move { Ok(Json(sent)) })
                .name("settings")
                .await?
                .into_inner();
            if recorded != now {
                // Not replayed, and not ended either: a handler may only
                // diverge from its journal at the journal's end, so the
                // attempt fails (retried with backoff, the reason shown in
                // Restate's invocation status, until a worker with the
                // journal's settings takes it or Restate's retry policy
                // pauses it).
                let message = format!(
                    "run {run} was journaled with other run settings than this worker's \
                     (journal: {recorded}; worker: {now}); a worker with the journal's settings must finish it"
                );
                eprintln!("subloop-restate: {message}");
                return Err(HandlerError::from(message));
            }
            let budget = subloop::Budget::new(request.calls).map_err(terminal)?;
            let (steps, orders) = Steps::new();
            let repeated = crate::Repeated::default();
            let (agent, model) = self
                .worker
                .parent_agent(&run, &request, &steps, &repeated)
                .map_err(terminal)?;
            drop(steps);
            let report = drive(
                agent,
                &request.question,
                budget,
                model,
                parent_pump(&ctx, orders),
            )
            .await?;
            let repeated = taken(&repeated);
            Ok(Json(RunResult {
                status: report.outcome.status.to_string(),
                text: report.outcome.text.clone(),
                calls: report.outcome.calls,
                repeated,
                report: serde_json::to_value(report.json_report()).unwrap_or_default(),
            }))
        }

        /// Answers the pending approval of a call.
        #[handler]
        async fn approve(
            &self,
            ctx: SharedWorkflowContext<'_>,
            answer: Json<Answer>,
        ) -> Result<(), HandlerError> {
            let answer = answer.into_inner();
            if answer.decision != "allow" && answer.decision != "deny" {
                return Err(TerminalError::new_with_code(
                    400,
                    format!(
                        "the decision is `allow` or `deny`, not `{}`",
                        answer.decision
                    ),
                )
                .into());
            }
            let pending: Vec<Pending> = ctx
                .get::<Json<Vec<Pending>>>(PENDING)
                .await?
                .map(Json::into_inner)
                .unwrap_or_default();
            let Some(waiting) = pending.iter().find(|p| p.call == answer.call) else {
                return Err(TerminalError::new_with_code(
                    404,
                    format!(
                        "run {} waits for no approval of call {}",
                        ctx.key(),
                        answer.call
                    ),
                )
                .into());
            };
            ctx.resolve_promise::<String>(&waiting.key, answer.decision);
            Ok(())
        }

        /// The approvals the run waits for.
        #[handler]
        async fn pending(
            &self,
            ctx: SharedWorkflowContext<'_>,
        ) -> Result<Json<Vec<Pending>>, HandlerError> {
            Ok(Json(
                ctx.get::<Json<Vec<Pending>>>(PENDING)
                    .await?
                    .map(Json::into_inner)
                    .unwrap_or_default(),
            ))
        }
    }

    #[restate_sdk::service]
    impl DurableChild {
        /// Runs one delegation to its end; its report is the parent's `task` result.
        #[handler]
        async fn run(
            &self,
            ctx: Context<'_>,
            request: Json<ChildRequest>,
        ) -> Result<Json<ChildResult>, HandlerError> {
            let request = request.into_inner();
            let (steps, orders) = Steps::new();
            let repeated = crate::Repeated::default();
            let (agent, model, budget) = self
                .worker
                .child_agent(&request, &steps, &repeated)
                .map_err(terminal)?;
            drop(steps);
            let report = drive(
                agent,
                &request.task,
                budget,
                model,
                child_pump(&ctx, orders),
            )
            .await?;
            let repeated = taken(&repeated)
                .iter()
                .map(|name| format!("child {}: {name}", request.number))
                .collect();
            Ok(Json(child_result(&report, repeated)))
        }
    }
}

/// Serves `worker`'s runs and children on `address` (HTTP/2 without TLS)
/// until the process ends. Register the address with the Restate server
/// (`client::register`) for it to send invocations here.
pub async fn serve(worker: Worker, address: std::net::SocketAddr) {
    HttpServer::new(endpoint(worker))
        .listen_and_serve(address)
        .await;
}

/// [`serve`] on a listener already bound (so a port in use is known before
/// the worker registers itself), until the process ends.
pub async fn serve_on(worker: Worker, listener: tokio::net::TcpListener) {
    HttpServer::new(endpoint(worker)).serve(listener).await;
}

/// A listener on `address` that further workers of this user on this host
/// may share (`SO_REUSEPORT`): they serve one deployment URI, and the
/// kernel spreads the server's connections (one per invocation) over them.
pub fn listen_shared(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseport(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

/// How long an invocation may go without journaling before Restate asks
/// it to suspend: a run waiting for an approval or for its children then
/// holds no worker, and the answer wakes it on whichever worker is there.
/// A step that takes longer (a slow model request, a long program) goes
/// on; its result is journaled when it ends, and the run is replayed from
/// the journal to go on.
pub const SUSPEND_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a step may run after Restate asked the invocation to suspend
/// before the attempt is aborted (and the step runs again): longer than
/// any step should take.
pub const ABORT_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

fn endpoint(worker: Worker) -> Endpoint {
    let options = || {
        ServiceOptions::new()
            .inactivity_timeout(SUSPEND_AFTER)
            .abort_timeout(ABORT_AFTER)
    };
    Endpoint::builder()
        .bind(
            DurableRun {
                worker: worker.clone(),
            }
            .into_service_definition()
            .options(options()),
        )
        .bind(
            // Children are started by runs only, never through the ingress.
            DurableChild { worker }
                .into_service_definition()
                .options(options().ingress_private(true)),
        )
        .build()
}
