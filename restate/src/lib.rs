//! Durable subloop runs on [Restate](https://restate.dev).
//!
//! A run is a Restate workflow ([`DurableRun`]) keyed by its run id. The
//! handler drives the library's own loop; what the loop does outside
//! itself is journaled, step by step:
//!
//! | step | journaled as | on a replay |
//! |---|---|---|
//! | a model reply (or failure) | `model N` | read back; the model is not asked |
//! | a tool's output (`read_file`, `run_main`) | `tool NAME ID` | read back; the program does not run |
//! | an approval | a durable promise, `approval N` | read back; nobody is asked again |
//! | a `task` call | a call to [`DurableChild`] | its report is read back; the child is not restarted |
//!
//! A step that was started by a worker that died before its result was
//! journaled runs again (at least once, for that step only); the run's
//! result names it in [`RunResult::repeated`].
//!
//! The engine sits behind a small seam of our own: the run's parts send
//! orders (record this work, wait for this approval, run these children) to
//! the handler's side, which is the only code that talks to Restate.
//!
//! ```no_run
//! # async fn serve_it() {
//! use subloop_restate::{Worker, WorkerSettings, DemoModels};
//! let worker = Worker::new(DemoModels, WorkerSettings::new());
//! subloop_restate::serve(worker, ([127, 0, 0, 1], 9080).into()).await;
//! # }
//! ```

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use subloop::agent::subagent::{ChildBudget, SubagentConfig, TaskReport, TaskTool};
use subloop::policy::hooks::Hooks;
use subloop::policy::permission::{AllowAll, Approver, DenyAll};
use subloop::providers::demo::{DemoChild, DemoParent};
use subloop::run::model::Model;
use subloop::tools::sandbox::{Sandbox, SandboxPolicy};
use subloop::tools::{ReadFile, RunMain, RunSettings, Tool};
use subloop::{AgentBuilder, Budget};

pub mod client;
mod engine;
mod parts;
mod steps;

pub use engine::{
    ABORT_AFTER, Answer, DurableChild, DurableRun, Pending, SUSPEND_AFTER, listen_shared, serve,
    serve_on,
};
pub use steps::{ChildRequest, ChildResult};

use parts::{DurableTask, JournaledModel, JournaledTool, PromiseApprover, Repeated};
use steps::Steps;

/// What a client submits: the question, the parent's call budget and the
/// workspace as the workers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The question.
    pub question: String,
    /// The parent's model calls.
    pub calls: u32,
    /// The workspace, as the workers see it.
    pub workspace: String,
}

/// What a run gives back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// How the run ended (`answered`, `call_limit`, …).
    pub status: String,
    /// The final text.
    pub text: String,
    /// The parent's model calls.
    pub calls: u32,
    /// The steps that may have run more than once: each was started by a worker
    /// that died before its result was journaled (`model 2`, `tool
    /// run_main toolu_03`, `child 1: model 1`).
    #[serde(default)]
    pub repeated: Vec<String>,
    /// The report `subloop run --json` prints for the same run.
    #[serde(default)]
    pub report: Value,
}

/// An error of a durable run's own (not the model's, not a tool's).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The engine could not record or replay a step.
    #[error("the durable engine failed: {0}")]
    Engine(String),
}

/// Where a worker's models come from: a fresh model per run and per child.
///
/// A replaced worker's model is asked only what the journal does not
/// hold, so a model answers from the request it is given (its history),
/// not from a count of its own.
pub trait Models: Send + Sync + 'static {
    /// The parent's model for one run.
    fn parent(&self) -> Box<dyn Model + Send>;
    /// The model of delegation `number` (1, 2, …).
    fn child(&self, number: usize) -> Box<dyn Model + Send>;
}

/// The built-in offline demo models (`subloop demo`'s).
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoModels;

impl Models for DemoModels {
    fn parent(&self) -> Box<dyn Model + Send> {
        Box::new(DemoParent)
    }

    fn child(&self, _number: usize) -> Box<dyn Model + Send> {
        Box::new(DemoChild)
    }
}

