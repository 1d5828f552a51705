//! Command hooks: programs a settings file names, run at points of a run
//! ([`HookEvent`]) with a JSON object on stdin, whose exit code and stdout
//! decide — the format Claude Code, codex and goose share (see
//! `docs/hooks.md`).
//!
//! [`CommandHooks`] is built once from the settings ([`CommandHooks::load`])
//! and handed to the agent (`AgentBuilder::command_hooks`), which runs them
//! for the parent and every child.
//!
//! Hooks of one event run one after another, in the order written, each
//! whose matcher matches; the first that blocks, denies, fails closed or
//! says `continue: false` ends the event (the later ones do not run). A
//! hook runs as `run_main` runs a program: `sh -c` in the workspace, in its
//! own process group (killed at its timeout, default 60 s, [`CommandHooks::DEFAULT_TIMEOUT`], and when
//! subloop ends), its environment cleared to [`CommandHooks::HOOK_ENV`], its output read
//! up to [`CommandHooks::OUTPUT_CAP`]. It starts hardened: pid 1 of a PID namespace
//! of its own where the machine allows one (what it leaves behind dies with
//! it), no descriptor but its stdio, `no_new_privs`, no capability.

mod output;
mod process;
mod settings;

pub use settings::HookSettingsError;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::core::agent_id::AgentId;
use crate::core::conversation::{ToolCall, ToolOutput};
use crate::core::hook::{HookDecision, HookEvent, HookRecord};
use crate::run::process::Programs;
use settings::Config;

/// The `agent_type` of a child in a hook's input (the parent's is `parent`).
const SUBAGENT_TYPE: &str = "subagent";

/// The command hooks of a settings file, with what a run tells them: the
/// session id, the trace (`transcript_path`) and the workspace (`cwd`).
/// Cheap to clone; clones share the parsed settings.
#[derive(Clone)]
pub struct CommandHooks {
    config: Arc<Config>,
    session_id: String,
    transcript: Option<PathBuf>,
    workspace: PathBuf,
    programs: Programs,
    left_out: Vec<HookEvent>,
}

impl std::fmt::Debug for CommandHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandHooks")
            .field("events", &self.config.events.keys().collect::<Vec<_>>())
            .field("session_id", &self.session_id)
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

impl Default for CommandHooks {
    fn default() -> Self {
        Self::none()
    }
}

/// An id for a session of hooks: the process and the time it started.
fn new_session_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or_default();
    format!("subloop-{}-{nanos:x}", std::process::id())
}

impl CommandHooks {
    /// How long a hook may run when its settings give no `timeout`.
    pub const DEFAULT_TIMEOUT: std::time::Duration = settings::DEFAULT_HOOK_TIMEOUT;

    /// How many bytes of a hook's stdout, and of its stderr, are read; the
    /// rest is counted and dropped, and a hook whose output was cut counts
    /// as failed (its JSON is not whole).
    pub const OUTPUT_CAP: usize = process::HOOK_OUTPUT_CAP;

    /// The variables of subloop's environment a hook gets (when set); every
    /// other one (API keys among them) is left out. `CLAUDE_PROJECT_DIR` and
    /// `SUBLOOP_WORKSPACE` are set to the workspace.
    pub const HOOK_ENV: [&'static str; 10] = process::HOOK_ENV;

    /// No hook at all.
    pub fn none() -> Self {
        Self::with_config(Config::default())
    }

    fn with_config(config: Config) -> Self {
        Self {
            config: Arc::new(config),
            session_id: new_session_id(),
            transcript: None,
            workspace: std::env::current_dir().unwrap_or_default(),
            programs: Programs::new(),
            left_out: Vec::new(),
        }
    }

    /// The hooks of the settings `text` (JSON, Claude Code's format);
    /// `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, HookSettingsError> {
        Config::parse(text, origin).map(Self::with_config)
    }

    /// The hooks of the settings file at `path`. Only an explicit file is
    /// read: subloop never looks for settings in the workspace.
    pub fn load(path: &Path) -> Result<Self, HookSettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| HookSettingsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Every hook's command line (run by `sh -c`), in the order of the
    /// settings.
    pub fn commands(&self) -> Vec<&str> {
        self.config
            .events
            .values()
            .flat_map(|(_, groups)| groups.iter())
            .flat_map(|group| group.hooks.iter())
            .map(|hook| hook.command.as_str())
            .collect()
    }

