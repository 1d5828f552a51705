//! What the Messages API really sends, through the live client and a loopback
//! mock: nullable usage in streams, the reply as received in the trace, the
//! same message streamed or not (server tool blocks, citations), the plan's
//! place in the request, key hygiene, the stream's printed text.

use crate::common;
use crate::mock_api;

use std::sync::Arc;
use std::time::Duration;

use crate::host::{self, DecisionMode, Models};
use mock_api::{MockServer, Reply, demo_handler, demo_stream_handler};
use serde_json::{Value, json};
use subloop::StatusKind;
use subloop::core::error::FailureKind;
use subloop::core::protocol::Message;
use subloop::core::protocol::Request;
use subloop::providers::anthropic::{Client, LiveConfig};
use subloop::providers::http::Timeouts;

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

fn lines(trace: &str) -> Vec<Value> {
    trace
        .lines()
        .map(|line| serde_json::from_str(line).expect("every trace line is JSON"))
        .collect()
}

/// Runs the demo live against `server` with a trace; returns the report and the trace lines.
fn traced_demo(client: Client) -> (subloop::RunReport, Vec<Value>) {
    let dir = common::TempDir::new("fidelity-trace");
    let path = dir.path().join("trace.jsonl");
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.decision = DecisionMode::Allow;
    settings.progress = false;
    settings.trace = Some(path.clone());
    let report = host::execute(&settings, Models::Live(Arc::new(client))).expect("run");
    let trace = std::fs::read_to_string(&path).expect("the trace was written");
    (report, lines(&trace))
}

fn responses(trace: &[Value]) -> Vec<&Value> {
    trace
        .iter()
        .filter(|line| line["kind"] == "response")
        .map(|line| &line["response"])
        .collect()
}

#[test]
fn null_usage_figures_in_message_delta_keep_what_message_start_said() {
    let events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_n", "type": "message", "role": "assistant",
                "content": [], "model": "m", "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 25, "cache_creation_input_tokens": 7, "cache_read_input_tokens": 40, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"input_tokens": null, "cache_creation_input_tokens": null, "cache_read_input_tokens": null, "output_tokens": 12}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let server = MockServer::start(move |_| Reply::sse(&events));
    let mut config = config(&server.url);
    config.stream = true;
    let client = Client::new(config).with_sleeper(|_| {});
    let messages = [Message::user_text("hi")];
    let received = client
        .send_received(&Request {
            system: "",
            tools: &[],
            messages: &messages,
            attachment: None,
            output: None,
        })
        .expect("null figures are no new figures, not a broken reply");
    let usage = received.response.usage.expect("usage");
    assert_eq!(usage.input_tokens, 25);
    assert_eq!(usage.cache_creation_input_tokens, 7);
    assert_eq!(usage.cache_read_input_tokens, 40);
    assert_eq!(usage.output_tokens, 12);
    let raw = received.raw.expect("the assembled message");
    assert_eq!(raw["usage"]["cache_read_input_tokens"], 40);
    assert_eq!(raw["usage"]["output_tokens"], 12);
}

