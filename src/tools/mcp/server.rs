//! One MCP server over stdio: its process and its client.
//!
//! The process is started by us, not by the SDK, so that it runs in a
//! process group led by `run_main`'s watchdog: it dies with subloop,
//! `SIGKILL` included, and on shutdown the whole group is killed. It gets
//! only the configured environment plus `PATH`, `HOME` and the locale.
//!
//! Started with `McpServer::start`, the client (rmcp) runs on a
//! current-thread tokio runtime on a thread of its own; the rest of subloop
//! talks to it over channels and stays synchronous. Started with
//! `McpServer::start_async` (for async runs), it runs as a task of the
//! caller's tokio runtime, with no thread or runtime of its own, and calls
//! are awaited on the run's own task (`McpServer::call_async`). Each call
//! has a timeout, and gives up when the run is cancelled or its future is
//! dropped; either way the request future is dropped, which sends the
//! server `notifications/cancelled`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::McpError;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RoleClient};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::Value;

use super::config::{ServerConfig, server_env};
use crate::run::harden;
use crate::run::limits::CancelHandle;
use crate::run::process::Watchdog;

/// The stderr lines of a server kept for messages.
const STDERR_LINES: usize = 8;
/// The longest stderr line kept, in bytes.
const STDERR_LINE_BYTES: usize = 300;
/// The most `tools/list` pages a listing follows.
const MAX_PAGES: usize = 100;
/// The most tools a server may list.
pub(crate) const MAX_TOOLS: usize = 1000;

/// How long a server may take to exit after its stdin is closed.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// A tool a server lists, as the wire has it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RemoteTool {
    /// The server's name for it.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its `inputSchema`, unchanged.
    pub input_schema: Value,
    /// The server's `readOnlyHint` annotation, if it gave one.
    pub read_only_hint: Option<bool>,
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallOutcome {
    /// The `tools/call` result, as JSON.
    Result(Value),
    /// A JSON-RPC error.
    RpcError {
        /// The error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// The server is gone: how it ended (`exit status: 3`, or that it
    /// closed its connection), then its last stderr lines, if any.
    Exited {
        /// How it ended.
        status: String,
        /// `; its last stderr lines: …`, or empty.
        stderr: String,
    },
    /// No answer within the timeout; the server was told to cancel.
    TimedOut(Duration),
    /// The run was cancelled while the call was in flight; the server was told.
    Cancelled,
}

/// Told when a server exits before subloop shut it down: the server's
/// name, and how it ended with its last stderr lines. Set once (the CLI
/// sets it when the trace is open, to record the exit).
#[derive(Clone, Default)]
pub struct ExitNotice(Arc<std::sync::OnceLock<Box<Tell>>>);

/// What an [`ExitNotice`] calls: the server, how it ended.
type Tell = dyn Fn(&str, &str) + Send + Sync;

impl ExitNotice {
    /// Sets what is told; a second call does nothing.
    pub fn set(&self, tell: impl Fn(&str, &str) + Send + Sync + 'static) {
        let _ = self.0.set(Box::new(tell));
    }

    fn tell(&self, server: &str, how: &str) {
        if let Some(tell) = self.0.get() {
            tell(server, how);
        }
    }
}

impl std::fmt::Debug for ExitNotice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExitNotice")
            .field("set", &self.0.get().is_some())
            .finish()
    }
}

/// What the server's thread and the rest of subloop share.
#[derive(Debug, Default)]
struct State {
    stderr: Mutex<VecDeque<String>>,
    exited: Mutex<Option<String>>,
    /// Wakes a blocking wait for the exit (see [`State::note_exit`]).
    exit_noted: std::sync::Condvar,
    /// Wakes an async wait for the exit.
    exit_notify: tokio::sync::Notify,
    list_changed: AtomicBool,
    shutting_down: AtomicBool,
    /// Wakes the server's task when its tool list changed (async servers
    /// read the new list right away, see [`McpServer::list`]).
    changed: tokio::sync::Notify,
    /// The list read again after a change, for an async server.
    relisted: Mutex<Option<Result<Vec<RemoteTool>, String>>>,
}

