//! A loopback HTTP/1.1 server that plays the Messages API for tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use subloop::Model;
use subloop::ModelResponse;
use subloop::core::protocol::Message;
use subloop::core::protocol::Request;
use subloop::core::protocol::ToolDefinition;
use subloop::providers::demo::{DemoChild, DemoParent};

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub connection: usize,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

/// What the server answers.
pub enum Reply {
    /// A complete response.
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Headers for a stream, then these bytes, then the connection is closed (a cut stream).
    Cut {
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Read the request, then say nothing for this long and close.
    Stall(Duration),
    /// Send headers announcing `declared` body bytes, send `sent`, then stall and close.
    StallBody {
        declared: usize,
        sent: Vec<u8>,
        stall: Duration,
    },
    /// Close the connection without answering.
    Hangup,
    /// A complete 200 event stream, written one event at a time with a pause after each.
    Slow { events: Vec<Vec<u8>>, gap: Duration },
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Self::Full {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let Self::Full { headers, .. } | Self::Cut { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }

    pub fn sse(events: &[(&str, Value)]) -> Self {
        Self::Full {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: sse_body(events),
        }
    }
}

pub fn sse_body(events: &[(&str, Value)]) -> Vec<u8> {
    let mut out = String::new();
    for (name, data) in events {
        out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    }
    out.into_bytes()
}

type Handler = Box<dyn FnMut(&Recorded) -> Reply + Send>;

/// The server; it stops when dropped (after its current connection ends).
pub struct MockServer {
    pub url: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    pub connections: Arc<AtomicUsize>,
}

/// What a `GET` gets (a model server's own endpoints, such as
/// llama-server's `/props`, which a live run asks for its context window):
/// not a model request, so not recorded and not handed to the handler.
type Props = Option<Value>;

impl MockServer {
    pub fn start(handler: impl FnMut(&Recorded) -> Reply + Send + 'static) -> Self {
        Self::start_with(None, handler)
    }

    /// A server that also answers `GET /props` with `props`, as
    /// llama-server does (every other `GET` is a 404).
    pub fn reporting(
        props: Value,
        handler: impl FnMut(&Recorded) -> Reply + Send + 'static,
    ) -> Self {
        Self::start_with(Some(props), handler)
    }

    fn start_with(props: Props, handler: impl FnMut(&Recorded) -> Reply + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Mutex<Handler>> = Arc::new(Mutex::new(Box::new(handler)));
        let (reqs, conns) = (requests.clone(), connections.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let index = conns.fetch_add(1, Ordering::SeqCst);
                let (reqs, handler, props) = (reqs.clone(), handler.clone(), props.clone());
                std::thread::spawn(move || serve(stream, index, &reqs, &handler, props.as_ref()));
            }
        });
        Self {
            url,
            requests,
            connections,
        }
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    connection: usize,
    requests: &Mutex<Vec<Recorded>>,
    handler: &Mutex<Handler>,
    props: Option<&Value>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let method = line.split_whitespace().next().unwrap_or("").to_owned();
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let length: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if method == "GET" {
            let (status, body) = match props.filter(|_| path == "/props") {
                Some(props) => (200, props.to_string()),
                None => (404, r#"{"error": "not found"}"#.to_owned()),
            };
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if writer.write_all(head.as_bytes()).is_err()
                || writer.write_all(body.as_bytes()).is_err()
            {
                return;
            }
            let _ = writer.flush();
            continue;
        }
        let recorded = Recorded {
            path,
            headers,
            body,
            connection,
        };
        requests.lock().unwrap().push(recorded.clone());
        let reply = (handler.lock().unwrap())(&recorded);
        match reply {
            Reply::Full {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                if writer.write_all(head.as_bytes()).is_err() || writer.write_all(&body).is_err() {
                    return;
                }
                let _ = writer.flush();
            }
            Reply::Cut { headers, body } => {
                let mut head = "HTTP/1.1 200 OK\r\nconnection: close\r\n".to_owned();
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = writer.write_all(head.as_bytes());
                let _ = writer.write_all(&body);
                let _ = writer.flush();
                return;
            }
            Reply::Stall(duration) => {
                std::thread::sleep(duration);
                return;
            }
            Reply::StallBody {
                declared,
                sent,
                stall,
            } => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
                );
                let _ = writer.write_all(head.as_bytes());
                let _ = writer.write_all(&sent);
                let _ = writer.flush();
                std::thread::sleep(stall);
                return;
            }
            Reply::Hangup => return,
            Reply::Slow { events, gap } => {
                let length: usize = events.iter().map(Vec::len).sum();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {length}\r\n\r\n"
                );
                if writer.write_all(head.as_bytes()).is_err() {
                    return;
                }
                for event in events {
                    if writer.write_all(&event).is_err() || writer.flush().is_err() {
                        return;
                    }
                    std::thread::sleep(gap);
                }
            }
        }
    }
}

