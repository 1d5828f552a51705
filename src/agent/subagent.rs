//! The `task` tool: a subagent with a fresh history, a whitelist, its own
//! budget, and a bounded report.
//!
//! A subagent is not a second loop. It is the same [`Conversation`] driven by
//! the same [`driver::run`], with another question (the task text), another
//! registry (built from the host's whitelist), another budget and its own
//! system prompt. Its calls pass the parent's permission gate; its hooks are
//! the set the host gave explicitly in [`SubagentConfig::new`]. The parent
//! gets one `tool_result` under the `task` call's id, holding
//! `{"status", "summary", "calls"}` taken straight from the child's outcome.
//!
//! A child can only hold read-only tools; `task` itself cannot be put in a
//! child registry:
//!
//! ```compile_fail
//! fn child_tool<T: subloop::tools::ReadOnlyTool>() {}
//! child_tool::<subloop::agent::subagent::TaskTool>(); // TaskTool is not read-only
//! ```

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::agent::executor::{Drive, Gate, Toolbox, run_command_hooks};
use crate::agent::output::{DEFAULT_OUTPUT_RETRIES, SchemaOutput, TypedOutput};
use crate::core::agent_id::AgentId;
use crate::core::call::{ToolRecord, Warning};
use crate::core::conversation::{
    Budget, Conversation, OnEmptyReply, Outcome, OutputCheck, StatusKind, ToolOutput,
};
use crate::core::error::SetupError;
use crate::core::hook::HookEvent;
use crate::core::protocol::ToolUseId;
use crate::policy::command_hooks::{CommandHooks, HookInput};
use crate::policy::hooks::{AuditLog, Hooks};
use crate::policy::permission::Approver;
use crate::run::driver::{self, block_on};
use crate::run::join::{CatchUnwind, join_all};
use crate::run::limits::RunGuard;
use crate::run::model::{AsyncModel, Blocking, ChildModels};
use crate::run::monitor::{AgentMonitor, SharedMonitor};
use crate::run::telemetry::{self, Telemetry};
use crate::tools::{
    BatchFuture, Capability, ReadOnlyRegistry, Registry, Tool, ToolContext, ToolFuture, refusal,
};
use tracing::instrument::WithSubscriber;
use tracing::{Instrument, Span};

/// The tool's name.
const TASK_TOOL: &str = "task";
/// The longest task text, in characters after trimming.
const MAX_TASK_CHARS: usize = 600;
/// The longest summary passed back whole, in characters.
pub(crate) const MAX_SUMMARY_CHARS: usize = 1200;
/// Appended to a summary cut at [`TaskTool::MAX_SUMMARY_CHARS`].
pub(crate) const TRUNCATION_NOTE: &str = "(summary too long, truncated; narrow the task)";
/// The default child system prompt.
pub(crate) const CHILD_SYSTEM: &str = "You are a subagent working for another agent. Do the task you are given \
with the tools you have, then answer with a short conclusion. You cannot run programs, change plans or delegate.";

/// A child's call budget: 1 to 8 model requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildBudget(Budget);

impl ChildBudget {
    /// The most a child may use.
    pub const MAX: u32 = 8;
    /// The default.
    pub const DEFAULT: u32 = 4;

    /// A budget of `calls` model requests; outside 1..=8 is an error.
    pub fn new(calls: u32) -> Result<Self, SetupError> {
        if !(1..=Self::MAX).contains(&calls) {
            return Err(SetupError::ChildBudget(calls));
        }
        Budget::new(calls)
            .map(Self)
            .map_err(|_| SetupError::ChildBudget(calls))
    }

    /// As a conversation budget.
    pub fn get(self) -> Budget {
        self.0
    }
}

impl Default for ChildBudget {
    fn default() -> Self {
        const FOUR: NonZeroU32 = match NonZeroU32::new(ChildBudget::DEFAULT) {
            Some(four) => four,
            None => panic!("the default child budget is not zero"),
        };
        Self(Budget::from_nonzero(FOUR))
    }
}

/// How the host sets up subagents.
#[derive(Clone)]
pub struct SubagentConfig {
    whitelist: Vec<String>,
    budget: ChildBudget,
    hooks: Hooks,
    models: Arc<dyn ChildModels>,
    system: String,
    output: Option<Arc<dyn OutputCheck>>,
    output_retries: u32,
}

