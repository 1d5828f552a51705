//! A loopback HTTP/1.1 model server for the concurrency bench: it plays the
//! Anthropic Messages API (`POST /v1/messages`) and the OpenAI Chat
//! Completions API (`POST /v1/chat/completions`) with the demo's offline
//! models (`providers::demo`), on tokio, with keep-alive connections.
//!
//! Each request is read back into a `core::protocol::Request`, answered by
//! `DemoChild` when its system prompt is the child's (`SubagentConfig::CHILD_SYSTEM`) and
//! by `DemoParent` otherwise, and written out as the API's JSON (or its
//! event stream when the body asks for `"stream": true`), after a fixed
//! delay. Every K-th request can be refused with a 429 (`retry-after-ms:
//! 50`) or left unanswered until the client gives up. A request that cannot
//! be read gets a 400 with an error body; nothing a client sends panics.
//! `GET /stats` answers the counters as JSON.
//!
//! Used by `examples/mock_server.rs` (a process of its own),
//! `examples/concurrent.rs` (in-process) and `tests/providers/concurrent_bench.rs`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use subloop::Model;
use subloop::ModelResponse;
use subloop::core::protocol::{
    Block, Message, ReplyBlock, Request, Role, StopReason, ToolDefinition, ToolResultContent,
    ToolUseId,
};
use subloop::providers::demo::{DemoChild, DemoParent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The largest request head (request line and headers) read.
const MAX_HEAD: usize = 64 * 1024;
/// The largest request body read.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// How the server answers.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long each answer is held back (a model's time to reply).
    pub delay: Duration,
    /// Every K-th request is refused with a 429 (`retry-after-ms: 50`); 0: never.
    pub status_429_every: u64,
    /// Every K-th request is never answered (the connection is held until
    /// the client closes it); 0: never.
    pub stall_every: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            delay: Duration::from_millis(100),
            status_429_every: 0,
            stall_every: 0,
        }
    }
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests read (every one, whatever it was answered).
    pub received: AtomicU64,
    /// Model requests answered with a reply (200).
    pub answered: AtomicU64,
    /// Requests refused with a 429.
    pub throttled: AtomicU64,
    /// Requests left unanswered.
    pub stalled: AtomicU64,
    /// Requests answered 400 or 404.
    pub bad: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// The most connections open at once.
    pub peak_open: AtomicU64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub received: u64,
    pub answered: u64,
    pub throttled: u64,
    pub stalled: u64,
    pub bad: u64,
    pub connections: u64,
    pub open: u64,
    pub peak_open: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        Snapshot {
            received: get(&self.received),
            answered: get(&self.answered),
            throttled: get(&self.throttled),
            stalled: get(&self.stalled),
            bad: get(&self.bad),
            connections: get(&self.connections),
            open: get(&self.open),
            peak_open: get(&self.peak_open),
        }
    }
}

impl Snapshot {
    /// The counters as `GET /stats` answers them.
    pub fn to_json(self) -> Value {
        json!({
            "received": self.received, "answered": self.answered,
            "throttled": self.throttled, "stalled": self.stalled, "bad": self.bad,
            "connections": self.connections, "open": self.open, "peak_open": self.peak_open,
        })
    }

    /// Reads what [`Snapshot::to_json`] wrote.
    pub fn from_json(value: &Value) -> Option<Self> {
        let get = |name: &str| value.get(name).and_then(Value::as_u64);
        Some(Self {
            received: get("received")?,
            answered: get("answered")?,
            throttled: get("throttled")?,
            stalled: get("stalled")?,
            bad: get("bad")?,
            connections: get("connections")?,
            open: get("open")?,
            peak_open: get("peak_open")?,
        })
    }

