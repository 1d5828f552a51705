//! The gated tool pipeline of one agent: registry → argument check →
//! permission → before hooks → tool → after hooks, with an audit entry before
//! and after every call. It is the driver's [`Executor`] for the parent and
//! for every child alike.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::core::agent_id::AgentId;
use crate::core::compaction::{CompactTrigger, Compaction};
use crate::core::conversation::{Interrupt, ToolCall, ToolOutput};
use crate::core::hook::HookEvent;
use crate::core::plan::SharedPlan;
use crate::core::protocol::{ToolDefinition, ToolUseId};
use crate::core::redact::Redactor;
use crate::policy::command_hooks::{CommandHooks, HookInput, HookOutcome, HookVerdict};
use crate::policy::hooks::{AuditEntry, AuditLog, HookCall, Hooks, Phase, Verdict};
use crate::policy::permission::{ApprovalRequest, Approver, Decision};
use crate::run::driver::{Executor, Round, RoundFuture, block_on, stopped_output};
use crate::run::join::CatchUnwind;
use crate::run::limits::RunGuard;
use crate::run::monitor::SharedMonitor;
use crate::run::monitor::{Event, Monitor};
use crate::run::telemetry::{self, Telemetry};
use crate::tools::{Capability, Registry, Tool, ToolContext, refusal};
use tracing::{Instrument, Span};

use crate::core::call::{CallDecision, ToolRecord, Warning};

/// What an agent's tool pipeline needs; shared by reference for one conversation.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) approver: &'a dyn Approver,
    pub(crate) hooks: &'a Hooks,
    pub(crate) commands: &'a CommandHooks,
    pub(crate) audit: &'a AuditLog,
    pub(crate) monitor: &'a SharedMonitor,
    pub(crate) guard: &'a RunGuard,
    pub(crate) telemetry: Telemetry,
    /// The secrets hidden from every result.
    pub(crate) redactor: &'a Redactor,
    /// When and how the conversation's history is compacted.
    pub(crate) compaction: Option<&'a Compaction>,
}

/// How a run is driven: which entry points of a tool an executor calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drive {
    /// [`Tool::run`] and [`Tool::run_batch`], on the run's thread.
    Blocking,
    /// [`Tool::run_async`] and [`Tool::run_batch_async`], awaited.
    Async,
}

/// The executor of one agent.
pub(crate) struct Toolbox<'a> {
    agent: AgentId,
    gate: Gate<'a>,
    drive: Drive,
    plan: Option<&'a SharedPlan>,
    records: Vec<ToolRecord>,
    warnings: Vec<Warning>,
    /// Answers of batched calls that ran ahead of their turn, by id.
    prepared: HashMap<ToolUseId, Answer>,
    /// The batches of the current reply, by the id of each one's first call.
    batches: HashMap<ToolUseId, Vec<ToolCall>>,
    over_limit: HashSet<ToolUseId>,
    /// The registry as refreshed at a turn boundary, when a tool source's
    /// tools changed; until then the agent's own.
    refreshed: Option<Registry>,
    /// The outputs of the round under way, in call order, so far.
    answered: Vec<ToolOutput>,
    /// Calls admitted whose tool is running, with their decision.
    running: HashMap<ToolUseId, CallDecision>,
    /// A stop hook blocked an answer of this conversation and it went on.
    stop_hook_active: bool,
}

/// The outcome of the pipeline for one call.
struct Answer {
    output: ToolOutput,
    record: ToolRecord,
    warnings: Vec<String>,
}

/// A call of a batch that passed admission: the call, its tool, the
/// decision and the warnings so far.
type AdmittedCall<'c> = (&'c ToolCall, Arc<dyn Tool>, CallDecision, Vec<String>);

enum Admission {
    Refused(ToolOutput, CallDecision),
    Admitted(Arc<dyn Tool>, CallDecision),
}