impl std::fmt::Debug for SubagentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentConfig")
            .field("whitelist", &self.whitelist)
            .field("budget", &self.budget)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl SubagentConfig {
    /// The default child system prompt.
    pub const CHILD_SYSTEM: &'static str = CHILD_SYSTEM;

    /// Children get their models from `models` and run `hooks`: the parent's
    /// hooks are never inherited, so the host names the child's set here
    /// (pass [`Hooks::none`] for none). Defaults: whitelist `read_file`,
    /// budget 4, [`SubagentConfig::CHILD_SYSTEM`].
    pub fn new(models: Arc<dyn ChildModels>, hooks: Hooks) -> Self {
        Self {
            whitelist: vec!["read_file".to_owned()],
            budget: ChildBudget::default(),
            hooks,
            models,
            system: CHILD_SYSTEM.to_owned(),
            output: None,
            output_retries: DEFAULT_OUTPUT_RETRIES,
        }
    }

    /// Asks each child for a structured answer, checked as the parent's is
    /// ([`crate::AgentBuilder::output_check`]): the report's `summary` is
    /// then the answer's JSON value, and a child whose answer still does
    /// not match after its retries reports `invalid_output` with the reason
    /// (an error result). The `task` tool's description tells the parent
    /// the shape that comes back.
    pub fn output_check(mut self, check: Arc<dyn OutputCheck>) -> Self {
        self.output = Some(check);
        self
    }

    /// [`SubagentConfig::output_check`] with a JSON schema.
    pub fn output_schema(self, schema: Value) -> Self {
        self.output_check(SchemaOutput::shared(schema))
    }

    /// [`SubagentConfig::output_check`] with the schema of `T`.
    pub fn output<T: JsonSchema + DeserializeOwned + 'static>(self) -> Self {
        self.output_check(TypedOutput::<T>::shared())
    }

    /// How many of a child's answers that do not match are sent back (default 1).
    pub fn output_retries(mut self, retries: u32) -> Self {
        self.output_retries = retries;
        self
    }

    /// The child's tools, by name; each must be a read-only tool of the parent.
    pub fn whitelist(mut self, names: &[&str]) -> Self {
        self.whitelist = names.iter().map(|name| (*name).to_owned()).collect();
        self
    }

    /// The child's call budget.
    pub fn budget(mut self, budget: ChildBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The child's system prompt.
    pub fn system(mut self, system: impl Into<String>) -> Self {
        self.system = system.into();
        self
    }
}

/// The `task` tool's description.
const TASK_DESCRIPTION: &str = "Delegate a self-contained sub-question to a subagent with a fresh history and read-only tools. \
Returns a JSON report {status, summary, calls}; only the summary comes back, not the subagent's history.";

/// What the parent gets back: `{"status", "summary", "calls"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TaskReport {
    /// The child's final status.
    pub status: StatusKind,
    /// The child's final text, cut to [`TaskTool::MAX_SUMMARY_CHARS`] with [`TaskTool::TRUNCATION_NOTE`] when longer.
    pub summary: String,
    /// Model requests the child made.
    pub calls: u32,
    /// Whether the parent's result is flagged `is_error` (status not
    /// `answered`, or summary truncated).
    #[serde(skip)]
    pub is_error: bool,
}

impl TaskReport {
    /// The report of a child's outcome. No model is asked to summarise.
    pub fn from_outcome(outcome: &Outcome) -> Self {
        let mut is_error = outcome.status != StatusKind::Answered;
        // A checked answer is its value (compact JSON); one that failed the
        // check says why.
        let mut summary = match (&outcome.output, &outcome.output_error) {
            (Some(value), _) => value.to_string(),
            (None, Some(error)) => {
                format!("the answer does not match the output schema: {error}")
            }
            (None, None) => outcome.text.clone(),
        };
        if let Some((cut, _)) = summary.char_indices().nth(MAX_SUMMARY_CHARS) {
            summary.truncate(cut);
            summary.push_str(TRUNCATION_NOTE);
            is_error = true;
        }
        Self {
            status: outcome.status,
            summary,
            calls: outcome.calls,
            is_error,
        }
    }

    /// The report of a child that was not started, with `status` and
    /// `summary` saying why: no calls, an error result.
    pub fn not_started(status: StatusKind, summary: impl Into<String>) -> Self {
        Self {
            status,
            summary: summary.into(),
            calls: 0,
            is_error: true,
        }
    }

