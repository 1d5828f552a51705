//! A run configured the way the CLI configures one: [`Settings`] (workspace,
//! policy, limits, trace, resume) and [`Models`] turn into an [`Agent`] that
//! runs and hands back its report ([`prepare`], [`execute`]); [`replay`]
//! re-runs a trace and compares; [`chat`] is a session of questions. The
//! binary only parses flags, wires signals and prints.
//!
//! May import: every layer below ([`subloop::record`] and down).
pub mod chat;
pub mod compact;
pub mod progress;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::host::progress::StderrProgress;
use subloop::agent::ResumePoint;
use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::agent::{Agent, AgentBuilder, RunReport};
use subloop::core::agent_id::AgentId;
use subloop::core::call::Warning;
use subloop::core::conversation::{Budget, OnEmptyReply};
use subloop::core::error::{InputError, ScriptError, SetupError};
use subloop::core::hook::HookEvent;
use subloop::core::redact::Redactor;
use subloop::policy::command_hooks::{CommandHooks, HookSettingsError};
use subloop::policy::hooks::Hooks;
use subloop::policy::permission::{AllowAll, Approver, AskTerminal, DenyAll};
use subloop::policy::terminal::TerminalInput;

/// Told when an approval prompt opens (with its tool) and closes (`None`).
type PromptWatch = Arc<dyn Fn(Option<&str>) + Send + Sync>;
use subloop::providers::demo::DemoChildren;
use subloop::providers::demo::DemoParent;
use subloop::providers::scripted::ScriptedChildren;
use subloop::providers::scripted::{Script, ScriptedModel};
use subloop::record::invariants::Policy;
use subloop::record::recorded::{RecordedRun, ReplayError};
use subloop::record::replay::Replay;
use subloop::record::replay::ReplayReport;
use subloop::record::resume::{ResumeError, ResumeFile};
use subloop::record::target::{self, TraceTargetError};
use subloop::record::trace::{TraceStatus, TraceWriter};
use subloop::record::view_html::{PageOutput, PageTrace};
use subloop::run::limits::{CancelHandle, Limits};
use subloop::run::model::ChildModels;
use subloop::run::model::Model;
use subloop::run::monitor::Event;
use subloop::run::monitor::Monitor;
use subloop::run::shutdown::{Registration, Shutdown};
use subloop::tools::sandbox::SandboxPolicy;
use subloop::tools::{ReadFile, RunMain, RunSettings};

mod protect;
pub use protect::PlantableHook;

/// The built-in demo workspace files, for runs outside the repository.
pub const DEMO_FILES: [(&str, &str); 2] = [
    ("main.py", include_str!("../../examples/workspace/main.py")),
    (
        "expected.txt",
        include_str!("../../examples/workspace/expected.txt"),
    ),
];

/// The question `subloop run` asks when none is given.
pub const DEFAULT_QUESTION: &str = "Check main.py against expected.txt.";

/// How calls that need approval are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionMode {
    /// Allow every call.
    Allow,
    /// Deny every call.
    Deny,
    /// Ask on the terminal; a non-terminal stdin denies.
    Ask,
}

impl DecisionMode {
    /// Parses `allow`, `deny` or `ask`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "allow" => Some(Self::Allow),
            "deny" => Some(Self::Deny),
            "ask" => Some(Self::Ask),
            _ => None,
        }
    }

    fn approver(
        self,
        input: &Arc<TerminalInput>,
        cancel: &CancelHandle,
        watch: Option<&PromptWatch>,
    ) -> Arc<dyn Approver> {
        match self {
            Self::Allow => Arc::new(AllowAll),
            Self::Deny => Arc::new(DenyAll),
            Self::Ask => Arc::new(
                AskTerminal::with_input(Arc::clone(input), cancel.clone())
                    .watched(watch.cloned())
                    .how_to_allow("use --decision allow to allow"),
            ),
        }
    }
}

