//! The live client against a loopback mock of the Messages API.

use crate::common;
use crate::mock_api;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::host::{self, DecisionMode, Models};
use mock_api::{MockServer, Recorded, Reply, demo_handler, sse_body};
use serde_json::{Value, json};
use subloop::ModelResponse;
use subloop::StatusKind;
use subloop::core::error::FailureKind;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::ReplyBlock;
use subloop::core::protocol::Request;
use subloop::core::protocol::StopReason;
use subloop::core::protocol::ToolDefinition;
use subloop::providers::anthropic::LiveConfig;
use subloop::providers::http::ApiKey;
use subloop::providers::http::ConfigError;
use subloop::providers::http::Timeouts;

use crate::clients::{Anthropic, Taps};

const KEY: &str = "sk-test-SECRET-0123456789";

fn config(base_url: &str) -> LiveConfig {
    let env = |name: &str| match name {
        "ANTHROPIC_API_KEY" => Some(KEY.to_owned()),
        "ANTHROPIC_BASE_URL" => Some(base_url.to_owned()),
        _ => None,
    };
    let mut config = LiveConfig::from_env(env, Some("claude-test".to_owned())).expect("config");
    config.timeouts = Timeouts {
        connect: Duration::from_secs(5),
        read: Duration::from_secs(10),
        overall: Duration::from_secs(30),
    };
    config
}

/// A client whose retry waits are recorded, not slept.
fn client(config: LiveConfig) -> (Anthropic, Arc<Mutex<Vec<Duration>>>) {
    let taps = Taps::default();
    (Anthropic::new(config, &taps), taps.sleeps)
}

fn one_request(client: &Anthropic) -> Result<ModelResponse, subloop::core::error::ModelFailure> {
    let messages = [Message::user_text("hi")];
    client.send(&Request {
        system: "sys",
        tools: &[],
        messages: &messages,
        attachment: None,
        output: None,
    })
}

fn demo_run(decision: DecisionMode) -> (subloop::RunReport, Vec<Recorded>, usize) {
    let server = MockServer::start(demo_handler());
    let (client, _) = client(config(&server.url));
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.decision = decision;
    settings.progress = false;
    let report = client.run(&settings);
    let connections = server.connections.load(std::sync::atomic::Ordering::SeqCst);
    (report, server.recorded(), connections)
}

fn offline_text(decision: DecisionMode) -> String {
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.decision = decision;
    settings.progress = false;
    host::execute(&settings, Models::Demo)
        .expect("offline run")
        .outcome
        .text
}

