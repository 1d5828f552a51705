//! Each tool an MCP server lists, as a [`Tool`]: registered as
//! `mcp__SERVER__TOOL`, its `inputSchema` offered to the model unchanged,
//! `executes` — so it passes the permission gate — unless the host marked
//! it read-only (`McpReadOnlyTool`, the only form a child may hold).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::McpError;
use super::config::{ServerConfig, tool_name};
use super::content::{result_text, rpc_error};
use super::server::{CallOutcome, ExitNotice, McpServer, RemoteTool};
use crate::core::conversation::ToolOutput;
use crate::run::limits::CancelHandle;
use crate::tools::{
    Capability, ReadOnlyTool, Tool, ToolContext, ToolEntry, ToolFuture, ToolSource, refusal,
};

/// The most bytes of a call's arguments an approval prompt shows.
const MAX_ACTION_ARGUMENTS: usize = 400;

/// One MCP tool that executes: it runs only after the gate allows it.
#[derive(Debug, Clone)]
pub(crate) struct McpTool {
    server: Arc<McpServer>,
    remote: String,
    name: String,
    description: String,
    schema: Value,
    cap: usize,
    timeout: Duration,
    cancel: CancelHandle,
}

/// One MCP tool the host marked read-only: it runs freely and may be in a
/// child's whitelist.
#[derive(Debug, Clone)]
pub(crate) struct McpReadOnlyTool(McpTool);

impl McpTool {
    /// The call's arguments as the server takes them, or the refusal.
    fn arguments(&self, input: &Value) -> Result<serde_json::Map<String, Value>, ToolOutput> {
        match input {
            Value::Object(map) => Ok(map.clone()),
            Value::Null => Ok(serde_json::Map::new()),
            _ => Err(refusal(format!(
                "{}: the arguments are not a JSON object",
                self.name
            ))),
        }
    }

    fn call(&self, input: &Value) -> ToolOutput {
        match self.arguments(input) {
            Ok(arguments) => {
                self.answer(
                    self.server
                        .call(&self.remote, arguments, self.timeout, &self.cancel),
                )
            }
            Err(refused) => refused,
        }
    }

    /// [`McpTool::call`], awaited on the run's task ([`McpServer::call_async`]).
    fn call_async<'a>(&'a self, input: &'a Value) -> ToolFuture<'a> {
        Box::pin(async move {
            match self.arguments(input) {
                Ok(arguments) => self.answer(
                    self.server
                        .call_async(&self.remote, arguments, self.timeout, &self.cancel)
                        .await,
                ),
                Err(refused) => refused,
            }
        })
    }

    /// The tool's answer for how the call ended.
    fn answer(&self, outcome: CallOutcome) -> ToolOutput {
        let server = self.server.name();
        match outcome {
            CallOutcome::Result(result) => {
                let (text, is_error) = result_text(&self.name, &result, self.cap);
                ToolOutput {
                    content: text.into(),
                    is_error,
                }
            }
            CallOutcome::RpcError { code, message } => {
                ToolOutput::error(rpc_error(server, code, &message))
            }
            CallOutcome::Exited { status, stderr } => {
                refusal(format!("MCP server {server} exited ({status}){stderr}"))
            }
            CallOutcome::TimedOut(after) => ToolOutput::error(format!(
                "{}: MCP server {server} did not answer within {} s; the call was cancelled",
                self.name,
                after.as_secs_f64()
            )),
            CallOutcome::Cancelled => refusal(format!(
                "the run was cancelled while MCP server {server} was running {}; the server was told to cancel it",
                self.remote
            )),
        }
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    fn capability(&self) -> Capability {
        Capability::Executes
    }

    fn action(&self, input: &Value) -> String {
        // A prompt line, not a dump: long arguments are cut.
        let mut arguments = input.to_string();
        if arguments.len() > MAX_ACTION_ARGUMENTS {
            let mut cut = MAX_ACTION_ARGUMENTS;
            while !arguments.is_char_boundary(cut) {
                cut -= 1;
            }
            let total = arguments.len();
            arguments.truncate(cut);
            arguments.push_str(&format!("… ({total} bytes)"));
        }
        format!(
            "MCP server {} tool {} with arguments {arguments}",
            self.server.name(),
            self.remote
        )
    }

    fn run(&self, input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        self.call(input)
    }

    fn run_async<'a>(&'a self, input: &'a Value, _context: &'a ToolContext<'a>) -> ToolFuture<'a> {
        self.call_async(input)
    }
}

impl Tool for McpReadOnlyTool {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn description(&self) -> &str {
        &self.0.description
    }