/// Why a call's arguments are not a JSON object, when its input is a JSON
/// string: a provider whose wire carries the arguments as text (Chat
/// Completions' `function.arguments`) keeps text that is not a JSON object
/// as that string, so it is sent back exactly as received; such a call is
/// refused, never run. Text that is not JSON says why it does not parse;
/// text that is JSON of another kind (`[1,2]`, `5`) says which kind it is.
fn unparsed_arguments(input: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let Value::String(text) = input else {
        return None;
    };
    let kind = match serde_json::from_str::<Value>(text) {
        Err(err) => return Some(format!("arguments are not valid JSON ({err})")),
        Ok(Value::Object(_)) => {
            return Some("arguments are a string holding a JSON object, not an object".to_owned());
        }
        Ok(Value::Array(_)) => "an array",
        Ok(Value::String(_)) => "a string",
        Ok(Value::Number(_)) => "a number",
        Ok(Value::Bool(_)) => "a boolean",
        Ok(Value::Null) => "null",
    };
    Some(format!("arguments are JSON but not an object: {kind}"))
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned())
}

/// What running command hooks needs: the hooks, and where their records
/// go (the monitors, so the trace, and the audit log).
pub(crate) type HookRun<'a> = (&'a CommandHooks, &'a SharedMonitor, &'a AuditLog);

/// Runs `agent`'s command hooks for `input` as the run is driven (in an
/// async run, off the runtime's worker): each hook's record goes to the
/// monitors and to the audit log, its warnings to `warnings`. What the
/// outcome means is the caller's to apply.
pub(crate) async fn run_command_hooks(
    (commands, monitor, audit): HookRun<'_>,
    agent: &AgentId,
    input: &HookInput<'_>,
    warnings: &mut Vec<String>,
    drive: Drive,
) -> HookOutcome {
    let outcome = commands.run(input, drive == Drive::Async).await;
    for record in &outcome.records {
        monitor.hook(agent, record);
        audit.record(AuditEntry {
            agent: agent.clone(),
            call_id: record.call_id.clone().unwrap_or_else(|| ToolUseId::new("")),
            tool: record.tool.clone().unwrap_or_default(),
            phase: Phase::Hook,
            decision: None,
            is_error: None,
            hook: Some(record.clone()),
        });
    }
    warnings.extend(outcome.warnings.iter().cloned());
    outcome
}

impl<'a> Toolbox<'a> {
    pub(crate) fn new(
        agent: AgentId,
        gate: Gate<'a>,
        plan: Option<&'a SharedPlan>,
        drive: Drive,
    ) -> Self {
        Self {
            agent,
            gate,
            drive,
            plan,
            records: Vec::new(),
            warnings: Vec::new(),
            prepared: HashMap::new(),
            batches: HashMap::new(),
            over_limit: HashSet::new(),
            refreshed: None,
            answered: Vec::new(),
            running: HashMap::new(),
            stop_hook_active: false,
        }
    }

    /// The registry in force: the refreshed one, or the agent's.
    fn registry(&self) -> &Registry {
        self.refreshed.as_ref().unwrap_or(self.gate.registry)
    }

    /// The records and warnings gathered, in call order.
    pub(crate) fn into_parts(self) -> (Vec<ToolRecord>, Vec<Warning>) {
        (self.records, self.warnings)
    }

    fn audit(&self, call: &ToolCall, phase: Phase, after: Option<(CallDecision, bool)>) {
        self.gate.audit.record(AuditEntry {
            agent: self.agent.clone(),
            call_id: call.id().clone(),
            tool: call.name().to_owned(),
            phase,
            decision: after.map(|(decision, _)| decision),
            is_error: after.map(|(_, is_error)| is_error),
            hook: None,
        });
    }

    /// [`run_command_hooks`] with this agent's gate; a hook's `continue:
    /// false` stops the run at its next boundary.
    /// In an async run the hooks run off the runtime's worker.
    async fn command_hooks(
        &self,
        input: &HookInput<'_>,
        warnings: &mut Vec<String>,
    ) -> HookOutcome {
        let outcome = self.run_hooks(input, warnings).await;
        if let Some(reason) = &outcome.stop {
            self.gate.guard.stop(reason.clone());
        }
        outcome
    }

