//! A JSON Lines trace of a run: every request and reply of the parent and of
//! every child, one object per line, written and flushed line by line.
//!
//! Every line has `agent` (`parent`, `child-1`, ...) and `kind`; a child's
//! lines also have `parent_tool_use_id`. The first line also carries
//! `version`, the format version ([`TraceWriter::VERSION`]); a reader refuses a
//! trace of another version, and reads a trace without one (written before
//! the field existed, in the same format) as version 1. Kinds:
//!
//! | kind | fields |
//! |---|---|
//! | `request` | `call`, `tools` (names offered), `messages` (appended since this agent's previous request), `attachment` (the plan, if any); on an agent's first request also `system` and `tool_definitions` (and on the parent's, `workspace`: the directory the tools work in, unless it was a temporary copy; `sandbox`: the level `run_main`'s programs start in; and `compaction`: the host's policy, `{"policy", "context_window"}`, when it gave one), which a later request carries again when the tools offered changed (an MCP server's list did) |
//! | `compaction` | `call` (the request it came before), `trigger` (`auto`, `overflow` or `manual`), `compactor`, `tokens` (the estimated input tokens of the history it replaced), `messages` (appended since this agent's previous request, and replaced with the rest), `replaced` (how many messages the replaced history held), `history` (the history from now on, whole: later requests' `messages` append to it), and for a summary the model wrote, `summary` (`text`, `usage`, `requests`: how many summary requests it took) |
//! | `response` | `call`, `response` (the reply as received) |
//! | `model_failed` | `call`, `error` |
//! | `empty_reply` | `call` (whose reply was an empty `end_turn`), `continued_with` (the user message that answered it, under `--on-empty-reply continue`) |
//! | `tool` | `name`, `id`, `decision`, `is_error`, `content` (the result exactly as sent to the model) |
//! | `warning` | `text` |
//! | `hook` | `event`, `command`, `call_id` and `tool` (tool events), `call` (the answer a stop hook judged), `exit_code`, `timed_out`, `decision`, `reason`, `duration_ms`: one command hook's run |
//! | `outcome` | `status`, `text`, `calls`, `usage` |
//! | `mcp_server` | (parent) `server`, `event` (`started`, with `tools`: the registered names; `exited`, with `how`: the exit status and the server's last stderr lines, when it exits mid-run) |
//! | `resumed` | (parent) `calls` kept, `ended` (the earlier part's status, or `interrupted`), `tokens`, `delegations`, `interrupted` (ids answered "not executed"), `workspace` (where the resumed run works), `sandbox` (the level it runs programs in): `subloop run --resume` appends it, then the resumed run's lines; parent calls after `calls` are replaced by the lines that follow |
//!
//! A write that fails stops the trace (one line on stderr; [`TraceStatus`]
//! tells the host afterwards). When the host's [`Shutdown`] runs (a signal ends the process), the
//! trace still ends with an `outcome` line, status `cancelled`, for every
//! agent that had not finished.
//!
//! Each message is written once, so the trace grows linearly; [`RebuiltRequest::from_trace`]
//! replays a trace into every request exactly as it was sent. A `tool` line
//! is written the moment its result exists, so the results of a last round
//! that no later request carried (the run stopped after it) are on record too. No credential
//! is ever part of a request; a provider client hides its secrets from its
//! replies and the agent from its tools' results ([`crate::core::redact`]),
//! and a writer given them ([`TraceWriter::redacting`]) hides them from
//! every line it writes besides (a question, a hook's reason, an MCP
//! server's stderr).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::core::agent_id::AgentId;
use crate::core::call::ToolRecord;
use crate::core::hook::HookRecord;
use crate::core::protocol::{Message, ToolDefinition, Usage};
use crate::core::redact::Redactor;
use crate::run::monitor::Event;
use crate::run::monitor::Monitor;
use crate::run::shutdown::{Registration, Shutdown, Termination};
use crate::tools::sandbox::Sandbox;

/// The trace format version written on a trace's first line, and the only one read.
pub(crate) const TRACE_VERSION: u64 = 1;