    /// The report of a `task` call past a run's delegation limit of `limit`.
    pub fn delegation_limit(limit: usize) -> Self {
        Self::not_started(
            StatusKind::DelegationLimit,
            format!(
                "delegation limit reached: this run may start at most {limit} subagent(s); no subagent was started for this task"
            ),
        )
    }

    /// The `tool_result` content and flag.
    pub fn to_output(&self) -> ToolOutput {
        // Serializing the struct keeps the field order: status, summary, calls.
        let content = serde_json::to_string(self).unwrap_or_else(|err| {
            json!({"status": "model_error", "summary": format!("report not serializable: {err}"), "calls": self.calls})
                .to_string()
        });
        ToolOutput {
            content: content.into(),
            is_error: self.is_error,
        }
    }
}

/// Everything the host keeps of one child.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ChildRecord {
    /// `child-N`, with the parent's `task` id.
    pub agent: AgentId,
    /// The parent's `task` call id.
    pub parent_tool_use_id: ToolUseId,
    /// The task text the child got.
    pub task: String,
    /// The report the parent got.
    pub report: TaskReport,
    /// The child's full outcome, history included.
    pub outcome: Outcome,
    /// The token usage of each of the child's replies, in order.
    pub usage_per_call: Vec<crate::core::protocol::Usage>,
    /// Empty replies of the child answered with a request to continue.
    pub empty_replies_continued: u32,
    /// The child's tool calls.
    pub tools: Vec<ToolRecord>,
    /// Warnings raised by the child's hooks.
    pub warnings: Vec<Warning>,
    /// How long the child ran.
    #[serde(serialize_with = "crate::agent::millis")]
    pub elapsed: Duration,
}

/// The run-wide services a child shares with its parent.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) approver: Arc<dyn Approver>,
    pub(crate) audit: AuditLog,
    pub(crate) monitor: SharedMonitor,
    pub(crate) children: Arc<Mutex<Vec<ChildRecord>>>,
    pub(crate) guard: Arc<RunGuard>,
    /// What an empty `end_turn` leads to, for the parent and every child.
    pub(crate) on_empty: OnEmptyReply,
    /// The settings' command hooks, for the parent and every child.
    pub(crate) commands: CommandHooks,
    /// What the spans of the parent and every child may record.
    pub(crate) telemetry: Telemetry,
    /// The secrets hidden from every tool result.
    pub(crate) redactor: crate::core::redact::Redactor,
    /// When and how the parent's and every child's history is compacted.
    pub(crate) compaction: Option<crate::core::compaction::Compaction>,
}

/// A child of a batch: its task, its number, its call's id and span.
type Planned<'c> = (&'c str, usize, &'c ToolUseId, &'c Span);

/// The `task` tool. Built by [`crate::AgentBuilder::subagents`].
pub struct TaskTool {
    registry: ReadOnlyRegistry,
    budget: ChildBudget,
    hooks: Hooks,
    models: Arc<dyn ChildModels>,
    system: String,
    /// The child's output check and its retries.
    output: Option<(Arc<dyn OutputCheck>, u32)>,
    /// What the parent is told the tool does (and, with an output check,
    /// the shape of the summary).
    description: String,
    /// The run's services, set once when the agent is built.
    shared: Arc<OnceLock<Shared>>,
}