    /// The settings' hooks for `input`, recorded: on this thread in a
    /// blocking run, off the runtime's worker in an async one.
    async fn run_hooks(&self, input: &HookInput<'_>, warnings: &mut Vec<String>) -> HookOutcome {
        let hooks = (self.gate.commands, self.gate.monitor, self.gate.audit);
        run_command_hooks(hooks, &self.agent, input, warnings, self.drive).await
    }

    /// The settings' `Stop` hooks (`SubagentStop` for a child): a block
    /// sends the agent on with its reason while the budget allows.
    async fn review(&mut self, call: u32, answer: &str, calls_left: bool) -> Option<String> {
        let input = HookInput::stop(&self.agent, call, answer, self.stop_hook_active);
        if !self.gate.commands.has(input.event()) {
            return None;
        }
        let mut warnings = Vec::new();
        // `continue: false` here only lets the agent finish, as it would.
        let outcome = self.run_hooks(&input, &mut warnings).await;
        let message = match outcome.verdict {
            HookVerdict::Block(reason) if outcome.stop.is_none() => Some(reason),
            _ => None,
        };
        let message = match message {
            Some(message) if calls_left => {
                self.stop_hook_active = true;
                Some(message)
            }
            Some(message) => {
                warnings.push(format!(
                    "a {} hook asked to go on ({message}), but no model call is left; the answer stands",
                    input.event()
                ));
                None
            }
            None => None,
        };
        self.warn(warnings);
        message
    }

    /// The settings' `PreCompact` hooks: a block (exit 2, `decision:
    /// block`) or a failure keeps the history as it is.
    async fn pre_compact(&mut self, call: u32, trigger: CompactTrigger) -> Option<String> {
        // Claude Code's triggers: the run's own decision is `auto`.
        let name = match trigger {
            CompactTrigger::Manual => "manual",
            _ => "auto",
        };
        let input = HookInput::pre_compact(&self.agent, call, name);
        if !self.gate.commands.has(input.event()) {
            return None;
        }
        let mut warnings = Vec::new();
        let outcome = self.run_hooks(&input, &mut warnings).await;
        self.warn(warnings);
        match outcome.verdict {
            HookVerdict::Block(reason) | HookVerdict::Failed(reason) => Some(reason),
            _ => outcome.stop,
        }
    }

    /// Warnings of this agent raised outside a call (a stop hook's).
    pub(crate) fn warn(&mut self, texts: Vec<String>) {
        for text in texts {
            self.gate.monitor.warning(&self.agent, &text);
            self.warnings.push(Warning {
                agent: self.agent.clone(),
                text,
            });
        }
    }

    /// Asks the approver about `call` (`why`: a hook's reason to ask, shown
    /// with the action); a denial or a panicking approver refuses it.
    async fn approve(
        &self,
        call: &ToolCall,
        tool: &dyn Tool,
        why: Option<&str>,
        warnings: &mut Vec<String>,
    ) -> Result<(), Admission> {
        let mut action = tool.action(call.input());
        if let Some(why) = why.filter(|why| !why.is_empty()) {
            action = format!("{action} (a hook asks: {why})");
        }
        let request = ApprovalRequest {
            agent: &self.agent,
            call,
            action: &action,
        };
        // An approver that panics fails closed, like a hook: denied, with a warning.
        let approver = self.gate.approver;
        let decided = match self.drive {
            Drive::Blocking => catch_unwind(AssertUnwindSafe(|| approver.decide(&request))),
            Drive::Async => {
                match catch_unwind(AssertUnwindSafe(|| approver.decide_async(&request))) {
                    Ok(future) => CatchUnwind(future).await,
                    Err(payload) => Err(payload),
                }
            }
        };
        match decided {
            Ok(Decision::Allow) => Ok(()),
            Ok(Decision::Deny) => Err(Admission::Refused(
                refusal("permission denied"),
                CallDecision::Denied,
            )),
            Err(payload) => {
                warnings.push(format!(
                    "the approver panicked deciding {}: {}",
                    call.name(),
                    panic_text(&*payload)
                ));
                Err(Admission::Refused(
                    refusal("approval failed"),
                    CallDecision::Denied,
                ))
            }
        }
    }