fn check_demo_requests(recorded: &[Recorded]) {
    assert_eq!(recorded.len(), 7, "parent 4 + child 3");
    let (mut parent, mut child) = (Vec::new(), Vec::new());
    for request in recorded {
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(request.header("x-api-key"), Some(KEY));
        assert_eq!(
            request.header("anthropic-version"),
            Some(LiveConfig::API_VERSION)
        );
        assert_eq!(request.header("content-type"), Some("application/json"));
        for (name, value) in &request.headers {
            if name != "x-api-key" {
                assert!(!value.contains(KEY), "key leaked into header {name}");
            }
        }
        assert!(
            !String::from_utf8_lossy(&request.body).contains(KEY),
            "key leaked into a body"
        );
        let body = request.json();
        assert_eq!(body["model"], "claude-test");
        assert_eq!(
            body["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        let blocks = last["content"].as_array().unwrap();
        assert!(
            blocks
                .iter()
                .any(|b| b["cache_control"] == json!({"type": "ephemeral"}))
        );
        if body["system"][0]["text"] == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM {
            child.push(body);
        } else {
            parent.push(body);
        }
    }
    assert_eq!(parent.len(), 4);
    assert_eq!(child.len(), 3);
    for body in &child {
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["read_file"]);
    }
    assert_eq!(
        child[0]["messages"].as_array().unwrap().len(),
        1,
        "the child starts from [user: task]"
    );
    for body in &parent {
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["read_file", "run_main", "todo_write", "task"]);
        assert_ne!(
            body["system"][0]["text"],
            subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM
        );
    }
    // Every tool_result of the parent answers the id of the call just before it.
    let last = parent.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .clone();
    for pair in last.windows(2) {
        if pair[0]["role"] == "assistant" {
            let asked: Vec<&Value> = pair[0]["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| &b["id"])
                .collect();
            let answered: Vec<&Value> = pair[1]["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| &b["tool_use_id"])
                .collect();
            assert_eq!(asked, answered);
        }
    }
    assert_eq!(last[2]["content"][0]["tool_use_id"], "toolu_parent_1");
}

#[test]
fn demo_allow_makes_seven_requests_and_matches_the_offline_answer() {
    let (report, recorded, connections) = demo_run(DecisionMode::Allow);
    check_demo_requests(&recorded);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.outcome.calls, 4);
    assert_eq!(report.children.len(), 1);
    assert_eq!(report.children[0].outcome.calls, 3);
    assert_eq!(report.outcome.text, offline_text(DecisionMode::Allow));
    assert!(report.outcome.text.contains("matches"));
    assert_eq!(connections, 1, "one connection is reused across the run");
    // usage: 4 parent replies of 100/10/50/40, 3 child replies
    assert_eq!(report.usage_per_call.len(), 4);
    assert_eq!(report.outcome.usage.input_tokens, 400);
    assert_eq!(report.outcome.usage.cache_read_input_tokens, 160);
    assert_eq!(report.total_usage().output_tokens, 70);
    let json = report.to_json();
    assert_eq!(json["usage"]["total"]["cache_creation_input_tokens"], 350);
    assert_eq!(
        json["children"][0]["usage"]["per_call"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn demo_deny_makes_seven_requests_and_matches_the_offline_answer() {
    let (report, recorded, _) = demo_run(DecisionMode::Deny);
    check_demo_requests(&recorded);
    assert_eq!(report.outcome.calls, 4);
    assert_eq!(report.outcome.text, offline_text(DecisionMode::Deny));
    assert!(report.outcome.text.contains("not run"));
}

#[test]
fn demo_live_through_the_binary_gives_the_offline_answer() {
    let server = MockServer::start(demo_handler());
    let run = |live: bool| {
        let mut command = Command::new(common::bin());
        command.args(["demo", "--decision", "allow", "--json", "--quiet"]);
        if live {
            command.arg("--live");
        }
        let output = command
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("ANTHROPIC_API_KEY", KEY)
            .env("ANTHROPIC_BASE_URL", &server.url)
            .env_remove("ANTHROPIC_MODEL")
            .stdin(Stdio::null())
            .output()
            .expect("run binary");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!String::from_utf8_lossy(&output.stderr).contains(KEY));
        serde_json::from_slice::<Value>(&output.stdout).expect("one JSON object")
    };
    let (live, offline) = (run(true), run(false));
    let trace = common::TempDir::new("live-trace");
    let trace_path = trace.path().join("trace.jsonl");
    let traced = Command::new(common::bin())
        .args(["demo", "--live", "--decision", "deny", "--quiet", "--trace"])
        .arg(&trace_path)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("ANTHROPIC_API_KEY", KEY)
        .env("ANTHROPIC_BASE_URL", &server.url)
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    assert_eq!(traced.status.code(), Some(0));
    let text = std::fs::read_to_string(&trace_path).expect("trace written");
    assert!(text.lines().count() > 7 && text.contains("\"kind\":\"request\""));
    assert!(!text.contains(KEY), "the key reached the trace");
    assert_eq!(live["text"], offline["text"]);
    assert_eq!(live["calls"], 4);
    assert_eq!(live["children"][0]["calls"], 3);
    assert_eq!(
        server.recorded().len(),
        14,
        "7 for the json run, 7 for the traced run"
    );
    assert_eq!(server.recorded()[0].json()["model"], "claude-sonnet-4-5");
}

#[test]
fn a_missing_key_is_a_one_line_error_with_exit_2() {
    let output = Command::new(common::bin())
        .args(["demo", "--live"])
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ANTHROPIC_API_KEY"));
    assert!(output.stdout.is_empty());
    let both = Command::new(common::bin())
        .args(["run", "--live", "--script", "x.json", "--workspace", "."])
        .env("ANTHROPIC_API_KEY", KEY)
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    assert_eq!(both.status.code(), Some(2));
    assert_eq!(
        LiveConfig::from_env(|_| None, None).err(),
        Some(ConfigError::MissingKey)
    );
}

#[test]
fn a_429_is_retried_honouring_retry_after() {
    let mut first = true;
    let server = MockServer::start(move |_| {
        if std::mem::take(&mut first) {
            Reply::json(429, json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}))
                .with_header("retry-after", "3")
        } else {
            Reply::json(
                200,
                json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}),
            )
        }
    });
    let (client, sleeps) = client(config(&server.url));
    let reply = one_request(&client).expect("second attempt succeeds");
    assert_eq!(reply, ModelResponse::answer("ok"));
    assert_eq!(server.recorded().len(), 2);
    assert_eq!(*sleeps.lock().unwrap(), [Duration::from_secs(3)]);
}