/// Everything a run is configured by.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The workspace directory.
    pub workspace: PathBuf,
    /// The question for the parent.
    pub question: String,
    /// The parent's call budget.
    pub max_calls: u32,
    /// How `run_main` calls are decided.
    pub decision: DecisionMode,
    /// `read_file`'s limit in bytes.
    pub read_limit: usize,
    /// How `run_main` runs.
    pub run: RunSettings,
    /// The sandbox `run_main` starts programs in (`--sandbox`, `--sandbox-env`).
    pub sandbox: SandboxPolicy,
    /// The child's call budget.
    pub child_budget: u32,
    /// Where to write the JSON Lines trace, if anywhere (never the script,
    /// never inside the workspace, never a FIFO: see [`subloop::record::target`]).
    pub trace: Option<PathBuf>,
    /// The script file the run replays, if any: the trace may not overwrite it.
    pub script: Option<PathBuf>,
    /// Whether to print progress lines on stderr.
    pub progress: bool,
    /// Run-wide limits: tool calls per reply, delegations, deadline, tokens.
    pub limits: Limits,
    /// Cancels the run from another thread (the CLI wires Ctrl-C to it).
    pub cancel: CancelHandle,
    /// The workspace is a temporary copy made for this run: removed afterwards.
    pub temporary_workspace: bool,
    /// What an empty `end_turn` reply leads to (`--on-empty-reply`).
    pub on_empty_reply: OnEmptyReply,
    /// The JSON schema the parent's answer must match (`--output-schema`).
    pub output_schema: Option<serde_json::Value>,
    /// How many answers that do not match it are sent back (`--output-retries`).
    pub output_retries: u32,
    /// A trace to resume (`--resume`): the run continues where it ends, and
    /// its lines are appended to it (see [`subloop::record::resume`]).
    pub resume: Option<PathBuf>,
    /// With `resume`: a follow-up question for the answered run it records
    /// (`--resume TRACE --question TEXT`), with `max_calls` of its own.
    pub follow_up: Option<String>,
    /// Where to write the run's HTML page when it ends (`--view`; checked
    /// like the trace file). Without a trace the run writes a temporary one.
    pub view: Option<PathBuf>,
    /// MCP servers whose tools join the run (`--mcp-config`, `--mcp`).
    pub mcp: Vec<subloop::tools::mcp::config::ServerConfig>,
    /// An MCP server's start timeout, also each MCP call's (`--mcp-timeout`).
    pub mcp_timeout: Duration,
    /// The tools a child may hold (`--child-tools`): read-only ones only.
    pub child_tools: Vec<String>,
    /// Where the approval prompt reads its answers: standard input, shared
    /// with whatever else of the host reads it (`subloop chat`'s lines).
    pub input: Arc<TerminalInput>,
    /// With `resume`: go on even though the trace records another
    /// workspace than `workspace` (`--other-workspace`).
    pub other_workspace: bool,
    /// What runs when the host's process is ended by a signal (the trace's
    /// last lines, removing temporary files); `None`: nothing registers.
    pub shutdown: Option<Arc<Shutdown>>,
    /// Sees every event of every agent, besides the trace and progress.
    pub watch: Option<EventWatch>,
    /// Where `run_main` keeps the process groups it runs (a host's, which
    /// it can kill on its way out).
    pub programs: subloop::tools::Programs,
    /// Told when an approval prompt opens and closes (`--decision ask`).
    pub prompt_watch: Option<ApprovalWatch>,
    /// Files the host read its configuration from (`--settings`,
    /// `--mcp-config`): inside the workspace, a program `run_main` starts
    /// may not write them.
    pub config_files: Vec<PathBuf>,
    /// The command hooks of the settings file (`--settings`); none by
    /// default. Each run gives them its workspace, its trace and the
    /// host's [`Settings::programs`].
    pub hooks: CommandHooks,
    /// What the run's spans may record (message content or not).
    pub telemetry: subloop::run::telemetry::Telemetry,
    /// How histories are compacted (`--compact`); `None`: not given, the
    /// default (`auto`), or for a replay the recorded run's.
    pub compact: Option<compact::CompactPolicy>,
    /// The model's context window in tokens (`--context-window`), if known:
    /// compaction starts before a request past 80% of it.
    pub context_window: Option<u64>,
}

/// A host's callback, shared (its `Debug` shows only that it is there).
pub struct Watch<F: ?Sized>(pub Arc<F>);

impl<F: ?Sized> Clone for Watch<F> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<F: ?Sized> std::fmt::Debug for Watch<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch(..)")
    }
}

/// Told when an approval prompt opens (with its tool) and closes (see
/// [`Settings::prompt_watch`]).
pub type ApprovalWatch = Watch<dyn Fn(Option<&str>) + Send + Sync>;

/// A host's watcher of a run's events (see [`Settings::watch`]).
pub type EventWatch = Watch<dyn Fn(&AgentId, &Event<'_>) + Send + Sync>;

/// A [`Monitor`] that hands each event to an [`EventWatch`].
struct WatchMonitor(EventWatch);

impl Monitor for WatchMonitor {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        (self.0.0)(agent, event);
    }
}