    /// What happened between `earlier` and this snapshot (`open` and
    /// `peak_open` are this snapshot's own).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            received: self.received - earlier.received,
            answered: self.answered - earlier.answered,
            throttled: self.throttled - earlier.throttled,
            stalled: self.stalled - earlier.stalled,
            bad: self.bad - earlier.bad,
            connections: self.connections - earlier.connections,
            open: self.open,
            peak_open: self.peak_open,
        }
    }
}

/// Raises the soft limit of open files to the hard limit (each connection
/// is a descriptor); returns the soft limit now in force.
pub fn raise_nofile_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(limit.rlim_cur)
}

/// A loopback listener on `port` (0: any) with a long accept queue, so a
/// burst of thousands of connections is not dropped (and retried by the
/// kernel a second later); the kernel caps it at `net.core.somaxconn`.
pub fn listen(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    socket.listen(65_535)
}

/// Accepts connections on `listener` and serves each on a task of its own, forever.
pub async fn serve(listener: TcpListener, options: Options, stats: Arc<Stats>) {
    let shared = Arc::new(Shared { options, stats });
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let shared = Arc::clone(&shared);
                shared.stats.connections.fetch_add(1, Ordering::SeqCst);
                let open = shared.stats.open.fetch_add(1, Ordering::SeqCst) + 1;
                shared.stats.peak_open.fetch_max(open, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    connection(stream, &shared).await;
                    shared.stats.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
            // Out of descriptors (or a connection reset before it was
            // accepted): wait a little and go on.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// A server running on a tokio runtime of its own, on a thread of its own;
/// it stops when dropped.
pub struct Running {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its counters.
    pub stats: Arc<Stats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The name of the in-process server's threads (to tell them apart in `/proc/self/task`).
pub const THREAD_NAME: &str = "bench-server";

impl Running {
    /// Starts a server on a loopback port with `threads` worker threads.
    pub fn start(options: Options, threads: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(async { listen(0) })?;
        let url = format!("http://{}", listener.local_addr()?);
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = serve(listener, options, served) => {}
                        _ = stopped => {}
                    }
                });
                // Stalled connections and sleeping answers are dropped.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(Self {
            url,
            stats,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Shared {
    options: Options,
    stats: Arc<Stats>,
}

/// One request as read.
struct Head {
    method: String,
    path: String,
    close: bool,
    length: Option<usize>,
    chunked: bool,
}

/// Why a connection's request could not be read.
enum ReadError {
    /// The connection closed (or failed) between requests or inside one.
    Closed,
    /// The bytes are not a request this server reads: answer 400 and close.
    Bad(String),
}

/// A connection's unread bytes and its stream.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Reads more bytes into the buffer; `Closed` at the end of the stream.
    async fn more(&mut self) -> Result<(), ReadError> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        match self.stream.read_buf(&mut self.buf).await {
            Ok(0) | Err(_) => Err(ReadError::Closed),
            Ok(_) => Ok(()),
        }
    }

    /// Reads up to the end of the next line (CRLF or LF) and takes it, without its end.
    async fn line(&mut self, limit: usize) -> Result<Vec<u8>, ReadError> {
        let mut searched = 0;
        loop {
            if let Some(at) = self.buf[searched..].iter().position(|&b| b == b'\n') {
                let end = searched + at;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            searched = self.buf.len();
            if searched > limit {
                return Err(ReadError::Bad("a line of the request is too long".into()));
            }
            self.more().await?;
        }
    }

    /// Takes the next `n` bytes.
    async fn take(&mut self, n: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < n {
            self.more().await?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads a request head; `Ok(None)` when the connection closed between requests.
    async fn head(&mut self) -> Result<Option<Head>, ReadError> {
        // Empty lines before a request line are ignored (RFC 9112 2.2).
        let request_line = loop {
            match self.line(MAX_HEAD).await {
                Ok(line) if line.is_empty() => continue,
                Ok(line) => break line,
                Err(ReadError::Closed) if self.buf.is_empty() => return Ok(None),
                Err(error) => return Err(error),
            }
        };
        let request_line = String::from_utf8(request_line)
            .map_err(|_| ReadError::Bad("the request line is not UTF-8".into()))?;
        let mut parts = request_line.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ReadError::Bad(format!(
                "not a request line: {:?}",
                request_line.chars().take(80).collect::<String>()
            )));
        };
        let old = match version {
            "HTTP/1.1" => false,
            "HTTP/1.0" => true,
            other => {
                return Err(ReadError::Bad(format!(
                    "unsupported version {:?}",
                    other.chars().take(20).collect::<String>()
                )));
            }
        };
        let mut head = Head {
            method: method.to_owned(),
            path: target.to_owned(),
            close: old,
            length: None,
            chunked: false,
        };
        let mut size = request_line.len();
        loop {
            let line = self.line(MAX_HEAD).await?;
            if line.is_empty() {
                break;
            }
            size += line.len();
            if size > MAX_HEAD {
                return Err(ReadError::Bad("the request head is too long".into()));
            }
            let line = String::from_utf8_lossy(&line);
            let Some((name, value)) = line.split_once(':') else {
                return Err(ReadError::Bad("a header line has no colon".into()));
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    let length = value
                        .parse::<usize>()
                        .map_err(|_| ReadError::Bad("a bad content-length".into()))?;
                    if head.length.is_some_and(|known| known != length) {
                        return Err(ReadError::Bad("two different content-lengths".into()));
                    }
                    head.length = Some(length);
                }
                "transfer-encoding" => {
                    if value.eq_ignore_ascii_case("chunked") {
                        head.chunked = true;
                    } else {
                        return Err(ReadError::Bad(format!(
                            "unsupported transfer-encoding {value:?}"
                        )));
                    }
                }
                "connection" => {
                    let value = value.to_ascii_lowercase();
                    if value.contains("close") {
                        head.close = true;
                    } else if value.contains("keep-alive") {
                        head.close = false;
                    }
                }
                _ => {}
            }
        }
        if head.chunked && head.length.is_some() {
            return Err(ReadError::Bad(
                "both content-length and transfer-encoding".into(),
            ));
        }
        Ok(Some(head))
    }

    /// Reads the body `head` announces.
    async fn body(&mut self, head: &Head) -> Result<Vec<u8>, ReadError> {
        if !head.chunked {
            let length = head.length.unwrap_or(0);
            if length > MAX_BODY {
                return Err(ReadError::Bad("the body is too large".into()));
            }
            return self.take(length).await;
        }
        let mut body = Vec::new();
        loop {
            let line = self.line(1024).await?;
            let text = String::from_utf8_lossy(&line);
            let size = text.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| ReadError::Bad("a bad chunk size".into()))?;
            if body.len() + size > MAX_BODY {
                return Err(ReadError::Bad("the body is too large".into()));
            }
            if size == 0 {
                // Trailers, up to an empty line.
                while !self.line(MAX_HEAD).await?.is_empty() {}
                return Ok(body);
            }
            body.extend(self.take(size).await?);
            if !self.line(2).await?.is_empty() {
                return Err(ReadError::Bad("a chunk is longer than its size".into()));
            }
        }
    }
}