#[test]
fn retry_after_ms_wins_and_overlong_retry_after_falls_back_to_backoff() {
    let mut n = 0;
    let server = MockServer::start(move |_| {
        n += 1;
        match n {
            1 => Reply::json(503, json!({}))
                .with_header("retry-after-ms", "120")
                .with_header("retry-after", "9"),
            2 => Reply::json(503, json!({})).with_header("retry-after", "3600"),
            _ => Reply::json(
                200,
                json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}),
            ),
        }
    });
    let (client, sleeps) = client(config(&server.url));
    one_request(&client).expect("third attempt succeeds");
    let sleeps = sleeps.lock().unwrap().clone();
    assert_eq!(sleeps[0], Duration::from_millis(120));
    assert!(
        sleeps[1] >= Duration::from_millis(750) && sleeps[1] <= Duration::from_secs(1),
        "{:?}",
        sleeps[1]
    );
}

#[test]
fn a_529_three_times_gives_up_after_the_retries() {
    let server = MockServer::start(|_| {
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        )
    });
    let (client, sleeps) = client(config(&server.url));
    let failure = one_request(&client).expect_err("gives up");
    assert_eq!(server.recorded().len(), 3, "1 try + 2 retries");
    assert_eq!(sleeps.lock().unwrap().len(), 2);
    assert_eq!(failure.kind(), Some(&FailureKind::Overloaded));
    assert!(
        failure.message().contains("Overloaded") && failure.message().contains("529"),
        "{}",
        failure.message()
    );
}

#[test]
fn a_400_is_not_retried_and_x_should_retry_false_is_obeyed() {
    for (status, header) in [
        (400, None),
        (401, None),
        (403, None),
        (404, None),
        (413, None),
        (500, Some("false")),
    ] {
        let server = MockServer::start(move |_| {
            let reply = Reply::json(
                status,
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
            );
            match header {
                Some(value) => reply.with_header("x-should-retry", value),
                None => reply,
            }
        });
        let (client, sleeps) = client(config(&server.url));
        let failure = one_request(&client).expect_err("fails");
        assert_eq!(server.recorded().len(), 1, "status {status} was retried");
        assert!(sleeps.lock().unwrap().is_empty());
        assert_eq!(failure.kind(), Some(&FailureKind::InvalidRequest));
    }
    // x-should-retry: true makes a 400 retryable.
    let mut n = 0;
    let server = MockServer::start(move |_| {
        n += 1;
        if n == 1 {
            Reply::json(400, json!({})).with_header("x-should-retry", "true")
        } else {
            Reply::json(
                200,
                json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}),
            )
        }
    });
    let (client, _) = client(config(&server.url));
    assert!(one_request(&client).is_ok());
}