    fn input_schema(&self) -> Value {
        self.0.schema.clone()
    }

    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }

    fn action(&self, input: &Value) -> String {
        self.0.action(input)
    }

    fn run(&self, input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        self.0.call(input)
    }

    fn run_async<'a>(&'a self, input: &'a Value, _context: &'a ToolContext<'a>) -> ToolFuture<'a> {
        self.0.call_async(input)
    }
}

impl ReadOnlyTool for McpReadOnlyTool {}

/// One server's tools, as a [`ToolSource`]: listed at start, and again at
/// a turn boundary after the server sent `notifications/tools/list_changed`.
#[derive(Debug)]
pub(crate) struct McpSource {
    config: ServerConfig,
    server: Arc<McpServer>,
    settings: McpSettings,
    /// The generation, the listing and its tools, as last read.
    cache: std::sync::Mutex<(u64, Vec<RemoteTool>, Vec<ToolEntry>)>,
}

impl McpSource {
    /// The registered tools of `listed`, and a warning for each one skipped.
    fn entries(&self, listed: &[RemoteTool]) -> (Vec<ToolEntry>, Vec<String>) {
        let mut entries = Vec::new();
        let mut warnings = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        let server = &self.config.name;
        for remote in listed {
            let shown = crate::core::text::printable(&remote.name);
            let Some(name) = tool_name(server, &remote.name) else {
                warnings.push(format!(
                    "MCP server {server}: tool {shown:?} skipped: mcp__{server}__{shown} does not fit the tool-name rule ^[a-zA-Z0-9_-]{{1,64}}$"
                ));
                continue;
            };
            if seen.contains(&name) {
                warnings.push(format!(
                    "MCP server {server}: tool {shown} is listed twice; the first is kept"
                ));
                continue;
            }
            // The API takes object schemas only.
            if remote.input_schema.get("type").and_then(Value::as_str) != Some("object") {
                warnings.push(format!(
                    "MCP server {server}: tool {shown} skipped: its inputSchema is not of type object"
                ));
                continue;
            }
            seen.push(name.clone());
            let read_only = is_read_only(&self.config, remote);
            let tool = McpTool {
                server: Arc::clone(&self.server),
                remote: remote.name.clone(),
                name,
                description: remote.description.clone(),
                schema: remote.input_schema.clone(),
                cap: self.settings.cap,
                timeout: self.settings.timeout,
                cancel: self.settings.cancel.clone(),
            };
            entries.push(if read_only {
                ToolEntry::ReadOnly(Arc::new(McpReadOnlyTool(tool)))
            } else {
                ToolEntry::General(Arc::new(tool))
            });
        }
        (entries, warnings)
    }
}

impl ToolSource for McpSource {
    fn label(&self) -> String {
        format!("MCP server {}", self.config.name)
    }

    fn current(&self) -> (u64, Vec<ToolEntry>, Option<String>) {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut warning = None;
        if self.server.list_changed() {
            match self.server.list(self.settings.timeout) {
                Ok(listed) if listed != cache.1 => {
                    let (entries, _) = self.entries(&listed);
                    cache.0 += 1;
                    cache.1 = listed;
                    cache.2 = entries;
                }
                Ok(_) => {}
                Err(err) => {
                    warning = Some(format!(
                        "MCP server {}: the tool list could not be read again ({err}); its tools are kept",
                        self.config.name
                    ));
                }
            }
        }
        (cache.0, cache.2.clone(), warning)
    }
}

