//! `--otlp`: the run's spans reach an OTLP/HTTP collector (a loopback
//! receiver here that decodes the protobuf body), in the OpenTelemetry
//! GenAI conventions, nested parent → child, with usage that adds up.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::common::{self, TempDir};

/// A loopback OTLP/HTTP receiver: every span of every `POST /v1/traces`.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&spans);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let sink = Arc::clone(&sink);
                std::thread::spawn(move || serve(stream, &sink));
            }
        });
        Self { url, spans }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (a few seconds at most) until `count` spans have arrived.
    fn wait_for(&self, count: usize) -> Vec<Span> {
        let until = Instant::now() + Duration::from_secs(10);
        while self.spans.lock().unwrap().len() < count && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.spans()
    }
}

/// Serves one connection: requests until the client closes it.
fn serve(stream: std::net::TcpStream, sink: &Mutex<Vec<Span>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let request_line = line.trim().to_owned();
        let mut length = 0usize;
        let mut content_type = String::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "content-type" => content_type = value.trim().to_owned(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        assert_eq!(request_line, "POST /v1/traces HTTP/1.1");
        assert_eq!(content_type, "application/x-protobuf");
        let export = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for resource in export.resource_spans {
            for scope in resource.scope_spans {
                sink.lock().unwrap().extend(scope.spans);
            }
        }
        let _ = writer.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        );
    }
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| value.value.clone())
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Value::StringValue(text)) => Some(text),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Value::IntValue(n)) => Some(n),
        _ => None,
    }
}

fn operation(span: &Span) -> String {
    text(span, "gen_ai.operation.name").unwrap_or_default()
}

/// The spans whose parent is `parent`.
fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|span| span.parent_span_id == parent.span_id)
        .collect()
}

fn count(spans: &[&Span], op: &str) -> usize {
    spans.iter().filter(|span| operation(span) == op).count()
}

/// The one root `invoke_agent` span.
fn root(spans: &[Span]) -> Span {
    let ids: Vec<&Vec<u8>> = spans.iter().map(|span| &span.span_id).collect();
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|span| !ids.contains(&&span.parent_span_id))
        .collect();
    assert_eq!(roots.len(), 1, "one root: {roots:#?}");
    assert_eq!(operation(roots[0]), "invoke_agent");
    roots[0].clone()
}

