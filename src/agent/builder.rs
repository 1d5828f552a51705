//! An agent: a registry, a permission gate, hooks, an optional plan and
//! optional subagents, assembled once and run on one question.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use crate::agent::executor::run_command_hooks;
use crate::agent::executor::{Drive, Gate, Toolbox};
use crate::agent::output::{DEFAULT_OUTPUT_RETRIES, SchemaOutput, TypedOutput};
use crate::agent::resume_point::ResumePoint;
use crate::agent::subagent::{ChildRecord, Shared, SubagentConfig, TaskTool};
use crate::core::agent_id::AgentId;
use crate::core::call::{ToolRecord, Warning};
use crate::core::compaction::Compaction;
use crate::core::conversation::{
    AwaitingModel, Budget, Conversation, Fresh, OnEmptyReply, Outcome, OutputCheck, StatusKind,
};
use crate::core::error::{InputError, SetupError};
use crate::core::hook::HookEvent;
use crate::core::plan::SharedPlan;
use crate::core::protocol::Usage;
use crate::core::redact::Redactor;
use crate::policy::command_hooks::{CommandHooks, HookInput, HookVerdict};
use crate::policy::hooks::{AuditEntry, AuditLog, Hooks};
use crate::policy::permission::Approver;
use crate::run::driver::{self, block_on};
use crate::run::limits::{CancelHandle, Limits, RunGuard, StopSignal};
use crate::run::model::{AsyncModel, Blocking, Model};
use crate::run::monitor::{AgentMonitor, Monitor, SharedMonitor};
use crate::run::telemetry::{self, Telemetry};
use crate::tools::{ReadOnlyTool, Registry, TodoWrite, Tool};
use tracing::Instrument;

/// The default parent system prompt.
pub(crate) const PARENT_SYSTEM: &str = "You are a careful coding agent working in a workspace. Use the tools to \
read files, delegate self-contained sub-questions with `task`, keep a plan with `todo_write`, and ask to run \
the program with `run_main` only when needed. Say plainly what you did not verify.";

/// Builds an [`Agent`]. The approver is required up front: it is the one
/// gate for the parent and every child.
///
/// Parts are gathered as plain values and assembled in [`AgentBuilder::build`]:
/// what a run consults on every call is configuration that no longer changes
/// (the limits, the cancel handle, the empty-reply policy) plus counters.
pub struct AgentBuilder {
    system: String,
    registry: Registry,
    hooks: Hooks,
    plan: Option<SharedPlan>,
    approver: Arc<dyn Approver>,
    monitor: SharedMonitor,
    limits: Limits,
    cancel: CancelHandle,
    on_empty: OnEmptyReply,
    /// Where the `task` tool finds the run's services once they exist.
    task: Option<Arc<OnceLock<Shared>>>,
    /// What the parent's answer is checked against.
    output: Option<Arc<dyn OutputCheck>>,
    /// How many answers that fail the check are sent back.
    output_retries: u32,
    /// The settings' command hooks.
    commands: CommandHooks,
    /// What the run's spans may record.
    telemetry: Telemetry,
    /// The secrets hidden from every tool result.
    redactor: Redactor,
    /// When and how histories are compacted.
    compaction: Option<Compaction>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("registry", &self.registry)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// The default parent system prompt.
    pub const PARENT_SYSTEM: &'static str = PARENT_SYSTEM;

    /// A builder with no tools, no hooks, [`AgentBuilder::PARENT_SYSTEM`] and `approver` as the gate.
    pub fn new(approver: Arc<dyn Approver>) -> Self {
        Self {
            system: PARENT_SYSTEM.to_owned(),
            registry: Registry::new(),
            hooks: Hooks::none(),
            plan: None,
            approver,
            monitor: SharedMonitor::default(),
            limits: Limits::default(),
            cancel: CancelHandle::new(),
            on_empty: OnEmptyReply::Stop,
            telemetry: Telemetry::default(),
            task: None,
            output: None,
            output_retries: DEFAULT_OUTPUT_RETRIES,
            commands: CommandHooks::none(),
            redactor: Redactor::default(),
            compaction: None,
        }
    }