/// A handler that plays the demo: the child model when the system prompt is
/// the child's, the parent model otherwise, answering as the API would.
pub fn demo_handler() -> impl FnMut(&Recorded) -> Reply + Send + 'static {
    let mut parent = DemoParent;
    let mut child = DemoChild;
    let mut count = 0;
    move |recorded| {
        count += 1;
        let body = recorded.json();
        let system = body["system"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let messages: Vec<Message> =
            serde_json::from_value(body["messages"].clone()).expect("messages parse");
        let tools: Vec<ToolDefinition> =
            serde_json::from_value(body["tools"].clone()).unwrap_or_default();
        let request = Request {
            system: &system,
            tools: &tools,
            messages: &messages,
            attachment: None,
            output: None,
        };
        let reply: ModelResponse =
            if system == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM {
                child.respond(&request)
            } else {
                parent.respond(&request)
            }
            .expect("demo models do not fail");
        let mut message = serde_json::to_value(&reply).expect("serializable");
        message["id"] = json!(format!("msg_mock_{count}"));
        message["type"] = json!("message");
        message["role"] = json!("assistant");
        message["model"] = body["model"].clone();
        message["stop_sequence"] = Value::Null;
        message["usage"] = json!({"input_tokens": 100, "output_tokens": 10,
            "cache_creation_input_tokens": 50, "cache_read_input_tokens": 40,
            "cache_creation": {"ephemeral_5m_input_tokens": 50, "ephemeral_1h_input_tokens": 0},
            "service_tier": "standard"});
        Reply::json(200, message)
    }
}

/// The demo handler, answering every request as an event stream (the same
/// messages, cut into the events the API sends).
pub fn demo_stream_handler() -> impl FnMut(&Recorded) -> Reply + Send + 'static {
    let mut plain = demo_handler();
    move |recorded| match plain(recorded) {
        Reply::Full { body, .. } => {
            let message: Value = serde_json::from_slice(&body).expect("the demo reply is JSON");
            Reply::sse(&message_events(&message))
        }
        other => other,
    }
}