#[test]
fn the_trace_response_line_is_the_reply_as_received() {
    let server = MockServer::start(demo_handler());
    let client = Client::new(config(&server.url)).with_sleeper(|_| {});
    let (report, trace) = traced_demo(client);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let responses = responses(&trace);
    assert_eq!(responses.len(), 7, "parent 4 + child 3");
    for (index, response) in responses.iter().enumerate() {
        assert!(
            response["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("msg_mock_")),
            "response {index} has no id: {response}"
        );
        assert_eq!(response["model"], "claude-test");
        assert_eq!(response["type"], "message");
        assert_eq!(response["role"], "assistant");
        assert!(response.as_object().unwrap().contains_key("stop_sequence"));
        assert_eq!(response["usage"]["service_tier"], "standard");
        assert_eq!(
            response["usage"]["cache_creation"]["ephemeral_5m_input_tokens"],
            50
        );
    }
}

#[test]
fn a_streamed_reply_is_traced_as_the_message_assembled_from_its_events() {
    let server = MockServer::start(demo_stream_handler());
    let mut config = config(&server.url);
    config.stream = true;
    let client = Client::new(config).with_sleeper(|_| {});
    let (report, trace) = traced_demo(client);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    // message_delta said `null` for the input figures: message_start's stay.
    assert_eq!(report.outcome.usage.input_tokens, 400);
    assert_eq!(report.outcome.usage.cache_read_input_tokens, 160);
    assert_eq!(report.outcome.usage.output_tokens, 40);
    let responses = responses(&trace);
    assert_eq!(responses.len(), 7);
    for response in responses {
        assert!(
            response["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("msg_mock_"))
        );
        assert_eq!(response["model"], "claude-test");
        assert_eq!(response["role"], "assistant");
        assert!(response.as_object().unwrap().contains_key("stop_sequence"));
        assert_eq!(response["usage"]["service_tier"], "standard");
        assert_eq!(response["usage"]["cache_read_input_tokens"], 40);
        assert_eq!(response["usage"]["output_tokens"], 10);
        assert!(!response["content"].as_array().unwrap().is_empty());
    }
}

/// A reply with server-side and MCP tool blocks whose input streams as
/// `input_json_delta` pieces, and a text block whose citation streams as a
/// `citations_delta` (the shapes of a recorded web-search stream).
fn server_tool_message() -> Value {
    json!({"id": "msg_ws", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "tokyo population"}, "caller": {"type": "direct"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
             "content": [{"type": "web_search_result", "title": "Tokyo", "url": "https://example.com/tokyo",
                          "encrypted_content": "EnC0", "page_age": null}]},
            {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "echo", "server_name": "tools",
             "input": {"text": "hi", "times": [1, 2]}},
            {"type": "text", "text": "About 14 million.",
             "citations": [{"type": "web_search_result_location", "cited_text": "14 million",
                            "url": "https://example.com/tokyo", "title": "Tokyo", "encrypted_index": "EnC1"}]},
        ],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 30, "output_tokens": 12, "server_tool_use": {"web_search_requests": 1}}})
}

/// [`server_tool_message`] as the API streams it.
fn server_tool_events() -> Vec<(&'static str, Value)> {
    let delta = |index: u64, delta: Value| {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    };
    let json_piece = |index: u64, piece: &str| {
        delta(
            index,
            json!({"type": "input_json_delta", "partial_json": piece}),
        )
    };
    let message = server_tool_message();
    let start = |index: u64, block: Value| {
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    };
    let stop = |index: u64| {
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    };
    vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_ws", "type": "message",
                "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 30, "output_tokens": 1}}}),
        ),
        start(
            0,
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                "input": {}, "caller": {"type": "direct"}}),
        ),
        json_piece(0, ""),
        json_piece(0, "{\"que"),
        json_piece(0, "ry\": \"tokyo po"),
        json_piece(0, "pulation\"}"),
        stop(0),
        start(1, message["content"][1].clone()),
        stop(1),
        start(
            2,
            json!({"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "echo",
                "server_name": "tools", "input": {}}),
        ),
        json_piece(2, "{\"text\": \"hi\", "),
        json_piece(2, "\"times\": [1, 2]}"),
        stop(2),
        start(3, json!({"type": "text", "text": "", "citations": []})),
        delta(
            3,
            json!({"type": "citations_delta", "citation": message["content"][3]["citations"][0]}),
        ),
        delta(3, json!({"type": "text_delta", "text": "About 14"})),
        delta(3, json!({"type": "text_delta", "text": " million."})),
        stop(3),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 12, "server_tool_use": {"web_search_requests": 1}}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
}

#[test]
fn a_reply_with_server_tool_blocks_is_the_same_streamed_or_not() {
    let received = |stream: bool| {
        let server = MockServer::start(move |_| {
            if stream {
                Reply::sse(&server_tool_events())
            } else {
                Reply::json(200, server_tool_message())
            }
        });
        let mut config = config(&server.url);
        config.stream = stream;
        let client = Client::new(config).with_sleeper(|_| {});
        let messages = [Message::user_text("How many people live in Tokyo?")];
        client
            .send_received(&Request {
                system: "",
                tools: &[],
                messages: &messages,
                attachment: None,
                output: None,
            })
            .expect("a reply")
    };
    let (plain, streamed) = (received(false), received(true));
    let streamed_raw = streamed.raw.expect("the assembled message");
    assert_eq!(
        streamed_raw["content"][0]["input"],
        json!({"query": "tokyo population"})
    );
    assert_eq!(
        streamed_raw["content"][2]["input"],
        json!({"text": "hi", "times": [1, 2]})
    );
    assert_eq!(Some(&streamed_raw), plain.raw.as_ref());
    assert_eq!(streamed.response, plain.response);
}