    /// Compacts the parent's history, and each child's within its own
    /// budget, by `compaction` ([`Compaction::auto`] is the usual choice):
    /// before a request its trigger says is due, and whenever the server
    /// refuses a request for its length. `None` (the default) never
    /// compacts: a request refused for its length finishes the
    /// conversation `context_overflow`. Each compaction is a
    /// [`Conversation::compact`] transition, told to the monitors
    /// ([`crate::run::monitor::Event::Compacted`]); the settings'
    /// `PreCompact` hooks may block it.
    pub fn compaction(mut self, compaction: Option<Compaction>) -> Self {
        self.compaction = compaction;
        self
    }

    /// Hides `redactor`'s secrets (the API key the run's model holds:
    /// `Client::redactor` of a provider) from every tool result, of the
    /// parent and of every child, before anything sees it: the after
    /// hooks, the model, the trace, the spans, the report. A provider
    /// client already hides its own secrets from the replies; this is for
    /// what the tools say (a program that prints the key). Default: nothing
    /// is hidden.
    pub fn redact(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// Asks for a structured answer: the parent's answer must be JSON that
    /// `check` accepts ([`crate::agent::output::SchemaOutput`] for a JSON
    /// schema, [`crate::agent::output::TypedOutput`] for a Rust type). The
    /// schema goes with every request (a provider with a native structured
    /// output constrains the reply with it), and every answer is checked
    /// here whatever the model: one that does not match is sent back with
    /// the reason up to [`SchemaOutput::DEFAULT_RETRIES`]
    /// times (see [`AgentBuilder::output_retries`]), then the run finishes
    /// `invalid_output`. The value is in the report ([`RunReport::output`]).
    pub fn output_check(mut self, check: Arc<dyn OutputCheck>) -> Self {
        self.output = Some(check);
        self
    }

    /// [`AgentBuilder::output_check`] with a JSON schema.
    pub fn output_schema(self, schema: Value) -> Self {
        self.output_check(SchemaOutput::shared(schema))
    }

    /// [`AgentBuilder::output_check`] with the schema of `T` (derived with
    /// `schemars`); [`RunReport::output`] gives the `T`.
    pub fn output<T: JsonSchema + DeserializeOwned + 'static>(self) -> Self {
        self.output_check(TypedOutput::<T>::shared())
    }

    /// How many answers that do not match the output schema are sent back
    /// before the run finishes `invalid_output` (default 1); it takes effect
    /// with an output check.
    pub fn output_retries(mut self, retries: u32) -> Self {
        self.output_retries = retries;
        self
    }

    /// The parent's system prompt.
    pub fn system(mut self, system: impl Into<String>) -> Self {
        self.system = system.into();
        self
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: impl Tool + 'static) -> Result<Self, SetupError> {
        self.registry.register(tool)?;
        Ok(self)
    }

    /// Adds a read-only tool (one a subagent whitelist may name).
    pub fn read_only_tool(mut self, tool: impl ReadOnlyTool + 'static) -> Result<Self, SetupError> {
        self.registry.register_read_only(tool)?;
        Ok(self)
    }

    /// Adds the tools of a source whose set can change during a run (an MCP
    /// server's): they are offered and dispatched as the source lists them
    /// at each turn boundary (a subagent's whitelist is resolved once, here).
    pub fn tool_source(
        mut self,
        source: std::sync::Arc<dyn crate::tools::ToolSource>,
    ) -> Result<Self, SetupError> {
        self.registry.register_source(source)?;
        Ok(self)
    }

    /// Adds `todo_write` and attaches the current plan to every parent request.
    pub fn plan(mut self) -> Result<Self, SetupError> {
        let plan = SharedPlan::new();
        self.registry.register(TodoWrite::new(plan.clone()))?;
        self.plan = Some(plan);
        Ok(self)
    }

    /// The run-wide limits (tool calls per reply, delegations, deadline,
    /// tokens) and the handle that cancels the run; the parent and every
    /// child share them, whatever the order of the builder calls.
    pub fn limits(mut self, limits: Limits, cancel: CancelHandle) -> Self {
        self.limits = limits;
        self.cancel = cancel;
        self
    }

