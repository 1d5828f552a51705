//! Tools: the [`Tool`] trait and typed tools ([`TypedTool`]), the
//! [`Registry`], argument checks, and the built-in tools `read_file`,
//! `run_main` (in its [`sandbox`]) and `todo_write`.
//!
//! A registry is the single source of both the tool definitions sent to the
//! model and the dispatch table, so a name the request did not offer cannot
//! be dispatched.
//!
//! May import: [`crate::core`], [`crate::run`].

pub mod mcp;
mod read_file;
mod registry;
pub(crate) mod run_main;
pub mod sandbox;
pub mod schema;
mod todo;
mod typed;

pub use read_file::Resolution;
pub use read_file::{ReadError, ReadFile, ReadFileArgs};
pub use registry::{ReadOnlyRegistry, Registry, ToolEntry, ToolSource};
pub(crate) use run_main::split_command;
pub use run_main::{ProcessGroups, Programs, RunMain, RunSettings};
pub(crate) use todo::TodoWrite;
pub use typed::{TypedTool, input_schema_for};

use serde_json::Value;

use crate::core::agent_id::AgentId;
use crate::core::conversation::{ToolCall, ToolOutput};

/// What a tool may do; decides whether it needs approval and whether a child may hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Capability {
    /// Only reads; runs freely and may be given to a subagent.
    ReadOnly,
    /// Executes programs; runs only after approval.
    Executes,
    /// Changes the agent's plan.
    Plans,
    /// Hands work to a subagent.
    Delegates,
}

impl Capability {
    /// Whether each call needs the approver's consent.
    pub fn needs_approval(self) -> bool {
        matches!(self, Self::Executes)
    }
}

/// Who is calling a tool, and with which call.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ToolContext<'a> {
    /// The agent making the call (`parent`, `child-1`, ...).
    pub agent: &'a AgentId,
    /// The call, with its id.
    pub call: &'a ToolCall,
    /// The call's `execute_tool` span. A tool that does its work elsewhere
    /// (another thread, a task of its own) opens its spans under it;
    /// `&Span::none()` where there is none.
    pub span: &'a tracing::Span,
}

impl<'a> ToolContext<'a> {
    /// The context of `call`, made by `agent`, under `span` (`&Span::none()`
    /// where there is none): what a host that calls a tool itself (a test
    /// of its own tool) gives it.
    pub fn new(agent: &'a AgentId, call: &'a ToolCall, span: &'a tracing::Span) -> Self {
        Self { agent, call, span }
    }
}

/// The future of a tool's answer in an async run ([`Tool::run_async`]).
pub(crate) type ToolFuture<'a> = crate::run::BoxFuture<'a, ToolOutput>;

/// The future of a batch's answers in an async run ([`Tool::run_batch_async`]).
pub(crate) type BatchFuture<'a> = crate::run::BoxFuture<'a, Vec<ToolOutput>>;

/// A tool the model can call.
///
/// A blocking run (`Agent::run`) calls [`Tool::run`] and [`Tool::run_batch`];
/// an async run (`Agent::run_async`) calls [`Tool::run_async`] and
/// [`Tool::run_batch_async`], whose defaults call the blocking ones on the
/// run's task: right for a tool that only computes or reads a file, wrong
/// for one that waits (a program, a server), which overrides them.
///
/// A tool whose arguments are a Rust type implements [`TypedTool`]
/// instead, and is a `Tool` through it.
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// The JSON schema of its input; arguments are checked against it before [`Tool::run`].
    fn input_schema(&self) -> Value;
    /// What it may do.
    fn capability(&self) -> Capability;
    /// A one-line description of what a call would do, shown when asking for approval.
    fn action(&self, input: &Value) -> String {
        format!("{} {}", self.name(), input)
    }

    /// Runs one call with checked arguments.
    fn run(&self, input: &Value, context: &ToolContext<'_>) -> ToolOutput;

    /// Runs several consecutive calls of one reply (the executor batches
    /// consecutive calls of a delegating tool only); outputs in call order.
    /// The default runs them one after another; a tool whose calls are
    /// independent (such as `task`) may run them concurrently.
    fn run_batch(&self, calls: &[ToolContext<'_>]) -> Vec<ToolOutput> {
        calls
            .iter()
            .map(|context| self.run(context.call.input(), context))
            .collect()
    }

    /// Runs one call in an async run. Dropping the future abandons the
    /// call: a tool that starts work outside the future (a program) stops
    /// it then. The default runs [`Tool::run`] when called, and its future
    /// is already complete.
    fn run_async<'a>(&'a self, input: &'a Value, context: &'a ToolContext<'a>) -> ToolFuture<'a> {
        Box::pin(std::future::ready(self.run(input, context)))
    }

    /// [`Tool::run_batch`] in an async run. The default runs the calls one
    /// after another through [`Tool::run_async`].
    fn run_batch_async<'a>(&'a self, calls: &'a [ToolContext<'a>]) -> BatchFuture<'a> {
        Box::pin(async move {
            let mut outputs = Vec::with_capacity(calls.len());
            for context in calls {
                outputs.push(self.run_async(context.call.input(), context).await);
            }
            outputs
        })
    }
}

/// A tool that only reads. Only these can be put in a [`ReadOnlyRegistry`],
/// the registry a subagent gets.
///
/// `task`, `run_main` and `todo_write` do not implement it, and the orphan
/// rule stops anyone else from implementing it for them, so a child holding
/// one of them cannot be written:
///
/// ```compile_fail
/// use subloop::tools::{ReadOnlyRegistry, RunMain, RunSettings};
/// let run_main = RunMain::new(std::path::Path::new("."), RunSettings::default()).unwrap();
/// let child = ReadOnlyRegistry::new().with(run_main); // RunMain: !ReadOnlyTool
/// ```
pub trait ReadOnlyTool: Tool {}

/// A refusal: `not executed: <reason>`, as an error result
/// ([`ToolOutput::refusal`]).
pub(crate) fn refusal(reason: impl std::fmt::Display) -> ToolOutput {
    ToolOutput::refusal(reason)
}