    /// The settings' `PreToolUse` hooks, after the gate and the in-process
    /// hooks let `call` through: a denial or a failure refuses it, `ask`
    /// asks the approver unless it already allowed this call; `allow`
    /// changes nothing (the gate has decided).
    async fn pre_tool_use(
        &self,
        call: &ToolCall,
        tool: &dyn Tool,
        decision: &mut CallDecision,
        warnings: &mut Vec<String>,
    ) -> Result<(), Admission> {
        if !self.gate.commands.has(HookEvent::PreToolUse) {
            return Ok(());
        }
        let outcome = self
            .command_hooks(&HookInput::pre_tool_use(&self.agent, call), warnings)
            .await;
        if let Some(reason) = &outcome.stop {
            return Err(Admission::Refused(
                refusal(format_args!("a PreToolUse hook stopped the run: {reason}")),
                CallDecision::Blocked,
            ));
        }
        match outcome.verdict {
            HookVerdict::Block(reason) => Err(Admission::Refused(
                refusal(format_args!("denied by a PreToolUse hook: {reason}")),
                CallDecision::Blocked,
            )),
            HookVerdict::Failed(reason) => Err(Admission::Refused(
                refusal(format_args!("a PreToolUse hook failed: {reason}")),
                CallDecision::HookFailed,
            )),
            HookVerdict::Ask(reason) if *decision != CallDecision::Allowed => {
                self.approve(call, tool, Some(&reason), warnings).await?;
                *decision = CallDecision::Allowed;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The settings' `PostToolUse` hooks after `call` ran: a block's reason
    /// and any context are appended to the result the model gets.
    async fn post_tool_use(
        &self,
        call: &ToolCall,
        output: &mut ToolOutput,
        warnings: &mut Vec<String>,
    ) {
        if !self.gate.commands.has(HookEvent::PostToolUse) {
            return;
        }
        let outcome = self
            .command_hooks(
                &HookInput::post_tool_use(&self.agent, call, output),
                warnings,
            )
            .await;
        let mut notes = Vec::new();
        if let HookVerdict::Block(reason) = &outcome.verdict {
            notes.push(format!("[PostToolUse hook: {reason}]"));
        }
        for context in &outcome.context {
            notes.push(format!("[PostToolUse hook context: {context}]"));
        }
        if !notes.is_empty() {
            output.content = format!("{}\n{}", output.content, notes.join("\n")).into();
        }
    }

    /// Registry, schema, permission and before hooks, in that order.
    async fn admit(&self, call: &ToolCall, warnings: &mut Vec<String>) -> Admission {
        self.audit(call, Phase::Before, None);
        if self.over_limit.contains(call.id()) {
            let limit = self.gate.guard.limits().max_tools_per_reply;
            return Admission::Refused(
                refusal(format_args!(
                    "too many tool calls in one reply (limit {limit})"
                )),
                CallDecision::OverLimit,
            );
        }
        let Some((tool, input_schema)) = self.registry().lookup_shared(call.name()) else {
            return Admission::Refused(
                refusal(format_args!("unregistered tool {}", call.name())),
                CallDecision::Unregistered,
            );
        };
        if let Some(reason) = unparsed_arguments(call.input()) {
            return Admission::Refused(refusal(reason), CallDecision::Invalid);
        }
        if let Err(err) = input_schema.validate(call.input()) {
            return Admission::Refused(
                refusal(format_args!("invalid input for {}: {err}", call.name())),
                CallDecision::Invalid,
            );
        }
        let mut decision = CallDecision::NotRequired;
        if tool.capability().needs_approval() {
            if let Err(refused) = self.approve(call, tool.as_ref(), None, warnings).await {
                return refused;
            }
            decision = CallDecision::Allowed;
        }
        let hook_call = HookCall {
            agent: &self.agent,
            call,
        };
        for hook in self.gate.hooks.iter() {
            let verdict = catch_unwind(AssertUnwindSafe(|| hook.before(&hook_call, warnings)));
            match verdict {
                Ok(Ok(Verdict::Continue)) => {}
                Ok(Ok(Verdict::Block(reason))) => {
                    return Admission::Refused(
                        refusal(format_args!("blocked by hook {}: {reason}", hook.name())),
                        CallDecision::Blocked,
                    );
                }
                Ok(Err(err)) => {
                    return Admission::Refused(
                        refusal(format_args!("hook {} failed: {err}", hook.name())),
                        CallDecision::HookFailed,
                    );
                }
                Err(payload) => {
                    return Admission::Refused(
                        refusal(format_args!(
                            "hook {} panicked: {}",
                            hook.name(),
                            panic_text(&*payload)
                        )),
                        CallDecision::HookFailed,
                    );
                }
            }
        }
        if let Err(refused) = self
            .pre_tool_use(call, tool.as_ref(), &mut decision, warnings)
            .await
        {
            return refused;
        }
        // Approval and hooks may take long (a `y/N` prompt waits for a
        // person): a run stopped meanwhile starts no tool.
        if let Some(interrupt) = self.gate.guard.interrupt() {
            return Admission::Refused(
                refusal(format_args!("the run was stopped ({})", interrupt.text)),
                CallDecision::Stopped,
            );
        }
        Admission::Admitted(tool, decision)
    }

    /// The secrets hidden from `output`'s content.
    fn redact(&self, output: &mut ToolOutput) {
        if let std::borrow::Cow::Owned(hidden) = self.gate.redactor.text(&output.content) {
            output.content = hidden.into();
        }
    }

    /// The in-process after hooks and the settings' `PostToolUse` hooks
    /// of a call that ran. The secrets are hidden from the result before
    /// the hooks see it, and again from what they made of it.
    async fn after_ran(
        &self,
        call: &ToolCall,
        output: &mut ToolOutput,
        warnings: &mut Vec<String>,
    ) {
        self.redact(output);
        let hook_call = HookCall {
            agent: &self.agent,
            call,
        };
        for hook in self.gate.hooks.iter() {
            let result = catch_unwind(AssertUnwindSafe(|| {
                hook.after(&hook_call, output, &mut *warnings)
            }));
            let failure = match result {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(err.to_string()),
                Err(payload) => Some(format!("panicked: {}", panic_text(&*payload))),
            };
            if let Some(failure) = failure {
                output.is_error = true;
                output.content = format!(
                    "{}\n[after hook {} failed: {failure}]",
                    output.content,
                    hook.name()
                )
                .into();
                warnings.push(format!("after hook {} failed: {failure}", hook.name()));
            }
        }
        self.post_tool_use(call, output, warnings).await;
    }

    /// The after audit entry and the record, the secrets hidden from the
    /// result (a call that ran has been through [`Toolbox::after_ran`]).
    fn conclude(
        &self,
        call: &ToolCall,
        mut output: ToolOutput,
        decision: CallDecision,
        warnings: Vec<String>,
    ) -> Answer {
        self.redact(&mut output);
        self.audit(call, Phase::After, Some((decision, output.is_error)));
        let record = ToolRecord {
            name: call.name().to_owned(),
            id: call.id().clone(),
            decision,
            is_error: output.is_error,
            content: output.content.clone(),
        };
        Answer {
            output,
            record,
            warnings,
        }
    }

    async fn run_tool(&self, tool: &dyn Tool, call: &ToolCall, span: &Span) -> ToolOutput {
        let context = ToolContext {
            agent: &self.agent,
            call,
            span,
        };
        let ran = match self.drive {
            Drive::Blocking => catch_unwind(AssertUnwindSafe(|| tool.run(call.input(), &context))),
            Drive::Async => {
                match catch_unwind(AssertUnwindSafe(|| tool.run_async(call.input(), &context))) {
                    Ok(future) => CatchUnwind(future).await,
                    Err(payload) => Err(payload),
                }
            }
        };
        ran.unwrap_or_else(|payload| {
            ToolOutput::error(format!(
                "{} failed: the tool panicked: {}",
                call.name(),
                panic_text(&*payload)
            ))
        })
    }

    async fn process(&mut self, call: &ToolCall) -> Answer {
        let span = telemetry::tool_span(call, self.gate.telemetry);
        let answer = async {
            let mut warnings = Vec::new();
            match self.admit(call, &mut warnings).await {
                Admission::Refused(output, decision) => {
                    self.conclude(call, output, decision, warnings)
                }
                Admission::Admitted(tool, decision) => {
                    self.running.insert(call.id().clone(), decision);
                    let mut output = self.run_tool(tool.as_ref(), call, &span).await;
                    self.running.remove(call.id());
                    self.after_ran(call, &mut output, &mut warnings).await;
                    self.conclude(call, output, decision, warnings)
                }
            }
        }
        .instrument(span.clone())
        .await;
        self.record_span(&span, &answer.record);
        answer
    }

    /// Records how a call ended on its `execute_tool` span.
    fn record_span(&self, span: &Span, record: &ToolRecord) {
        telemetry::record_tool(
            span,
            self.gate.telemetry,
            record.decision.as_str(),
            record.is_error,
            &record.content,
        );
    }

    /// Runs one batch: consecutive calls to one delegating tool. Admission
    /// runs in call order; the admitted calls then run together through
    /// [`Tool::run_batch`] (or [`Tool::run_batch_async`]); every answer
    /// waits in `prepared` for its turn.
    async fn run_batch(&mut self, run: &[ToolCall]) {
        let mut admitted: Vec<AdmittedCall<'_>> = Vec::new();
        let mut spans = Vec::new();
        for call in run {
            let mut warnings = Vec::new();
            let span = telemetry::tool_span(call, self.gate.telemetry);
            let admission = self
                .admit(call, &mut warnings)
                .instrument(span.clone())
                .await;
            match admission {
                Admission::Refused(output, decision) => {
                    let answer = span.in_scope(|| self.conclude(call, output, decision, warnings));
                    self.record_span(&span, &answer.record);
                    self.prepared.insert(call.id().clone(), answer);
                }
                Admission::Admitted(tool, decision) => {
                    self.running.insert(call.id().clone(), decision);
                    admitted.push((call, tool, decision, warnings));
                    spans.push(span);
                }
            }
        }
        let Some((first, tool, ..)) = admitted.first() else {
            return;
        };
        let (name, tool) = (first.name(), Arc::clone(tool));
        let contexts: Vec<ToolContext<'_>> = admitted
            .iter()
            .zip(&spans)
            .map(|((call, ..), span)| ToolContext {
                agent: &self.agent,
                call,
                span,
            })
            .collect();
        let ran = match self.drive {
            Drive::Blocking => catch_unwind(AssertUnwindSafe(|| tool.run_batch(&contexts))),
            Drive::Async => {
                match catch_unwind(AssertUnwindSafe(|| tool.run_batch_async(&contexts))) {
                    Ok(future) => CatchUnwind(future).await,
                    Err(payload) => Err(payload),
                }
            }
        };
        let outputs = ran.unwrap_or_else(|payload| {
            let text = format!(
                "{name} failed: the tool panicked: {}",
                panic_text(&*payload)
            );
            vec![ToolOutput::error(text); contexts.len()]
        });
        let mut outputs = outputs.into_iter();
        for ((call, _, decision, warnings), span) in admitted.into_iter().zip(spans) {
            let output = outputs.next().unwrap_or_else(|| {
                ToolOutput::error(format!(
                    "{name} failed: the batch returned no result for this call"
                ))
            });
            self.running.remove(call.id());
            let (mut output, mut warnings) = (output, warnings);
            self.after_ran(call, &mut output, &mut warnings)
                .instrument(span.clone())
                .await;
            let answer = span.in_scope(|| self.conclude(call, output, decision, warnings));
            self.record_span(&span, &answer.record);
            self.prepared.insert(call.id().clone(), answer);
        }
    }

    /// Answers one call of the round: from its batch (started here when
    /// the call is the batch's first), or through the pipeline.
    async fn answer(&mut self, call: &ToolCall) -> ToolOutput {
        if let Some(run) = self.batches.remove(call.id()) {
            self.run_batch(&run).await;
        }
        let answer = match self.prepared.remove(call.id()) {
            Some(answer) => answer,
            None => self.process(call).await,
        };
        self.deliver(answer)
    }

    fn deliver(&mut self, answer: Answer) -> ToolOutput {
        for text in answer.warnings {
            self.gate.monitor.warning(&self.agent, &text);
            self.warnings.push(Warning {
                agent: self.agent.clone(),
                text,
            });
        }
        self.gate.monitor.tool(&self.agent, &answer.record);
        self.records.push(answer.record);
        answer.output
    }
}

impl Executor for Toolbox<'_> {
    fn definitions(&self) -> &[ToolDefinition] {
        self.registry().definitions()
    }

    /// A tool source said its tools changed: from the next request on, the
    /// definitions sent and the dispatch table are its current list.
    fn refresh(&mut self) {
        let (fresh, mut notes) = self.registry().refreshed();
        if let Some(fresh) = &fresh {
            let before = self.registry().names().join(", ");
            let after = fresh.names().join(", ");
            if before != after {
                notes.push(format!("the tools changed: now {after}"));
            }
        }
        for text in notes {
            self.gate.monitor.warning(&self.agent, &text);
            self.warnings.push(Warning {
                agent: self.agent.clone(),
                text,
            });
        }
        if let Some(fresh) = fresh {
            self.refreshed = Some(fresh);
        }
    }

    fn attachment(&self) -> Option<String> {
        self.plan.map(SharedPlan::render)
    }

    /// One call on its own, outside a round (the driver asks for rounds).
    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        block_on(self.answer(call))
    }

    fn interrupt(&self) -> Option<Interrupt> {
        self.gate.guard.interrupt()
    }

    /// The settings' `Stop` hooks (`SubagentStop` for a child), on this thread.
    fn review_answer(&mut self, call: u32, answer: &str, calls_left: bool) -> Option<String> {
        crate::run::driver::block_on(self.review(call, answer, calls_left))
    }

    /// The settings' `Stop` hooks, off the worker in an async run.
    fn review_answer_async<'b>(
        &'b mut self,
        call: u32,
        answer: &'b str,
        calls_left: bool,
    ) -> crate::run::BoxFuture<'b, Option<String>> {
        Box::pin(self.review(call, answer, calls_left))
    }

    fn telemetry(&self) -> Telemetry {
        self.gate.telemetry
    }

    fn compaction(&self) -> Option<Compaction> {
        self.gate.compaction.cloned()
    }

    /// The settings' `PreCompact` hooks, on this thread.
    fn before_compaction(&mut self, call: u32, trigger: CompactTrigger) -> Option<String> {
        crate::run::driver::block_on(self.pre_compact(call, trigger))
    }

    /// The settings' `PreCompact` hooks, off the worker in an async run.
    fn before_compaction_async(
        &mut self,
        call: u32,
        trigger: CompactTrigger,
    ) -> crate::run::BoxFuture<'_, Option<String>> {
        Box::pin(self.pre_compact(call, trigger))
    }

    /// Plans the round (the per-reply limit, batches of consecutive
    /// delegating calls), then runs it in call order; once the run is
    /// stopped, a call that has not run is answered `not executed` (with an
    /// audit entry and a record, decision `stopped`), and a batch whose first
    /// call cannot start does not start at all. A call a started batch
    /// already ran is delivered even after the stop: a result is never lost.
    fn execute_round<'r>(
        &'r mut self,
        calls: &'r [ToolCall],
        agent: &'r AgentId,
        monitor: &'r mut dyn Monitor,
    ) -> RoundFuture<'r> {
        Box::pin(async move {
            if self.interrupt().is_none() {
                self.plan_round(calls);
            }
            self.answered.clear();
            let mut stopped = None;
            for call in calls {
                monitor.event(agent, &Event::ToolRequested { call });
                let output = match self.interrupt() {
                    Some(interrupt) if !self.prepared.contains_key(call.id()) => {
                        let output = stopped_output(&interrupt);
                        self.skip(call, &output);
                        stopped = Some(interrupt);
                        output
                    }
                    _ => self.answer(call).await,
                };
                monitor.event(
                    agent,
                    &Event::ToolFinished {
                        call,
                        output: &output,
                    },
                );
                self.answered.push(output);
            }
            Round {
                outputs: std::mem::take(&mut self.answered),
                stopped,
            }
        })
    }

    /// The round's future was dropped: the calls answered so far keep
    /// their outputs; a call a batch already ran is delivered (a result is
    /// never lost); a call whose tool was running is answered that its
    /// result is lost, and every other call `not executed`, each with its
    /// audit entries and its record.
    fn abandon_round(&mut self, calls: &[ToolCall], interrupt: &Interrupt) -> Vec<ToolOutput> {
        let mut outputs = std::mem::take(&mut self.answered);
        for call in calls.iter().skip(outputs.len()) {
            let output = if let Some(answer) = self.prepared.remove(call.id()) {
                self.deliver(answer)
            } else if let Some(decision) = self.running.remove(call.id()) {
                let output = ToolOutput::error(format!(
                    "{} was abandoned while it ran: {}; its result is lost",
                    call.name(),
                    interrupt.text
                ));
                let answer = self.conclude(call, output, decision, Vec::new());
                self.deliver(answer)
            } else {
                let output = stopped_output(interrupt);
                self.skip(call, &output);
                output
            };
            outputs.push(output);
        }
        self.batches.clear();
        self.running.clear();
        outputs
    }
}