/// The format version declared by `first`, a trace's first line: its
/// `version` field, or 1 when there is none (traces written before the field
/// existed have the same format). Any version but [`TraceWriter::VERSION`] is an
/// error saying which version was found.
pub(crate) fn check_version(first: &Value) -> Result<u64, String> {
    match first.get("version") {
        None => Ok(1),
        Some(Value::Number(number)) if number.as_u64() == Some(TRACE_VERSION) => Ok(TRACE_VERSION),
        Some(other) => Err(format!(
            "trace format version {other} is not supported: this subloop reads version {TRACE_VERSION}"
        )),
    }
}

/// Writes the trace; each line goes to the file in one write.
///
/// If the process is ended by a signal the host handles through a [`Shutdown`] ([`TraceWriter::on_shutdown`])
/// (`SIGTERM`, `SIGHUP`, a second Ctrl-C), the trace still ends with an
/// `outcome` line, status `cancelled`, for every agent that had not
/// finished (children first, the parent last).
#[derive(Debug)]
pub struct TraceWriter {
    shared: Arc<Mutex<TraceFile>>,
    /// The tool names each agent's last request offered: when they change
    /// (a tool source's list changed), the request carries the definitions again.
    offered: HashMap<AgentId, Vec<String>>,
    /// The workspace the run works in, written on the parent's first request.
    workspace: Option<String>,
    /// The sandbox level of `run_main`, written on the parent's first request.
    sandbox: Option<Sandbox>,
    /// The host's compaction policy, written on the parent's first request.
    compaction: Option<Value>,
    _termination: Option<Registration>,
    /// The host's shutdown, asked before every line whether the process is ending.
    shutdown: Option<Arc<Shutdown>>,
}

/// A handle on a trace that a host keeps after giving the writer to an
/// agent: it writes lines of the host's own into the trace, and tells
/// afterwards whether the trace was written completely.
#[derive(Debug, Clone)]
pub struct TraceStatus(Arc<Mutex<TraceFile>>);

impl TraceStatus {
    /// One line for the parent: `kind` and `fields` (an object), such as
    /// the MCP servers' start and exit.
    pub fn line(&self, kind: &str, fields: Value) {
        lock(&self.0).emit(&AgentId::Parent, kind, fields);
    }

    /// The first write error, if a write failed (no line was written after it).
    pub fn error(&self) -> Option<String> {
        lock(&self.0).error.clone()
    }
}

#[derive(Debug)]
struct TraceFile {
    file: File,
    error: Option<String>,
    /// Set once the process is ending: no line may follow the last outcome.
    closed: bool,
    /// Agents that sent a request and have not finished: (agent, calls, usage).
    open: Vec<(AgentId, u32, Usage)>,
    /// Whether a line was written (the first one carries the format version).
    started: bool,
    /// The secrets hidden from every line.
    redactor: Redactor,
}

fn lock(shared: &Mutex<TraceFile>) -> MutexGuard<'_, TraceFile> {
    shared.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// One trace line: `version` on the first line of a trace, then `agent`,
/// `kind`, `parent_tool_use_id` for a child, then `fields`.
fn render(agent: &AgentId, kind: &str, fields: Value, first: bool) -> String {
    let mut object = Map::new();
    if first {
        object.insert("version".into(), json!(TRACE_VERSION));
    }
    object.insert("agent".into(), json!(agent));
    object.insert("kind".into(), json!(kind));
    if let Some(id) = agent.parent_tool_use_id() {
        object.insert("parent_tool_use_id".into(), json!(id));
    }
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    let mut text = Value::Object(object).to_string();
    text.push('\n');
    text
}

impl TraceFile {
    /// Renders and writes one line (the first one with the format version),
    /// the secrets hidden from every string in it.
    fn emit(&mut self, agent: &AgentId, kind: &str, mut fields: Value) {
        self.redactor.value(&mut fields);
        let text = render(agent, kind, fields, !self.started);
        self.started = true;
        self.write(&text);
    }

