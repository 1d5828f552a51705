//! The OpenAI-compatible provider against a loopback `/v1/chat/completions`
//! server: the demo (allow and deny, plain and streamed, through the
//! library and the binary), tool rounds, parallel and interleaved calls,
//! every finish_reason, invalid arguments, retries, error bodies, a cut
//! stream and usage.

use crate::common;
use crate::mock_api;
use crate::mock_openai;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::host::{self, DecisionMode, Models, Settings};
use mock_api::{MockServer, Recorded, Reply};
use mock_openai::{chunks, demo_handler, sse, stream_body, usage};
use serde_json::{Value, json};
use subloop::ModelResponse;
use subloop::StatusKind;
use subloop::core::error::FailureKind;
use subloop::core::protocol::Message;
use subloop::core::protocol::Request;
use subloop::core::protocol::StopReason;
use subloop::core::protocol::Usage;
use subloop::providers::http::ConfigError;
use subloop::providers::http::Timeouts;
use subloop::providers::openai::OpenAiConfig;

use crate::clients::{OpenAi, Taps};

const KEY: &str = "sk-openai-SECRET-0123456789";

fn config(base_url: &str, key: Option<&str>) -> OpenAiConfig {
    let base = format!("{base_url}/v1");
    let env = |name: &str| match name {
        "OPENAI_API_KEY" => key.map(str::to_owned),
        "OPENAI_BASE_URL" => Some(base.clone()),
        _ => None,
    };
    let mut config = OpenAiConfig::from_env(env, Some("gpt-test".to_owned())).expect("config");
    config.timeouts = Timeouts {
        connect: Duration::from_secs(5),
        read: Duration::from_secs(10),
        overall: Duration::from_secs(30),
    };
    config
}

/// A client whose retry waits are recorded, not slept.
fn new_client(config: OpenAiConfig) -> (OpenAi, Arc<Mutex<Vec<Duration>>>) {
    let taps = Taps::default();
    (OpenAi::new(config, &taps), taps.sleeps)
}

fn one_request(client: &OpenAi) -> Result<ModelResponse, subloop::core::error::ModelFailure> {
    let messages = [Message::user_text("hi")];
    client.send(&Request {
        system: "sys",
        tools: &[],
        messages: &messages,
        attachment: None,
        output: None,
    })
}

fn demo_settings(decision: DecisionMode) -> Settings {
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.decision = decision;
    settings.progress = false;
    settings
}

fn offline_text(decision: DecisionMode) -> String {
    host::execute(&demo_settings(decision), Models::Demo)
        .expect("offline run")
        .outcome
        .text
}

fn demo_run(decision: DecisionMode, stream: bool) -> (subloop::RunReport, Vec<Recorded>) {
    let server = MockServer::start(demo_handler());
    let mut config = config(&server.url, None);
    config.stream = stream;
    let (client, _) = new_client(config);
    let report = client.run(&demo_settings(decision));
    (report, server.recorded())
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function");
            t["function"]["name"].as_str().expect("name").to_owned()
        })
        .collect()
}

fn check_demo_requests(recorded: &[Recorded], stream: bool) {
    assert_eq!(recorded.len(), 7, "parent 4 + child 3");
    let (mut parent, mut child) = (Vec::new(), Vec::new());
    for request in recorded {
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(request.header("authorization"), None, "no key, no header");
        assert_eq!(request.header("content-type"), Some("application/json"));
        let body = request.json();
        assert_eq!(body["model"], "gpt-test");
        assert_eq!(body["max_tokens"], 4096, "a local server gets max_tokens");
        assert_eq!(body["stream"] == true, stream);
        let messages = body["messages"].as_array().expect("messages").clone();
        assert_eq!(messages[0]["role"], "system");
        // Every assistant message with calls is followed by one tool message
        // per call, in call order.
        for (at, message) in messages.iter().enumerate() {
            if let Some(calls) = message["tool_calls"].as_array() {
                for (offset, call) in calls.iter().enumerate() {
                    let answer = &messages[at + 1 + offset];
                    assert_eq!(answer["role"], "tool");
                    assert_eq!(answer["tool_call_id"], call["id"]);
                    assert!(call["function"]["arguments"].is_string());
                }
            }
        }
        if messages[0]["content"] == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM {
            child.push(body);
        } else {
            parent.push(body);
        }
    }
    assert_eq!((parent.len(), child.len()), (4, 3));
    for body in &child {
        assert_eq!(
            tool_names(body),
            ["read_file"],
            "the child gets read_file only"
        );
    }
    assert_eq!(
        child[0]["messages"].as_array().map(Vec::len),
        Some(2),
        "the child starts from [system, user: task]"
    );
    for body in &parent {
        assert_eq!(
            tool_names(body),
            ["read_file", "run_main", "todo_write", "task"]
        );
    }
    // Once the plan exists it is a second system message, before the history.
    let last = parent[3]["messages"].as_array().expect("messages");
    assert_eq!(last[1]["role"], "system");
    assert!(
        last[1]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("plan"),
        "{}",
        last[1]
    );
    assert!(last[2..].iter().all(|m| m["role"] != "system"));
}