    /// What the settings held that does not run (events subloop does not
    /// have, fields it does not support), one note each.
    pub fn notes(&self) -> &[String] {
        &self.config.notes
    }

    /// Whether any hook would run at `event`.
    pub fn has(&self, event: HookEvent) -> bool {
        !self.left_out.contains(&event)
            && self
                .config
                .events
                .get(event.as_str())
                .is_some_and(|(_, groups)| groups.iter().any(|group| !group.hooks.is_empty()))
    }

    /// Whether no hook runs at any event.
    pub fn is_empty(&self) -> bool {
        !HookEvent::ALL.into_iter().any(|event| self.has(event))
    }

    /// How many hooks the settings name, over every event.
    pub fn count(&self) -> usize {
        self.config
            .events
            .values()
            .flat_map(|(_, groups)| groups.iter().map(|group| group.hooks.len()))
            .sum()
    }

    /// The workspace: the hooks' working directory and `cwd`, and
    /// `CLAUDE_PROJECT_DIR` in their environment.
    pub fn workspace(mut self, workspace: &Path) -> Self {
        self.workspace = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_owned());
        self
    }

    /// The trace of the run, given to hooks as `transcript_path`.
    pub fn transcript(mut self, trace: Option<&Path>) -> Self {
        self.transcript = trace.map(Path::to_owned);
        self
    }

    /// The session id hooks are given (default: one made when the settings
    /// were read, shared by every clone).
    pub fn session_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = id.into();
        self
    }

    /// Keeps the process groups of running hooks in `programs` (a host's,
    /// which it kills on its way out), instead of a list of their own.
    pub fn with_programs(mut self, programs: Programs) -> Self {
        self.programs = programs;
        self
    }

    /// The same hooks without those of `events` (a replay asks the
    /// recorded question as recorded, so it leaves out `SessionStart` and
    /// `UserPromptSubmit`, whose context is already in it).
    pub fn without(mut self, events: &[HookEvent]) -> Self {
        self.left_out.extend_from_slice(events);
        self
    }

    /// The JSON object a hook reads on stdin for `input`.
    pub(crate) fn input_json(&self, input: &HookInput<'_>) -> Value {
        let mut object = Map::new();
        object.insert("session_id".into(), json!(self.session_id));
        if let Some(trace) = &self.transcript {
            object.insert("transcript_path".into(), json!(trace.display().to_string()));
        }
        object.insert("cwd".into(), json!(self.workspace.display().to_string()));
        object.insert("hook_event_name".into(), json!(input.event.as_str()));
        object.insert("agent_id".into(), json!(input.agent.to_string()));
        object.insert("agent_type".into(), json!(agent_type(input.agent)));
        if let Some(id) = input.agent.parent_tool_use_id() {
            object.insert("parent_tool_use_id".into(), json!(id));
        }
        if let Some(call) = input.call {
            object.insert("tool_name".into(), json!(call.name()));
            object.insert("tool_input".into(), call.input().clone());
            object.insert("tool_use_id".into(), json!(call.id()));
        }
        if let Some(output) = input.response {
            object.insert(
                "tool_response".into(),
                json!({"content": output.content.as_str(), "is_error": output.is_error}),
            );
        }
        if let Some(prompt) = input.prompt {
            object.insert("prompt".into(), json!(prompt));
        }
        if let Some(task) = input.task {
            object.insert("task".into(), json!(task));
        }
        if let Some((active, message)) = input.stop {
            object.insert("stop_hook_active".into(), json!(active));
            object.insert("last_assistant_message".into(), json!(message));
        }
        if let Some(source) = input.source {
            object.insert("source".into(), json!(source));
        }
        if let Some(reason) = input.reason {
            object.insert("reason".into(), json!(reason));
        }
        if let Some(trigger) = input.trigger {
            object.insert("trigger".into(), json!(trigger));
            object.insert("custom_instructions".into(), json!(""));
        }
        Value::Object(object)
    }

    /// Runs the hooks of `input`'s event whose matcher matches, in the
    /// order written, until one blocks, denies, fails closed or stops the
    /// run; returns what they decided together, with a record of each.
    /// Each hook runs on this thread (the future is complete when made),
    /// or, `off_worker`, off an async runtime's worker (on tokio's blocking
    /// pool, or a thread of its own), so a hook that waits holds no worker.
    pub(crate) async fn run(&self, input: &HookInput<'_>, off_worker: bool) -> HookOutcome {
        let mut outcome = HookOutcome::default();
        if !self.has(input.event) {
            return outcome;
        }
        let Some((_, groups)) = self.config.events.get(input.event.as_str()) else {
            return outcome;
        };
        let subject = input.subject();
        let matching = groups
            .iter()
            .filter(|group| subject.is_none_or(|subject| group.matcher.matches(subject)))
            .flat_map(|group| group.hooks.iter());
        let stdin = self.input_json(input).to_string().into_bytes();
        let env = process::environment(&self.workspace);
        for hook in matching {
            let ran = if off_worker {
                let (command, stdin, workspace) =
                    (hook.command.clone(), stdin.clone(), self.workspace.clone());
                let (env, timeout, programs) = (env.clone(), hook.timeout, self.programs.clone());
                crate::run::offload::off_worker(move || {
                    process::run(&command, stdin, &workspace, &env, timeout, &programs)
                })
                .await
            } else {
                process::run(
                    &hook.command,
                    stdin.clone(),
                    &self.workspace,
                    &env,
                    hook.timeout,
                    &self.programs,
                )
            };
            let judged = output::judge(input.event, &hook.command, hook.fail_open, &ran);
            outcome.records.push(HookRecord {
                event: input.event,
                command: hook.command.clone(),
                call_id: input.call.map(|call| call.id().clone()),
                tool: input.call.map(|call| call.name().to_owned()),
                call: input.model_call,
                exit_code: ran.exit_code,
                timed_out: ran.timed_out,
                decision: judged.decision,
                reason: judged.reason.clone(),
                duration: ran.duration,
            });
            outcome.warnings.extend(judged.warnings);
            outcome.context.extend(judged.context);
            if let Some(reason) = judged.stop {
                outcome.stop = Some(reason);
                break;
            }
            let reason = judged.reason.unwrap_or_default();
            match judged.decision {
                HookDecision::Deny | HookDecision::Block => {
                    outcome.verdict = HookVerdict::Block(reason);
                    break;
                }
                HookDecision::Failed => {
                    outcome.verdict = HookVerdict::Failed(reason);
                    break;
                }
                HookDecision::Ask if !matches!(outcome.verdict, HookVerdict::Ask(_)) => {
                    outcome.verdict = HookVerdict::Ask(reason);
                }
                HookDecision::Allow if outcome.verdict == HookVerdict::Continue => {
                    outcome.verdict = HookVerdict::Allow;
                }
                _ => {}
            }
        }
        outcome
    }
}