impl State {
    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        if lines.is_empty() {
            String::new()
        } else {
            let joined: Vec<&str> = lines.iter().map(String::as_str).collect();
            format!("; its last stderr lines: {}", joined.join(" | "))
        }
    }

    /// Notes how the server exited and wakes whoever waits for it.
    fn note_exit(&self, message: String) {
        *self.exited.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
        self.exit_noted.notify_all();
        self.exit_notify.notify_waiters();
    }

    fn exit_message(&self) -> Option<String> {
        self.exited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The client side's handler: it notes `notifications/tools/list_changed`.
struct Handler(Arc<State>);

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.0.list_changed.store(true, Ordering::SeqCst);
        self.0.changed.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("subloop", env!("CARGO_PKG_VERSION")),
        )
    }
}

enum Job {
    Call {
        tool: String,
        arguments: serde_json::Map<String, Value>,
        timeout: Duration,
        cancel: CancelHandle,
        reply: std::sync::mpsc::Sender<CallOutcome>,
    },
    List {
        reply: std::sync::mpsc::Sender<Result<Vec<RemoteTool>, String>>,
        timeout: Duration,
    },
    Shutdown,
}

/// A started server. Dropping it shuts the server down: its stdin is
/// closed, it gets half a second to exit, then its process group is killed.
pub(crate) struct McpServer {
    name: String,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    state: Arc<State>,
    /// The thread of a server started with `McpServer::start`.
    thread: Option<std::thread::JoinHandle<()>>,
    /// The client's handle, for calls awaited on the caller's task.
    peer: rmcp::Peer<RoleClient>,
    /// Started with `McpServer::start_async`: a task of the caller's runtime.
    on_caller_runtime: bool,
}

/// What the server's task hands over once it started: its tools and its client's handle.
type Ready = Result<(Vec<RemoteTool>, rmcp::Peer<RoleClient>), McpError>;

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A server being started: [`Starting::wait`] gives it, with its tools.
pub(crate) struct Starting {
    name: String,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    state: Arc<State>,
    thread: std::thread::JoinHandle<()>,
    ready: std::sync::mpsc::Receiver<Ready>,
    /// Sends the cancel's answer to [`Starting::wait`].
    cancelled: std::sync::mpsc::Sender<Ready>,
    timeout: Duration,
}

/// A server being started on the caller's runtime:
/// [`StartingAsync::wait`] gives it, with its tools.
pub(crate) struct StartingAsync {
    name: String,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    state: Arc<State>,
    ready: tokio::sync::oneshot::Receiver<Ready>,
    timeout: Duration,
}