    /// What an empty `end_turn` reply leads to, for the parent and every
    /// child, whatever the order of the builder calls (default:
    /// [`OnEmptyReply::Stop`], `protocol_error`).
    pub fn on_empty_reply(mut self, policy: OnEmptyReply) -> Self {
        self.on_empty = policy;
        self
    }

    /// What the run's spans may record (see [`crate::run::telemetry`]):
    /// by default no message or tool content.
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// The parent's hooks.
    pub fn hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// The command hooks of a settings file ([`CommandHooks::load`]), run
    /// for the parent and every child, whatever the order of the builder
    /// calls: `SessionStart` and `UserPromptSubmit` before the question,
    /// `PreToolUse` after the permission gate and the in-process
    /// [`Hooks`] let a call through, `PostToolUse` after its in-process
    /// after hooks, `SubagentStart` before a child's first request, `Stop`
    /// and `SubagentStop` on an answer, `SessionEnd` when the run is over
    /// (see `docs/hooks.md`).
    pub fn command_hooks(mut self, hooks: CommandHooks) -> Self {
        self.commands = hooks;
        self
    }

    /// Adds a monitor (progress printer, trace, ...); it sees the parent and every child.
    pub fn monitor(self, monitor: impl Monitor + 'static) -> Self {
        self.monitor.add(monitor);
        self
    }

    /// Adds the `task` tool. The child registry is built now, from the tools
    /// registered so far, by the config's whitelist.
    pub fn subagents(mut self, config: SubagentConfig) -> Result<Self, SetupError> {
        let services = Arc::new(OnceLock::new());
        let task = TaskTool::new(&self.registry, config, Arc::clone(&services))?;
        self.registry.register(task)?;
        self.task = Some(services);
        Ok(self)
    }

    /// The tool definitions the parent will offer.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Finishes the agent.
    pub fn build(self) -> Agent {
        let shared = Shared {
            approver: self.approver,
            audit: AuditLog::new(),
            monitor: self.monitor,
            children: Arc::new(Mutex::new(Vec::new())),
            guard: Arc::new(RunGuard::new(self.limits, self.cancel)),
            on_empty: self.on_empty,
            commands: self.commands,
            telemetry: self.telemetry,
            redactor: self.redactor,
            compaction: self.compaction,
        };
        if let Some(services) = &self.task {
            // Set once, here; a builder builds one agent.
            let _ = services.set(shared.clone());
        }
        Agent {
            system: self.system,
            registry: self.registry,
            hooks: self.hooks,
            plan: self.plan,
            shared,
            output: self.output.map(|check| (check, self.output_retries)),
            early: Vec::new(),
        }
    }
}