/// `parent`, or [`SUBAGENT_TYPE`] for a child.
fn agent_type(agent: &AgentId) -> &'static str {
    match agent {
        AgentId::Parent => "parent",
        AgentId::Child { .. } => SUBAGENT_TYPE,
    }
}

/// What a hook is told about one event. Made with the constructor of its
/// event; every input also carries the agent (`agent_id`, `agent_type`,
/// and a child's `parent_tool_use_id`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HookInput<'a> {
    event: HookEvent,
    agent: &'a AgentId,
    call: Option<&'a ToolCall>,
    response: Option<&'a ToolOutput>,
    prompt: Option<&'a str>,
    task: Option<&'a str>,
    stop: Option<(bool, &'a str)>,
    source: Option<&'a str>,
    reason: Option<&'a str>,
    model_call: Option<u32>,
    trigger: Option<&'a str>,
}

impl<'a> HookInput<'a> {
    fn new(event: HookEvent, agent: &'a AgentId) -> Self {
        Self {
            event,
            agent,
            call: None,
            response: None,
            prompt: None,
            task: None,
            stop: None,
            source: None,
            reason: None,
            model_call: None,
            trigger: None,
        }
    }

    /// `PreCompact`: `trigger` (`auto` for a compaction the run decided
    /// on, its threshold's or after an overflow; `manual` for one the host
    /// asked for) and `custom_instructions` (none: the built-in compactors
    /// take no instructions), before model request `call`.
    pub fn pre_compact(agent: &'a AgentId, call: u32, trigger: &'a str) -> Self {
        Self {
            trigger: Some(trigger),
            model_call: Some(call),
            ..Self::new(HookEvent::PreCompact, agent)
        }
    }