fn env_config(key: &str, base_url: &str) -> LiveConfig {
    let env = |name: &str| match name {
        "ANTHROPIC_API_KEY" => Some(key.to_owned()),
        "ANTHROPIC_BASE_URL" => Some(base_url.to_owned()),
        _ => None,
    };
    let mut config = LiveConfig::from_env(env, Some("claude-test".to_owned())).expect("config");
    config.retry.max_retries = 0;
    config
}

fn one_request(
    client: &Client,
) -> Result<subloop::ModelResponse, subloop::core::error::ModelFailure> {
    let messages = [Message::user_text("hi")];
    client.send(&Request {
        system: "",
        tools: &[],
        messages: &messages,
        attachment: None,
        output: None,
    })
}

#[test]
fn a_short_key_is_not_scrubbed_into_garble_and_a_long_one_is() {
    let echo = |key: &str| {
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": format!("model: not found for key {key}")}})
    };
    let short = "o";
    let server = MockServer::start(move |_| Reply::json(400, echo(short)));
    let failure = one_request(&Client::new(env_config(short, &server.url))).expect_err("400");
    assert_eq!(failure.kind(), Some(&FailureKind::InvalidRequest));
    assert_eq!(
        failure.message(),
        "HTTP 400 invalid_request_error: model: not found for key o (after 1 attempt(s))"
    );
    let eight = "k3y-8chr";
    let server = MockServer::start(move |_| Reply::json(400, echo(eight)));
    let failure = one_request(&Client::new(env_config(eight, &server.url))).expect_err("400");
    assert_eq!(
        failure.message(),
        "HTTP 400 invalid_request_error: model: not found for key *** (after 1 attempt(s))"
    );
}

#[test]
fn the_userinfo_of_the_base_url_is_never_printed() {
    let secret = "hunter2-long-secret";
    // Echoed back by the server, and in a connection error to a closed port.
    let server = MockServer::start(move |_| {
        Reply::json(
            401,
            json!({"type": "error", "error": {"type": "authentication_error",
                "message": format!("refused http://alice:{secret}@proxy and {secret}")}}),
        )
    });
    let with_userinfo = server
        .url
        .replacen("http://", &format!("http://alice:{secret}@"), 1);
    let config = env_config(KEY, &with_userinfo);
    assert_eq!(
        config.display_base_url(),
        server.url.replacen("http://", "http://***@", 1)
    );
    assert!(!format!("{config:?}").contains(secret));
    let failure = one_request(&Client::new(config)).expect_err("401");
    assert!(!failure.message().contains(secret), "{}", failure.message());
    assert!(
        !failure.message().contains("alice:"),
        "{}",
        failure.message()
    );
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let config = env_config(KEY, &format!("http://alice:{secret}@127.0.0.1:{closed}"));
    let failure = one_request(&Client::new(config)).expect_err("nothing listens");
    assert!(!failure.message().contains(secret), "{}", failure.message());
    let wrong_scheme = LiveConfig::from_env(
        |name| match name {
            "ANTHROPIC_API_KEY" => Some(KEY.to_owned()),
            "ANTHROPIC_BASE_URL" => Some(format!("ftp://alice:{secret}@host")),
            _ => None,
        },
        None,
    )
    .expect_err("not http");
    assert!(!wrong_scheme.to_string().contains(secret), "{wrong_scheme}");
}

#[test]
fn a_password_holding_url_delimiters_is_never_printed_either() {
    // Pasted unencoded, `/`, `?` and `#` end the authority by the URL
    // grammar, yet the text before the last `@` is still the user's secret.
    for secret in ["hunter2/long", "hunter2?long", "hunter2#long"] {
        let url = format!("http://alice:{secret}@127.0.0.1:1/");
        let config = env_config(KEY, &url);
        assert_eq!(config.display_base_url(), "http://***@127.0.0.1:1/");
        assert!(!format!("{config:?}").contains(secret), "{config:?}");
    }
}