/// The started servers, each a [`ToolSource`], with a line per server
/// (its registered tools) and a warning per tool skipped.
#[derive(Default)]
#[non_exhaustive]
pub struct McpTools {
    /// One source per server, in configuration order.
    pub sources: Vec<Arc<dyn ToolSource>>,
    /// The servers, with the registered names of their tools.
    pub servers: Vec<(String, Vec<String>)>,
    /// Tools skipped (a name that does not fit the API's rule, or listed twice).
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTools")
            .field("sources", &self.sources.len())
            .field("servers", &self.servers)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// How MCP tools run: the byte cap of results, the start and per-call
/// timeout, and the run's cancel handle.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct McpSettings {
    /// The most bytes of a result the model gets (`read_file`'s limit).
    pub cap: usize,
    /// The start timeout, also the per-call timeout.
    pub timeout: Duration,
    /// Cancels calls in flight.
    pub cancel: CancelHandle,
    /// Told when a server exits mid-run.
    pub exit_notice: ExitNotice,
}

impl McpSettings {
    /// Results capped at `cap` bytes, `timeout` to start and per call, never
    /// cancelled, and no one told when a server exits.
    pub fn new(cap: usize, timeout: Duration) -> Self {
        Self {
            cap,
            timeout,
            cancel: CancelHandle::new(),
            exit_notice: ExitNotice::default(),
        }
    }
}

impl McpTools {
    /// Starts every server in `configs` at once and lists their tools; the
    /// first server that fails to start is the error (the others are shut down).
    pub fn start(configs: &[ServerConfig], settings: &McpSettings) -> Result<Self, McpError> {
        let starting: Vec<_> = configs
            .iter()
            .map(|config| McpServer::start(config, settings.timeout, settings.exit_notice.clone()))
            .collect();
        let mut all = Self::default();
        // The first failure ends the start: the servers started are shut
        // down as they drop, those still starting when their channel closes.
        for (config, pending) in configs.iter().zip(starting) {
            let (server, listed) = pending.wait(&settings.cancel)?;
            all.add(config, server, &listed, settings);
        }
        Ok(all)
    }

    /// [`McpTools::start`] for async runs: every server is a task of the
    /// current tokio runtime, with no thread
    /// or runtime of its own, and its tools' calls are awaited on the run's
    /// task.
    pub async fn start_async(
        configs: &[ServerConfig],
        settings: &McpSettings,
    ) -> Result<Self, McpError> {
        let starting: Vec<_> = configs
            .iter()
            .map(|config| {
                McpServer::start_async(config, settings.timeout, settings.exit_notice.clone())
            })
            .collect();
        let mut all = Self::default();
        for (config, pending) in configs.iter().zip(starting) {
            let (server, listed) = pending.wait(&settings.cancel).await?;
            all.add(config, server, &listed, settings);
        }
        Ok(all)
    }

    /// Adds a started server's source, its line and its warnings.
    fn add(
        &mut self,
        config: &ServerConfig,
        server: McpServer,
        listed: &[RemoteTool],
        settings: &McpSettings,
    ) {
        let mut source = McpSource {
            config: config.clone(),
            server: Arc::new(server),
            settings: settings.clone(),
            cache: std::sync::Mutex::new((0, Vec::new(), Vec::new())),
        };
        let (entries, warnings) = source.entries(listed);
        self.warnings.extend(warnings);
        self.servers.push((
            config.name.clone(),
            entries
                .iter()
                .map(|entry| entry.name().to_owned())
                .collect(),
        ));
        source.cache = std::sync::Mutex::new((0, listed.to_vec(), entries));
        self.sources.push(Arc::new(source));
    }
}

/// The host's decision: marked in the config (or `--mcp-read-only`), or
/// the server's `readOnlyHint` where the host opted in to trust it.
fn is_read_only(config: &ServerConfig, remote: &RemoteTool) -> bool {
    config.read_only.contains(&remote.name)
        || (config.trust_annotations && remote.read_only_hint == Some(true))
}