#[test]
fn demo_allow_makes_seven_requests_and_prints_42() {
    let (report, recorded) = demo_run(DecisionMode::Allow, false);
    check_demo_requests(&recorded, false);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.outcome.calls, 4);
    assert_eq!(report.children.len(), 1);
    assert_eq!(report.children[0].outcome.calls, 3);
    assert_eq!(report.outcome.text, offline_text(DecisionMode::Allow));
    assert!(
        report.outcome.text.contains("42"),
        "{}",
        report.outcome.text
    );
    // 4 parent replies of 100 prompt tokens, 40 of them cached.
    assert_eq!(report.outcome.usage.input_tokens, 240);
    assert_eq!(report.outcome.usage.cache_read_input_tokens, 160);
    assert_eq!(report.total_usage().output_tokens, 70);
}

#[test]
fn demo_deny_makes_seven_requests_and_says_the_program_was_not_run() {
    let (report, recorded) = demo_run(DecisionMode::Deny, false);
    check_demo_requests(&recorded, false);
    assert_eq!(report.outcome.calls, 4);
    assert_eq!(report.outcome.text, offline_text(DecisionMode::Deny));
    assert!(report.outcome.text.contains("not run"));
    assert!(report.outcome.text.contains("42"));
}

#[test]
fn the_streamed_demo_gives_the_same_answers() {
    for decision in [DecisionMode::Allow, DecisionMode::Deny] {
        let (report, recorded) = demo_run(decision, true);
        check_demo_requests(&recorded, true);
        assert_eq!(report.outcome.status, StatusKind::Answered);
        assert_eq!(report.outcome.text, offline_text(decision));
        assert_eq!(report.outcome.usage.cache_read_input_tokens, 160);
    }
}

#[test]
fn demo_live_provider_openai_through_the_binary() {
    let server = MockServer::start(demo_handler());
    let base = format!("{}/v1", server.url);
    for (decision, mode, extra) in [
        ("allow", DecisionMode::Allow, None),
        ("deny", DecisionMode::Deny, Some("--stream")),
    ] {
        let mut command = Command::new(common::bin());
        command.args([
            "demo",
            "--live",
            "--provider",
            "openai",
            "--decision",
            decision,
            "--quiet",
        ]);
        command.args(extra);
        let output = command
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("OPENAI_BASE_URL", &base)
            .env("OPENAI_MODEL", "local-model")
            .env("OPENAI_API_KEY", KEY)
            .stdin(Stdio::null())
            .output()
            .expect("run binary");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("42"), "{stdout}");
        assert_eq!(stdout.trim_end(), offline_text(mode), "{decision}");
    }
    let recorded = server.recorded();
    assert_eq!(recorded.len(), 14, "7 requests per run");
    for request in &recorded {
        assert_eq!(request.json()["model"], "local-model");
        let bearer = format!("Bearer {KEY}");
        assert_eq!(request.header("authorization"), Some(bearer.as_str()));
    }
}