impl McpServer {
    /// Starts `config`'s server (in subloop's working directory, as a
    /// server started by hand would be) on a thread of its own; several can
    /// be started at once, then each [`Starting::wait`]ed for, each within
    /// `timeout` of its start.
    pub fn start(config: &ServerConfig, timeout: Duration, notice: ExitNotice) -> Starting {
        let state = Arc::new(State::default());
        let (jobs, receiver) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let cancelled = ready_tx.clone();
        let thread_state = Arc::clone(&state);
        let name = config.name.clone();
        let config = config.clone();
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = ready_tx.send(Err(McpError::Failed {
                        name: config.name.clone(),
                        message: format!("cannot start its runtime: {err}"),
                        stderr: String::new(),
                    }));
                    return;
                }
            };
            let ready = Box::new(move |ready: Ready| {
                let _ = ready_tx.send(ready);
            });
            runtime.block_on(serve(config, thread_state, receiver, ready, notice, false));
        });
        Starting {
            name,
            jobs,
            state,
            thread,
            ready,
            cancelled,
            timeout,
        }
    }

    /// Starts `config`'s server as a task of the current tokio runtime (no
    /// thread, no runtime of its own), for async runs; then
    /// [`StartingAsync::wait`]. Its calls are awaited with
    /// [`McpServer::call_async`]. Must be called within a tokio runtime
    /// with its I/O and time drivers enabled.
    pub fn start_async(
        config: &ServerConfig,
        timeout: Duration,
        notice: ExitNotice,
    ) -> StartingAsync {
        let state = Arc::new(State::default());
        let (jobs, receiver) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let ready_tx = Box::new(move |ready: Ready| {
            let _ = ready_tx.send(ready);
        });
        tokio::spawn(serve(
            config.clone(),
            Arc::clone(&state),
            receiver,
            ready_tx,
            notice,
            true,
        ));
        StartingAsync {
            name: config.name.clone(),
            jobs,
            state,
            ready,
            timeout,
        }
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// [`McpServer::call`], awaited on the caller's task: the request goes
    /// straight to the client, and dropping the future drops the request,
    /// which tells the server `notifications/cancelled`.
    pub async fn call_async(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        timeout: Duration,
        cancel: &CancelHandle,
    ) -> CallOutcome {
        if self.state.exit_message().is_some() {
            return self.gone_async().await;
        }
        match call(
            &self.peer,
            &self.state,
            tool.to_owned(),
            arguments,
            timeout,
            cancel,
        )
        .await
        {
            CallOutcome::Exited { .. } => self.gone_async().await,
            outcome => outcome,
        }
    }

    /// [`McpServer::gone`], waiting on the runtime's timer.
    async fn gone_async(&self) -> CallOutcome {
        // Woken when the exit is noted; registered before the first look.
        let noted = self.state.exit_notify.notified();
        tokio::pin!(noted);
        noted.as_mut().enable();
        if self.state.exit_message().is_none() {
            let _ = tokio::time::timeout(Duration::from_millis(300), noted).await;
        }
        let status = self
            .state
            .exit_message()
            .unwrap_or_else(|| "it closed its connection".to_owned());
        CallOutcome::Exited {
            status,
            stderr: self.state.stderr_tail(),
        }
    }

    /// Calls `tool` (the server's name for it) with `arguments`.
    pub fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        timeout: Duration,
        cancel: &CancelHandle,
    ) -> CallOutcome {
        if self.state.exit_message().is_some() {
            return self.gone();
        }
        let (reply, answer) = std::sync::mpsc::channel();
        let job = Job::Call {
            tool: tool.to_owned(),
            arguments,
            timeout,
            cancel: cancel.clone(),
            reply,
        };
        if self.jobs.send(job).is_err() {
            return self.gone();
        }
        match answer.recv() {
            Ok(CallOutcome::Exited { .. }) | Err(_) => self.gone(),
            Ok(outcome) => outcome,
        }
    }

    /// Whether the server said its tool list changed since the last
    /// [`McpServer::list`]. For a server started with
    /// `McpServer::start_async`: whether the new list has been read.
    pub fn list_changed(&self) -> bool {
        if self.on_caller_runtime {
            return self
                .state
                .relisted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some();
        }
        self.state.list_changed.load(Ordering::SeqCst)
    }

    /// Lists the server's tools again (`tools/list`, every page), within
    /// `timeout`. A server started with `McpServer::start_async` has read
    /// its new list as soon as it said it changed (a turn boundary never
    /// waits on the run's own runtime): this hands that list over.
    pub fn list(&self, timeout: Duration) -> Result<Vec<RemoteTool>, String> {
        if self.on_caller_runtime {
            return self
                .state
                .relisted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_else(|| Err("the new list has not been read yet".to_owned()));
        }
        self.state.list_changed.store(false, Ordering::SeqCst);
        let (reply, answer) = std::sync::mpsc::channel();
        let gone = |server: &Self| match server.gone() {
            CallOutcome::Exited { status, stderr } => {
                format!("the server exited ({status}){stderr}")
            }
            _ => "the server is gone".to_owned(),
        };
        if self.jobs.send(Job::List { reply, timeout }).is_err() {
            return Err(gone(self));
        }
        // The runtime's own timeout answers first; this one is a backstop.
        answer
            .recv_timeout(timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| Err(gone(self)))
    }

    /// The server is gone: how it ended, with its last stderr lines.
    fn gone(&self) -> CallOutcome {
        // The exit is noted by the server's thread; give it a moment.
        let exited = self.state.exited.lock().unwrap_or_else(|p| p.into_inner());
        let (exited, _) = self
            .state
            .exit_noted
            .wait_timeout_while(exited, Duration::from_millis(300), |exited| {
                exited.is_none()
            })
            .unwrap_or_else(|p| p.into_inner());
        let status = exited
            .clone()
            .unwrap_or_else(|| "it closed its connection".to_owned());
        drop(exited);
        CallOutcome::Exited {
            status,
            stderr: self.state.stderr_tail(),
        }
    }
}