impl std::fmt::Debug for TaskTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskTool")
            .field("registry", &self.registry)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl TaskTool {
    /// Appended to a summary cut at [`TaskTool::MAX_SUMMARY_CHARS`].
    pub const TRUNCATION_NOTE: &'static str = TRUNCATION_NOTE;

    /// The longest summary passed back whole, in characters.
    pub const MAX_SUMMARY_CHARS: usize = MAX_SUMMARY_CHARS;

    /// The tool's name.
    pub const NAME: &'static str = TASK_TOOL;
    /// The longest task text, in characters after trimming.
    pub const MAX_TASK_CHARS: usize = MAX_TASK_CHARS;

    /// Builds the child registry from `parent` by whitelist; fails on a name
    /// the parent lacks or a tool that is not read-only (there is no fallback).
    pub(crate) fn new(
        parent: &Registry,
        config: SubagentConfig,
        shared: Arc<OnceLock<Shared>>,
    ) -> Result<Self, SetupError> {
        if let Some(name) = config.whitelist.iter().find(|name| *name == TASK_TOOL) {
            return Err(SetupError::NotReadOnly(name.clone()));
        }
        let names: Vec<&str> = config.whitelist.iter().map(String::as_str).collect();
        let registry = parent.read_only_subset(&names)?;
        let mut description = TASK_DESCRIPTION.to_owned();
        if let Some(check) = &config.output {
            description.push_str(&format!(
                " The summary of an answered report is a JSON value matching this schema: {}",
                check.schema()
            ));
        }
        Ok(Self {
            registry,
            budget: config.budget,
            hooks: config.hooks,
            models: config.models,
            system: config.system,
            output: config.output.map(|check| (check, config.output_retries)),
            description,
            shared,
        })
    }

    /// The child's registry.
    pub fn child_registry(&self) -> &ReadOnlyRegistry {
        &self.registry
    }

    /// The report for a `task` call of a tool that is not part of a built
    /// agent (its registry was taken before `build`).
    fn not_built() -> ToolOutput {
        TaskReport::not_started(
            StatusKind::ModelError,
            "the task tool is not part of a built agent; no subagent was started",
        )
        .to_output()
    }

    /// The report for a `task` call past the run's delegation limit.
    fn over_limit(shared: &Shared) -> ToolOutput {
        TaskReport::delegation_limit(shared.guard.limits().max_delegations).to_output()
    }

    /// The trimmed task text of a `task` call's `input`, or the refusal
    /// the parent gets instead (an empty text, or one over
    /// [`TaskTool::MAX_TASK_CHARS`]): what a host that runs children
    /// elsewhere checks before it starts one.
    pub fn task_text(input: &Value) -> Result<&str, ToolOutput> {
        check_task(input)
    }

    /// Runs one child to its end and files its record; always returns a
    /// report. `drive` says how: on this thread with the blocking child
    /// model, or awaited with the async one.
    async fn run_child(
        &self,
        shared: &Shared,
        number: usize,
        task: &str,
        parent_call: &ToolUseId,
        call_span: &Span,
        drive: Drive,
    ) -> ToolOutput {
        let agent = AgentId::Child {
            number,
            parent_tool_use_id: parent_call.clone(),
        };
        // The child's span hangs under its `task` call's, whichever thread
        // or future it runs on.
        let dispatch = telemetry::dispatch_of(call_span);
        let span = telemetry::child_agent_span(call_span, &dispatch, &agent);
        telemetry::record_agent_input(&span, shared.telemetry, task);
        telemetry::record_budget(&span, self.budget.get().get());
        let started = Instant::now();
        let gate = Gate {
            registry: self.registry.registry(),
            approver: shared.approver.as_ref(),
            hooks: &self.hooks,
            commands: &shared.commands,
            audit: &shared.audit,
            monitor: &shared.monitor,
            guard: &shared.guard,
            telemetry: shared.telemetry,
            redactor: &shared.redactor,
            compaction: shared.compaction.as_ref(),
        };
        let mut toolbox = Toolbox::new(agent.clone(), gate, None, drive);
        let mut observer = AgentMonitor::new(&shared.monitor, &shared.guard);
        let task_text = Self::subagent_start(shared, &agent, task, &mut toolbox, drive).await;
        let outcome = match Conversation::new(&task_text, self.budget.get()) {
            Ok(fresh) => {
                let mut fresh = fresh
                    .with_system(self.system.as_str())
                    .on_empty_reply(shared.on_empty);
                if let Some((check, retries)) = &self.output {
                    fresh = fresh.expect_output(Arc::clone(check), *retries);
                }
                let conversation = fresh.begin();
                match drive {
                    Drive::Blocking => {
                        let mut model = Blocking(self.models.model_for(number));
                        telemetry::record_identity(&span, model.identity().as_ref());
                        driver::drive(
                            &agent,
                            conversation,
                            0,
                            &mut model,
                            &mut toolbox,
                            &mut observer,
                        )
                        .instrument(span.clone())
                        .with_subscriber(dispatch.clone())
                        .await
                    }
                    Drive::Async => {
                        let mut model = self.models.async_model_for(number);
                        telemetry::record_identity(&span, model.identity().as_ref());
                        driver::drive(
                            &agent,
                            conversation,
                            0,
                            &mut *model,
                            &mut toolbox,
                            &mut observer,
                        )
                        .instrument(span.clone())
                        .with_subscriber(dispatch.clone())
                        .await
                    }
                }
            }
            // Unreachable after `check_task`, but a result is never lost.
            Err(err) => refusal_outcome(task, &err.to_string()),
        };
        let (tools, warnings) = toolbox.into_parts();
        let empty_replies_continued = observer.continued();
        let usage_per_call = observer.into_usage();
        // A child delegates nothing: its total is its own usage.
        telemetry::record_outcome(&span, &outcome, &outcome.usage);
        let report = TaskReport::from_outcome(&outcome);
        let output = report.to_output();
        shared
            .children
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(ChildRecord {
                agent,
                parent_tool_use_id: parent_call.clone(),
                task: task.to_owned(),
                report,
                outcome,
                usage_per_call,
                empty_replies_continued,
                tools,
                warnings,
                elapsed: started.elapsed(),
            });
        output
    }

    /// The settings' `SubagentStart` hooks: the child's first message is
    /// its task with their context appended.
    async fn subagent_start(
        shared: &Shared,
        agent: &AgentId,
        task: &str,
        toolbox: &mut Toolbox<'_>,
        drive: Drive,
    ) -> String {
        if !shared.commands.has(HookEvent::SubagentStart) {
            return task.to_owned();
        }
        let mut warnings = Vec::new();
        let input = HookInput::subagent_start(agent, task);
        let hooks = (&shared.commands, &shared.monitor, &shared.audit);
        let outcome = run_command_hooks(hooks, agent, &input, &mut warnings, drive).await;
        toolbox.warn(warnings);
        if let Some(reason) = &outcome.stop {
            shared.guard.stop(reason.clone());
        }
        match outcome.context_text() {
            Some(context) => format!("{task}\n\n{context}"),
            None => task.to_owned(),
        }
    }

    /// The report of a child that panicked.
    fn panicked(task: &str, number: usize, id: &ToolUseId) -> ToolOutput {
        let outcome = refusal_outcome(
            task,
            &format!("the subagent for {id} (child-{number}) panicked"),
        );
        TaskReport::from_outcome(&outcome).to_output()
    }

    /// The children of a batch: for each call, the task and the number of
    /// its child, or the answer it gets without one (a refusal, the
    /// delegation limit).
    fn plan_batch<'c>(
        shared: &Shared,
        calls: &'c [ToolContext<'c>],
    ) -> Vec<Result<Planned<'c>, ToolOutput>> {
        let checked: Vec<Result<&str, ToolOutput>> = calls
            .iter()
            .map(|context| check_task(context.call.input()))
            .collect();
        let valid = checked.iter().filter(|task| task.is_ok()).count();
        let mut numbers = shared.guard.reserve_delegations(valid).into_iter();
        calls
            .iter()
            .zip(checked)
            .map(|(context, task)| {
                let task = task?;
                match numbers.next().flatten() {
                    Some(number) => Ok((task, number, context.call.id(), context.span)),
                    None => Err(Self::over_limit(shared)),
                }
            })
            .collect()
    }

    /// The task and number of a single call's child, or its answer.
    fn plan_one<'c>(shared: &Shared, input: &'c Value) -> Result<(&'c str, usize), ToolOutput> {
        let task = check_task(input)?;
        match shared
            .guard
            .reserve_delegations(1)
            .first()
            .copied()
            .flatten()
        {
            Some(number) => Ok((task, number)),
            None => Err(Self::over_limit(shared)),
        }
    }
}

