//! The seam between a run and the engine that journals it: the steps a
//! durable run records, as orders sent to the engine's side of the run.
//!
//! The run's parts (its model, its tools, its approver, its `task` tool)
//! hold a [`Steps`] handle and know nothing of Restate. The engine's side
//! ([`crate::engine`]) takes the orders one by one, in the order the loop
//! gives them, and journals each: a result already in the journal is
//! replayed and the work is not done again. Another engine (Temporal, say)
//! would take the same orders.

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::RunError;

/// What a journaled step holds: the work's result, and whether the work
/// may have run more than once (an earlier worker started it and died before its
/// result was journaled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Recorded {
    /// The result, as JSON text.
    pub value: String,
    /// Whether an earlier attempt had started this step.
    pub repeated: bool,
}

/// A `task` call handed to a child invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildRequest {
    /// The parent run's id.
    pub run: String,
    /// The parent's `task` call id.
    pub call: String,
    /// The delegation's number in the run (1, 2, …).
    pub number: usize,
    /// The task text, checked.
    pub task: String,
    /// The workspace, as the workers see it.
    pub workspace: String,
}

/// A child's answer: the `task` result the parent gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildResult {
    /// The report `{status, summary, calls}` as JSON text.
    pub content: String,
    /// Whether the parent's result is flagged `is_error`.
    pub is_error: bool,
    /// The steps of the child that may have run more than once.
    #[serde(default)]
    pub repeated: Vec<String>,
}

/// An order to the engine's side of a run.
pub(crate) enum Order {
    /// Journal the result of some work, done only if the journal lacks it:
    /// the engine sends on `go` when the work must run, and the work's
    /// result comes back on `result`.
    Run {
        name: String,
        go: oneshot::Sender<()>,
        result: oneshot::Receiver<String>,
        done: oneshot::Sender<Result<Recorded, RunError>>,
    },
    /// Wait, without holding a process, until someone answers the approval
    /// of `call` (`allow` or `deny`).
    Approval {
        call: String,
        action: String,
        done: oneshot::Sender<Result<String, RunError>>,
    },
    /// Run these children, each as an invocation of its own, together.
    Children {
        requests: Vec<ChildRequest>,
        done: oneshot::Sender<Vec<Result<ChildResult, RunError>>>,
    },
}

/// A run's handle on its journal. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Steps {
    orders: mpsc::UnboundedSender<Order>,
}

impl Steps {
    /// A handle and the receiving end the engine serves.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Order>) {
        let (orders, receiver) = mpsc::unbounded_channel();
        (Self { orders }, receiver)
    }

    /// `work`'s result (JSON text), from the journal if it is there, else
    /// by doing `work` once and journaling what it gave.
    pub(crate) async fn run<F>(&self, name: String, work: F) -> Result<Recorded, RunError>
    where
        F: std::future::Future<Output = String>,
    {
        let (go, go_rx) = oneshot::channel();
        let (result_tx, result) = oneshot::channel();
        let (done, mut done_rx) = oneshot::channel();
        self.orders
            .send(Order::Run {
                name,
                go,
                result,
                done,
            })
            .map_err(|_| RunError::Engine("the journal is closed".to_owned()))?;
        // Either the engine replays the step (done comes first) or it asks
        // for the work (go), then journals what the work gave.
        tokio::select! {
            biased;
            done = &mut done_rx => return done.unwrap_or_else(|_| Err(closed())),
            go = go_rx => {
                if go.is_ok() {
                    let _ = result_tx.send(work.await);
                }
            }
        }
        done_rx.await.unwrap_or_else(|_| Err(closed()))
    }

    /// The answer to the approval of `call`, when someone gives it.
    pub(crate) async fn approval(&self, call: String, action: String) -> Result<String, RunError> {
        let (done, done_rx) = oneshot::channel();
        self.orders
            .send(Order::Approval { call, action, done })
            .map_err(|_| closed())?;
        done_rx.await.unwrap_or_else(|_| Err(closed()))
    }

    /// The children's answers, in the order of `requests`.
    pub(crate) async fn children(
        &self,
        requests: Vec<ChildRequest>,
    ) -> Vec<Result<ChildResult, RunError>> {
        let count = requests.len();
        let (done, done_rx) = oneshot::channel();
        if self
            .orders
            .send(Order::Children { requests, done })
            .is_err()
        {
            return (0..count).map(|_| Err(closed())).collect();
        }
        done_rx
            .await
            .unwrap_or_else(|_| (0..count).map(|_| Err(closed())).collect())
    }
}

fn closed() -> RunError {
    RunError::Engine("the journal closed before the step was recorded".to_owned())
}
