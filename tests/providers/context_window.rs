//! A model server with a small context window, on loopback, for both
//! providers and both clients: it refuses every request whose messages
//! take more than a set number of bytes with the provider's own
//! context-window error body. A run that reads more files than fit
//! finishes `answered` with compaction on (the default, and with the
//! model's summaries) and `context_overflow` with it off — not
//! `model_error`, not a hang.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use subloop::StatusKind;
use subloop::providers::anthropic::LiveConfig;
use subloop::providers::http::Timeouts;
use subloop::providers::openai::OpenAiConfig;

use crate::clients::{Anthropic, OpenAi, Taps};
use crate::common::TempDir;
use crate::host::{DecisionMode, Settings, compact::CompactPolicy};
use crate::mock_api::{MockServer, Recorded, Reply};

/// The most bytes of messages the server takes.
const WINDOW: usize = 9_000;
/// The files the model reads, one per request, 3 KB each: all five do not
/// fit together.
const FILES: [&str; 5] = ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"];

fn workspace(dir: &TempDir) -> std::path::PathBuf {
    let root = dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    for (n, name) in FILES.iter().enumerate() {
        let text: String = std::iter::repeat_n(char::from(b'a' + n as u8), 3000).collect();
        std::fs::write(root.join(name), text).unwrap();
    }
    root
}

fn settings(root: &std::path::Path, policy: CompactPolicy) -> Settings {
    let mut settings = Settings::new(root.to_path_buf());
    settings.question = "Read every file and say which letters they hold.".to_owned();
    settings.decision = DecisionMode::Deny;
    settings.progress = false;
    settings.max_calls = 20;
    settings.compact = Some(policy);
    settings
}

/// Which provider's wire the server speaks.
#[derive(Clone, Copy, Debug)]
enum Wire {
    Anthropic,
    OpenAi,
}

/// The server: over `WINDOW` bytes of messages, the provider's refusal;
/// else the next file to read (counted over the files whose content the
/// request holds, whole or cleared), then the answer.
fn server(wire: Wire) -> (MockServer, Arc<Mutex<Vec<usize>>>) {
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&sizes);
    let mut reads = 0;
    let server = MockServer::start(move |request: &Recorded| {
        let body = request.json();
        let bytes = body["messages"].to_string().len();
        seen.lock().unwrap().push(bytes);
        if bytes > WINDOW {
            return Reply::json(400, refusal(wire, bytes));
        }
        // A summary request (its system prompt says so): the summary.
        if body.to_string().contains("You write handoff summaries") {
            return Reply::json(200, summary(wire));
        }
        let next = FILES.get(reads).copied();
        reads += 1;
        Reply::json(200, reply(wire, reads, next, bytes / 4))
    });
    (server, sizes)
}