#[test]
fn bodies_that_are_not_messages_are_model_errors() {
    for (body, kind) in [
        (b"<html>oops</html>".to_vec(), "invalid_response"),
        (br#"{"hello": "world"}"#.to_vec(), "invalid_response"),
        (br#"[1, 2]"#.to_vec(), "invalid_response"),
        (
            br#"{"type": "error", "error": {"type": "api_error", "message": "boom"}}"#.to_vec(),
            "api_error",
        ),
    ] {
        let reply_body = body.clone();
        let server = MockServer::start(move |_| Reply::Full {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: reply_body.clone(),
        });
        let (client, _) = client(config(&server.url));
        let failure = one_request(&client).expect_err("not a message");
        assert_eq!(
            failure.kind().map(FailureKind::as_str),
            Some(kind),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
}

fn stream_events() -> Vec<(&'static str, Value)> {
    vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m", "stop_reason": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"pa"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "th\": \"main.py\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 30}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
}

fn streaming(url: &str) -> (Anthropic, Arc<Mutex<Vec<String>>>) {
    let mut config = config(url);
    config.stream = true;
    let taps = Taps::showing();
    let client = Anthropic::new(config, &taps);
    (client, taps.shown.expect("a sink"))
}

#[test]
fn a_stream_assembles_the_same_reply_as_a_plain_call() {
    let server = MockServer::start(|_| Reply::sse(&stream_events()));
    let (client, shown) = streaming(&server.url);
    let reply = one_request(&client).expect("stream");
    assert_eq!(server.recorded()[0].json()["stream"], true);
    assert_eq!(reply.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(
        reply.content,
        vec![
            ReplyBlock::Known(Block::text("Let me check.")),
            ReplyBlock::Known(Block::tool_use(
                "toolu_9",
                "read_file",
                json!({"path": "main.py"})
            )),
        ]
    );
    let usage = reply.usage.expect("usage");
    assert_eq!((usage.input_tokens, usage.output_tokens), (25, 30));
    assert_eq!(
        shown.lock().unwrap().concat(),
        "Let me check.\n",
        "the text ends its line"
    );
}

#[test]
fn a_stream_cut_before_message_stop_is_a_model_error() {
    let mut events = stream_events();
    events.truncate(8);
    let body = sse_body(&events);
    let server = MockServer::start(move |_| Reply::Cut {
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: body.clone(),
    });
    let (client, _) = streaming(&server.url);
    let failure = one_request(&client).expect_err("cut stream");
    assert_eq!(failure.kind(), Some(&FailureKind::Stream));
    assert!(
        failure.message().contains("message_stop"),
        "{}",
        failure.message()
    );
}

#[test]
fn an_error_event_inside_a_200_stream_is_an_api_error() {
    let mut events = stream_events();
    events.truncate(4);
    events.push((
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    let server = MockServer::start(move |_| Reply::sse(&events));
    let (client, _) = streaming(&server.url);
    let failure = one_request(&client).expect_err("error event");
    assert_eq!(failure.kind(), Some(&FailureKind::Overloaded));
}

#[test]
fn a_stalled_server_trips_the_read_timeout_and_is_not_asked_again() {
    let server = MockServer::start(|_| Reply::Stall(Duration::from_secs(20)));
    let mut config = config(&server.url);
    config.timeouts.read = Duration::from_millis(300);
    config.retry.max_retries = 1;
    let (client, sleeps) = client(config);
    let failure = one_request(&client).expect_err("times out");
    assert_eq!(
        failure.kind(),
        Some(&FailureKind::Timeout),
        "{}",
        failure.message()
    );
    // The request was sent: the server may still be generating the reply,
    // so it is not sent again, and the error says what to change.
    assert_eq!(
        server.recorded().len(),
        1,
        "a response timeout is not retried"
    );
    assert!(sleeps.lock().unwrap().is_empty());
    for remedy in ["stream the reply", "fewer tokens", "a longer read timeout"] {
        assert!(failure.message().contains(remedy), "{}", failure.message());
    }
}

#[test]
fn a_stall_in_the_middle_of_a_body_is_retried() {
    let mut first = true;
    let server = MockServer::start(move |_| {
        if std::mem::take(&mut first) {
            Reply::StallBody {
                declared: 500,
                sent: br#"{"content": [{"type": "te"#.to_vec(),
                stall: Duration::from_secs(5),
            }
        } else {
            Reply::json(
                200,
                json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}),
            )
        }
    });
    let mut config = config(&server.url);
    config.timeouts.read = Duration::from_millis(300);
    let (client, sleeps) = client(config);
    assert_eq!(
        one_request(&client).expect("retried after the stall"),
        ModelResponse::answer("ok")
    );
    assert_eq!(server.recorded().len(), 2);
    assert_eq!(sleeps.lock().unwrap().len(), 1);
}

#[test]
fn a_dropped_connection_is_retried() {
    let mut first = true;
    let server = MockServer::start(move |_| {
        if std::mem::take(&mut first) {
            Reply::Hangup
        } else {
            Reply::json(
                200,
                json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}),
            )
        }
    });
    let (client, _) = client(config(&server.url));
    assert_eq!(
        one_request(&client).expect("retried"),
        ModelResponse::answer("ok")
    );
    assert_eq!(server.recorded().len(), 2);
}

/// A loopback server that answers `replies` (status, JSON body) in order
/// and records what it was sent; the client of this thread's driver on it.
fn fake(replies: Vec<(u16, String)>) -> (Anthropic, MockServer) {
    let mut replies = std::collections::VecDeque::from(replies);
    let server = MockServer::start(move |_| match replies.pop_front() {
        Some((status, body)) => Reply::Full {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into_bytes(),
        },
        None => Reply::Hangup,
    });
    let (client, _) = client(config(&server.url));
    (client, server)
}

#[test]
fn the_request_body_is_exactly_the_messages_api_body_with_cache_breakpoints() {
    let (client, server) = fake(vec![(
        200,
        json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}).to_string(),
    )]);
    let tools = [
        ToolDefinition {
            name: "a".into(),
            description: "A".into(),
            input_schema: json!({"type": "object"}),
        },
        ToolDefinition {
            name: "b".into(),
            description: "B".into(),
            input_schema: json!({"type": "object"}),
        },
    ];
    let messages: Vec<Message> = serde_json::from_value(json!([
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "t1", "name": "a", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]}
    ]))
    .unwrap();
    let request = Request {
        system: "be brief",
        tools: &tools,
        messages: &messages,
        attachment: Some("Current plan: x"),
        output: None,
    };
    client.send(&request).expect("ok");
    let sent = server.recorded();
    let (headers, body) = (sent[0].headers.clone(), sent[0].json());
    let eph = json!({"type": "ephemeral"});
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "system": [
                {"type": "text", "text": "be brief", "cache_control": eph},
                {"type": "text", "text": "Current plan: x"}
            ],
            "tools": [
                {"name": "a", "description": "A", "input_schema": {"type": "object"}},
                {"name": "b", "description": "B", "input_schema": {"type": "object"}, "cache_control": eph}
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "question"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "t1", "name": "a", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "done", "cache_control": eph}]}
            ]
        })
    );
    // The protocol's headers, in its order, among the transport's own.
    let ours = ["x-api-key", "anthropic-version", "content-type", "accept"];
    let names: Vec<String> = headers
        .iter()
        .map(|(k, _)| k.to_ascii_lowercase())
        .filter(|k| ours.contains(&k.as_str()))
        .collect();
    assert_eq!(names, ours);
}