/// Who answers the approvals `run_main` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Approvals {
    /// A person, later, through the run's `approve` handler (`subloop
    /// approve`); the run waits without holding a worker.
    Ask,
    /// Every call is allowed.
    Allow,
    /// Every call is denied (answered `not executed: permission denied`).
    Deny,
}

/// How a worker sets up the runs it serves. Every worker serving one
/// Restate service must have the same settings: a run's journal records
/// them, and a worker whose settings differ refuses to replay it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerSettings {
    /// Who answers `run_main`'s approvals.
    pub approvals: Approvals,
    /// How `run_main` runs the program; `None` offers no `run_main`.
    pub run_main: Option<RunSettings>,
    /// The sandbox `run_main` starts programs in.
    pub sandbox: Sandbox,
    /// Each child's model calls, 1 to 8; 0 offers no `task` tool.
    pub child_calls: u32,
    /// The run limits: tool calls per reply and delegations per run; a
    /// token budget counts the parent's tokens, and each child's its own.
    /// A deadline is not applied: a replay would meet it at another point
    /// of the run than the attempt that journaled it.
    pub limits: subloop::run::limits::Limits,
    /// Where each run's trace is written (`RUN.jsonl`; a child's
    /// `RUN.child-N.jsonl`), by the worker that ran its last attempt: an
    /// attempt replays the whole run, so it writes the whole trace anew.
    /// Not part of the settings a journal records.
    pub trace_dir: Option<std::path::PathBuf>,
    /// The folder every submitted workspace must be inside (compared as
    /// canonical paths); `None` takes any folder a submission names, which
    /// is only right when everyone who can reach the Restate ingress may
    /// read and run what this worker can.
    pub workspace_root: Option<std::path::PathBuf>,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerSettings {
    /// Approvals asked, `python3 main.py` with the library's defaults,
    /// the workspace-write sandbox, children with 4 calls.
    pub fn new() -> Self {
        Self {
            approvals: Approvals::Ask,
            run_main: Some(RunSettings::default()),
            sandbox: Sandbox::WorkspaceWrite,
            child_calls: 4,
            limits: subloop::run::limits::Limits::default(),
            trace_dir: None,
            workspace_root: None,
        }
    }

    /// The trace file of `run` (`RUN.jsonl`, or `RUN.child-N.jsonl` for
    /// delegation `child`), if traces are written: the run id with every
    /// character other than `A-Za-z0-9._-` as `_`, and, when that changed
    /// it or it could be taken for a child's, a hash of the id, so two
    /// runs never share a file.
    fn trace(&self, run: &str, child: Option<usize>) -> Option<std::path::PathBuf> {
        let dir = self.trace_dir.as_ref()?;
        let plain: String = run
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let trimmed = plain.trim_start_matches('.');
        let name = if trimmed == run && !run.contains(".child-") && !run.is_empty() {
            trimmed.to_owned()
        } else {
            // FNV-1a over the id's bytes.
            let hash = run.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
            format!("{trimmed}-{hash:016x}")
        };
        let name = name.as_str();
        Some(match child {
            None => dir.join(format!("{name}.jsonl")),
            Some(number) => dir.join(format!("{name}.child-{number}.jsonl")),
        })
    }

    /// What a run's journal records of these settings for `request`, and
    /// what a replay compares.
    fn fingerprint(&self, request: &RunRequest) -> Value {
        let run_main = self.run_main.as_ref().map(|settings| {
            json!({"command": settings.command, "timeout_ms": settings.timeout.as_millis() as u64,
                "output_cap": settings.output_cap, "sandbox": self.sandbox})
        });
        json!({
            "format": 1,
            "workspace": request.workspace,
            "approvals": self.approvals,
            "run_main": run_main,
            "child_calls": self.child_calls,
            "max_tools_per_reply": self.limits.max_tools_per_reply,
            "max_delegations": self.limits.max_delegations,
            "max_tokens_total": self.limits.max_tokens_total,
        })
    }
}