impl Settings {
    /// Defaults for `workspace`: ask, 8 parent calls, 4 child calls, 64 KiB reads.
    pub fn new(workspace: PathBuf) -> Self {
        Self {
            workspace,
            question: DEFAULT_QUESTION.to_owned(),
            max_calls: 8,
            decision: DecisionMode::Ask,
            read_limit: ReadFile::DEFAULT_LIMIT,
            run: RunSettings::default(),
            sandbox: SandboxPolicy::default(),
            child_budget: ChildBudget::DEFAULT,
            trace: None,
            script: None,
            progress: true,
            limits: Limits::default(),
            cancel: CancelHandle::new(),
            temporary_workspace: false,
            on_empty_reply: OnEmptyReply::Stop,
            output_schema: None,
            output_retries: subloop::agent::output::SchemaOutput::DEFAULT_RETRIES,
            resume: None,
            follow_up: None,
            view: None,
            mcp: Vec::new(),
            mcp_timeout: DEFAULT_MCP_TIMEOUT,
            child_tools: vec!["read_file".to_owned()],
            input: TerminalInput::stdin(),
            other_workspace: false,
            shutdown: None,
            watch: None,
            programs: subloop::tools::Programs::new(),
            prompt_watch: None,
            config_files: Vec::new(),
            hooks: CommandHooks::none(),
            telemetry: subloop::run::telemetry::Telemetry::default(),
            compact: None,
            context_window: None,
        }
    }

    /// The compaction policy in force: the one given, else `auto`.
    pub fn compact_policy(&self) -> compact::CompactPolicy {
        self.compact.unwrap_or(compact::CompactPolicy::Auto)
    }
}

/// Where the models come from.
#[derive(Debug, Clone)]
pub enum Models {
    /// Replay a script.
    Script(Script),
    /// The built-in demo models.
    Demo,
    /// The Anthropic Messages API, one shared client for the parent and every child.
    #[cfg(feature = "live")]
    Live(Arc<subloop::providers::anthropic::Client>),
    /// An OpenAI-compatible Chat Completions server, one shared client.
    #[cfg(feature = "live")]
    OpenAi(Arc<subloop::providers::openai::Client>),
}

impl Models {
    /// The secrets the models hold (a live client's API key, its base
    /// URL's password): the run hides them from every tool result and from
    /// every trace line, as the client hides them from its replies.
    pub fn redactor(&self) -> Redactor {
        match self {
            Self::Script(_) | Self::Demo => Redactor::default(),
            #[cfg(feature = "live")]
            Self::Live(client) => client.redactor(),
            #[cfg(feature = "live")]
            Self::OpenAi(client) => client.redactor(),
        }
    }
}