#[test]
fn fixture_response_bodies_round_trip() {
    let fixtures = [
        json!({"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}),
        json!({"id": "msg_02", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "Reading."}, {"type": "tool_use", "id": "toolu_01A", "name": "read_file", "input": {"path": "main.py"}}], "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 20, "output_tokens": 9}}),
        json!({"id": "msg_03", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [{"type": "thinking", "thinking": "Let me think", "signature": "EqQBCgIYAhIM"}, {"type": "text", "text": "42"}], "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 7}}),
        json!({"id": "msg_04", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "The answer is"}], "stop_reason": "max_tokens", "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}),
        json!({"id": "msg_05", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": "refusal", "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 0}}),
    ];
    let replies = fixtures.iter().map(|f| (200, f.to_string())).collect();
    let (client, _server) = fake(replies);
    for fixture in &fixtures {
        let reply = one_request(&client).expect("a message");
        let back = serde_json::to_value(&reply).unwrap();
        assert_eq!(back["content"], fixture["content"]);
        assert_eq!(back["stop_reason"], fixture["stop_reason"]);
        assert_eq!(
            back["usage"]["input_tokens"],
            fixture["usage"]["input_tokens"]
        );
    }
    for (status, kind) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ] {
        let body = json!({"type": "error", "error": {"type": kind, "message": format!("{kind} happened")}, "request_id": "req_1"});
        let (client, server) = fake(vec![(status, body.to_string())]);
        let failure = one_request(&client).expect_err("error body");
        assert_eq!(failure.kind().map(FailureKind::as_str), Some(kind));
        assert!(failure.message().contains(&format!("{kind} happened")));
        assert_eq!(server.recorded().len(), 1, "{status} is not retried");
    }
}

#[test]
fn a_prompt_too_long_for_the_context_window_is_its_own_kind() {
    for message in [
        "prompt is too long: 208656 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 197824 + 8192 > 200000, decrease input length or `max_tokens` and try again",
    ] {
        let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message},
            "request_id": "req_011CWdepJvA2D819tdYYq4h7"});
        let (client, server) = fake(vec![(400, body.to_string())]);
        let failure = one_request(&client).expect_err("400");
        assert_eq!(failure.kind(), Some(&FailureKind::ContextWindow));
        assert_eq!(
            failure.kind().map(FailureKind::as_str),
            Some("context_window_exceeded")
        );
        // The text still says what the server said.
        let text = format!("HTTP 400 invalid_request_error: {message} (after 1 attempt(s))");
        assert_eq!(failure.message(), text);
        assert_eq!(server.recorded().len(), 1, "not retried");
    }
    // Another 400 keeps the API's type.
    let body = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-20250514"}});
    let (client, _server) = fake(vec![(400, body.to_string())]);
    let failure = one_request(&client).expect_err("400");
    assert_eq!(failure.kind(), Some(&FailureKind::InvalidRequest));
}