/// The stream events of a complete message: `message_start` (everything but
/// the content, output tokens 1), one start/delta/stop per block (text in two
/// pieces, tool input as partial JSON), `message_delta` (stop reason, stop
/// sequence, the output tokens, and `null` for the input figures, as the API's
/// `MessageDeltaUsage` allows), `message_stop`.
pub fn message_events(message: &Value) -> Vec<(&'static str, Value)> {
    let mut start = message.clone();
    // What context editing cleared comes with `message_delta`, as the API sends it.
    let edits = start
        .as_object_mut()
        .and_then(|object| object.remove("context_management"));
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["stop_sequence"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": start}),
    )];
    let blocks = message["content"].as_array().cloned().unwrap_or_default();
    for (index, block) in blocks.iter().enumerate() {
        let mut opened = block.clone();
        let deltas: Vec<Value> = match block["type"].as_str() {
            Some("text") => {
                opened["text"] = json!("");
                let text = block["text"].as_str().unwrap_or_default();
                let cut = text
                    .char_indices()
                    .nth(text.chars().count() / 2)
                    .map_or(0, |(i, _)| i);
                vec![
                    json!({"type": "text_delta", "text": &text[..cut]}),
                    json!({"type": "text_delta", "text": &text[cut..]}),
                ]
            }
            Some("tool_use") => {
                opened["input"] = json!({});
                vec![
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                ]
            }
            _ => Vec::new(),
        };
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": opened}),
        ));
        for delta in deltas {
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
    let mut delta = json!({"type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": {"output_tokens": message["usage"]["output_tokens"], "input_tokens": null,
            "cache_creation_input_tokens": null, "cache_read_input_tokens": null}});
    if let Some(edits) = edits {
        delta["context_management"] = edits;
    }
    events.push(("message_delta", delta));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

/// What one request did with the simulated prompt cache, in bytes of the
/// canonical JSON of its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheUse {
    /// Bytes read from the cache (the longest cached prefix found).
    pub read: usize,
    /// Bytes written to the cache (up to the last breakpoint, past what was read).
    pub written: usize,
    /// Bytes of the whole prompt.
    pub total: usize,
}

/// A model of the API's prompt cache, enough to see which prefix a request
/// would read back: the prompt is tools, then system blocks, then message
/// blocks, in that order; each block carrying `cache_control` is a
/// breakpoint; a request writes the prefix up to each breakpoint, and reads
/// the longest prefix a previous request wrote that ends at one of its own
/// breakpoints or at most 20 blocks before one (the API's lookback).
#[derive(Debug, Default)]
pub struct PromptCache {
    written: std::collections::HashSet<String>,
}

/// The prompt of a request body cut into blocks (without their
/// `cache_control`), each with whether it is a breakpoint.
pub fn prompt_blocks(body: &Value) -> Vec<(String, bool)> {
    let strip = |block: &Value| {
        let mut block = block.clone();
        let marked = block
            .as_object_mut()
            .and_then(|object| object.remove("cache_control"))
            .is_some();
        (block.to_string(), marked)
    };
    let mut blocks = Vec::new();
    for tool in body["tools"].as_array().into_iter().flatten() {
        blocks.push(strip(tool));
    }
    for block in body["system"].as_array().into_iter().flatten() {
        let (text, marked) = strip(block);
        blocks.push((format!("system:{text}"), marked));
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or_default();
        for (index, block) in message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let (text, marked) = strip(block);
            let tag = if index == 0 { role } else { "" };
            blocks.push((format!("{tag}:{text}"), marked));
        }
    }
    blocks
}

impl PromptCache {
    pub fn request(&mut self, body: &Value) -> CacheUse {
        let blocks = prompt_blocks(body);
        let mut prefixes = Vec::with_capacity(blocks.len());
        let mut prefix = String::new();
        for (text, _) in &blocks {
            prefix.push_str(text);
            prefix.push('\u{1e}');
            prefixes.push(prefix.clone());
        }
        let breakpoints: Vec<usize> = blocks
            .iter()
            .enumerate()
            .filter(|(_, (_, marked))| *marked)
            .map(|(index, _)| index)
            .collect();
        let mut read = 0;
        for &point in &breakpoints {
            for candidate in &prefixes[point.saturating_sub(20)..=point] {
                if self.written.contains(candidate) {
                    read = read.max(candidate.len());
                }
            }
        }
        let last = breakpoints.last().map_or(0, |&point| prefixes[point].len());
        for &point in &breakpoints {
            self.written.insert(prefixes[point].clone());
        }
        CacheUse {
            read,
            written: last.saturating_sub(read),
            total: prefix.len(),
        }
    }
}

/// Whether any message of a request body holds a text block after a `tool_result` block.
pub fn text_after_tool_result(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|message| {
            let kinds: Vec<&str> = message["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|block| block["type"].as_str())
                .collect();
            kinds
                .iter()
                .position(|kind| *kind == "tool_result")
                .is_some_and(|first| kinds[first..].contains(&"text"))
        })
}