/// A worker: the models and settings every run it serves uses.
#[derive(Clone)]
pub struct Worker {
    models: Arc<dyn Models>,
    settings: Arc<WorkerSettings>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker whose runs ask `models`, set up by `settings`.
    pub fn new(models: impl Models, settings: WorkerSettings) -> Self {
        Self {
            models: Arc::new(models),
            settings: Arc::new(settings),
        }
    }

    /// The settings' limits, without a deadline.
    fn limits(&self) -> subloop::run::limits::Limits {
        let mut limits = self.settings.limits;
        limits.deadline = None;
        limits
    }

    /// `workspace` if it may be used: inside the workspace root, when
    /// there is one.
    fn workspace<'p>(
        &self,
        workspace: &'p str,
    ) -> Result<&'p std::path::Path, subloop::core::error::SetupError> {
        let path = std::path::Path::new(workspace);
        if let Some(root) = &self.settings.workspace_root {
            let refused = |message: String| subloop::core::error::SetupError::Workspace {
                path: path.to_owned(),
                message,
            };
            let real = path
                .canonicalize()
                .map_err(|error| refused(error.to_string()))?;
            let root = root
                .canonicalize()
                .map_err(|error| refused(format!("the workspace root: {error}")))?;
            if !real.starts_with(&root) {
                return Err(refused(format!(
                    "not inside this worker's workspace root {}",
                    root.display()
                )));
            }
        }
        Ok(path)
    }

    /// The parent agent of run `run`, its parts journaling through `steps`.
    fn parent_agent(
        &self,
        run: &str,
        request: &RunRequest,
        steps: &Steps,
        repeated: &Repeated,
    ) -> Result<(subloop::Agent, JournaledModel), subloop::core::error::SetupError> {
        let workspace = self.workspace(&request.workspace)?;
        let approver: Arc<dyn Approver> = match self.settings.approvals {
            Approvals::Ask => Arc::new(PromiseApprover {
                steps: steps.clone(),
            }),
            Approvals::Allow => Arc::new(AllowAll),
            Approvals::Deny => Arc::new(DenyAll),
        };
        let journaled = |tool: Arc<dyn Tool>| JournaledTool {
            inner: tool,
            steps: steps.clone(),
            repeated: Arc::clone(repeated),
        };
        let read_file = ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT)?;
        let mut builder = AgentBuilder::new(approver)
            .plan()?
            .limits(self.limits(), subloop::run::limits::CancelHandle::new());
        if self.settings.child_calls > 0 {
            // The library's `task` tool, for its description and schema:
            // built over a plain `read_file`, never run.
            let config = SubagentConfig::new(
                Arc::new(subloop::providers::demo::DemoChildren),
                Hooks::none(),
            );
            let probe = AgentBuilder::new(Arc::new(DenyAll))
                .read_only_tool(ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT)?)?
                .subagents(config)?;
            let definition = probe
                .registry()
                .lookup_shared(TaskTool::NAME)
                .map(|(tool, _)| tool)
                .ok_or_else(|| {
                    subloop::core::error::SetupError::RunCommand("no task tool".into())
                })?;
            builder = builder.tool(DurableTask {
                definition,
                steps: steps.clone(),
                run: run.to_owned(),
                workspace: request.workspace.clone(),
                delegations: Mutex::new(0),
                max_delegations: self.settings.limits.max_delegations,
                repeated: Arc::clone(repeated),
            })?;
        }
        builder = builder.tool(journaled(Arc::new(read_file)))?;
        if let Some(settings) = &self.settings.run_main {
            let run_main = RunMain::new(workspace, settings.clone())?
                .with_sandbox(SandboxPolicy::new(self.settings.sandbox));
            builder = builder.tool(journaled(Arc::new(run_main)))?;
        }
        if let Some(writer) = self
            .settings
            .trace(run, None)
            .and_then(|path| trace_writer(&path, workspace))
        {
            builder = builder.monitor(writer);
        }
        let model = JournaledModel {
            steps: steps.clone(),
            inner: Arc::new(Mutex::new(self.models.parent())),
            calls: 0,
            repeated: Arc::clone(repeated),
        };
        Ok((builder.build(), model))
    }

    /// The agent of delegation `request`: a fresh history, `read_file`
    /// only, its own call budget, no approvals.
    fn child_agent(
        &self,
        request: &ChildRequest,
        steps: &Steps,
        repeated: &Repeated,
    ) -> Result<(subloop::Agent, JournaledModel, Budget), subloop::core::error::SetupError> {
        let workspace = self.workspace(&request.workspace)?;
        let read_file = ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT)?;
        let mut builder = AgentBuilder::new(Arc::new(DenyAll))
            .limits(self.limits(), subloop::run::limits::CancelHandle::new())
            .system(SubagentConfig::CHILD_SYSTEM)
            .tool(JournaledTool {
                inner: Arc::new(read_file),
                steps: steps.clone(),
                repeated: Arc::clone(repeated),
            })?;
        if let Some(writer) = self
            .settings
            .trace(&request.run, Some(request.number))
            .and_then(|path| trace_writer(&path, workspace))
        {
            builder = builder.monitor(writer);
        }
        let agent = builder.build();
        let model = JournaledModel {
            steps: steps.clone(),
            inner: Arc::new(Mutex::new(self.models.child(request.number))),
            calls: 0,
            repeated: Arc::clone(repeated),
        };
        let budget = ChildBudget::new(self.settings.child_calls)?.get();
        Ok((agent, model, budget))
    }
}