#[test]
fn the_live_line_of_the_binary_hides_the_userinfo() {
    let server = MockServer::start(demo_handler());
    let secret = "hunter2-long-secret";
    let output = std::process::Command::new(common::bin())
        .args(["demo", "--live", "--decision", "deny"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("ANTHROPIC_API_KEY", KEY)
        .env(
            "ANTHROPIC_BASE_URL",
            server
                .url
                .replacen("http://", &format!("http://alice:{secret}@"), 1),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "[live] model claude-sonnet-4-5 at {}",
            server.url.replacen("http://", "http://***@", 1)
        )),
        "{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains(secret));
}

#[test]
fn streamed_text_ends_its_line_before_the_next_progress_line() {
    let server = MockServer::start(demo_stream_handler());
    let output = std::process::Command::new(common::bin())
        .args(["demo", "--live", "--stream", "--decision", "allow"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("ANTHROPIC_API_KEY", KEY)
        .env("ANTHROPIC_BASE_URL", &server.url)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run binary");
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let answer = String::from_utf8_lossy(&output.stdout);
    let answer = answer.trim_end();
    assert!(
        stderr.contains(&format!("{answer}\n[parent] finished")),
        "the streamed answer ends its line:\n{stderr}"
    );
    for line in stderr.lines() {
        for tag in ["[parent]", "[child-1]"] {
            assert!(
                line.find(tag).is_none_or(|at| at == 0),
                "a progress line glued to streamed text: {line:?}\n{stderr}"
            );
        }
    }
}

#[test]
fn subagents_streaming_side_by_side_never_tear_each_others_lines() {
    // The parent delegates twice in one reply; both children stream a long
    // line at once, one event at a time. Their lines must come out whole.
    let texts = ["A".repeat(60), "B".repeat(60)];
    let wanted = texts.clone();
    let mut parent_calls = 0;
    let mut child_calls = 0;
    let server = MockServer::start(move |recorded| {
        let body = recorded.json();
        let message = if body["system"][0]["text"]
            == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM
        {
            child_calls += 1;
            let text = &texts[(child_calls - 1) % 2];
            json!({"content": [{"type": "text", "text": format!("child says {text}")}],
                "stop_reason": "end_turn"})
        } else {
            parent_calls += 1;
            if parent_calls == 1 {
                json!({"content": [
                    {"type": "tool_use", "id": "toolu_a", "name": "task", "input": {"task": "Read main.py."}},
                    {"type": "tool_use", "id": "toolu_b", "name": "task", "input": {"task": "Read expected.txt."}}],
                    "stop_reason": "tool_use"})
            } else {
                json!({"content": [{"type": "text", "text": "Both read."}], "stop_reason": "end_turn"})
            }
        };
        let mut message = message;
        message["id"] = json!("msg_side");
        message["type"] = json!("message");
        message["role"] = json!("assistant");
        message["model"] = json!("claude-test");
        message["stop_sequence"] = Value::Null;
        message["usage"] = json!({"input_tokens": 10, "output_tokens": 5});
        // Text in pieces of 10 characters, so each stream has many events.
        let mut events = mock_api::message_events(&message);
        let mut pieces = Vec::new();
        for (name, event) in events.drain(..) {
            match event["delta"]["text"].as_str() {
                Some(text) if name == "content_block_delta" => {
                    let chars: Vec<char> = text.chars().collect();
                    for chunk in chars.chunks(10) {
                        let mut piece = event.clone();
                        piece["delta"]["text"] = json!(chunk.iter().collect::<String>());
                        pieces.push((name, piece));
                    }
                }
                _ => pieces.push((name, event)),
            }
        }
        Reply::Slow {
            events: pieces
                .iter()
                .map(|event| mock_api::sse_body(std::slice::from_ref(event)))
                .collect(),
            gap: Duration::from_millis(20),
        }
    });
    let output = std::process::Command::new(common::bin())
        .args(["demo", "--live", "--stream", "--decision", "deny"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("ANTHROPIC_API_KEY", KEY)
        .env("ANTHROPIC_BASE_URL", &server.url)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    for text in &wanted {
        let line = format!("child says {text}");
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

/// A handler answering the parent from `replies` in order, as the API would.
fn scripted_handler(replies: Vec<Value>) -> impl FnMut(&mock_api::Recorded) -> Reply + Send {
    let mut replies = replies.into_iter();
    let mut count = 0;
    move |_| {
        count += 1;
        let mut message = replies.next().expect("a reply for every request");
        message["id"] = json!(format!("msg_plan_{count}"));
        message["type"] = json!("message");
        message["role"] = json!("assistant");
        message["model"] = json!("claude-test");
        message["usage"] = json!({"input_tokens": 10, "output_tokens": 5});
        Reply::json(200, message)
    }
}

fn plan_input(status: &str) -> Value {
    json!({"items": [{"id": "read", "text": "read main.py", "status": status},
                     {"id": "run", "text": "run it", "status": "pending"}]})
}

#[test]
fn the_plan_rides_as_a_second_system_block_and_only_its_change_costs_cache_reads() {
    let replies = vec![
        json!({"content": [{"type": "tool_use", "id": "toolu_1", "name": "todo_write", "input": plan_input("in_progress")}], "stop_reason": "tool_use"}),
        json!({"content": [{"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "main.py"}}], "stop_reason": "tool_use"}),
        json!({"content": [{"type": "tool_use", "id": "toolu_3", "name": "todo_write", "input": plan_input("completed")}], "stop_reason": "tool_use"}),
        json!({"content": [{"type": "text", "text": "main.py prints the expected text."}], "stop_reason": "end_turn"}),
    ];
    let server = MockServer::start(scripted_handler(replies));
    let client = Client::new(config(&server.url)).with_sleeper(|_| {});
    let mut settings =
        host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
    settings.decision = DecisionMode::Deny;
    settings.progress = false;
    let report = host::execute(&settings, Models::Live(Arc::new(client))).expect("run");
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let bodies: Vec<Value> = server.recorded().iter().map(|r| r.json()).collect();
    assert_eq!(bodies.len(), 4);
    let eph = json!({"type": "ephemeral"});
    let plans: Vec<&str> = bodies
        .iter()
        .map(|body| {
            assert!(!mock_api::text_after_tool_result(body), "{body}");
            let system = body["system"].as_array().expect("system blocks");
            assert_eq!(system.len(), 2, "the system prompt, then the plan");
            assert_eq!(system[0]["cache_control"], eph);
            assert_eq!(system[1].get("cache_control"), None);
            system[1]["text"].as_str().expect("the plan text")
        })
        .collect();
    assert!(plans[0].contains("none yet"));
    assert!(plans[1].contains("[>] read: read main.py"));
    assert_eq!(plans[1], plans[2], "read_file leaves the plan alone");
    assert!(plans[3].contains("[x] read: read main.py"));
    // The cached prefix (tools + the first system block, with its
    // breakpoint) is byte-identical on every request.
    let prefix = |body: &Value| {
        let blocks = mock_api::prompt_blocks(body);
        let tools = body["tools"].as_array().map_or(0, Vec::len);
        blocks[..=tools].to_vec()
    };
    for body in &bodies[1..] {
        assert_eq!(prefix(body), prefix(&bodies[0]));
    }
    // What each request reads back from the cache.
    let mut cache = mock_api::PromptCache::default();
    let uses: Vec<mock_api::CacheUse> = bodies.iter().map(|body| cache.request(body)).collect();
    let stable: usize = prefix(&bodies[0])
        .iter()
        .map(|(text, _)| text.len() + 1)
        .sum();
    assert_eq!(uses[0].read, 0);
    assert_eq!(
        uses[1].read, stable,
        "a changed plan: only tools + system are read"
    );
    assert_eq!(
        uses[2].read,
        uses[1].read + uses[1].written,
        "an unchanged plan: everything the previous request wrote is read"
    );
    assert_eq!(uses[3].read, stable, "a changed plan again");
    for (index, (body, used)) in bodies.iter().zip(&uses).enumerate() {
        eprintln!(
            "request {}: plan {}, cache read {} of {} bytes, written {}",
            index + 1,
            if index > 0 && body["system"][1] == bodies[index - 1]["system"][1] {
                "unchanged"
            } else {
                "new"
            },
            used.read,
            used.total,
            used.written
        );
    }
}

#[test]
fn a_live_demo_never_sends_a_text_block_after_tool_results() {
    for (stream, decision) in [(false, DecisionMode::Allow), (true, DecisionMode::Deny)] {
        let server = if stream {
            MockServer::start(demo_stream_handler())
        } else {
            MockServer::start(demo_handler())
        };
        let mut config = config(&server.url);
        config.stream = stream;
        let mut settings =
            host::demo_settings(Some(common::examples().join("workspace"))).expect("settings");
        settings.decision = decision;
        settings.progress = false;
        let report =
            host::execute(&settings, Models::Live(Arc::new(Client::new(config)))).expect("run");
        assert_eq!(report.outcome.status, StatusKind::Answered);
        let recorded = server.recorded();
        assert_eq!(recorded.len(), 7);
        let mut results = 0;
        for request in &recorded {
            let body = request.json();
            assert!(!mock_api::text_after_tool_result(&body), "{body}");
            results += body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["content"][0]["type"] == "tool_result")
                .count();
        }
        assert!(results > 0, "the run did send tool results");
    }
}