/// Each provider's real context-window error body.
fn refusal(wire: Wire, bytes: usize) -> Value {
    let tokens = bytes / 4;
    match wire {
        Wire::Anthropic => json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": format!("prompt is too long: {tokens} tokens > {} maximum", WINDOW / 4)}}),
        Wire::OpenAi => {
            json!({"error": {"message": format!("This model's maximum context length is {} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages.", WINDOW / 4),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
        }
    }
}

/// The reply to request `n`: a read of `file`, or the answer; its usage
/// says the prompt took `prompt` tokens.
fn reply(wire: Wire, n: usize, file: Option<&str>, prompt: usize) -> Value {
    let mut reply = match (wire, file) {
        (Wire::Anthropic, Some(file)) => {
            json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant",
            "model": "claude-test", "content": [{"type": "tool_use", "id": format!("toolu_{n}"), "name": "read_file",
            "input": {"path": file}}], "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 10}})
        }
        (Wire::Anthropic, None) => {
            json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant",
            "model": "claude-test", "content": [{"type": "text", "text": "Five files, five letters."}],
            "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 100, "output_tokens": 10}})
        }
        (Wire::OpenAi, Some(file)) => {
            json!({"id": "chatcmpl-x", "object": "chat.completion", "created": 1,
            "model": "gpt-test", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{n}"), "type": "function",
                "function": {"name": "read_file", "arguments": json!({"path": file}).to_string()}}]}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
        }
        (Wire::OpenAi, None) => {
            json!({"id": "chatcmpl-x", "object": "chat.completion", "created": 1,
            "model": "gpt-test", "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "Five files, five letters."}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
        }
    };
    match wire {
        Wire::Anthropic => reply["usage"]["input_tokens"] = json!(prompt),
        Wire::OpenAi => reply["usage"]["prompt_tokens"] = json!(prompt),
    }
    reply
}

fn summary(wire: Wire) -> Value {
    let text = "Read files of one letter each, so far a, b and c.";
    match wire {
        Wire::Anthropic => json!({"id": "msg_s", "type": "message", "role": "assistant",
            "model": "claude-test", "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 300, "output_tokens": 20}}),
        Wire::OpenAi => json!({"id": "chatcmpl-s", "object": "chat.completion", "created": 1,
            "model": "gpt-test", "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320}}),
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(5),
        read: Duration::from_secs(10),
        overall: Duration::from_secs(30),
    }
}

fn run(wire: Wire, url: &str, settings: &Settings) -> subloop::RunReport {
    match wire {
        Wire::Anthropic => {
            let env = |name: &str| match name {
                "ANTHROPIC_API_KEY" => Some("sk-ant-test".to_owned()),
                "ANTHROPIC_BASE_URL" => Some(url.to_owned()),
                _ => None,
            };
            let mut config = LiveConfig::from_env(env, Some("claude-test".to_owned())).unwrap();
            config.timeouts = timeouts();
            Anthropic::new(config, &Taps::default()).run(settings)
        }
        Wire::OpenAi => {
            let base = format!("{url}/v1");
            let env = |name: &str| match name {
                "OPENAI_BASE_URL" => Some(base.clone()),
                _ => None,
            };
            let mut config = OpenAiConfig::from_env(env, Some("gpt-test".to_owned())).unwrap();
            config.timeouts = timeouts();
            OpenAi::new(config, &Taps::default()).run(settings)
        }
    }
}

fn overflowing_run_answers_with_compaction_and_overflows_without(wire: Wire) {
    let dir = TempDir::new("context-window");
    let root = workspace(&dir);

    let (mock, sizes) = server(wire);
    let mut on = settings(&root, CompactPolicy::Auto);
    on.trace = Some(dir.path().join("on.jsonl"));
    let report = run(wire, &mock.url, &on);
    assert_eq!(
        report.outcome.status,
        StatusKind::Answered,
        "{wire:?}: {}",
        report.outcome.text
    );
    let sizes = sizes.lock().unwrap().clone();
    let refused = sizes.iter().filter(|bytes| **bytes > WINDOW).count();
    assert!(refused >= 1, "{wire:?}: {sizes:?}");
    // Each refusal was followed by a compaction and one more try, never
    // by the same request again.
    assert_eq!(
        sizes.len(),
        FILES.len() + 1 + refused,
        "{wire:?}: {sizes:?}"
    );
    let read: Vec<&str> = report.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(read, ["read_file"; 5], "{wire:?}");
    let trace = std::fs::read_to_string(on.trace.as_ref().unwrap()).unwrap();
    assert!(trace.contains("\"kind\":\"compaction\""), "{wire:?}");
    assert!(
        trace.contains("\"error_type\":\"context_window_exceeded\""),
        "{wire:?}"
    );
    let recorded = subloop::record::recorded::RecordedRun::parse(&trace).unwrap();
    let broken: Vec<_> = subloop::record::invariants::Policy::default()
        .check(&recorded)
        .into_iter()
        .filter(|verdict| !verdict.held())
        .collect();
    assert!(broken.is_empty(), "{wire:?}: {broken:?}");

    // The model summarizes instead: the run reads every file and answers,
    // each refusal answered by a summary of the older rounds.
    let (mock, _) = server(wire);
    let mut summarized = settings(&root, CompactPolicy::Summarize);
    summarized.trace = Some(dir.path().join("summarize.jsonl"));
    let report = run(wire, &mock.url, &summarized);
    assert_eq!(
        report.outcome.status,
        StatusKind::Answered,
        "{wire:?}: {}",
        report.outcome.text
    );
    assert_eq!(report.tools.len(), FILES.len(), "{wire:?}");
    let trace = std::fs::read_to_string(summarized.trace.as_ref().unwrap()).unwrap();
    let compactions: Vec<Value> = trace
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|line| line["kind"] == "compaction")
        .collect();
    assert!(!compactions.is_empty(), "{wire:?}");
    assert!(
        compactions
            .iter()
            .all(|line| line["compactor"] == "summarize"),
        "{wire:?}: {compactions:?}"
    );
    assert!(
        mock.recorded().iter().any(|request| request
            .json()
            .to_string()
            .contains("You write handoff summaries")),
        "{wire:?}"
    );

    let (mock, sizes) = server(wire);
    let off = settings(&root, CompactPolicy::Off);
    let report = run(wire, &mock.url, &off);
    assert_eq!(
        report.outcome.status,
        StatusKind::ContextOverflow,
        "{wire:?}"
    );
    assert!(
        report.outcome.text.contains("compaction is off"),
        "{}",
        report.outcome.text
    );
    // The refused request is the last one: asked once.
    let sizes = sizes.lock().unwrap().clone();
    assert_eq!(sizes.iter().filter(|bytes| **bytes > WINDOW).count(), 1);
    assert!(sizes.last().is_some_and(|bytes| *bytes > WINDOW));
}

#[test]
fn anthropic_overflow_is_compacted_or_ends_context_overflow() {
    overflowing_run_answers_with_compaction_and_overflows_without(Wire::Anthropic);
}

#[test]
fn openai_overflow_is_compacted_or_ends_context_overflow() {
    overflowing_run_answers_with_compaction_and_overflows_without(Wire::OpenAi);
}

crate::async_twins!(
    anthropic_overflow_is_compacted_or_ends_context_overflow,
    openai_overflow_is_compacted_or_ends_context_overflow,
);

/// A server that reports its window (`GET /props`, as llama-server does):
/// without `--context-window`, the run takes it from there, records it,
/// and compacts before a request past 80% of it, never refused.
#[test]
fn the_window_a_server_reports_is_used_before_any_refusal() {
    let dir = TempDir::new("context-window-props");
    let root = workspace(&dir);
    let mut reads = 0;
    let props = json!({"default_generation_settings": {"n_ctx": 2000}, "total_slots": 1});
    let mock = MockServer::reporting(props, move |request: &Recorded| {
        let bytes = request.json()["messages"].to_string().len();
        if bytes > WINDOW {
            return Reply::json(400, refusal(Wire::OpenAi, bytes));
        }
        let next = FILES.get(reads).copied();
        reads += 1;
        Reply::json(200, reply(Wire::OpenAi, reads, next, bytes / 4))
    });
    let trace = dir.path().join("props.jsonl");
    let out = std::process::Command::new(crate::common::bin())
        .args([
            "run",
            "--live",
            "--provider",
            "openai",
            "--quiet",
            "--decision",
            "deny",
        ])
        .arg("--workspace")
        .arg(&root)
        .args([
            "--question",
            "Read every file.",
            "--max-calls",
            "20",
            "--trace",
        ])
        .arg(&trace)
        .env("OPENAI_BASE_URL", format!("{}/v1", mock.url))
        .env("OPENAI_MODEL", "gpt-test")
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let first = lines.iter().find(|line| line["kind"] == "request").unwrap();
    assert_eq!(
        first["compaction"],
        json!({"policy": "auto", "context_window": 2000})
    );
    let compactions: Vec<&Value> = lines
        .iter()
        .filter(|line| line["kind"] == "compaction")
        .collect();
    assert!(!compactions.is_empty());
    assert!(compactions.iter().all(|line| line["trigger"] == "auto"));
    assert!(lines.iter().all(|line| line["kind"] != "model_failed"));
}

/// The Messages API's summary block, as a reply begins with it.
fn compaction_block() -> Value {
    json!({"type": "compaction", "content": "Read a.txt and b.txt: one letter each.",
           "encrypted_content": "b3BhcXVl"})
}

/// `--compact native`: the Messages API's own tool-result clearing and
/// compaction. Each request carries both betas and both edits (clearing
/// past 60% of the window, the last 3 tool uses and every `task` report
/// kept; compaction past 80%); what the server cleared, as each reply
/// says, is kept in the trace's `response` line, and its summary block is
/// sent back with every later request, streamed or not. With the other
/// provider it is a usage error.
#[test]
fn native_clearing_is_asked_of_the_messages_api_and_recorded() {
    for stream in [false, true] {
        let dir = TempDir::new("context-window-native");
        let root = workspace(&dir);
        let mut reads = 0;
        let mock = MockServer::start(move |_request: &Recorded| {
            let next = FILES.get(reads).copied();
            reads += 1;
            let mut message = reply(Wire::Anthropic, reads, next, 900 * reads);
            message["context_management"] = json!({"applied_edits": [
                {"type": "clear_tool_uses_20250919", "cleared_tool_uses": reads, "cleared_input_tokens": 700 * reads}]});
            // The third reply begins with the server's summary.
            if reads == 3 {
                let content = message["content"].as_array_mut().unwrap();
                content.insert(0, compaction_block());
            }
            if stream {
                crate::mock_api::Reply::sse(&crate::mock_api::message_events(&message))
            } else {
                Reply::json(200, message)
            }
        });
        let trace = dir.path().join("native.jsonl");
        let mut command = std::process::Command::new(crate::common::bin());
        command
            .args([
                "run",
                "--live",
                "--compact",
                "native",
                "--context-window",
                "10000",
            ])
            .args([
                "--quiet",
                "--decision",
                "deny",
                "--question",
                "Read every file.",
            ])
            .arg("--workspace")
            .arg(&root)
            .arg("--trace")
            .arg(&trace)
            .env("ANTHROPIC_BASE_URL", &mock.url)
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .stdin(std::process::Stdio::null());
        if stream {
            command.arg("--stream");
        }
        let out = command.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let requests = mock.recorded();
        assert_eq!(requests.len(), FILES.len() + 1);
        for (n, request) in requests.iter().enumerate() {
            assert_eq!(
                request.header("anthropic-beta"),
                Some("context-management-2025-06-27,compact-2026-01-12")
            );
            let body = request.json();
            assert_eq!(
                body["context_management"],
                json!({"edits": [{"type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 6000},
                    "keep": {"type": "tool_uses", "value": 3}, "exclude_tools": ["task"]},
                    {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 8000}}]})
            );
            // From the fourth request on, the summary goes back as received.
            let sent_back = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|message| message["content"].as_array().cloned().unwrap_or_default())
                .any(|mut block| {
                    if let Some(object) = block.as_object_mut() {
                        object.remove("cache_control");
                    }
                    block == compaction_block()
                });
            assert_eq!(sent_back, n >= 3, "stream {stream}: request {}", n + 1);
        }
        let responses: Vec<Value> = std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|line| line["kind"] == "response")
            .collect();
        assert_eq!(responses.len(), FILES.len() + 1);
        let view = std::process::Command::new(crate::common::bin())
            .args(["view", "--check"])
            .arg(&trace)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&view.stdout);
        assert_eq!(view.status.code(), Some(0), "{text}");
        assert!(
            text.contains("parent call 3 (4 tools offered) -> tool_use, 2700 in / 10 out tokens (the server summarized the history before it)"),
            "{text}"
        );
        for (n, line) in responses.iter().enumerate() {
            assert_eq!(
                line["response"]["context_management"]["applied_edits"][0]["cleared_tool_uses"],
                n + 1,
                "stream {stream}: {line}"
            );
        }
    }
    let dir = TempDir::new("context-window-native-openai");
    let out = std::process::Command::new(crate::common::bin())
        .args([
            "run",
            "--live",
            "--provider",
            "openai",
            "--model",
            "m",
            "--compact",
            "native",
        ])
        .arg("--workspace")
        .arg(workspace(&dir))
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--compact native"));
}