/// An assembled agent, run once with [`Agent::run`].
pub struct Agent {
    system: String,
    registry: Registry,
    hooks: Hooks,
    plan: Option<SharedPlan>,
    shared: Shared,
    output: Option<(Arc<dyn OutputCheck>, u32)>,
    /// Warnings raised before the run (a host's own prompt hooks).
    early: Vec<Warning>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunReport {
    /// The parent's outcome.
    pub outcome: Outcome,
    /// The token usage of each parent reply, in order.
    pub usage_per_call: Vec<Usage>,
    /// Empty parent replies answered with a request to continue
    /// ([`OnEmptyReply::Continue`]); each child's count is in its record.
    pub empty_replies_continued: u32,
    /// The parent's tool calls, in order.
    pub tools: Vec<ToolRecord>,
    /// Every child, in delegation order.
    pub children: Vec<ChildRecord>,
    /// Hook warnings of the parent.
    pub warnings: Vec<Warning>,
    /// The audit log of the whole run.
    pub audit: Vec<AuditEntry>,
    /// How long the whole run took.
    #[serde(serialize_with = "millis")]
    pub elapsed: Duration,
    /// The limits the run had.
    pub limits: Limits,
}

/// Serializes a duration as whole milliseconds.
pub(crate) fn millis<S: serde::Serializer>(
    duration: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Why a report holds no output value of the type asked for.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The run did not finish with a checked answer (it asked for none, or
    /// it finished otherwise: `invalid_output`, `call_limit`, …).
    #[error("the run holds no checked answer (it finished {0})")]
    Missing(StatusKind),
    /// The value is not a `T`.
    #[error("the answer is not of the type asked for: {0}")]
    Type(#[from] serde_json::Error),
}

impl RunReport {
    /// The parent's checked answer as a `T` (see
    /// [`AgentBuilder::output_check`]).
    pub fn output<T: DeserializeOwned>(&self) -> Result<T, OutputError> {
        let value = self
            .outcome
            .output
            .as_ref()
            .ok_or(OutputError::Missing(self.outcome.status))?;
        Ok(T::deserialize(value)?)
    }

    /// Token counts of the parent and every child together.
    pub fn total_usage(&self) -> Usage {
        let mut total = self.outcome.usage;
        for child in &self.children {
            total.add(&child.outcome.usage);
        }
        total
    }
}

impl Agent {
    /// The run's stop signal (cancelled, stopped by a hook, deadline
    /// passed, token budget spent), waited on rather than polled: for
    /// models that can abandon a request in flight, such as the live
    /// clients (give it to their model through a `StopSlot`).
    pub fn stop_signal(&self) -> StopSignal {
        StopSignal::new(Arc::clone(&self.shared.guard))
    }

    /// Runs the parent conversation on `question` with `budget` model
    /// requests, on this thread: tools run here, a batch of children runs
    /// one thread per child.
    pub fn run(
        self,
        question: &str,
        budget: Budget,
        model: &mut dyn Model,
    ) -> Result<RunReport, InputError> {
        Conversation::start(question, budget)?;
        let mut agent = self;
        let question = block_on(agent.open_session("startup", Some(question), Drive::Blocking))?;
        let conversation = agent.configure(Conversation::new(&question, budget)?);
        let mut model = Blocking(model);
        Ok(block_on(agent.drive(
            conversation,
            0,
            &mut model,
            Drive::Blocking,
        )))
    }

    /// Runs the parent conversation on `question` with `budget` model
    /// requests, awaited: the same loop as [`Agent::run`], with each tool's
    /// async entry point ([`Tool::run_async`]) and each child's async model
    /// ([`crate::run::model::ChildModels::async_model_for`]); children run
    /// side by side on this run's task. No thread is started and no runtime
    /// is named: any executor can poll it, and with a `Send` model the
    /// future is `Send` (it can be spawned on a multi-threaded runtime).
    ///
    /// Dropping the future cancels the run: the model request in flight is
    /// abandoned, a running program is killed, children are dropped, and
    /// every conversation finishes `cancelled`, so a trace written by a
    /// monitor ends with each agent's outcome. The report is then lost; the
    /// monitors have seen everything.
    pub async fn run_async<M>(
        self,
        question: &str,
        budget: Budget,
        model: &mut M,
    ) -> Result<RunReport, InputError>
    where
        M: AsyncModel + ?Sized,
    {
        Conversation::start(question, budget)?;
        let mut agent = self;
        let question = agent
            .open_session("startup", Some(question), Drive::Async)
            .await?;
        let conversation = agent.configure(Conversation::new(&question, budget)?);
        Ok(agent.drive(conversation, 0, model, Drive::Async).await)
    }

    /// Continues a run cut short, from `point` (which `record::resume` rebuilds from a trace): its
    /// rebuilt history, with the tokens and delegations it already spent
    /// counted against this run's limits and its plan restored. The
    /// conversation's call budget already counts the earlier calls.
    pub fn resume(self, point: ResumePoint, model: &mut dyn Model) -> RunReport {
        let mut agent = self;
        let (conversation, sent) = agent.restore(point);
        let _ = block_on(agent.open_session("resume", None, Drive::Blocking));
        let mut model = Blocking(model);
        block_on(agent.drive(conversation, sent, &mut model, Drive::Blocking))
    }

    /// [`Agent::resume`], awaited as [`Agent::run_async`] is.
    pub async fn resume_async<M>(self, point: ResumePoint, model: &mut M) -> RunReport
    where
        M: AsyncModel + ?Sized,
    {
        let mut agent = self;
        let (conversation, sent) = agent.restore(point);
        let _ = agent.open_session("resume", None, Drive::Async).await;
        agent.drive(conversation, sent, model, Drive::Async).await
    }

    /// Runs the parent's command hooks of `event` for `input`; warnings
    /// go to `warnings`. In an async run they run off the worker.
    async fn parent_hooks(
        &self,
        input: &HookInput<'_>,
        warnings: &mut Vec<String>,
        drive: Drive,
    ) -> crate::policy::command_hooks::HookOutcome {
        let shared = &self.shared;
        let hooks = (&shared.commands, &shared.monitor, &shared.audit);
        run_command_hooks(hooks, &AgentId::Parent, input, warnings, drive).await
    }

    /// Runs the settings' `UserPromptSubmit` hooks on `question`, a
    /// question the host asks on its own (a follow-up it rebuilds a
    /// resumed run with; [`Agent::run`] does this for its question): the
    /// question with their context appended, or the block
    /// ([`InputError::PromptBlocked`]). Their records go to the run's
    /// monitors and audit log, their warnings to the report.
    pub fn submit_prompt(&mut self, question: &str) -> Result<String, InputError> {
        let mut warnings = Vec::new();
        let asked = block_on(self.prompt_hooks(question, &mut warnings, Drive::Blocking));
        self.keep_warnings(warnings);
        asked
    }

    async fn prompt_hooks(
        &self,
        question: &str,
        warnings: &mut Vec<String>,
        drive: Drive,
    ) -> Result<String, InputError> {
        if !self.shared.commands.has(HookEvent::UserPromptSubmit) {
            return Ok(question.to_owned());
        }
        let outcome = self
            .parent_hooks(
                &HookInput::user_prompt_submit(&AgentId::Parent, question),
                warnings,
                drive,
            )
            .await;
        if let Some(reason) = outcome.stop {
            return Err(InputError::PromptBlocked(reason));
        }
        if let HookVerdict::Block(reason) = outcome.verdict {
            return Err(InputError::PromptBlocked(reason));
        }
        Ok(match outcome.context_text() {
            Some(context) => format!("{question}\n\n{context}"),
            None => question.to_owned(),
        })
    }

    /// Warnings raised before the run: told to the monitors now, and kept
    /// for the report.
    fn keep_warnings(&mut self, warnings: Vec<String>) {
        for text in warnings {
            self.shared.monitor.warning(&AgentId::Parent, &text);
            self.early.push(Warning {
                agent: AgentId::Parent,
                text,
            });
        }
    }

    /// The settings' `SessionStart` hooks (`source`: `startup` or
    /// `resume`), then for a new question its `UserPromptSubmit` hooks:
    /// the question to ask, their context appended, or the block. A
    /// resumed run's question is already asked, so context for it is
    /// left out with a warning.
    async fn open_session(
        &mut self,
        source: &str,
        question: Option<&str>,
        drive: Drive,
    ) -> Result<String, InputError> {
        let mut warnings = Vec::new();
        let mut context = Vec::new();
        if self.shared.commands.has(HookEvent::SessionStart) {
            let outcome = self
                .parent_hooks(
                    &HookInput::session_start(&AgentId::Parent, source),
                    &mut warnings,
                    drive,
                )
                .await;
            if let Some(reason) = outcome.stop {
                self.shared.guard.stop(reason);
            }
            context.extend(outcome.context);
        }
        let asked = match question {
            None => {
                if !context.is_empty() {
                    warnings.push(
                        "a SessionStart hook gave context, which is added only to a new run's question; it was left out"
                            .to_owned(),
                    );
                }
                Ok(String::new())
            }
            Some(question) => {
                self.prompt_hooks(question, &mut warnings, drive)
                    .await
                    .map(|asked| {
                        if context.is_empty() {
                            asked
                        } else {
                            format!("{asked}\n\n{}", context.join("\n\n"))
                        }
                    })
            }
        };
        self.keep_warnings(warnings);
        asked
    }

    /// The parent's configuration (system prompt, empty-reply policy,
    /// output check) set on `fresh`, which then begins.
    fn configure(&self, fresh: Conversation<Fresh>) -> Conversation<AwaitingModel> {
        let mut fresh = fresh
            .with_system(self.system.as_str())
            .on_empty_reply(self.shared.on_empty);
        if let Some((check, retries)) = &self.output {
            fresh = fresh.expect_output(Arc::clone(check), *retries);
        }
        fresh.begin()
    }

    /// Charges what the run cut short had spent and restores its plan;
    /// gives back its conversation, configured as this agent's, and how
    /// many messages are on record.
    fn restore(&self, point: ResumePoint) -> (Conversation<AwaitingModel>, usize) {
        let ResumePoint {
            conversation,
            sent,
            spent,
            plan,
            ..
        } = point;
        self.shared.guard.charge(spent.tokens, spent.delegations);
        if let (Some(shared), Some(plan)) = (&self.plan, plan) {
            shared.replace(plan);
        }
        (self.configure(conversation.reopen()), sent)
    }

    /// Drives the parent conversation to its end, the first `sent` messages
    /// already on record.
    async fn drive<M>(
        mut self,
        conversation: Conversation<AwaitingModel>,
        sent: usize,
        model: &mut M,
        drive: Drive,
    ) -> RunReport
    where
        M: AsyncModel + ?Sized,
    {
        let started = Instant::now();
        self.shared.guard.start();
        let agent = AgentId::Parent;
        let gate = Gate {
            registry: &self.registry,
            approver: self.shared.approver.as_ref(),
            hooks: &self.hooks,
            commands: &self.shared.commands,
            audit: &self.shared.audit,
            monitor: &self.shared.monitor,
            guard: &self.shared.guard,
            telemetry: self.shared.telemetry,
            redactor: &self.shared.redactor,
            compaction: self.shared.compaction.as_ref(),
        };
        // The run's root span: a child of the caller's current span, if any.
        let span = telemetry::agent_span(&agent);
        telemetry::record_identity(&span, model.identity().as_ref());
        telemetry::record_budget(&span, conversation.budget().get());
        let mut toolbox = Toolbox::new(agent.clone(), gate, self.plan.as_ref(), drive);
        let mut observer = AgentMonitor::new(&self.shared.monitor, &self.shared.guard);
        let outcome = driver::drive(
            &agent,
            conversation,
            sent,
            model,
            &mut toolbox,
            &mut observer,
        )
        .instrument(span.clone())
        .await;
        let (tools, mut warnings) = toolbox.into_parts();
        warnings.splice(0..0, std::mem::take(&mut self.early));
        if self.shared.commands.has(HookEvent::SessionEnd) {
            let mut texts = Vec::new();
            self.parent_hooks(
                &HookInput::session_end(&agent, outcome.status.as_str()),
                &mut texts,
                drive,
            )
            .await;
            for text in texts {
                self.shared.monitor.warning(&agent, &text);
                warnings.push(Warning {
                    agent: agent.clone(),
                    text,
                });
            }
        }
        let empty_replies_continued = observer.continued();
        let usage_per_call = observer.into_usage();
        let mut children = std::mem::take(
            &mut *self
                .shared
                .children
                .lock()
                .unwrap_or_else(|poison| poison.into_inner()),
        );
        children.sort_by_key(|child| match child.agent {
            AgentId::Child { number, .. } => number,
            AgentId::Parent => 0,
        });
        let mut total = outcome.usage;
        for child in &children {
            total.add(&child.outcome.usage);
        }
        telemetry::record_outcome(&span, &outcome, &total);
        RunReport {
            elapsed: started.elapsed(),
            limits: self.shared.guard.limits(),
            outcome,
            usage_per_call,
            empty_replies_continued,
            tools,
            children,
            warnings,
            // The run is over (children included): the log is handed over, not copied.
            audit: self.shared.audit.take(),
        }
    }
}