/// A trace of an `openai` live run replays as is, offline: reproduced.
#[test]
fn an_openai_trace_replays_as_reproduced() {
    let server = MockServer::start(demo_handler());
    let base = format!("{}/v1", server.url);
    let dir = common::TempDir::new("openai-replay");
    let trace = dir.path().join("run.jsonl");
    for stream in [false, true] {
        let mut command = Command::new(common::bin());
        command.args([
            "demo",
            "--live",
            "--provider",
            "openai",
            "--decision",
            "allow",
            "--quiet",
        ]);
        if stream {
            command.arg("--stream");
        }
        let output = command
            .arg("--trace")
            .arg(&trace)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("OPENAI_BASE_URL", &base)
            .env("OPENAI_MODEL", "local-model")
            .stdin(Stdio::null())
            .output()
            .expect("run binary");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let before = server.recorded().len();
        let replay = Command::new(common::bin())
            .arg("replay")
            .arg(&trace)
            .args([
                "--workspace",
                "examples/workspace",
                "--decision",
                "allow",
                "--quiet",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("OPENAI_BASE_URL")
            .stdin(Stdio::null())
            .output()
            .expect("run replay");
        let stdout = String::from_utf8_lossy(&replay.stdout);
        assert_eq!(
            replay.status.code(),
            Some(0),
            "stream {stream}: {stdout} {}",
            String::from_utf8_lossy(&replay.stderr)
        );
        assert!(stdout.starts_with("reproduced:"), "{stdout}");
        assert_eq!(
            server.recorded().len(),
            before,
            "the replay sends no request"
        );
    }
}

#[test]
fn a_missing_model_is_a_one_line_error_with_exit_2() {
    let output = Command::new(common::bin())
        .args(["demo", "--live", "--provider", "openai"])
        .env_remove("OPENAI_MODEL")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("OPENAI_MODEL") && stderr.contains("--model"));
    assert!(output.stdout.is_empty());
    assert_eq!(
        OpenAiConfig::from_env(|_| None, None).err(),
        Some(ConfigError::MissingModel)
    );
    let config = OpenAiConfig::from_env(|_| None, Some("m".into())).expect("defaults");
    assert_eq!(config.base_url, "https://api.openai.com/v1");
    assert!(config.api_key.is_none());
}

/// A settings for a run in the demo workspace with `question`.
fn run_settings(question: &str) -> Settings {
    let mut settings = demo_settings(DecisionMode::Deny);
    settings.question = question.to_owned();
    settings
}

fn reply(message: Value, finish: &str, cached: Option<u64>) -> Value {
    json!({"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "gpt-test",
           "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
           "usage": usage(cached)})
}

fn call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

fn answer(text: &str) -> Value {
    reply(
        json!({"role": "assistant", "content": text, "refusal": null}),
        "stop",
        None,
    )
}

/// Answers with `replies` in order, recording every request.
fn serve(replies: Vec<Reply>) -> MockServer {
    let mut replies = replies.into_iter();
    MockServer::start(move |_| replies.next().unwrap_or(Reply::Hangup))
}

fn run_against(server: &MockServer, stream: bool) -> subloop::RunReport {
    let mut config = config(&server.url, None);
    config.stream = stream;
    let (client, _) = new_client(config);
    client.run(&run_settings("Compare the files."))
}

#[test]
fn parallel_tool_calls_are_answered_in_call_order() {
    let server = serve(vec![
        Reply::json(
            200,
            reply(
                json!({"role": "assistant", "content": null, "tool_calls": [
                    call("call_b", "read_file", "{\"path\": \"expected.txt\"}"),
                    call("call_a", "read_file", "{\"path\": \"main.py\"}"),
                ]}),
                "tool_calls",
                None,
            ),
        ),
        Reply::json(200, answer("both read")),
    ]);
    let report = run_against(&server, false);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.outcome.text, "both read");
    let second = server.recorded()[1].json();
    let messages = second["messages"].as_array().expect("messages");
    let tail: Vec<(&str, &str)> = messages[messages.len() - 2..]
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default(),
                m["tool_call_id"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(tail, [("tool", "call_b"), ("tool", "call_a")]);
    let expected = std::fs::read_to_string(common::examples().join("workspace/expected.txt"))
        .expect("expected.txt");
    assert_eq!(messages[messages.len() - 2]["content"], expected);
    let assistant = &messages[messages.len() - 3];
    assert_eq!(assistant["content"], Value::Null);
    assert_eq!(
        assistant["tool_calls"][1]["function"]["arguments"],
        "{\"path\":\"main.py\"}"
    );
}

#[test]
fn a_stream_with_interleaved_calls_split_across_many_chunks() {
    let first = reply(
        json!({"role": "assistant", "content": "Reading both.", "tool_calls": [
            call("call_0", "read_file", "{\"path\": \"main.py\"}"),
            call("call_1", "read_file", "{\"path\": \"expected.txt\"}"),
        ]}),
        "tool_calls",
        Some(0),
    );
    let pieces = chunks(&first);
    let argument_pieces = pieces
        .iter()
        .filter(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] != "")
        .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .count();
    assert!(argument_pieces >= 12, "{argument_pieces} pieces");
    let server = serve(vec![sse(&pieces), sse(&chunks(&answer("done")))]);
    let report = run_against(&server, true);
    assert_eq!(
        report.outcome.status,
        StatusKind::Answered,
        "{}",
        report.outcome.text
    );
    let ran: Vec<(&str, bool)> = report
        .tools
        .iter()
        .map(|t| (t.id.as_str(), t.is_error))
        .collect();
    assert_eq!(ran, [("call_0", false), ("call_1", false)]);
    assert!(report.tools[0].content.contains("print"));
    let second = server.recorded()[1].json();
    assert_eq!(second["stream"], true);
    assert_eq!(second["stream_options"], json!({"include_usage": true}));
    let messages = second["messages"].as_array().expect("messages");
    let assistant = &messages[messages.len() - 3];
    assert_eq!(assistant["content"], "Reading both.");
    assert_eq!(
        assistant["tool_calls"][1]["function"]["arguments"],
        "{\"path\":\"expected.txt\"}"
    );
}