    fn write(&mut self, text: &str) {
        if self.error.is_some() || self.closed {
            return;
        }
        if let Err(err) = self.file.write_all(text.as_bytes()) {
            let _ = writeln!(
                std::io::stderr(),
                "subloop: writing the trace failed; it is incomplete from here on: {err}"
            );
            self.error = Some(err.to_string());
        }
    }

    /// The process is ending: an `outcome` line for every unfinished agent, then nothing more.
    fn terminate(&mut self, termination: &Termination) {
        let open = std::mem::take(&mut self.open);
        let (parent, children): (Vec<_>, Vec<_>) = open
            .into_iter()
            .partition(|(agent, ..)| *agent == AgentId::Parent);
        for (agent, calls, usage) in children.into_iter().chain(parent) {
            let text = format!(
                "cancelled by {}: subloop was stopped before this agent finished; the programs run_main was running were killed",
                termination.cause()
            );
            let fields =
                json!({"status": "cancelled", "text": text, "calls": calls, "usage": usage});
            self.emit(&agent, "outcome", fields);
        }
        self.closed = true;
    }

    /// Keeps track of which agents are running, for [`TraceFile::terminate`].
    fn track(&mut self, agent: &AgentId, event: &Event<'_>) {
        let index = self.open.iter().position(|(who, ..)| who == agent);
        match (event, index) {
            (Event::Request { call, .. }, Some(index)) => {
                if let Some(open) = self.open.get_mut(index) {
                    open.1 = *call;
                }
            }
            (Event::Request { call, .. }, None) => {
                self.open.push((agent.clone(), *call, Usage::default()));
            }
            (Event::Response { response, .. }, Some(index)) => {
                if let (Some(open), Some(usage)) = (self.open.get_mut(index), &response.usage) {
                    open.2.add(usage);
                }
            }
            (Event::Finished { .. }, Some(index)) => {
                self.open.remove(index);
            }
            _ => {}
        }
    }
}

impl TraceWriter {
    /// The trace format version written on a trace's first line, and the only one read.
    pub const VERSION: u64 = TRACE_VERSION;