impl Starting {
    /// Waits for the handshake and the tool listing (every page); a
    /// cancelled run (Ctrl-C) stops the wait.
    pub fn wait(self, cancel: &CancelHandle) -> Result<(McpServer, Vec<RemoteTool>), McpError> {
        let name = self.name.clone();
        // A cancel answers the wait itself, at once.
        let (answer, cancelled_name) = (self.cancelled, name.clone());
        let _cancel = cancel.on_cancel(move || {
            let _ = answer.send(Err(McpError::Failed {
                name: cancelled_name.clone(),
                message: "the run was cancelled while it started".to_owned(),
                stderr: String::new(),
            }));
        });
        let ready = self.ready.recv_timeout(self.timeout);
        let stop = Stopper {
            jobs: Some(self.jobs.clone()),
            thread: Some(self.thread),
        };
        match ready {
            Ok(Ok((tools, peer))) => Ok((
                McpServer {
                    name,
                    jobs: self.jobs,
                    state: self.state,
                    thread: stop.defuse(),
                    peer,
                    on_caller_runtime: false,
                },
                tools,
            )),
            Ok(Err(err)) => Err(err),
            Err(_) if cancel.is_cancelled() => Err(McpError::Failed {
                name,
                message: "the run was cancelled while it started".to_owned(),
                stderr: String::new(),
            }),
            Err(_) => Err(McpError::Timeout {
                name,
                secs: self.timeout.as_secs_f64(),
                stderr: self.state.stderr_tail(),
            }),
        }
    }
}

impl StartingAsync {
    /// Waits for the handshake and the tool listing (every page), within
    /// the start timeout; a cancelled run stops the wait, and so does
    /// dropping the future (the server is then shut down).
    pub async fn wait(
        self,
        cancel: &CancelHandle,
    ) -> Result<(McpServer, Vec<RemoteTool>), McpError> {
        let stop = Stopper {
            jobs: Some(self.jobs.clone()),
            thread: None,
        };
        let cancelled = cancel.cancelled();
        let ready = tokio::select! {
            ready = tokio::time::timeout(self.timeout, self.ready) => ready,
            () = cancelled => {
                return Err(McpError::Failed {
                    name: self.name,
                    message: "the run was cancelled while it started".to_owned(),
                    stderr: String::new(),
                });
            }
        };
        match ready {
            Ok(Ok(Ok((tools, peer)))) => {
                stop.defuse();
                Ok((
                    McpServer {
                        name: self.name,
                        jobs: self.jobs,
                        state: self.state,
                        thread: None,
                        peer,
                        on_caller_runtime: true,
                    },
                    tools,
                ))
            }
            Ok(Ok(Err(err))) => Err(err),
            Ok(Err(_)) => Err(McpError::Failed {
                name: self.name,
                message: "its task ended before it started".to_owned(),
                stderr: self.state.stderr_tail(),
            }),
            Err(_) => Err(McpError::Timeout {
                name: self.name,
                secs: self.timeout.as_secs_f64(),
                stderr: self.state.stderr_tail(),
            }),
        }
    }
}