impl Toolbox<'_> {
    /// Plans the reply: each run of two or more *consecutive* calls to one
    /// delegating tool (such as `task`) becomes a batch, started when
    /// the round reaches the run's first call, so every earlier
    /// call of the reply has finished and every later one waits for it.
    /// Everything else runs one by one, in call order.
    fn plan_round(&mut self, calls: &[ToolCall]) {
        let limit = self.gate.guard.limits().max_tools_per_reply;
        self.over_limit = calls
            .iter()
            .skip(limit)
            .map(|call| call.id().clone())
            .collect();
        self.batches.clear();
        let admitted = calls.get(..limit).unwrap_or(calls);
        for run in admitted.chunk_by(|a, b| a.name() == b.name()) {
            let [first, _, ..] = run else { continue };
            let delegates = self
                .registry()
                .get(first.name())
                .is_some_and(|tool| tool.capability() == Capability::Delegates);
            if delegates {
                self.batches.insert(first.id().clone(), run.to_vec());
            }
        }
    }

    /// Records a call the round answered without running it.
    fn skip(&mut self, call: &ToolCall, output: &ToolOutput) {
        // A batch whose first call cannot start does not start at all.
        self.batches.remove(call.id());
        self.audit(call, Phase::Before, None);
        let answer = self.conclude(call, output.clone(), CallDecision::Stopped, Vec::new());
        self.deliver(answer);
    }
}