    /// `PreToolUse`: `tool_name`, `tool_input`, `tool_use_id`.
    pub fn pre_tool_use(agent: &'a AgentId, call: &'a ToolCall) -> Self {
        Self {
            call: Some(call),
            ..Self::new(HookEvent::PreToolUse, agent)
        }
    }

    /// `PostToolUse`: the call's fields and `tool_response` (`content`, `is_error`).
    pub fn post_tool_use(agent: &'a AgentId, call: &'a ToolCall, output: &'a ToolOutput) -> Self {
        Self {
            call: Some(call),
            response: Some(output),
            ..Self::new(HookEvent::PostToolUse, agent)
        }
    }

    /// `UserPromptSubmit`: `prompt`.
    pub fn user_prompt_submit(agent: &'a AgentId, prompt: &'a str) -> Self {
        Self {
            prompt: Some(prompt),
            ..Self::new(HookEvent::UserPromptSubmit, agent)
        }
    }

    /// `Stop` for the parent, `SubagentStop` for a child: the answer of
    /// model request `call` as `last_assistant_message`, and
    /// `stop_hook_active` (whether the agent already goes on because a
    /// stop hook blocked).
    pub fn stop(agent: &'a AgentId, call: u32, answer: &'a str, active: bool) -> Self {
        let event = match agent {
            AgentId::Parent => HookEvent::Stop,
            AgentId::Child { .. } => HookEvent::SubagentStop,
        };
        Self {
            stop: Some((active, answer)),
            model_call: Some(call),
            ..Self::new(event, agent)
        }
    }

    /// `SubagentStart`: the child about to start, and its `task`.
    pub fn subagent_start(agent: &'a AgentId, task: &'a str) -> Self {
        Self {
            task: Some(task),
            ..Self::new(HookEvent::SubagentStart, agent)
        }
    }

    /// `SessionStart`: `source`, `startup` for a new run or `resume`.
    pub fn session_start(agent: &'a AgentId, source: &'a str) -> Self {
        Self {
            source: Some(source),
            ..Self::new(HookEvent::SessionStart, agent)
        }
    }

    /// `SessionEnd`: `reason`, the run's status (`answered`, `call_limit`, …).
    pub fn session_end(agent: &'a AgentId, reason: &'a str) -> Self {
        Self {
            reason: Some(reason),
            ..Self::new(HookEvent::SessionEnd, agent)
        }
    }

    /// The event.
    pub fn event(&self) -> HookEvent {
        self.event
    }

    /// What the matcher is tested against: the tool's name, the agent
    /// type, the source or the reason; `None` (every group) for events
    /// without a matcher.
    fn subject(&self) -> Option<&str> {
        match self.event {
            HookEvent::PreToolUse | HookEvent::PostToolUse => self.call.map(ToolCall::name),
            HookEvent::SubagentStart | HookEvent::SubagentStop => Some(agent_type(self.agent)),
            HookEvent::SessionStart => self.source,
            HookEvent::SessionEnd => self.reason,
            HookEvent::PreCompact => self.trigger,
            HookEvent::UserPromptSubmit | HookEvent::Stop => None,
        }
    }
}

/// What an event's hooks decided together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum HookVerdict {
    /// No decision.
    #[default]
    Continue,
    /// `allow` (never more than the gate allowed).
    Allow,
    /// `ask`: the approver decides the call, with this reason.
    Ask(String),
    /// A denial (PreToolUse) or a block (exit 2, `decision: "block"`), with the reason.
    Block(String),
    /// A hook failed where a failure blocks (PreToolUse, not `failOpen`).
    Failed(String),
}

/// The hooks of one event, run: their verdict, their context, whether
/// the run is to stop, their warnings and a record of each.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub(crate) struct HookOutcome {
    /// What they decided.
    pub verdict: HookVerdict,
    /// Context for the model, in order.
    pub context: Vec<String>,
    /// `continue: false`: why the run stops.
    pub stop: Option<String>,
    /// Warnings for the user.
    pub warnings: Vec<String>,
    /// One record per hook that ran.
    pub records: Vec<HookRecord>,
}

impl HookOutcome {
    /// The context joined into one text, if there is any.
    pub fn context_text(&self) -> Option<String> {
        (!self.context.is_empty()).then(|| self.context.join("\n\n"))
    }
}