/// Shuts a server down unless defused: a start that failed, timed out or
/// was dropped leaves nothing running.
struct Stopper {
    jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stopper {
    /// The server started: it is the [`McpServer`]'s to shut down.
    fn defuse(mut self) -> Option<std::thread::JoinHandle<()>> {
        self.jobs = None;
        self.thread.take()
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        if let Some(jobs) = self.jobs.take() {
            let _ = jobs.send(Job::Shutdown);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for McpServer {
    /// Asks the server's task to shut down; a server with a thread of its
    /// own is waited for. A server on the caller's runtime shuts down as
    /// its task goes on, or, if the runtime is itself shutting down, as its
    /// task is dropped: its process group is killed either way.
    fn drop(&mut self) {
        let _ = self.jobs.send(Job::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The server's whole life, on its runtime.
async fn serve(
    config: ServerConfig,
    state: Arc<State>,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>,
    ready: Box<dyn FnOnce(Ready) + Send>,
    notice: ExitNotice,
    relist_on_change: bool,
) {
    let name = config.name.clone();
    let failed = |message: String, state: &State| McpError::Failed {
        name: name.clone(),
        message,
        stderr: state.stderr_tail(),
    };
    let cannot_spawn = |source| McpError::Spawn {
        name: name.clone(),
        command: config.command.clone(),
        source,
    };
    let watchdog = match Watchdog::spawn() {
        Ok(watchdog) => watchdog,
        Err(source) => {
            ready(Err(cannot_spawn(source)));
            return;
        }
    };
    let mut command = tokio::process::Command::new(&config.command);
    command
        .args(&config.args)
        .env_clear()
        .envs(server_env(&config.env, std::env::vars()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(watchdog.group());
    // It starts hardened: no descriptor but its stdio, `no_new_privs`, no
    // capability.
    let highest_fd = harden::highest_fd();
    // SAFETY: the closure runs in the forked child before the exec and
    // makes only async-signal-safe calls.
    unsafe {
        command.pre_exec(move || {
            harden::close_inherited_fds(highest_fd);
            harden::drop_privileges()
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(source) => {
            ready(Err(cannot_spawn(source)));
            return;
        }
    };
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(keep_stderr(stderr, Arc::clone(&state)));
    }
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        ready(Err(failed("its stdio could not be opened".into(), &state)));
        return;
    };
    // The handshake and the listing; a shutdown (the start timed out, or
    // setup failed elsewhere) ends them, and the group goes.
    let handshake = async {
        let client = Handler(Arc::clone(&state))
            .serve((stdout, stdin))
            .await
            .map_err(|err| (true, format!("the handshake failed: {err}")))?;
        match list_tools(client.peer()).await {
            Ok(tools) => Ok((client, tools)),
            Err(err) => {
                let _ = client.cancel().await;
                Err((false, err))
            }
        }
    };
    let started = tokio::select! {
        started = handshake => started,
        _ = jobs.recv() => {
            drop(watchdog);
            let _ = child.wait().await;
            return;
        }
    };
    let client = match started {
        Ok((client, tools)) => {
            ready(Ok((tools, client.peer().clone())));
            client
        }
        Err((in_handshake, message)) => {
            let status = if in_handshake {
                exit_status(&mut child).await
            } else {
                None
            };
            let message = match status {
                Some(status) => format!("{message} (it exited: {status})"),
                None => message,
            };
            // Let the stderr reader take the last lines first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            ready(Err(failed(message, &state)));
            drop(watchdog);
            let _ = child.wait().await;
            return;
        }
    };
    // Notes the exit as soon as it happens, so later calls are answered at once.
    let exit_state = Arc::clone(&state);
    let exit_name = name.clone();
    let waiter = tokio::spawn(async move {
        let status = child.wait().await;
        let message = match status {
            Ok(status) => status.to_string(),
            Err(err) => format!("it could not be waited for: {err}"),
        };
        exit_state.note_exit(message.clone());
        if !exit_state.shutting_down.load(Ordering::SeqCst) {
            // Its last stderr lines may still be on their way.
            tokio::time::sleep(Duration::from_millis(50)).await;
            notice.tell(
                &exit_name,
                &format!("{message}{}", exit_state.stderr_tail()),
            );
        }
    });
    let peer = client.peer().clone();
    loop {
        let job = tokio::select! {
            job = jobs.recv() => job,
            () = state.changed.notified(), if relist_on_change => {
                // An async server reads its new list at once, so that a
                // turn boundary only takes it (see `McpServer::list`).
                let peer = peer.clone();
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let listed = list_tools(&peer).await;
                    *state.relisted.lock().unwrap_or_else(|p| p.into_inner()) = Some(listed);
                });
                continue;
            }
        };
        match job {
            Some(Job::Call {
                tool,
                arguments,
                timeout,
                cancel,
                reply,
            }) => {
                let peer = peer.clone();
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let outcome = call(&peer, &state, tool, arguments, timeout, &cancel).await;
                    let _ = reply.send(outcome);
                });
            }
            Some(Job::List { reply, timeout }) => {
                let peer = peer.clone();
                tokio::spawn(async move {
                    let listed = match tokio::time::timeout(timeout, list_tools(&peer)).await {
                        Ok(listed) => listed,
                        Err(_) => Err(format!(
                            "tools/list did not answer within {} s",
                            timeout.as_secs_f64()
                        )),
                    };
                    let _ = reply.send(listed);
                });
            }
            Some(Job::Shutdown) | None => break,
        }
    }
    state.shutting_down.store(true, Ordering::SeqCst);
    // Closing the client closes the server's stdin: it may exit by itself.
    drop(peer);
    let _ = client.cancel().await;
    let _ = tokio::time::timeout(EXIT_GRACE, waiter).await;
    // The group goes, then its leader is reaped.
    drop(watchdog);
}

/// Reads the server's stderr to its end, keeping the last
/// [`STDERR_LINES`] lines, each cut to [`STDERR_LINE_BYTES`] (read as
/// bytes: any bytes, any length, never more than a line's cap held).
async fn keep_stderr(mut stderr: tokio::process::ChildStderr, state: Arc<State>) {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 4096];
    let mut line: Vec<u8> = Vec::new();
    let mut cut = false;
    let push = |line: &mut Vec<u8>, cut: &mut bool| {
        let mut text = crate::core::text::printable(&String::from_utf8_lossy(line));
        if *cut {
            text.push('…');
        }
        let mut kept = state.stderr.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() == STDERR_LINES {
            kept.pop_front();
        }
        kept.push_back(text);
        line.clear();
        *cut = false;
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &byte in chunk.get(..n).unwrap_or_default() {
            if byte == b'\n' {
                push(&mut line, &mut cut);
            } else if line.len() < STDERR_LINE_BYTES {
                line.push(byte);
            } else {
                cut = true;
            }
        }
    }
    if !line.is_empty() {
        push(&mut line, &mut cut);
    }
}

/// The exit status, if the child exited within a moment.
async fn exit_status(child: &mut tokio::process::Child) -> Option<std::process::ExitStatus> {
    tokio::time::timeout(Duration::from_millis(300), child.wait())
        .await
        .ok()?
        .ok()
}

async fn call(
    peer: &rmcp::Peer<RoleClient>,
    state: &State,
    tool: String,
    arguments: serde_json::Map<String, Value>,
    timeout: Duration,
    cancel: &CancelHandle,
) -> CallOutcome {
    let params = CallToolRequestParams::new(tool).with_arguments(arguments);
    let request = peer.call_tool(params);
    let cancelled = cancel.cancelled();
    // Leaving the request unfinished drops it, which sends the server
    // `notifications/cancelled` for it.
    tokio::select! {
        result = tokio::time::timeout(timeout, request) => match result {
            Ok(Ok(result)) => match serde_json::to_value(&result) {
                Ok(value) => CallOutcome::Result(value),
                Err(err) => CallOutcome::RpcError { code: 0, message: format!("the result could not be read: {err}") },
            },
            Ok(Err(ServiceError::McpError(error))) => CallOutcome::RpcError {
                code: i64::from(error.code.0),
                message: error.message.into_owned(),
            },
            Ok(Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                CallOutcome::Exited { status: state.exit_message().unwrap_or_default(), stderr: String::new() }
            }
            Ok(Err(other)) => CallOutcome::RpcError { code: 0, message: other.to_string() },
            Err(_) => CallOutcome::TimedOut(timeout),
        },
        () = cancelled => CallOutcome::Cancelled,
    }
}

/// Every page of `tools/list`, up to [`MAX_PAGES`] pages and [`MAX_TOOLS`] tools.
async fn list_tools(peer: &rmcp::Peer<RoleClient>) -> Result<Vec<RemoteTool>, String> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor);
        let page = peer
            .list_tools(Some(params))
            .await
            .map_err(|err| format!("tools/list failed: {}", describe(&err)))?;
        tools.extend(page.tools.iter().map(remote_tool));
        if tools.len() > MAX_TOOLS {
            return Err(format!("it lists more than {MAX_TOOLS} tools"));
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(format!("its tool list goes on past {MAX_PAGES} pages"))
}

fn describe(err: &ServiceError) -> String {
    match err {
        ServiceError::McpError(error) => format!("error {}: {}", error.code.0, error.message),
        other => other.to_string(),
    }
}

fn remote_tool(tool: &rmcp::model::Tool) -> RemoteTool {
    let value = serde_json::to_value(tool).unwrap_or(Value::Null);
    let text = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    RemoteTool {
        name: text("name"),
        description: text("description"),
        input_schema: value
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        read_only_hint: value
            .get("annotations")
            .and_then(|annotations| annotations.get("readOnlyHint"))
            .and_then(Value::as_bool),
    }
}