/// A trace writer on `path` (created anew), recording `workspace`; `None`,
/// said on stderr, when the file cannot be made: the run goes on without.
fn trace_writer(
    path: &std::path::Path,
    workspace: &std::path::Path,
) -> Option<subloop::record::trace::TraceWriter> {
    match subloop::record::trace::TraceWriter::create(path) {
        Ok(writer) => Some(writer.with_workspace(workspace)),
        Err(error) => {
            eprintln!(
                "subloop-restate: the trace {} cannot be written ({error}); the run goes on without it",
                path.display()
            );
            None
        }
    }
}

/// The report a child's outcome gives the parent.
fn child_result(report: &subloop::RunReport, repeated: Vec<String>) -> ChildResult {
    let output = TaskReport::from_outcome(&report.outcome).to_output();
    ChildResult {
        content: output.content.to_string(),
        is_error: output.is_error,
        repeated,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn trace_names_never_collide_and_stay_in_the_folder() {
        let mut settings = WorkerSettings::new();
        settings.trace_dir = Some(std::path::PathBuf::from("/traces"));
        let name = |run: &str, child| settings.trace(run, child).unwrap();
        assert_eq!(
            name("run-1", None),
            std::path::Path::new("/traces/run-1.jsonl")
        );
        assert_ne!(name("a/b", None), name("a_b", None));
        assert_ne!(name("a?b", None), name("a/b", None));
        assert_ne!(name("x.child-1", None), name("x", Some(1)));
        for hostile in ["../../etc/passwd", "..", "/abs", "", "é/ü"] {
            let path = name(hostile, None);
            assert_eq!(
                path.parent(),
                Some(std::path::Path::new("/traces")),
                "{hostile}"
            );
            assert!(!path.file_name().unwrap().to_string_lossy().starts_with('.'));
        }
    }

    #[test]
    fn a_workspace_outside_the_root_is_refused() {
        let base =
            std::env::temp_dir().join(format!("subloop-restate-root-{}", std::process::id()));
        let (root, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(root.join("ws")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let mut settings = WorkerSettings::new();
        settings.workspace_root = Some(root.clone());
        let worker = Worker::new(DemoModels, settings);
        let inside = root.join("ws").display().to_string();
        assert!(worker.workspace(&inside).is_ok());
        for refused in [
            outside.display().to_string(),
            root.join("ws/../../outside").display().to_string(),
            "/".to_owned(),
        ] {
            let error = worker.workspace(&refused).unwrap_err().to_string();
            assert!(error.contains("workspace root"), "{refused}: {error}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