fn refusal_outcome(task: &str, reason: &str) -> Outcome {
    Outcome {
        status: StatusKind::ModelError,
        text: format!("the subagent could not start: {reason}"),
        calls: 0,
        messages: vec![crate::core::protocol::Message::user_text(task)],
        usage: Default::default(),
        output: None,
        output_error: None,
    }
}

/// The trimmed task text, or the refusal the parent gets instead.
fn check_task(input: &Value) -> Result<&str, ToolOutput> {
    let task = input
        .get("task")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .trim();
    let chars = task.chars().count();
    if chars == 0 {
        return Err(refusal("invalid task: the task text is empty"));
    }
    if chars > MAX_TASK_CHARS {
        return Err(refusal(format_args!(
            "invalid task: the task text is {chars} characters; the limit is {MAX_TASK_CHARS}"
        )));
    }
    Ok(task)
}

impl Tool for TaskTool {
    fn name(&self) -> &str {
        TASK_TOOL
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "task": {
                    "type": "string",
                    "description": "The sub-question, 1 to 600 characters, self-contained",
                    "minLength": 1
                }
            },
            "required": ["task"],
            "additionalProperties": false
        })
    }

    fn capability(&self) -> Capability {
        Capability::Delegates
    }

    fn run(&self, input: &Value, context: &ToolContext<'_>) -> ToolOutput {
        let Some(shared) = self.shared.get() else {
            return Self::not_built();
        };
        match Self::plan_one(shared, input) {
            Ok((task, number)) => block_on(self.run_child(
                shared,
                number,
                task,
                context.call.id(),
                context.span,
                Drive::Blocking,
            )),
            Err(answer) => answer,
        }
    }

    /// Consecutive delegations of one reply run concurrently, one thread
    /// each (a single one on this thread; the executor batches only a run
    /// of consecutive `task` calls,
    /// after every earlier call of the reply has finished); numbers are
    /// given in call order and reports come back in call order, so the
    /// transcript is the same as a sequential run's.
    fn run_batch(&self, calls: &[ToolContext<'_>]) -> Vec<ToolOutput> {
        let Some(shared) = self.shared.get() else {
            return calls.iter().map(|_| Self::not_built()).collect();
        };
        let mut planned = Self::plan_batch(shared, calls);
        // One child runs on this thread: a run holds one thread.
        if planned.len() == 1
            && let Some(one) = planned.pop()
        {
            let answer = match one {
                Ok((task, number, id, span)) => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        block_on(self.run_child(shared, number, task, id, span, Drive::Blocking))
                    }))
                    .unwrap_or_else(|_| Self::panicked(task, number, id))
                }
                Err(answer) => answer,
            };
            return vec![answer];
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = planned
                .into_iter()
                .map(|planned| {
                    planned.map(|(task, number, id, span)| {
                        let child = scope.spawn(move || {
                            block_on(self.run_child(
                                shared,
                                number,
                                task,
                                id,
                                span,
                                Drive::Blocking,
                            ))
                        });
                        (child, task, number, id)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| match handle {
                    Ok((child, task, number, id)) => child
                        .join()
                        .unwrap_or_else(|_| Self::panicked(task, number, id)),
                    Err(answer) => answer,
                })
                .collect()
        })
    }

    /// One delegation in an async run: the child is awaited on the run's
    /// task, its model the async one ([`ChildModels::async_model_for`]).
    fn run_async<'a>(&'a self, input: &'a Value, context: &'a ToolContext<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
            let Some(shared) = self.shared.get() else {
                return Self::not_built();
            };
            match Self::plan_one(shared, input) {
                Ok((task, number)) => {
                    self.run_child(
                        shared,
                        number,
                        task,
                        context.call.id(),
                        context.span,
                        Drive::Async,
                    )
                    .await
                }
                Err(answer) => answer,
            }
        })
    }

    /// Consecutive delegations in an async run: the children run side by
    /// side on the run's own task (no thread, no spawned task), numbered
    /// and reported in call order as in a blocking run. Dropping the
    /// future drops every child, and each child's conversation finishes
    /// `cancelled`.
    fn run_batch_async<'a>(&'a self, calls: &'a [ToolContext<'a>]) -> BatchFuture<'a> {
        Box::pin(async move {
            let Some(shared) = self.shared.get() else {
                return calls.iter().map(|_| Self::not_built()).collect();
            };
            let planned = Self::plan_batch(shared, calls);
            let children: Vec<_> = planned
                .iter()
                .filter_map(|planned| planned.as_ref().ok())
                .map(|&(task, number, id, span)| {
                    CatchUnwind(Box::pin(self.run_child(
                        shared,
                        number,
                        task,
                        id,
                        span,
                        Drive::Async,
                    )))
                })
                .collect();
            let mut reports = join_all(children).await.into_iter();
            planned
                .into_iter()
                .map(|planned| match planned {
                    Ok((task, number, id, _)) => match reports.next() {
                        Some(Ok(report)) => report,
                        _ => Self::panicked(task, number, id),
                    },
                    Err(answer) => answer,
                })
                .collect()
        })
    }
}