    /// Creates (or truncates) the trace file.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self::from_file(File::create(path)?))
    }

    /// A writer that goes on with the trace `file` of a run being resumed
    /// (opened at its end):
    /// writes a `resumed` line with `fields` (the calls kept, what the earlier
    /// part ended with and spent: `ResumePoint::trace_fields` in `record::resume`),
    /// then the resumed run's lines. The first line, with the format version,
    /// is already there.
    pub fn resume(file: File, fields: Value) -> Self {
        let mut writer = Self::from_file(file);
        lock(&writer.shared).started = true;
        writer.line(&AgentId::Parent, "resumed", fields);
        writer
    }

    /// Records `workspace` (the directory the run's tools work in) on the
    /// parent's first request line, so that a resume can tell whether it
    /// goes on in the same place.
    pub fn with_workspace(mut self, workspace: &Path) -> Self {
        self.workspace = Some(workspace.to_string_lossy().into_owned());
        self
    }

    /// Hides `redactor`'s secrets (the API key the run's model holds) from
    /// every line written from now on, whatever it holds: a reply, a tool
    /// result, a question, a hook's reason, an MCP server's stderr.
    pub fn redacting(self, redactor: Redactor) -> Self {
        lock(&self.shared).redactor = redactor;
        self
    }

    /// Records `level`, the sandbox `run_main` starts programs in, on the
    /// parent's first request line.
    pub fn with_sandbox(mut self, level: Sandbox) -> Self {
        self.sandbox = Some(level);
        self
    }

    /// Records the host's compaction policy (its name, as the host calls
    /// it, and the context window it assumed, if any) on the parent's
    /// first request, so a replay can compact as the run did.
    pub fn with_compaction(mut self, policy: &str, context_window: Option<u64>) -> Self {
        self.compaction = Some(json!({"policy": policy, "context_window": context_window}));
        self
    }

    /// A writer on a new trace at `path`, opened after checking that it is
    /// none of `protected` (compared by device and inode) and not inside
    /// `workspace` (compared as canonical paths), and that it is a regular
    /// file or a character device. A regular file is truncated only after
    /// every check passed.
    pub fn open(
        path: &Path,
        workspace: &Path,
        protected: &[(&Path, &'static str)],
    ) -> Result<Self, crate::record::target::TraceTargetError> {
        crate::record::target::open(path, workspace, protected).map(Self::from_file)
    }

    /// Creates a fresh file for a temporary trace in the temporary
    /// directory, named after `prefix`: a new name (never an existing file
    /// or link), readable by its owner only. The caller removes it.
    pub fn create_temporary(prefix: &str) -> std::io::Result<std::path::PathBuf> {
        crate::record::target::create_private(prefix)
    }

    /// A writer on a file already opened for writing.
    pub fn from_file(file: File) -> Self {
        let shared = Arc::new(Mutex::new(TraceFile {
            file,
            error: None,
            closed: false,
            started: false,
            open: Vec::new(),
            redactor: Redactor::default(),
        }));
        Self {
            shared,
            offered: HashMap::new(),
            workspace: None,
            sandbox: None,
            compaction: None,
            _termination: None,
            shutdown: None,
        }
    }

    /// Registers with the host's `shutdown`: when the process is ended by
    /// a signal, the trace still ends with an `outcome` line, status
    /// `cancelled`, for every agent that had not finished, and nothing is
    /// written after it. A run that finishes once the process is ending
    /// (its programs were killed by the same signal) ends its trace the
    /// same way.
    pub fn on_shutdown(mut self, shutdown: &Arc<Shutdown>) -> Self {
        self.shutdown = Some(Arc::clone(shutdown));
        let on_exit = Arc::clone(&self.shared);
        self._termination = Some(shutdown.on_termination(move |termination| {
            // The run may hold the lock for a moment; never wait long.
            let until = Instant::now() + Duration::from_secs(1);
            loop {
                match on_exit.try_lock() {
                    Ok(mut file) => break file.terminate(termination),
                    Err(std::sync::TryLockError::Poisoned(poison)) => {
                        break poison.into_inner().terminate(termination);
                    }
                    Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(std::sync::TryLockError::WouldBlock) => break,
                }
            }
        }));
        self
    }

    /// A handle that writes lines of the host's own into this trace
    /// ([`TraceStatus::line`]) and tells afterwards whether every line was
    /// written ([`TraceStatus::error`]).
    pub fn status(&self) -> TraceStatus {
        TraceStatus(Arc::clone(&self.shared))
    }

    fn line(&mut self, agent: &AgentId, kind: &str, fields: Value) {
        lock(&self.shared).emit(agent, kind, fields);
    }

    /// Whether the process is ending; if so, the trace is ended with the
    /// termination (once) and nothing more is written.
    fn ending(&self) -> bool {
        let Some(termination) = self.shutdown.as_ref().and_then(|s| s.ending()) else {
            return false;
        };
        let mut file = lock(&self.shared);
        if !file.closed {
            file.terminate(&termination);
        }
        true
    }
}

impl Monitor for TraceWriter {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        if self.ending() {
            return;
        }
        lock(&self.shared).track(agent, event);
        match event {
            Event::Request {
                call,
                request,
                new_messages,
            } => {
                let names: Vec<String> = request
                    .tool_names()
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                let mut fields = Map::new();
                fields.insert("call".into(), json!(call));
                fields.insert("tools".into(), json!(names));
                fields.insert("messages".into(), json!(new_messages));
                fields.insert("attachment".into(), json!(request.attachment));
                if *call == 1 {
                    fields.insert("system".into(), json!(request.system));
                    if let Some(schema) = request.output {
                        fields.insert("output_schema".into(), schema.clone());
                    }
                    if let (AgentId::Parent, Some(workspace)) = (agent, &self.workspace) {
                        fields.insert("workspace".into(), json!(workspace));
                    }
                    if let (AgentId::Parent, Some(compaction)) = (agent, &self.compaction) {
                        fields.insert("compaction".into(), compaction.clone());
                    }
                    if let (AgentId::Parent, Some(sandbox)) = (agent, self.sandbox) {
                        fields.insert("sandbox".into(), json!(sandbox));
                    }
                }
                let changed = self.offered.get(agent) != Some(&names);
                if *call == 1 || changed {
                    fields.insert("tool_definitions".into(), json!(request.tools));
                    self.offered.insert(agent.clone(), names);
                }
                self.line(agent, "request", Value::Object(fields));
            }
            Event::Response {
                call,
                response,
                raw,
            } => {
                // The reply as received when there is one; else the parsed form.
                let response = match raw {
                    Some(raw) => (*raw).clone(),
                    None => json!(response),
                };
                self.line(
                    agent,
                    "response",
                    json!({"call": call, "response": response}),
                );
            }
            Event::EmptyReplyContinued { call, prompt } => {
                self.line(
                    agent,
                    "empty_reply",
                    json!({"call": call, "continued_with": prompt}),
                );
            }
            Event::InvalidAnswer { call, error } => {
                self.line(
                    agent,
                    "invalid_answer",
                    json!({"call": call, "error": error}),
                );
            }
            Event::Compacted {
                call,
                trigger,
                compactor,
                tokens,
                new_messages,
                replaced,
                history,
                summary,
                summary_usage,
                summary_requests,
            } => {
                let mut fields = json!({
                    "call": call,
                    "trigger": trigger,
                    "compactor": compactor,
                    "tokens": tokens,
                    "messages": new_messages,
                    "replaced": replaced,
                    "history": history,
                });
                if let (Some(text), Some(object)) = (summary, fields.as_object_mut()) {
                    object.insert(
                        "summary".into(),
                        json!({"text": text, "usage": summary_usage, "requests": summary_requests}),
                    );
                }
                self.line(agent, "compaction", fields);
            }
            Event::ModelFailed { call, failure } => {
                let error_type = failure.kind().map(|kind| kind.as_str());
                let fields =
                    json!({"call": call, "error": failure.message(), "error_type": error_type});
                self.line(agent, "model_failed", fields);
            }
            Event::Finished { outcome } => {
                let mut fields = Map::new();
                fields.insert("status".into(), json!(outcome.status));
                fields.insert("text".into(), json!(outcome.text));
                fields.insert("calls".into(), json!(outcome.calls));
                fields.insert("usage".into(), json!(outcome.usage));
                if let Some(output) = &outcome.output {
                    fields.insert("output".into(), output.clone());
                }
                if let Some(error) = &outcome.output_error {
                    fields.insert("output_error".into(), json!(error));
                }
                self.line(agent, "outcome", Value::Object(fields));
            }
            Event::ToolRequested { .. } | Event::ToolFinished { .. } => {}
        }
    }

    fn tool(&mut self, agent: &AgentId, record: &ToolRecord) {
        if !self.ending() {
            self.line(agent, "tool", json!(record));
        }
    }

    fn warning(&mut self, agent: &AgentId, warning: &str) {
        if !self.ending() {
            self.line(agent, "warning", json!({"text": warning}));
        }
    }

    fn hook(&mut self, agent: &AgentId, record: &HookRecord) {
        if !self.ending() {
            self.line(agent, "hook", json!(record));
        }
    }
}