fn subloop(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(common::bin());
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
        .env_remove("TRACEPARENT");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run subloop")
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The demo: the parent's `invoke_agent` holds its `chat` and
/// `execute_tool` spans; the `task` call's `execute_tool` holds the
/// child's `invoke_agent`, which holds the child's.
#[test]
fn the_demo_exports_its_span_tree() {
    let receiver = Receiver::start();
    let output = subloop(repo(), &["demo", "--otlp", &receiver.url], &[]);
    assert!(output.status.success(), "{output:?}");
    let spans = receiver.spans();
    let root = root(&spans);
    assert_eq!(root.name, "invoke_agent subloop");
    assert_eq!(text(&root, "gen_ai.agent.id").as_deref(), Some("parent"));
    assert_eq!(
        text(&root, "gen_ai.provider.name").as_deref(),
        Some("subloop.demo")
    );
    assert_eq!(text(&root, "subloop.status").as_deref(), Some("answered"));
    let under_root = children(&spans, &root);
    let chats = count(&under_root, "chat");
    let tools = count(&under_root, "execute_tool");
    assert!(
        (chats, tools) == (4, 3),
        "the demo parent makes 4 requests and 3 tool calls: {chats} chat, {tools} execute_tool"
    );
    assert_eq!(int(&root, "subloop.calls"), Some(chats as i64));
    let task = under_root
        .iter()
        .find(|span| text(span, "gen_ai.tool.name").as_deref() == Some("task"))
        .expect("a task call");
    assert_eq!(task.name, "execute_tool task");
    assert!(text(task, "gen_ai.tool.call.id").is_some());
    let child = children(&spans, task);
    assert_eq!(child.len(), 1, "{child:#?}");
    let child = child[0];
    assert_eq!(operation(child), "invoke_agent");
    assert_eq!(child.name, "invoke_agent subloop.task");
    let under_child = children(&spans, child);
    assert_eq!(
        (
            count(&under_child, "chat"),
            count(&under_child, "execute_tool")
        ),
        (3, 2),
        "the demo child: 3 requests, 2 tool calls"
    );
    assert_eq!(
        under_child.len(),
        count(&under_child, "chat") + count(&under_child, "execute_tool")
    );
    for span in &spans {
        assert_eq!(span.trace_id, root.trace_id, "one trace");
        // No content without the opt-in.
        assert!(text(span, "gen_ai.input.messages").is_none());
        assert!(text(span, "gen_ai.output.messages").is_none());
        assert!(text(span, "gen_ai.tool.call.arguments").is_none());
    }
    let chat = under_root
        .iter()
        .find(|span| operation(span) == "chat")
        .unwrap();
    assert_eq!(chat.name, "chat");
    assert_eq!(chat.kind, 3, "chat is a client span");
}

const TWO_TASKS: &str = r#"{
  "parent": [
    {"content": [
        {"type": "tool_use", "id": "p1", "name": "task", "input": {"task": "Read main.py."}},
        {"type": "tool_use", "id": "p2", "name": "task", "input": {"task": "Read expected.txt."}}],
     "stop_reason": "tool_use", "usage": {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 50}},
    {"content": [{"type": "text", "text": "Both read."}], "stop_reason": "end_turn",
     "usage": {"input_tokens": 200, "output_tokens": 20}}
  ],
  "children": [
    [{"content": [{"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "main.py"}}],
      "stop_reason": "tool_use", "usage": {"input_tokens": 7, "output_tokens": 1}},
     {"content": [{"type": "text", "text": "42"}], "stop_reason": "end_turn",
      "usage": {"input_tokens": 8, "output_tokens": 2}}],
    [{"content": [{"type": "text", "text": "expected 42"}], "stop_reason": "end_turn",
      "usage": {"input_tokens": 30, "output_tokens": 3, "cache_creation_input_tokens": 5}}]
  ]
}"#;

fn two_tasks(env: &[(&str, &str)]) -> (Receiver, Vec<Span>) {
    let ws = common::marker_workspace();
    let script = ws.write("two_tasks.json", TWO_TASKS);
    let receiver = Receiver::start();
    let output = subloop(
        ws.path(),
        &[
            "run",
            "--workspace",
            ws.path().to_str().unwrap(),
            "--script",
            script.to_str().unwrap(),
            "--otlp",
            &receiver.url,
        ],
        env,
    );
    assert!(output.status.success(), "{output:?}");
    let spans = receiver.spans();
    (receiver, spans)
}

/// Two subagents started by one reply run side by side: each under its own
/// `task` call; every `invoke_agent` carries its own usage, the parent's
/// also the total with its children.
#[test]
fn two_parallel_subagents_nest_and_their_usage_adds_up() {
    let (_receiver, spans) = two_tasks(&[]);
    let root = root(&spans);
    let under_root = children(&spans, &root);
    assert_eq!(count(&under_root, "chat"), 2);
    assert_eq!(count(&under_root, "execute_tool"), 2);
    // Own usage: all input (cached included), as the conventions count it.
    assert_eq!(int(&root, "gen_ai.usage.input_tokens"), Some(350));
    assert_eq!(int(&root, "gen_ai.usage.output_tokens"), Some(30));
    assert_eq!(int(&root, "gen_ai.usage.cache_read.input_tokens"), Some(50));
    // The total: the parent's and both children's.
    assert_eq!(
        int(&root, "subloop.usage.total_input_tokens"),
        Some(350 + 15 + 35)
    );
    assert_eq!(
        int(&root, "subloop.usage.total_output_tokens"),
        Some(30 + 3 + 3)
    );
    assert_eq!(
        int(&root, "subloop.usage.total_cache_creation_input_tokens"),
        Some(5)
    );
    let mut child_chats = Vec::new();
    for task in under_root
        .iter()
        .filter(|span| operation(span) == "execute_tool")
    {
        let child = children(&spans, task);
        assert_eq!(child.len(), 1);
        assert_eq!(operation(child[0]), "invoke_agent");
        child_chats.push(count(&children(&spans, child[0]), "chat"));
    }
    child_chats.sort();
    assert_eq!(child_chats, vec![1, 2]);
    let first_chat = under_root
        .iter()
        .find(|span| operation(span) == "chat" && int(span, "subloop.call") == Some(1))
        .unwrap();
    assert_eq!(int(first_chat, "gen_ai.usage.input_tokens"), Some(150));
    assert_eq!(
        text(first_chat, "gen_ai.response.finish_reasons").as_deref(),
        Some("tool_use")
    );
}

/// `TRACEPARENT` makes the run part of the caller's trace.
#[test]
fn traceparent_joins_the_callers_trace() {
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let (_receiver, spans) = two_tasks(&[("TRACEPARENT", &format!("00-{trace}-{parent}-01"))]);
    let root = root(&spans);
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(hex(&root.parent_span_id), parent);
    for span in &spans {
        assert_eq!(hex(&span.trace_id), trace);
    }
}

/// Content only with the standard opt-in.
#[test]
fn content_is_recorded_only_when_asked_for() {
    let (_receiver, spans) = two_tasks(&[]);
    assert!(
        spans
            .iter()
            .all(|span| text(span, "gen_ai.input.messages").is_none()
                && text(span, "gen_ai.tool.call.result").is_none())
    );
    let (_receiver, spans) =
        two_tasks(&[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")]);
    let chat = spans.iter().find(|span| operation(span) == "chat").unwrap();
    assert!(
        text(chat, "gen_ai.input.messages").is_some_and(|text| text.contains("main.py")),
        "{:?}",
        chat.attributes
    );
    assert!(text(chat, "gen_ai.output.messages").is_some());
    let read = spans
        .iter()
        .find(|span| text(span, "gen_ai.tool.name").as_deref() == Some("read_file"))
        .unwrap();
    assert!(text(read, "gen_ai.tool.call.arguments").is_some_and(|text| text.contains("main.py")));
    assert!(text(read, "gen_ai.tool.call.result").is_some());
}

/// A run ended by `SIGTERM` (its program sleeping) still exports its spans.
#[test]
fn a_run_ended_by_sigterm_still_exports_its_spans() {
    let ws = TempDir::new("otel-sigterm");
    ws.write("main.py", "import time\ntime.sleep(30)\n");
    let script = ws.write(
        "script.json",
        r#"{"parent": [
            {"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}], "stop_reason": "tool_use"},
            {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}]}"#,
    );
    let receiver = Receiver::start();
    let mut command = Command::new(common::bin());
    common::default_signals(&mut command)
        .args([
            "run",
            "--workspace",
            ws.path().to_str().unwrap(),
            "--script",
            script.to_str().unwrap(),
            "--decision",
            "allow",
            "--run-timeout",
            "60",
            "--otlp",
            &receiver.url,
        ])
        .current_dir(ws.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env("OTEL_BSP_SCHEDULE_DELAY", "50");
    let mut child = command.spawn().unwrap();
    // The first chat span is exported once it ends (after the first reply).
    let first = receiver.wait_for(1);
    assert!(!first.is_empty(), "no span before the signal");
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill on the pid of a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let spans = receiver.spans();
    let root = root(&spans);
    assert_eq!(text(&root, "subloop.status").as_deref(), Some("cancelled"));
    let tool = spans
        .iter()
        .find(|span| text(span, "gen_ai.tool.name").as_deref() == Some("run_main"))
        .expect("the run_main call's span");
    assert_eq!(tool.parent_span_id, root.span_id);
    let _ = HashMap::<(), ()>::new();
}