/// Which API a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
}

/// A response to write.
struct Response {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Response {
    fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: body.to_string().into_bytes(),
        }
    }

    fn bytes(&self, close: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            429 => "Too Many Requests",
            _ => "Status",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\ncontent-length: {}\r\n",
            self.status,
            self.body.len()
        );
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        if close {
            out.push_str("connection: close\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// An error body in the API's shape.
fn error_body(api: Api, kind: &str, message: &str) -> Value {
    match api {
        Api::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        Api::OpenAi => json!({"error": {"message": message, "type": kind, "param": null,
            "code": if kind == "rate_limit_error" { json!("rate_limit_exceeded") } else { Value::Null }}}),
    }
}

async fn connection(stream: TcpStream, shared: &Shared) {
    let mut conn = Conn {
        stream,
        buf: Vec::with_capacity(4096),
    };
    loop {
        let read = match conn.head().await {
            Ok(None) => return,
            Ok(Some(head)) => match conn.body(&head).await {
                Ok(body) => Ok((head, body)),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        let (head, body) = match read {
            Ok(request) => request,
            Err(ReadError::Closed) => return,
            Err(ReadError::Bad(message)) => {
                shared.stats.received.fetch_add(1, Ordering::SeqCst);
                shared.stats.bad.fetch_add(1, Ordering::SeqCst);
                let body = error_body(Api::Anthropic, "invalid_request_error", &message);
                let _ = conn
                    .stream
                    .write_all(&Response::json(400, &body).bytes(true))
                    .await;
                return;
            }
        };
        let response = match answer(&head, &body, shared).await {
            Some(response) => response,
            None => {
                // Stalled: hold the connection, reading and dropping
                // whatever comes, until the client closes it.
                let mut sink = [0u8; 1024];
                while matches!(conn.stream.read(&mut sink).await, Ok(n) if n > 0) {}
                return;
            }
        };
        if conn
            .stream
            .write_all(&response.bytes(head.close))
            .await
            .is_err()
            || head.close
        {
            return;
        }
        // A buffer grown by a long body is not kept for an idle connection.
        if conn.buf.is_empty() && conn.buf.capacity() > 64 * 1024 {
            conn.buf = Vec::with_capacity(4096);
        }
    }
}

/// The response to one request; `None`: leave it unanswered.
async fn answer(head: &Head, body: &[u8], shared: &Shared) -> Option<Response> {
    let stats = &shared.stats;
    let options = &shared.options;
    let path = head.path.split('?').next().unwrap_or("");
    let api = match (head.method.as_str(), path) {
        ("GET", "/stats") => {
            return Some(Response::json(200, &stats.snapshot().to_json()));
        }
        ("POST", "/v1/messages") => Api::Anthropic,
        ("POST", "/v1/chat/completions") => Api::OpenAi,
        (method, _) => {
            stats.received.fetch_add(1, Ordering::SeqCst);
            stats.bad.fetch_add(1, Ordering::SeqCst);
            let message = format!(
                "no such endpoint: {method} {}",
                path.chars().take(100).collect::<String>()
            );
            return Some(Response::json(
                404,
                &error_body(Api::Anthropic, "not_found_error", &message),
            ));
        }
    };
    let number = stats.received.fetch_add(1, Ordering::SeqCst) + 1;
    if options.stall_every > 0 && number.is_multiple_of(options.stall_every) {
        stats.stalled.fetch_add(1, Ordering::SeqCst);
        return None;
    }
    if options.status_429_every > 0 && number.is_multiple_of(options.status_429_every) {
        stats.throttled.fetch_add(1, Ordering::SeqCst);
        let message = format!(
            "mock rate limit: every {}th request is refused",
            options.status_429_every
        );
        let mut response = Response::json(429, &error_body(api, "rate_limit_error", &message));
        response.headers.push(("retry-after-ms", "50".into()));
        return Some(response);
    }
    let reply = serde_json::from_slice::<Value>(body)
        .map_err(|err| format!("the body is not JSON: {err}"))
        .and_then(|body| match api {
            Api::Anthropic => anthropic_reply(&body, number),
            Api::OpenAi => openai_reply(&body, number),
        });
    match reply {
        Ok(response) => {
            tokio::time::sleep(options.delay).await;
            stats.answered.fetch_add(1, Ordering::SeqCst);
            Some(response)
        }
        Err(message) => {
            stats.bad.fetch_add(1, Ordering::SeqCst);
            Some(Response::json(
                400,
                &error_body(api, "invalid_request_error", &message),
            ))
        }
    }
}

/// What the demo models answer to a request read back into the crate's types.
fn demo_reply(
    system: &str,
    tools: &[ToolDefinition],
    messages: &[Message],
    attachment: Option<&str>,
) -> Result<ModelResponse, String> {
    if messages.is_empty() {
        return Err("messages is empty".into());
    }
    let request = Request {
        system,
        tools,
        messages,
        attachment,
        // The demo models answer in text; a structured answer is not asked for.
        output: None,
    };
    let reply = if system == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM {
        DemoChild.respond(&request)
    } else {
        DemoParent.respond(&request)
    };
    reply.map_err(|failure| failure.message().to_owned())
}

fn sse_response(events: String) -> Response {
    Response {
        status: 200,
        headers: vec![("content-type", "text/event-stream".into())],
        body: events.into_bytes(),
    }
}

/// Answers a Messages API body.
fn anthropic_reply(body: &Value, number: u64) -> Result<Response, String> {
    let (system, attachment) = match &body["system"] {
        Value::String(text) => (text.clone(), None),
        Value::Array(blocks) => {
            let text = |index: usize| {
                blocks
                    .get(index)
                    .and_then(|block| block["text"].as_str())
                    .map(str::to_owned)
            };
            (text(0).unwrap_or_default(), text(1))
        }
        _ => (String::new(), None),
    };
    let messages: Vec<Message> = serde_json::from_value(body["messages"].clone())
        .map_err(|err| format!("messages: {err}"))?;
    let tools: Vec<ToolDefinition> = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(tools) => {
            serde_json::from_value(tools.clone()).map_err(|err| format!("tools: {err}"))?
        }
    };
    let reply = demo_reply(&system, &tools, &messages, attachment.as_deref())?;
    let mut message = serde_json::to_value(&reply).map_err(|err| err.to_string())?;
    message["id"] = json!(format!("msg_bench_{number}"));
    message["type"] = json!("message");
    message["role"] = json!("assistant");
    message["model"] = body["model"].clone();
    message["stop_sequence"] = Value::Null;
    message["usage"] = json!({"input_tokens": 100, "output_tokens": 10,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
    if body["stream"] == true {
        let mut out = String::new();
        for (name, data) in message_events(&message) {
            out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        }
        return Ok(sse_response(out));
    }
    Ok(Response::json(200, &message))
}

/// The stream events of a complete message, as the Messages API sends them.
fn message_events(message: &Value) -> Vec<(&'static str, Value)> {
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": start}),
    )];
    let blocks = message["content"].as_array().cloned().unwrap_or_default();
    for (index, block) in blocks.iter().enumerate() {
        let mut opened = block.clone();
        let delta = match block["type"].as_str() {
            Some("text") => {
                opened["text"] = json!("");
                Some(json!({"type": "text_delta", "text": block["text"]}))
            }
            Some("tool_use") => {
                opened["input"] = json!({});
                Some(
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                )
            }
            _ => None,
        };
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": opened}),
        ));
        if let Some(delta) = delta {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push((
        "message_delta",
        json!({"type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null},
            "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

/// A message's text: a string, or the text of an array of parts.
fn content_text(content: &Value) -> Result<String, String> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect()),
        _ => Err("a message's content is neither text nor parts".into()),
    }
}

/// Answers a Chat Completions body.
fn openai_reply(body: &Value, number: u64) -> Result<Response, String> {
    let mut system = None;
    let mut attachment = None;
    let mut messages: Vec<Message> = Vec::new();
    let wire = body["messages"]
        .as_array()
        .ok_or("messages is not an array")?;
    for message in wire {
        let text = content_text(&message["content"])?;
        match message["role"].as_str() {
            Some("system" | "developer") if system.is_none() => system = Some(text),
            Some("system" | "developer") => attachment = Some(text),
            Some("user") => messages.push(Message::user_text(text)),
            Some("assistant") => {
                let mut content = Vec::new();
                if !text.is_empty() {
                    content.push(Block::text(text));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
                    let input = match serde_json::from_str::<Value>(arguments) {
                        Ok(object @ Value::Object(_)) => object,
                        _ => Value::String(arguments.to_owned()),
                    };
                    let id = call["id"].as_str().ok_or("a tool call without an id")?;
                    let name = call["function"]["name"]
                        .as_str()
                        .ok_or("a tool call without a name")?;
                    content.push(Block::tool_use(id, name, input));
                }
                messages.push(Message {
                    role: Role::Assistant,
                    content,
                });
            }
            Some("tool") => {
                let id = message["tool_call_id"]
                    .as_str()
                    .ok_or("a tool message without tool_call_id")?;
                let block = Block::ToolResult {
                    tool_use_id: ToolUseId::new(id),
                    content: ToolResultContent::Text(text.into()),
                    is_error: false,
                };
                match messages.last_mut() {
                    Some(last)
                        if last.role == Role::User
                            && matches!(last.content.first(), Some(Block::ToolResult { .. })) =>
                    {
                        last.content.push(block);
                    }
                    _ => messages.push(Message {
                        role: Role::User,
                        content: vec![block],
                    }),
                }
            }
            other => return Err(format!("unexpected role {other:?}")),
        }
    }
    let tools: Vec<ToolDefinition> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|tool| {
            Ok(ToolDefinition {
                name: tool["function"]["name"]
                    .as_str()
                    .ok_or("a tool without a name")?
                    .to_owned(),
                description: tool["function"]["description"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                input_schema: tool["function"]["parameters"].clone(),
            })
        })
        .collect::<Result<_, String>>()?;
    let system = system.unwrap_or_default();
    let reply = demo_reply(&system, &tools, &messages, attachment.as_deref())?;
    let completion = completion(&reply, &format!("chatcmpl-bench-{number}"), &body["model"]);
    if body["stream"] == true {
        let mut out: String = chunks(&completion)
            .iter()
            .map(|chunk| format!("data: {chunk}\n\n"))
            .collect();
        out.push_str("data: [DONE]\n\n");
        return Ok(sse_response(out));
    }
    Ok(Response::json(200, &completion))
}

/// A crate reply as a `chat.completion` body.
fn completion(reply: &ModelResponse, id: &str, model: &Value) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in &reply.content {
        match block {
            ReplyBlock::Known(Block::Text { text: piece }) => text.push_str(piece),
            ReplyBlock::Known(Block::ToolUse { id, name, input }) => calls.push(json!({
                "id": id, "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
            _ => {}
        }
    }
    let finish = match reply.stop_reason {
        Some(StopReason::ToolUse) => "tool_calls",
        _ => "stop",
    };
    let content = if text.is_empty() {
        Value::Null
    } else {
        json!(text)
    };
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": id, "object": "chat.completion", "created": 1_760_000_000, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    })
}

/// A `chat.completion` as the chunks a server streams: the role, the text,
/// each call (its id and name, then its arguments), the finish reason, the usage.
fn chunks(completion: &Value) -> Vec<Value> {
    let head = |choices: Value| {
        json!({"id": completion["id"], "object": "chat.completion.chunk",
               "created": completion["created"], "model": completion["model"],
               "choices": choices, "usage": null})
    };
    let delta = |delta: Value| head(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    let message = &completion["choices"][0]["message"];
    let mut out = vec![delta(json!({"role": "assistant", "content": ""}))];
    if let Some(text) = message["content"].as_str() {
        out.push(delta(json!({"content": text})));
    }
    for (index, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        out.push(delta(
            json!({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}]}),
        ));
        out.push(delta(
            json!({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}),
        ));
    }
    out.push(head(json!([{"index": 0, "delta": {},
        "finish_reason": completion["choices"][0]["finish_reason"]}])));
    let mut last = head(json!([]));
    last["usage"] = completion["usage"].clone();
    out.push(last);
    out
}