/// Why a run could not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AppError {
    /// The agent could not be assembled.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The script could not be loaded.
    #[error(transparent)]
    Script(#[from] ScriptError),
    /// The trace to replay could not be read or is not a usable trace.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The question or budget is unusable.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The trace file was refused or could not be created.
    #[error(transparent)]
    Trace(#[from] TraceTargetError),
    /// The trace to resume cannot be continued.
    #[error("cannot resume {path}: {error}{}", resume_flags(error))]
    Resume {
        /// The trace.
        path: PathBuf,
        /// Why.
        error: ResumeError,
    },
    /// The `--view` page cannot be drawn from the run's trace.
    #[error("{0}")]
    View(String),
    /// An MCP server could not be started (or this build has no MCP client).
    #[error("{0}")]
    Mcp(String),
    /// The settings file's hooks cannot be used.
    #[error(transparent)]
    Hooks(#[from] HookSettingsError),
    /// A hook or MCP server would run code a confined program can plant.
    #[error(transparent)]
    Plantable(#[from] PlantableHook),
    /// The demo workspace could not be created.
    #[error("cannot create a demo workspace in {path}: {source}")]
    DemoWorkspace {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The flags that do what a resume refusal asks for, as the CLI names them.
fn resume_flags(error: &ResumeError) -> String {
    match error {
        ResumeError::OtherWorkspace { recorded, .. } => {
            format!(" (--workspace {recorded}, or --other-workspace)")
        }
        ResumeError::BudgetSpent { made } => format!(" (--max-calls above {made})"),
        _ => String::new(),
    }
}

/// The default `--mcp-timeout`.
pub const DEFAULT_MCP_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds the full agent: `read_file`, `run_main`, the MCP servers' tools,
/// `todo_write` and `task` (children get the `child_tools`), with the
/// settings' gate.
#[allow(dead_code)] // the tests and benches that include this module call it
pub fn build_agent(settings: &Settings, children: Arc<dyn ChildModels>) -> Result<Agent, AppError> {
    let approver = settings.decision.approver(
        &settings.input,
        &settings.cancel,
        settings.prompt_watch.as_ref().map(|watch| &watch.0),
    );
    assemble(
        settings,
        approver,
        children,
        None,
        settings.trace.as_deref(),
        Redactor::default(),
    )
    .map(|(agent, _, _)| agent)
}

/// The agent, and the status of its trace if it writes one.
fn assemble(
    settings: &Settings,
    approver: Arc<dyn Approver>,
    children: Arc<dyn ChildModels>,
    resume: Option<(&Resuming, &ResumePoint)>,
    trace: Option<&Path>,
    redactor: Redactor,
) -> Result<(Agent, Option<TraceStatus>, McpSetup), AppError> {
    let child_budget = ChildBudget::new(settings.child_budget)?;
    protect::refuse_plantable(settings)?;
    let hooks = settings
        .hooks
        .clone()
        .workspace(&settings.workspace)
        .transcript(trace.or(settings.resume.as_deref()))
        .with_programs(settings.programs.clone());
    let mut builder = AgentBuilder::new(approver)
        .command_hooks(hooks)
        .limits(settings.limits, settings.cancel.clone())
        .on_empty_reply(settings.on_empty_reply)
        .telemetry(settings.telemetry)
        .output_retries(settings.output_retries)
        .compaction(
            settings
                .compact_policy()
                .compaction(settings.context_window),
        )
        .redact(redactor.clone());
    if let Some(schema) = &settings.output_schema {
        builder = builder.output_schema(schema.clone());
    }
    let builder = builder
        .read_only_tool(ReadFile::new(&settings.workspace, settings.read_limit)?)?
        .tool(run_main(settings)?)?;
    let (builder, mcp) = mcp_tools(settings, builder)?;
    let whitelist: Vec<&str> = settings.child_tools.iter().map(String::as_str).collect();
    let mut builder = builder.plan()?.subagents(
        SubagentConfig::new(children, Hooks::none())
            .budget(child_budget)
            .whitelist(&whitelist),
    )?;
    if settings.progress {
        builder = builder.monitor(StderrProgress);
    }
    // The host's own watcher of events (the CLI's Ctrl-C line names the
    // tool the run waits for).
    if let Some(watch) = &settings.watch {
        builder = builder.monitor(WatchMonitor(watch.clone()));
    }
    let mut status = None;
    let protected = script_of(settings);
    if let Some((resuming, point)) = resume {
        let file = resuming.append().map_err(|source| {
            AppError::from(TraceTargetError::Io {
                path: settings.resume.clone().unwrap_or_default(),
                what: target::FileRole::Trace,
                source,
            })
        })?;
        let mut fields = point.trace_fields();
        if let Some(object) = fields.as_object_mut() {
            if let Some(workspace) = recorded_workspace(settings) {
                object.insert("workspace".into(), serde_json::json!(workspace));
            }
            object.insert(
                "sandbox".into(),
                serde_json::json!(settings.sandbox.level()),
            );
        }
        let mut writer = TraceWriter::resume(file, fields)
            .redacting(redactor)
            .with_sandbox(settings.sandbox.level());
        if let Some(shutdown) = &settings.shutdown {
            writer = writer.on_shutdown(shutdown);
        }
        mcp.record(&writer.status());
        status = Some(writer.status());
        builder = builder.monitor(writer);
    } else if let Some(path) = trace {
        let mut writer =
            TraceWriter::open(path, &settings.workspace, &protected)?.redacting(redactor);
        if let Some(workspace) = recorded_workspace(settings) {
            writer = writer.with_workspace(Path::new(&workspace));
        }
        writer = writer
            .with_sandbox(settings.sandbox.level())
            .with_compaction(settings.compact_policy().as_str(), settings.context_window);
        if let Some(shutdown) = &settings.shutdown {
            writer = writer.on_shutdown(shutdown);
        }
        mcp.record(&writer.status());
        status = Some(writer.status());
        builder = builder.monitor(writer);
    }
    Ok((builder.build(), status, mcp))
}

/// `run_main` as the settings configure it: its command, sandbox, the
/// host's process groups and shutdown.
fn run_main(settings: &Settings) -> Result<RunMain, AppError> {
    let mut tool = RunMain::new(&settings.workspace, settings.run.clone())?
        .with_programs(settings.programs.clone())
        .with_sandbox(protect::policy(settings));
    if let Some(shutdown) = &settings.shutdown {
        tool = tool.with_shutdown(Arc::clone(shutdown));
    }
    Ok(tool)
}

/// The workspace a trace records: its canonical path, unless it is a
/// temporary copy (which is gone once the run ends).
fn recorded_workspace(settings: &Settings) -> Option<String> {
    if settings.temporary_workspace {
        return None;
    }
    let path =
        std::fs::canonicalize(&settings.workspace).unwrap_or_else(|_| settings.workspace.clone());
    Some(path.to_string_lossy().into_owned())
}

/// Refuses to go on with a run recorded in another workspace than the one
/// given, unless the host says it is meant (`--other-workspace`).
fn same_workspace(settings: &Settings, run: &RecordedRun) -> Result<(), ResumeError> {
    let (Some(recorded), Some(given)) = (run.workspace(), recorded_workspace(settings)) else {
        return Ok(());
    };
    if recorded == given || settings.other_workspace {
        return Ok(());
    }
    Err(ResumeError::OtherWorkspace {
        recorded: recorded.to_owned(),
        given,
    })
}

/// The file a run reads that nothing it writes may be: the script, if any.
fn script_of(settings: &Settings) -> Vec<(&Path, &'static str)> {
    settings
        .script
        .iter()
        .map(|script| (script.as_path(), "script"))
        .collect()
}

/// Starts the settings' MCP servers (all at once) and registers their tools.
#[cfg(feature = "mcp")]
fn mcp_tools(
    settings: &Settings,
    mut builder: AgentBuilder,
) -> Result<(AgentBuilder, McpSetup), AppError> {
    use subloop::tools::mcp::server::ExitNotice;
    use subloop::tools::mcp::tool::{McpSettings, McpTools};
    if settings.mcp.is_empty() {
        return Ok((builder, McpSetup::default()));
    }
    let notice = ExitNotice::default();
    let tools = McpTools::start(&settings.mcp, &{
        let mut mcp = McpSettings::new(settings.read_limit, settings.mcp_timeout);
        mcp.cancel = settings.cancel.clone();
        mcp.exit_notice = notice.clone();
        mcp
    })
    .map_err(|err| AppError::Mcp(err.to_string()))?;
    let mut lines: Vec<String> = tools
        .warnings
        .iter()
        .map(|warning| format!("[mcp] {}", subloop::core::text::printable(warning)))
        .collect();
    for (server, names) in &tools.servers {
        lines.push(format!(
            "[mcp] server {server}: {} tool(s): {}",
            names.len(),
            subloop::core::text::printable(&names.join(", "))
        ));
    }
    for source in tools.sources {
        builder = builder.tool_source(source)?;
    }
    Ok((
        builder,
        McpSetup {
            lines,
            servers: tools.servers,
            notice: Some(notice),
        },
    ))
}

/// What starting the MCP servers leaves for the run: the progress lines,
/// the servers with their registered tools, and where a mid-run exit is told.
#[derive(Debug, Default)]
struct McpSetup {
    lines: Vec<String>,
    servers: Vec<(String, Vec<String>)>,
    #[cfg(feature = "mcp")]
    notice: Option<subloop::tools::mcp::server::ExitNotice>,
}

impl McpSetup {
    /// Records the servers in the trace (`notes`): a `started` line each
    /// now, an `exited` line when one exits mid-run.
    fn record(&self, notes: &TraceStatus) {
        for (server, tools) in &self.servers {
            notes.line(
                "mcp_server",
                serde_json::json!({"server": server, "event": "started", "tools": tools}),
            );
        }
        #[cfg(feature = "mcp")]
        if let Some(notice) = &self.notice {
            let notes = notes.clone();
            notice.set(move |server, how| {
                notes.line(
                    "mcp_server",
                    serde_json::json!({"server": server, "event": "exited", "how": how}),
                );
            });
        }
    }
}

/// Without the `mcp` feature a run given servers is refused.
#[cfg(not(feature = "mcp"))]
fn mcp_tools(
    settings: &Settings,
    builder: AgentBuilder,
) -> Result<(AgentBuilder, McpSetup), AppError> {
    if settings.mcp.is_empty() {
        Ok((builder, McpSetup::default()))
    } else {
        Err(AppError::Mcp(
            "this subloop was built without the `mcp` feature; rebuild with default features to use MCP servers".to_owned(),
        ))
    }
}

/// A finished CLI run: the report, and whether its record is complete.
#[derive(Debug)]
pub struct Run {
    /// What the run produced; a failed trace write is one of its `warnings`.
    pub report: RunReport,
    /// The first trace write error, if writing the trace failed.
    pub trace_error: Option<String>,
    /// Why the `--view` page could not be written, if it could not.
    pub page_error: Option<String>,
    /// The MCP servers of the run with their registered tools (in `--json`).
    pub mcp_servers: Vec<(String, Vec<String>)>,
}

impl Run {
    /// Whether the run succeeded as the CLI counts it: the status is
    /// `answered` and the trace and the page (if any) were written whole.
    pub fn succeeded(&self) -> bool {
        self.report.outcome.status == subloop::StatusKind::Answered
            && self.trace_error.is_none()
            && self.page_error.is_none()
    }
}

/// Runs the parent on `models` and returns the report: [`prepare`], then [`Prepared::run`].
#[allow(dead_code)] // the tests and benches that include this module call it
pub fn execute(settings: &Settings, models: Models) -> Result<RunReport, AppError> {
    prepare(settings, models)?.run().map(|run| run.report)
}

/// A run assembled and checked but not started: every error that refuses
/// a run (workspace, tools, trace file, budget, question) comes from
/// [`prepare`], so a host can print progress only once the run will go ahead.
pub struct Prepared {
    agent: Agent,
    parent: Box<dyn Model>,
    budget: Budget,
    question: String,
    trace: Option<TraceStatus>,
    trace_path: Option<PathBuf>,
    resume: Option<ResumePoint>,
    page: Option<PageOutput>,
    mcp_lines: Vec<String>,
    mcp_servers: Vec<(String, Vec<String>)>,
    // A temporary workspace is removed afterwards, whatever happens.
    _cleanup: TemporaryWorkspace,
    /// The host's shutdown list: once it runs, the page is not written.
    shutdown: Option<Arc<Shutdown>>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("agent", &self.agent)
            .field("budget", &self.budget)
            .field("question", &self.question)
            .finish_non_exhaustive()
    }
}

/// Builds the agent and the models for a run on `settings`, checking
/// everything a run needs before anything runs.
pub fn prepare(settings: &Settings, models: Models) -> Result<Prepared, AppError> {
    let cleanup = TemporaryWorkspace::for_settings(settings);
    let budget = Budget::new(settings.max_calls)?;
    if settings.question.trim().is_empty() {
        return Err(InputError::EmptyQuestion.into());
    }
    // A resumed run is rebuilt (and checked) before anything else happens.
    let mut resuming = match &settings.resume {
        Some(path) => {
            let resuming = Resuming::load(path, settings)?;
            same_workspace(settings, &resuming.run).map_err(|error| AppError::Resume {
                path: path.clone(),
                error,
            })?;
            let point = match &settings.follow_up {
                Some(question) => {
                    ResumePoint::follow_up(&resuming.run, question, budget, settings.on_empty_reply)
                }
                None => ResumePoint::rebuild(&resuming.run, budget, settings.on_empty_reply),
            }
            .map_err(|error| AppError::Resume {
                path: path.clone(),
                error,
            })?;
            Some((resuming, point))
        }
        None => None,
    };
    // The page is checked (and its temporary trace made) before anything
    // is opened or started: a refused page leaves every file as it was.
    let page = match &settings.view {
        Some(path) => {
            let page_trace = PageTrace::for_run(
                settings.trace.as_deref().or(settings.resume.as_deref()),
                settings.shutdown.as_ref(),
            )
            .map_err(|error| AppError::View(format!("{error} (--trace)")))?;
            let mut protected = script_of(settings);
            if let Some(resumed) = &settings.resume {
                protected.push((resumed.as_path(), "trace file"));
            }
            let policy = Policy {
                parent_calls: Some(settings.max_calls),
                child_calls: Some(settings.child_budget),
                ..Policy::default()
            };
            Some(PageOutput::open(
                path,
                &settings.workspace,
                &protected,
                page_trace,
                policy,
            )?)
        }
        None => None,
    };
    let trace_path: Option<PathBuf> = match (&settings.resume, &page) {
        (Some(_), _) => None,
        (None, Some(page)) => Some(page.trace_path().to_owned()),
        (None, None) => settings.trace.clone(),
    };
    // Children of a resumed run are numbered after the earlier ones; a
    // script's `children` are the resumed part's, from its first.
    let earlier = resuming
        .as_ref()
        .map_or(0, |(_, point)| point.spent_delegations());
    // A request in flight gives up as soon as this run is stopped.
    #[cfg(feature = "live")]
    let stop_slot: subloop::providers::http::StopSlot = Arc::default();
    // The secrets the models hold are hidden from every tool result and trace line.
    let redactor = models.redactor();
    let (parent, children): (Box<dyn Model>, Arc<dyn ChildModels>) = match models {
        Models::Script(script) => {
            // Only the trace writes the replies as written: without one, no
            // reply is parsed a second time per request.
            let raw = trace_path.is_some() || settings.resume.is_some();
            let Script { parent, children } = script;
            let child_models = move |number: usize| -> Box<dyn Model + Send> {
                let number = number.saturating_sub(earlier);
                match number.checked_sub(1).and_then(|index| children.get(index)) {
                    Some(replies) => Box::new(ScriptedModel::from_script(replies.clone(), raw)),
                    // No such child: the failure scripted children give.
                    None => ScriptedChildren::default().model_for(number),
                }
            };
            (
                Box::new(ScriptedModel::from_script(parent, raw)),
                Arc::new(child_models),
            )
        }
        Models::Demo => (Box::new(DemoParent), Arc::new(DemoChildren)),
        #[cfg(feature = "live")]
        Models::OpenAi(client) => {
            use subloop::providers::openai::OpenAiModel;
            let children = Arc::clone(&client);
            let child_slot = Arc::clone(&stop_slot);
            let child_models = move |_number: usize| -> Box<dyn Model + Send> {
                // Children of one batch stream at once: their text is
                // shown by whole lines, so lines never tear.
                Box::new(
                    OpenAiModel::with_stop(Arc::clone(&children), Arc::clone(&child_slot))
                        .with_whole_lines(),
                )
            };
            (
                Box::new(OpenAiModel::with_stop(client, Arc::clone(&stop_slot))),
                Arc::new(child_models),
            )
        }
        #[cfg(feature = "live")]
        Models::Live(client) => {
            use subloop::providers::anthropic::AnthropicModel;
            let children = Arc::clone(&client);
            let child_slot = Arc::clone(&stop_slot);
            let child_models = move |_number: usize| -> Box<dyn Model + Send> {
                // Children of one batch stream at once: their text is
                // shown by whole lines, so lines never tear.
                Box::new(
                    AnthropicModel::with_stop(Arc::clone(&children), Arc::clone(&child_slot))
                        .with_whole_lines(),
                )
            };
            (
                Box::new(AnthropicModel::with_stop(client, Arc::clone(&stop_slot))),
                Arc::new(child_models),
            )
        }
    };
    let (mut agent, trace, mcp) = assemble(
        settings,
        settings.decision.approver(
            &settings.input,
            &settings.cancel,
            settings.prompt_watch.as_ref().map(|watch| &watch.0),
        ),
        children,
        resuming.as_ref().map(|(resuming, point)| (resuming, point)),
        trace_path.as_deref(),
        redactor,
    )?;
    // A follow-up question is the user's prompt: its UserPromptSubmit
    // hooks run now (recorded in the trace), and what they add is asked.
    if let (Some(question), Some((resumed, point))) = (&settings.follow_up, &mut resuming) {
        let asked = agent.submit_prompt(question)?;
        if asked != *question {
            *point = ResumePoint::follow_up(&resumed.run, &asked, budget, settings.on_empty_reply)
                .map_err(|error| AppError::Resume {
                    path: settings.resume.clone().unwrap_or_default(),
                    error,
                })?;
        }
    }
    #[cfg(feature = "live")]
    let _ = stop_slot.set(agent.stop_signal());
    Ok(Prepared {
        agent,
        parent,
        budget,
        question: settings.question.clone(),
        trace,
        trace_path: settings.trace.clone().or_else(|| settings.resume.clone()),
        resume: resuming.map(|(_, point)| point),
        page,
        mcp_lines: mcp.lines,
        mcp_servers: mcp.servers,
        shutdown: settings.shutdown.clone(),
        _cleanup: cleanup,
    })
}

/// A trace read for `--resume`, through its locked file.
struct Resuming {
    file: ResumeFile,
    run: RecordedRun,
}

impl Resuming {
    /// Takes the trace's lock, then reads it: what is read is what this
    /// run (and no other) goes on from.
    fn load(path: &Path, settings: &Settings) -> Result<Self, AppError> {
        // A trace that cannot be read says so, as before any other check.
        std::fs::metadata(path).map_err(|source| ReplayError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file = target::open_to_resume(path, &settings.workspace, &script_of(settings))?;
        let file = ResumeFile::read(file, path)?;
        let run = file.run().clone();
        Ok(Self { file, run })
    }

    /// The trace file cut to its whole lines and positioned at its end.
    fn append(&self) -> std::io::Result<std::fs::File> {
        self.file.append()
    }
}

impl Prepared {
    /// The MCP servers started and their tools (and any tool skipped), one
    /// line each, for the progress output.
    pub fn mcp_lines(&self) -> &[String] {
        &self.mcp_lines
    }

    /// For a resumed run, the line saying where it goes on: the calls kept,
    /// how the earlier part ended, and the calls answered "not executed".
    pub fn resumed_line(&self) -> Option<String> {
        let point = self.resume.as_ref()?;
        let interrupted = match point.interrupted.len() {
            0 => String::new(),
            1 => "; 1 call it left unfinished is answered \"not executed\"".to_owned(),
            n => format!("; {n} calls it left unfinished are answered \"not executed\""),
        };
        let asked = if point.follow_up.is_some() {
            "; a follow-up question is asked"
        } else {
            ""
        };
        Some(format!(
            "[resumed] after parent call {} (the earlier run ended {}; {} tokens, {} delegations spent){interrupted}{asked}",
            point.spent_calls(),
            point.ended,
            point.spent_tokens(),
            point.spent_delegations()
        ))
    }

    /// Runs the parent: the report, with a failed trace write added to its
    /// warnings, and the trace's write error.
    pub fn run(mut self) -> Result<Run, AppError> {
        let mut report = match self.resume {
            Some(point) => self.agent.resume(point, self.parent.as_mut()),
            None => self
                .agent
                .run(&self.question, self.budget, self.parent.as_mut())?,
        };
        let trace_error = self.trace.and_then(|status| status.error());
        if let (Some(error), Some(path)) = (&trace_error, &self.trace_path) {
            report.warnings.push(Warning::new(
                AgentId::Parent,
                format!(
                    "writing the trace {} failed: {error}; the trace is incomplete",
                    path.display()
                ),
            ));
        }
        // The page last: it is drawn from the finished trace. A run the
        // process is ending under (a signal) leaves the old page as it was.
        let ending = self
            .shutdown
            .as_ref()
            .is_some_and(|shutdown| shutdown.ending().is_some());
        let page_error = self.page.filter(|_| !ending).and_then(|page| {
            let path = page.path().to_owned();
            let error = page.write().err()?;
            let text = format!("writing the view page {} failed: {error}", path.display());
            let _ = writeln!(
                std::io::stderr(),
                "subloop: {}",
                subloop::core::text::printable(&text)
            );
            report
                .warnings
                .push(Warning::new(AgentId::Parent, text.clone()));
            Some(text)
        });
        Ok(Run {
            report,
            trace_error,
            page_error,
            mcp_servers: self.mcp_servers,
        })
    }
}

/// Replays the trace at `trace`: the parent and every child get their
/// replies from it (child `n` from `child-n`'s lines), the tools run for real
/// through `settings`' gate against its workspace, and every request is
/// compared with the recorded one. The question is the recorded one
/// (`settings.question` is not used); budgets, limits and policy come from
/// `settings`, so give the recorded run's flags. Without `keep_going`, the
/// first divergence stops the replay. After the run, each agent's number of
/// requests, its tool calls (the trace's `tool` lines, which also hold a last
/// round no request carried) and the parent's outcome (status and text) are
/// compared too.
pub fn replay(
    settings: &Settings,
    trace: &Path,
    keep_going: bool,
) -> Result<ReplayReport, AppError> {
    let _cleanup = TemporaryWorkspace::for_settings(settings);
    let replay = Replay::load(trace)?
        .keep_going(keep_going)
        .on_empty_reply(settings.on_empty_reply);
    let mut settings = settings.clone();
    // The recorded question is asked as recorded: context that SessionStart
    // or UserPromptSubmit hooks added to it is already in it.
    settings.hooks = settings
        .hooks
        .clone()
        .without(&[HookEvent::SessionStart, HookEvent::UserPromptSubmit]);
    // The answer is checked as the recorded run checked it.
    if settings.output_schema.is_none() {
        settings.output_schema = replay.output_schema().cloned();
    }
    // Histories are compacted as the recorded run compacted them.
    if settings.compact.is_none()
        && settings.context_window.is_none()
        && let Some((policy, window)) = compact::recorded(trace)
    {
        settings.compact = Some(policy);
        settings.context_window = window;
    }
    let budget = Budget::new(settings.max_calls)?;
    let approver = settings.decision.approver(
        &settings.input,
        &settings.cancel,
        settings.prompt_watch.as_ref().map(|watch| &watch.0),
    );
    replay.run(approver, budget, |approver, children| {
        assemble(
            &settings,
            approver,
            children,
            None,
            settings.trace.as_deref(),
            Redactor::default(),
        )
        .map(|(agent, _, _)| agent)
    })
}

/// Settings for `subloop demo`: the demo question, and the workspace given,
/// or `examples/workspace` when run from the repository, or else a fresh
/// temporary copy of the built-in files.
pub fn demo_settings(workspace: Option<PathBuf>) -> Result<Settings, AppError> {
    let local = Path::new("examples/workspace");
    let (workspace, temporary) = match workspace {
        Some(dir) => (dir, false),
        None if local.join("main.py").is_file() && local.join("expected.txt").is_file() => {
            (local.to_owned(), false)
        }
        None => (fresh_demo_workspace()?, true),
    };
    let mut settings = Settings::new(workspace);
    settings.question = DemoParent::QUESTION.to_owned();
    settings.temporary_workspace = temporary;
    Ok(settings)
}

fn fresh_demo_workspace() -> Result<PathBuf, AppError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("subloop-demo-{}-{nanos}", std::process::id()));
    let fail = |source| AppError::DemoWorkspace {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(fail)?;
    for (name, text) in DEMO_FILES {
        std::fs::write(dir.join(name), text).map_err(fail)?;
    }
    Ok(dir)
}

/// Removes a temporary demo workspace when dropped (hosts and the CLI hold
/// one from the moment the copy exists, so no exit path leaves it behind),
/// or when a signal ends the process (with the settings' [`Shutdown`]).
#[derive(Debug)]
pub struct TemporaryWorkspace(Option<(PathBuf, Option<Registration>)>);

impl TemporaryWorkspace {
    /// A guard for `settings`' workspace if it is a temporary copy; else one that does nothing.
    pub fn for_settings(settings: &Settings) -> Self {
        Self(settings.temporary_workspace.then(|| {
            let dir = settings.workspace.clone();
            let on_exit = dir.clone();
            let registration = settings.shutdown.as_ref().map(|shutdown| {
                shutdown.on_termination(move |_| {
                    let _ = std::fs::remove_dir_all(&on_exit);
                })
            });
            (dir, registration)
        }))
    }
}

impl Drop for TemporaryWorkspace {
    fn drop(&mut self) {
        if let Some((dir, _)) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