/// `value`'s string field `key`, if it has one.
fn field_str<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// A copy of `value`'s field `key`; null when it has none.
fn field(value: &Value, key: &str) -> Value {
    value.get(key).cloned().unwrap_or_default()
}

/// A request as rebuilt from a trace.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RebuiltRequest {
    /// The agent that sent it.
    pub agent: String,
    /// Its 1-based number for that agent.
    pub call: u64,
    /// The system prompt.
    pub system: String,
    /// The tool definitions offered.
    pub tools: Vec<ToolDefinition>,
    /// The history sent.
    pub messages: Vec<Message>,
    /// The attached plan, if any.
    pub attachment: Option<String>,
}

impl RebuiltRequest {
    /// Rebuilds every request of a trace, in trace order. A line that is not a
    /// complete JSON object (such as a last line cut by a crash) is an error
    /// naming its number, and so is a first line of another format version.
    pub fn from_trace(trace: &str) -> Result<Vec<Self>, String> {
        rebuild_requests(trace)
    }
}

/// [`RebuiltRequest::from_trace`].
fn rebuild_requests(trace: &str) -> Result<Vec<RebuiltRequest>, String> {
    struct AgentState {
        system: String,
        tools: Vec<ToolDefinition>,
        messages: Vec<Message>,
        /// The history each compaction made, with the request it came before.
        compactions: Vec<(u64, Vec<Message>)>,
    }
    let mut agents: HashMap<String, AgentState> = HashMap::new();
    let mut requests = Vec::new();
    for (index, line) in trace.lines().enumerate() {
        let number = index + 1;
        let value: Value =
            serde_json::from_str(line).map_err(|err| format!("line {number}: {err}"))?;
        if number == 1 {
            check_version(&value).map_err(|err| format!("line 1: {err}"))?;
        }
        if field_str(&value, "kind") == Some("resumed")
            && field_str(&value, "agent") == Some("parent")
        {
            // The parent's requests after the kept ones are asked again below.
            let kept = value
                .get("calls")
                .and_then(Value::as_u64)
                .ok_or(format!("line {number}: a `resumed` line without `calls`"))?;
            requests.retain(|request: &RebuiltRequest| {
                request.agent != "parent" || request.call <= kept
            });
            let held = requests
                .iter()
                .rev()
                .find(|request| request.agent == "parent")
                .map(|request| request.messages.clone())
                .unwrap_or_default();
            if let Some(state) = agents.get_mut("parent") {
                // A compaction before the next request stands (the resumed
                // run sends its history); later ones do not.
                state.compactions.retain(|(call, _)| *call <= kept + 1);
                state.messages = match state.compactions.last() {
                    Some((call, history)) if *call == kept + 1 => history.clone(),
                    _ => held,
                };
            }
            continue;
        }
        if field_str(&value, "kind") == Some("compaction") {
            let agent = field_str(&value, "agent").ok_or(format!("line {number}: no agent"))?;
            let call = value
                .get("call")
                .and_then(Value::as_u64)
                .ok_or(format!("line {number}: no call number"))?;
            let history: Vec<Message> = serde_json::from_value(field(&value, "history"))
                .map_err(|err| format!("line {number}: history: {err}"))?;
            let state = agents
                .get_mut(agent)
                .ok_or(format!("line {number}: a compaction before any request"))?;
            state.messages.clone_from(&history);
            state.compactions.push((call, history));
            continue;
        }
        if field_str(&value, "kind") != Some("request") {
            continue;
        }
        let agent = field_str(&value, "agent")
            .ok_or(format!("line {number}: no agent"))?
            .to_owned();
        let call = value
            .get("call")
            .and_then(Value::as_u64)
            .ok_or(format!("line {number}: no call number"))?;
        let new: Vec<Message> = serde_json::from_value(field(&value, "messages"))
            .map_err(|err| format!("line {number}: messages: {err}"))?;
        let state = match agents.get_mut(&agent) {
            Some(state) if call > 1 => state,
            _ => {
                let tools = serde_json::from_value(field(&value, "tool_definitions"))
                    .map_err(|err| format!("line {number}: tool_definitions: {err}"))?;
                let system = field_str(&value, "system").unwrap_or_default().to_owned();
                agents.insert(
                    agent.clone(),
                    AgentState {
                        system,
                        tools,
                        messages: Vec::new(),
                        compactions: Vec::new(),
                    },
                );
                agents.get_mut(&agent).ok_or("agent state lost")?
            }
        };
        // The offered tools changed (a tool source's list did): the
        // request carries the definitions again.
        if call > 1 && !value.get("tool_definitions").is_none_or(Value::is_null) {
            state.tools = serde_json::from_value(field(&value, "tool_definitions"))
                .map_err(|err| format!("line {number}: tool_definitions: {err}"))?;
        }
        state.messages.extend(new);
        requests.push(RebuiltRequest {
            agent,
            call,
            system: state.system.clone(),
            tools: state.tools.clone(),
            messages: state.messages.clone(),
            attachment: field_str(&value, "attachment").map(str::to_owned),
        });
    }
    Ok(requests)
}