#[test]
fn invalid_json_arguments_are_answered_and_sent_back_as_received() {
    let broken = "{\"path\": \"main.py\"";
    // Arguments that are JSON but not an object are named for what they are,
    // plain or streamed.
    let not_objects = [
        ("[\"main.py\"]", "an array"),
        ("[1,2]", "an array"),
        ("\"main.py\"", "a string"),
        ("5", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
    ];
    for stream in [false, true] {
        let mut calls = vec![call("call_bad", "read_file", broken)];
        for (n, (arguments, _)) in not_objects.iter().enumerate() {
            calls.push(call(&format!("call_{n}"), "read_file", arguments));
        }
        calls.push(call("call_ok", "read_file", "{\"path\": \"main.py\"}"));
        let first = reply(
            json!({"role": "assistant", "content": null, "tool_calls": calls}),
            "tool_calls",
            None,
        );
        let first = if stream {
            sse(&chunks(&first))
        } else {
            Reply::json(200, first)
        };
        let then = if stream {
            sse(&chunks(&answer("went on")))
        } else {
            Reply::json(200, answer("went on"))
        };
        let server = serve(vec![first, then]);
        let report = run_against(&server, stream);
        assert_eq!(
            report.outcome.status,
            StatusKind::Answered,
            "stream {stream}"
        );
        assert_eq!(report.outcome.text, "went on");
        let records: Vec<(&str, bool, &str)> = report
            .tools
            .iter()
            .map(|t| (t.id.as_str(), t.is_error, t.decision.as_str()))
            .collect();
        let mut expected = vec![("call_bad".to_owned(), true, "invalid")];
        expected.extend((0..not_objects.len()).map(|n| (format!("call_{n}"), true, "invalid")));
        expected.push(("call_ok".to_owned(), false, "not_required"));
        let expected: Vec<(&str, bool, &str)> = expected
            .iter()
            .map(|(id, error, decision)| (id.as_str(), *error, *decision))
            .collect();
        assert_eq!(records, expected, "stream {stream}");
        assert!(
            report.tools[0]
                .content
                .starts_with("not executed: arguments are not valid JSON ("),
            "{}",
            report.tools[0].content
        );
        for (n, (arguments, kind)) in not_objects.iter().enumerate() {
            assert_eq!(
                report.tools[n + 1].content,
                format!("not executed: arguments are JSON but not an object: {kind}"),
                "stream {stream}, arguments {arguments}"
            );
        }
        let second = server.recorded()[1].json();
        let messages = second["messages"].as_array().expect("messages");
        let assistant = &messages[messages.len() - 3 - not_objects.len()];
        assert_eq!(assistant["tool_calls"][0]["function"]["arguments"], broken);
        assert_eq!(
            assistant["tool_calls"][1]["function"]["arguments"],
            "[\"main.py\"]"
        );
        assert_eq!(
            messages[messages.len() - 2 - not_objects.len()]["content"],
            report.tools[0].content.as_str()
        );
    }
}

#[test]
fn each_finish_reason() {
    let text = json!({"role": "assistant", "content": "partial"});
    let cases = [
        ("stop", Some(StopReason::EndTurn)),
        ("length", Some(StopReason::MaxTokens)),
        ("content_filter", Some(StopReason::Refusal)),
        ("tool_calls", Some(StopReason::ToolUse)),
        ("eos_token", Some(StopReason::Other("eos_token".into()))),
    ];
    let server = serve(
        cases
            .iter()
            .map(|(finish, _)| Reply::json(200, reply(text.clone(), finish, None)))
            .collect(),
    );
    let (client, _) = new_client(config(&server.url, None));
    for (finish, expected) in cases {
        let response = one_request(&client).expect("a reply");
        assert_eq!(response.stop_reason, expected, "{finish}");
    }
    // Through the loop: length stops the run, content_filter is a refusal.
    for (finish, status, words) in [
        ("length", StatusKind::ModelStopped, "max_tokens"),
        ("content_filter", StatusKind::ModelStopped, "refusal"),
        ("eos_token", StatusKind::ModelStopped, "eos_token"),
    ] {
        let server = serve(vec![Reply::json(200, reply(text.clone(), finish, None))]);
        let report = run_against(&server, false);
        assert_eq!(report.outcome.status, status, "{finish}");
        assert!(
            report.outcome.text.contains(words),
            "{}",
            report.outcome.text
        );
    }
}

#[test]
fn tool_calls_with_finish_reason_stop_and_bad_ids_are_protocol_errors() {
    let cases = [
        (
            vec![call("call_1", "read_file", "{\"path\": \"main.py\"}")],
            "stop",
            "end_turn",
        ),
        (
            vec![call("", "read_file", "{\"path\": \"main.py\"}")],
            "tool_calls",
            "empty",
        ),
        (
            vec![
                call("dup", "read_file", "{\"path\": \"main.py\"}"),
                call("dup", "read_file", "{\"path\": \"expected.txt\"}"),
            ],
            "tool_calls",
            "dup",
        ),
    ];
    for (calls, finish, words) in cases {
        let server = serve(vec![Reply::json(
            200,
            reply(
                json!({"role": "assistant", "content": null, "tool_calls": calls}),
                finish,
                None,
            ),
        )]);
        let report = run_against(&server, false);
        assert_eq!(report.outcome.status, StatusKind::ProtocolError, "{finish}");
        assert!(
            report.outcome.text.to_lowercase().contains(words),
            "{}",
            report.outcome.text
        );
        assert!(report.tools.is_empty(), "nothing ran");
        assert_eq!(server.recorded().len(), 1);
    }
}

#[test]
fn a_429_with_retry_after_then_success() {
    let server = serve(vec![
        Reply::json(
            429,
            json!({"error": {"message": "Rate limit reached", "type": "requests",
                "param": null, "code": "rate_limit_exceeded"}}),
        )
        .with_header("retry-after", "3"),
        Reply::json(200, answer("ok")),
    ]);
    let (client, sleeps) = new_client(config(&server.url, None));
    let response = one_request(&client).expect("retried");
    assert_eq!(response.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(*sleeps.lock().unwrap(), [Duration::from_secs(3)]);
    assert_eq!(server.recorded().len(), 2);
}

#[test]
fn a_500_is_retried_and_400_401_403_404_are_not() {
    let server = serve(vec![
        Reply::json(
            500,
            json!({"error": {"message": "boom", "type": "server_error"}}),
        ),
        Reply::json(200, answer("ok")),
    ]);
    let (client, sleeps) = new_client(config(&server.url, None));
    assert!(one_request(&client).is_ok());
    assert_eq!(sleeps.lock().unwrap().len(), 1);
    for status in [400, 401, 403, 404] {
        let server = serve(vec![
            Reply::json(
                status,
                json!({"error": {"message": format!("no {status}"),
                "type": "invalid_request_error", "param": null, "code": null}}),
            ),
            Reply::json(200, answer("never")),
        ]);
        let (client, sleeps) = new_client(config(&server.url, None));
        let failure = one_request(&client).expect_err("not retried");
        assert!(
            failure.message().contains(&format!("no {status}")),
            "{}",
            failure.message()
        );
        assert!(sleeps.lock().unwrap().is_empty());
        assert_eq!(server.recorded().len(), 1, "{status}");
    }
}

#[test]
fn a_context_window_overflow_is_its_own_kind_on_every_server() {
    let bodies = [
        // OpenAI: the code says it.
        json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        // vLLM: a bare error object with a numeric code; the message says it.
        json!({"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError", "param": null, "code": 400}),
        // llama.cpp: its own type.
        json!({"error": {"code": 400, "message": "request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": 9412, "n_ctx": 8192}}),
    ];
    for body in bodies {
        let server = serve(vec![
            Reply::json(400, body.clone()),
            Reply::json(200, answer("never")),
        ]);
        let (client, sleeps) = new_client(config(&server.url, None));
        let failure = one_request(&client).expect_err("400");
        assert_eq!(failure.kind(), Some(&FailureKind::ContextWindow), "{body}");
        // The text keeps the server's own name for it.
        let name = body
            .pointer("/error/type")
            .or(body.get("type"))
            .and_then(Value::as_str);
        let name = name.expect("a type");
        assert!(
            failure.message().starts_with(&format!("HTTP 400 {name}: ")),
            "{failure}"
        );
        assert!(sleeps.lock().unwrap().is_empty(), "not retried");
        assert_eq!(server.recorded().len(), 1);
    }
}

#[test]
fn a_401_body_reaches_the_user_and_says_to_set_the_key() {
    let body = json!({"error": {"message": "Incorrect API key provided: sk-openai-SECRET-0123456789.",
        "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}});
    let server = serve(vec![Reply::json(401, body.clone())]);
    let (client, _) = new_client(config(&server.url, None));
    let report = client.run(&run_settings("hi"));
    assert_eq!(report.outcome.status, StatusKind::ModelError);
    let text = &report.outcome.text;
    assert!(text.contains("HTTP 401"), "{text}");
    assert!(text.contains("Incorrect API key provided"), "{text}");
    assert!(text.contains("set OPENAI_API_KEY"), "{text}");
    // With a key, it is scrubbed from the text, and the hint says to check it.
    let server = serve(vec![Reply::json(401, body)]);
    let (client, _) = new_client(config(&server.url, Some(KEY)));
    let failure = one_request(&client).expect_err("401");
    assert!(!failure.message().contains(KEY), "{}", failure.message());
    assert!(failure.message().contains("OPENAI_API_KEY"));
    assert_eq!(failure.kind(), Some(&FailureKind::InvalidRequest));
    // A 401 whose body is not JSON still says what to do.
    let server = serve(vec![Reply::Full {
        status: 401,
        headers: vec![],
        body: b"Unauthorized".to_vec(),
    }]);
    let (client, _) = new_client(config(&server.url, None));
    let failure = one_request(&client).expect_err("401");
    assert_eq!(failure.kind(), Some(&FailureKind::Authentication));
    assert!(
        failure.message().contains("Unauthorized")
            && failure.message().contains("set OPENAI_API_KEY")
    );
}

#[test]
fn a_cut_stream_is_a_model_error() {
    let full = chunks(&answer("forty-two"));
    let cut = &full[..full.len() - 2];
    let server = serve(vec![Reply::Cut {
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: stream_body(cut, false),
    }]);
    let report = run_against(&server, true);
    assert_eq!(report.outcome.status, StatusKind::ModelError);
    assert!(
        report.outcome.text.contains("before [DONE]"),
        "{}",
        report.outcome.text
    );
}

#[test]
fn usage_with_and_without_cached_tokens() {
    let server = serve(vec![
        Reply::json(200, reply(json!({"content": "a"}), "stop", Some(30))),
        Reply::json(200, reply(json!({"content": "b"}), "stop", None)),
        Reply::json(
            200,
            json!({"id": "x", "choices": [{"index": 0, "message": {"content": "c"},
                "finish_reason": "stop"}]}),
        ),
        Reply::json(
            200,
            json!({"id": "x", "object": "chat.completion", "choices": []}),
        ),
    ]);
    let (client, _) = new_client(config(&server.url, None));
    let usages: Vec<Option<Usage>> = (0..3)
        .map(|_| one_request(&client).expect("reply").usage)
        .collect();
    let usage = |input, cached| Usage::new(input, 10).with_cache(0, cached);
    assert_eq!(usages, [Some(usage(70, 30)), Some(usage(100, 0)), None]);
    let failure = one_request(&client).expect_err("no choices");
    assert_eq!(failure.kind(), Some(&FailureKind::InvalidResponse));
    assert!(
        failure.message().contains("no choices"),
        "{}",
        failure.message()
    );
}

#[test]
fn the_trace_keeps_reasoning_fields_that_are_not_sent_back() {
    let server = serve(vec![
        Reply::json(
            200,
            reply(
                json!({"role": "assistant", "content": null, "reasoning_content": "let me look",
                    "tool_calls": [call("c1", "read_file", "{\"path\": \"main.py\"}")]}),
                "tool_calls",
                None,
            ),
        ),
        Reply::json(200, answer("done")),
    ]);
    let trace = common::TempDir::new("openai-trace");
    let path = trace.path().join("trace.jsonl");
    let mut settings = run_settings("look");
    settings.trace = Some(path.clone());
    let (client, _) = new_client(config(&server.url, None));
    let report = client.run(&settings);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let text = std::fs::read_to_string(&path).expect("trace");
    assert!(
        text.contains("let me look"),
        "the raw reply is in the trace"
    );
    let second = String::from_utf8_lossy(&server.recorded()[1].body).into_owned();
    assert!(!second.contains("let me look"), "not sent back");
    assert!(!second.contains("reasoning_content"));
}

#[test]
fn a_server_that_refuses_max_tokens_gets_max_completion_tokens_from_then_on() {
    let server = MockServer::start(|recorded| {
        if recorded.json().get("max_tokens").is_some() {
            Reply::json(
                400,
                json!({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                    "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}),
            )
        } else {
            Reply::json(200, answer("ok"))
        }
    });
    let (client, sleeps) = new_client(config(&server.url, None));
    assert!(one_request(&client).is_ok());
    assert!(one_request(&client).is_ok());
    let fields: Vec<(bool, Value)> = server
        .recorded()
        .iter()
        .map(|r| {
            let body = r.json();
            (
                body.get("max_tokens").is_some(),
                body["max_completion_tokens"].clone(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            (true, Value::Null),
            (false, json!(4096)),
            (false, json!(4096))
        ]
    );
    assert!(
        sleeps.lock().unwrap().is_empty(),
        "not a retry with backoff"
    );
    assert_eq!(
        client.max_tokens_field(),
        subloop::providers::openai::request::MaxTokensField::MaxCompletionTokens,
        "the client keeps sending the field the server took"
    );
    // A 400 for another reason is not resent.
    let server = serve(vec![Reply::json(
        400,
        json!({"error": {"message": "bad messages", "type": "invalid_request_error", "param": "messages"}}),
    )]);
    let (client, _) = new_client(config(&server.url, None));
    assert!(one_request(&client).is_err());
    assert_eq!(server.recorded().len(), 1);
}

#[test]
fn a_deadline_abandons_a_request_in_flight() {
    let server = MockServer::start(|_| Reply::Stall(Duration::from_secs(20)));
    let (client, _) = new_client(config(&server.url, None));
    let mut settings = demo_settings(DecisionMode::Deny);
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
    assert!(
        report.outcome.text.contains("abandoned"),
        "{}",
        report.outcome.text
    );
}

#[test]
fn streamed_text_is_shown_as_it_arrives_and_ends_its_line() {
    let server = serve(vec![sse(&chunks(&answer("forty-two")))]);
    let mut config = config(&server.url, None);
    config.stream = true;
    let taps = Taps::showing();
    let client = OpenAi::new(config, &taps);
    let response = one_request(&client).expect("a reply");
    assert_eq!(response.stop_reason, Some(StopReason::EndTurn));
    let shown = taps.shown.expect("a sink");
    assert_eq!(*shown.lock().unwrap(), ["fort", "y-two", "\n"]);
}

/// A stream of `completion` sent one chunk at a time, `gap` apart, its
/// text cut in pieces of 10 characters: a slow server, so streams running
/// side by side interleave.
fn slow_stream(completion: &Value, gap: Duration) -> Reply {
    let mut events = Vec::new();
    for chunk in chunks(completion) {
        match chunk["choices"][0]["delta"]["content"].as_str() {
            Some(text) if !text.is_empty() => {
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(10) {
                    let mut part = chunk.clone();
                    part["choices"][0]["delta"]["content"] =
                        json!(piece.iter().collect::<String>());
                    events.push(stream_body(&[part], false));
                }
            }
            _ => events.push(stream_body(&[chunk], false)),
        }
    }
    events.push(b"data: [DONE]\n\n".to_vec());
    Reply::Slow { events, gap }
}

/// A server whose parent delegates twice in one reply, the two children
/// then streaming a long line each at once, a few characters at a time;
/// and the lines the children say.
fn side_by_side_server() -> (MockServer, Vec<String>) {
    let texts = ["A".repeat(60), "B".repeat(60)];
    let lines = texts
        .iter()
        .map(|text| format!("child says {text}"))
        .collect();
    let (mut parent_calls, mut child_calls) = (0, 0);
    let server = MockServer::start(move |recorded| {
        let body = recorded.json();
        let completion = if body["messages"][0]["content"]
            == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM
        {
            child_calls += 1;
            answer(&format!("child says {}", texts[(child_calls - 1) % 2]))
        } else {
            parent_calls += 1;
            if parent_calls == 1 {
                let calls = json!([
                    call("call_a", "task", r#"{"task": "Read main.py."}"#),
                    call("call_b", "task", r#"{"task": "Read expected.txt."}"#),
                ]);
                reply(
                    json!({"role": "assistant", "content": null, "tool_calls": calls}),
                    "tool_calls",
                    None,
                )
            } else {
                answer("Both read.")
            }
        };
        assert_eq!(body["stream"], true, "a streaming client asks for a stream");
        slow_stream(&completion, Duration::from_millis(20))
    });
    (server, lines)
}

#[test]
fn subagents_streaming_side_by_side_never_tear_each_others_lines() {
    // Through the binary: the children's lines come out whole on stderr.
    let (server, lines) = side_by_side_server();
    let output = Command::new(common::bin())
        .args([
            "run",
            "--workspace",
            "examples/workspace",
            "--live",
            "--provider",
            "openai",
            "--stream",
            "--decision",
            "deny",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_MODEL", "gpt-test")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        server.recorded().len(),
        4,
        "two parent requests, one per child"
    );
    for line in &lines {
        assert!(
            stderr.lines().any(|shown| shown == line),
            "{line:?} is not a whole line of its own:\n{stderr}"
        );
    }
    assert!(
        stderr.lines().all(|line| !line.is_empty()),
        "no stray blank line:\n{stderr}"
    );
}

#[test]
fn children_streaming_side_by_side_reach_the_sink_by_whole_lines() {
    // Through the library, blocking or async: each piece of a child's text
    // that reaches the sink is whole lines.
    let (server, lines) = side_by_side_server();
    let mut config = config(&server.url, None);
    config.stream = true;
    let taps = Taps::showing();
    let client = OpenAi::new(config, &taps);
    let report = client.run(&run_settings("Read both files."));
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let shown = taps.shown.expect("a sink").lock().unwrap().concat();
    for line in &lines {
        assert!(
            shown.lines().any(|piece| piece == line),
            "{line:?} is not a whole line of its own:\n{shown}"
        );
    }
}

/// The schema of the structured-answer tests: closed and fully required,
/// so OpenAI's strict mode applies.
fn verdict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]}},
        "required": ["verdict"],
        "additionalProperties": false
    })
}

#[test]
fn a_structured_answer_sends_response_format_and_a_mismatch_goes_back() {
    let server = serve(vec![
        Reply::json(200, answer("It passes.")),
        Reply::json(200, answer(r#"{"verdict": "pass"}"#)),
    ]);
    let (client, _) = new_client(config(&server.url, None));
    let mut settings = run_settings("Does it pass?");
    settings.output_schema = Some(verdict_schema());
    let report = client.run(&settings);
    assert_eq!(
        report.outcome.status,
        StatusKind::Answered,
        "{}",
        report.outcome.text
    );
    assert_eq!(report.outcome.output, Some(json!({"verdict": "pass"})));
    let recorded = server.recorded();
    assert_eq!(recorded.len(), 2);
    for request in &recorded {
        assert_eq!(
            request.json()["response_format"],
            json!({"type": "json_schema", "json_schema": {
                "name": "answer", "schema": verdict_schema(), "strict": true
            }})
        );
    }
    // The second request ends with the answer and the reason it was sent back.
    let messages = recorded[1].json()["messages"].clone();
    let n = messages.as_array().map_or(0, Vec::len);
    assert_eq!(
        messages[n - 2],
        json!({"role": "assistant", "content": "It passes."})
    );
    assert_eq!(
        messages[n - 1],
        json!({"role": "user", "content": "Your answer does not match the required output schema: the answer is not JSON (expected value at line 1 column 1). Reply again with only the JSON value, matching the schema."})
    );
}

crate::async_twins!(
    a_structured_answer_sends_response_format_and_a_mismatch_goes_back,
    demo_allow_makes_seven_requests_and_prints_42,
    demo_deny_makes_seven_requests_and_says_the_program_was_not_run,
    the_streamed_demo_gives_the_same_answers,
    parallel_tool_calls_are_answered_in_call_order,
    a_stream_with_interleaved_calls_split_across_many_chunks,
    invalid_json_arguments_are_answered_and_sent_back_as_received,
    each_finish_reason,
    tool_calls_with_finish_reason_stop_and_bad_ids_are_protocol_errors,
    a_429_with_retry_after_then_success,
    a_500_is_retried_and_400_401_403_404_are_not,
    a_401_body_reaches_the_user_and_says_to_set_the_key,
    a_cut_stream_is_a_model_error,
    usage_with_and_without_cached_tokens,
    the_trace_keeps_reasoning_fields_that_are_not_sent_back,
    a_server_that_refuses_max_tokens_gets_max_completion_tokens_from_then_on,
    a_deadline_abandons_a_request_in_flight,
    streamed_text_is_shown_as_it_arrives_and_ends_its_line,
    children_streaming_side_by_side_reach_the_sink_by_whole_lines,
    a_streamed_reply_leaves_its_connection_for_the_next_request,
);

/// A stream ends at `[DONE]`, and the body's end is read after it, so the
/// next request goes over the same connection; a server that holds the
/// body open after `[DONE]` costs the request a moment, not its read
/// timeout (the connection is then closed, not kept).
#[test]
fn a_streamed_reply_leaves_its_connection_for_the_next_request() {
    let done = || slow_stream(&answer("hi"), Duration::ZERO);
    // A run of two streamed requests: a read, then the answer.
    let read = reply(
        json!({"role": "assistant", "content": null, "tool_calls": [
            call("call_a", "read_file", "{\"path\": \"main.py\"}"),
        ]}),
        "tool_calls",
        None,
    );
    let server = serve(vec![
        slow_stream(&read, Duration::ZERO),
        slow_stream(&answer("read"), Duration::ZERO),
    ]);
    let report = run_against(&server, true);
    assert_eq!(report.outcome.text, "read", "{:?}", report.outcome);
    assert_eq!(
        server.connections.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // Everything up to [DONE] at once, then the body held open for 1 s.
    let Reply::Slow { events, .. } = done() else {
        unreachable!("a slow stream");
    };
    let held = Reply::Slow {
        events: vec![events.concat(), b": held\n\n".to_vec()],
        gap: Duration::from_secs(1),
    };
    let server = serve(vec![held]);
    let mut settings = config(&server.url, None);
    settings.stream = true;
    let (client, _) = new_client(settings);
    let started = std::time::Instant::now();
    let reply = one_request(&client).expect("held");
    assert_eq!(reply.content, ModelResponse::answer("hi").content);
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "waited for the held body: {:?}",
        started.elapsed()
    );
}

/// A server that accepts and never answers: the run ends `model_error`, the
/// error says what to change in words, and the CLI names its flags.
#[test]
fn a_server_that_never_answers_is_a_model_error_naming_the_flags_that_help() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    // Every connection held open, never answered, until the test ends (the
    // run first asks `GET /props` for the window, which goes unanswered
    // too, then the model request).
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        let _ = listener.set_nonblocking(true);
        let until = std::time::Instant::now() + Duration::from_secs(4);
        while std::time::Instant::now() < until {
            if let Ok((stream, _)) = listener.accept() {
                open.push(stream);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let output = Command::new(common::bin())
        .args([
            "demo",
            "--live",
            "--provider",
            "openai",
            "--decision",
            "deny",
            "--timeout-read",
            "1",
            "--retries",
            "0",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OPENAI_BASE_URL", &base)
        .env("OPENAI_MODEL", "local-model")
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    let _ = held.join();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("allow a longer read timeout"), "{stdout}");
    assert!(!stdout.contains("--timeout-read"), "{stdout}");
    assert!(
        stderr.contains("try --stream, a smaller --max-tokens, or a longer --timeout-read"),
        "{stderr}"
    );
}