#[test]
fn the_key_never_appears_in_failures() {
    let echo = format!(
        "{{\"type\": \"error\", \"error\": {{\"type\": \"authentication_error\", \"message\": \"bad key {KEY}\"}}}}"
    );
    let (client, _server) = fake(vec![(401, echo)]);
    let failure = one_request(&client).expect_err("401");
    assert!(!failure.message().contains(KEY), "{}", failure.message());
    assert!(failure.message().contains("***"));
    assert!(!format!("{:?}", ApiKey::new(KEY)).contains(KEY));
    assert!(!format!("{:?}", client).contains(KEY));
}

#[test]
fn a_deadline_abandons_a_request_in_flight() {
    let server = MockServer::start(|_| Reply::Stall(Duration::from_secs(20)));
    let (client, _) = client(config(&server.url));
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.progress = false;
    settings.limits.deadline = Some(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let report = client.run(&settings);
    // Well before the 10 s read timeout of `config`.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.outcome.status, StatusKind::Deadline);
    assert_eq!(report.outcome.calls, 1);
    assert!(
        report.outcome.text.contains("abandoned"),
        "{}",
        report.outcome.text
    );
}

#[test]
fn cancelling_abandons_a_request_in_flight() {
    let server = MockServer::start(|_| Reply::Stall(Duration::from_secs(20)));
    let mut config = config(&server.url);
    // The worker's request times out after 1.5 s; it must not retry once stopped.
    config.timeouts.read = Duration::from_millis(1500);
    let (client, _) = client(config);
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.progress = false;
    let cancel = settings.cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        cancel.cancel();
    });
    let started = std::time::Instant::now();
    let report = client.run(&settings);
    canceller.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(450),
        "waited for the HTTP timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(report.outcome.status, StatusKind::Cancelled);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(server.recorded().len(), 1, "no retry after the cancel");
}

#[test]
fn a_client_reused_after_a_cancelled_run_serves_the_next_run() {
    let server = MockServer::start(demo_handler());
    let (client, _) = client(config(&server.url));
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.progress = false;
    settings.decision = DecisionMode::Allow;
    let first = settings.clone();
    first.cancel.cancel();
    let cancelled = client.run(&first);
    assert_eq!(cancelled.outcome.status, StatusKind::Cancelled);
    settings.cancel = subloop::run::limits::CancelHandle::new();
    let second = client.run(&settings);
    assert_eq!(
        second.outcome.status,
        StatusKind::Answered,
        "{}",
        second.outcome.text
    );
    assert_eq!(second.outcome.calls, 4);
}

#[test]
fn a_structured_answer_sends_output_config_and_a_mismatch_goes_back() {
    let schema = json!({
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["pass", "fail"]},
            "lines": {"type": "integer", "minimum": 1},
            "notes": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 80}}}
        },
        "required": ["verdict", "lines"]
    });
    let text = |text: &str| {
        Reply::json(
            200,
            json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}),
        )
    };
    let mut replies = vec![
        text(r#"{"verdict": "maybe", "lines": 3}"#),
        text(r#"{"verdict": "pass", "lines": 3}"#),
    ]
    .into_iter();
    let server = MockServer::start(move |_| replies.next().unwrap_or(Reply::Hangup));
    let (client, _) = client(config(&server.url));
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.progress = false;
    settings.output_schema = Some(schema);
    let report = client.run(&settings);
    assert_eq!(
        report.outcome.status,
        StatusKind::Answered,
        "{}",
        report.outcome.text
    );
    assert_eq!(
        report.outcome.output,
        Some(json!({"verdict": "pass", "lines": 3}))
    );
    let recorded = server.recorded();
    assert_eq!(recorded.len(), 2);
    // The schema as the API takes it: objects closed, the bounds it does not
    // support left out (they are still checked here).
    let sent = json!({"format": {"type": "json_schema", "schema": {
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["pass", "fail"]},
            "lines": {"type": "integer"},
            "notes": {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": false}
        },
        "required": ["verdict", "lines"],
        "additionalProperties": false
    }}});
    for request in &recorded {
        assert_eq!(request.json()["output_config"], sent);
        assert_eq!(request.header("anthropic-beta"), None, "no beta header");
    }
    let messages = recorded[1].json()["messages"].clone();
    let n = messages.as_array().map_or(0, Vec::len);
    assert_eq!(
        messages[n - 1]["content"][0]["text"],
        "Your answer does not match the required output schema: answer.verdict: must be one of \"pass\", \"fail\". Reply again with only the JSON value, matching the schema."
    );
}

crate::async_twins!(
    a_structured_answer_sends_output_config_and_a_mismatch_goes_back,
    demo_allow_makes_seven_requests_and_matches_the_offline_answer,
    demo_deny_makes_seven_requests_and_matches_the_offline_answer,
    a_429_is_retried_honouring_retry_after,
    retry_after_ms_wins_and_overlong_retry_after_falls_back_to_backoff,
    a_529_three_times_gives_up_after_the_retries,
    a_400_is_not_retried_and_x_should_retry_false_is_obeyed,
    bodies_that_are_not_messages_are_model_errors,
    a_stream_assembles_the_same_reply_as_a_plain_call,
    a_stream_cut_before_message_stop_is_a_model_error,
    an_error_event_inside_a_200_stream_is_an_api_error,
    a_stalled_server_trips_the_read_timeout_and_is_not_asked_again,
    a_stall_in_the_middle_of_a_body_is_retried,
    a_dropped_connection_is_retried,
    the_request_body_is_exactly_the_messages_api_body_with_cache_breakpoints,
    fixture_response_bodies_round_trip,
    the_key_never_appears_in_failures,
    a_deadline_abandons_a_request_in_flight,
    cancelling_abandons_a_request_in_flight,
    a_client_reused_after_a_cancelled_run_serves_the_next_run,
);
