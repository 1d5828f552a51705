//! Round trips of the wire types on Messages API bodies shaped as the API documents them.

use serde_json::{Value, json};
use subloop::ModelResponse;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::ReplyBlock;
use subloop::core::protocol::Role;
use subloop::core::protocol::StopReason;
use subloop::core::protocol::ToolResultContent;
use subloop::core::protocol::ToolUseId;
use subloop::core::protocol::Usage;

/// Parses a full response body the way the crate does.
fn parse(body: &Value) -> ModelResponse {
    ModelResponse::from_value(body.clone()).expect("a valid Messages API response")
}

/// The subset of a response body that `ModelResponse` keeps, for shape comparisons.
fn kept_fields(body: &Value) -> Value {
    json!({
        "content": body["content"],
        "stop_reason": body["stop_reason"],
        "usage": body["usage"],
    })
}

#[test]
fn text_reply_parses_and_reserializes_unchanged() {
    let body = json!({
        "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "text", "text": "Hi! My name is Claude."}
        ],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {
            "input_tokens": 2095,
            "output_tokens": 503,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0
        }
    });
    let reply = parse(&body);
    assert_eq!(
        reply.content,
        vec![ReplyBlock::Known(Block::text("Hi! My name is Claude."))]
    );
    assert_eq!(reply.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(reply.usage, Some(Usage::new(2095, 503).with_cache(0, 0)));
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
    // And the re-serialized form parses back to the same value.
    let again = ModelResponse::from_value(serde_json::to_value(&reply).unwrap()).unwrap();
    assert_eq!(again, reply);
}

#[test]
fn tool_use_reply_parses_calls_in_order() {
    let body = json!({
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-opus-4-1-20250805",
        "content": [
            {"type": "text", "text": "I'll check the current weather in San Francisco for you."},
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA", "unit": "celsius"}
            },
            {
                "type": "tool_use",
                "id": "toolu_01B7xq3r9Lk2m3n4p5q6r7s8",
                "name": "get_time",
                "input": {"timezone": "America/Los_Angeles"}
            }
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {
            "input_tokens": 384,
            "output_tokens": 92,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0
        }
    });
    let reply = parse(&body);
    assert_eq!(reply.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(
        reply.content,
        vec![
            ReplyBlock::Known(Block::text(
                "I'll check the current weather in San Francisco for you."
            )),
            ReplyBlock::Known(Block::tool_use(
                "toolu_01A09q90qw90lq917835lq9",
                "get_weather",
                json!({"location": "San Francisco, CA", "unit": "celsius"}),
            )),
            ReplyBlock::Known(Block::tool_use(
                "toolu_01B7xq3r9Lk2m3n4p5q6r7s8",
                "get_time",
                json!({"timezone": "America/Los_Angeles"}),
            )),
        ]
    );
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn thinking_and_redacted_thinking_are_kept_byte_for_byte() {
    let thinking = r#"{"type":"thinking","thinking":"Let me analyze this step by step.\nFirst, 27 * 453 = 12231.","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+BkPgA5Y/3XfN7dO8Dz1k5g/Bn1/dXy6MyZlA=="}"#;
    let redacted = r#"{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj2pLmN0kRoXJnRVO4qy5cB5Kg=="}"#;
    let text = r#"{"type":"text","text":"27 * 453 = 12,231"}"#;
    let body_text = format!(
        r#"{{"id":"msg_01ThinkRedact","type":"message","role":"assistant","model":"claude-3-7-sonnet-20250219","content":[{thinking},{redacted},{text}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":48,"output_tokens":311,"cache_creation_input_tokens":null,"cache_read_input_tokens":null}}}}"#
    );
    let reply: ModelResponse = serde_json::from_str(&body_text).unwrap();
    assert_eq!(reply.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(reply.content.len(), 3);
    match &reply.content[0] {
        ReplyBlock::Known(Block::Thinking {
            thinking,
            signature,
        }) => {
            assert_eq!(
                thinking,
                "Let me analyze this step by step.\nFirst, 27 * 453 = 12231."
            );
            assert!(signature.starts_with("EqQBCgIYAhIM"), "{signature}");
        }
        other => panic!("expected a thinking block, got {other:?}"),
    }
    match &reply.content[1] {
        ReplyBlock::Known(Block::RedactedThinking { data }) => {
            assert!(data.ends_with("cB5Kg=="), "{data}");
        }
        other => panic!("expected a redacted_thinking block, got {other:?}"),
    }
    // Each block re-serializes to exactly the bytes it arrived as.
    let out: Vec<String> = reply
        .content
        .iter()
        .map(|block| serde_json::to_string(block).unwrap())
        .collect();
    assert_eq!(out, vec![thinking, redacted, text]);
    // The same holds for the Block as stored in the history.
    let ReplyBlock::Known(block) = &reply.content[0] else {
        unreachable!()
    };
    assert_eq!(serde_json::to_string(block).unwrap(), thinking);
    let ReplyBlock::Known(block) = &reply.content[1] else {
        unreachable!()
    };
    assert_eq!(serde_json::to_string(block).unwrap(), redacted);
}

#[test]
fn max_tokens_reply_parses() {
    let body = json!({
        "id": "msg_01MaxTok",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Here is a very long essay that was cut"}],
        "stop_reason": "max_tokens",
        "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 1024}
    });
    let reply = parse(&body);
    assert_eq!(reply.stop_reason, Some(StopReason::MaxTokens));
    assert_eq!(reply.stop_reason.as_ref().unwrap().as_str(), "max_tokens");
    // Absent cache fields default to zero.
    assert_eq!(reply.usage, Some(Usage::new(12, 1024).with_cache(0, 0)));
    assert_eq!(
        serde_json::to_value(&reply).unwrap()["stop_reason"],
        "max_tokens"
    );
}

#[test]
fn refusal_reply_parses() {
    let body = json!({
        "id": "msg_01Refusal",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "I can't help with that."}],
        "stop_reason": "refusal",
        "stop_sequence": null,
        "usage": {"input_tokens": 30, "output_tokens": 7,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(reply.stop_reason, Some(StopReason::Refusal));
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn pause_turn_reply_parses() {
    let body = json!({
        "id": "msg_01Pause",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Searching..."}],
        "stop_reason": "pause_turn",
        "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 20,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(reply.stop_reason, Some(StopReason::PauseTurn));
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn model_context_window_exceeded_reply_parses() {
    let body = json!({
        "id": "msg_01Ctx",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Partial"}],
        "stop_reason": "model_context_window_exceeded",
        "stop_sequence": null,
        "usage": {"input_tokens": 199000, "output_tokens": 1000,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(
        reply.stop_reason,
        Some(StopReason::ModelContextWindowExceeded)
    );
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn stop_sequence_reply_parses() {
    let body = json!({
        "id": "msg_01StopSeq",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "one, two"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": ", three",
        "usage": {"input_tokens": 9, "output_tokens": 4,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(reply.stop_reason, Some(StopReason::StopSequence));
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn unknown_stop_reason_is_kept_as_other() {
    let body = json!({
        "id": "msg_01Future",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-9",
        "content": [{"type": "text", "text": "?"}],
        "stop_reason": "brand_new_reason",
        "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(
        reply.stop_reason,
        Some(StopReason::Other("brand_new_reason".to_owned()))
    );
    assert_eq!(
        reply.stop_reason.as_ref().unwrap().to_string(),
        "brand_new_reason"
    );
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn every_stop_reason_string_round_trips() {
    let names = [
        ("end_turn", StopReason::EndTurn),
        ("tool_use", StopReason::ToolUse),
        ("max_tokens", StopReason::MaxTokens),
        ("stop_sequence", StopReason::StopSequence),
        ("pause_turn", StopReason::PauseTurn),
        ("refusal", StopReason::Refusal),
        (
            "model_context_window_exceeded",
            StopReason::ModelContextWindowExceeded,
        ),
        ("", StopReason::Other(String::new())),
        ("END_TURN", StopReason::Other("END_TURN".to_owned())),
    ];
    for (name, reason) in names {
        let parsed: StopReason = serde_json::from_value(json!(name)).unwrap();
        assert_eq!(parsed, reason, "{name}");
        assert_eq!(serde_json::to_value(&parsed).unwrap(), json!(name));
    }
}

#[test]
fn null_stop_reason_is_none() {
    // Streaming `message_start` events carry a message with `stop_reason: null`.
    let body = json!({
        "id": "msg_01Null",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": null,
        "stop_sequence": null,
        "usage": {"input_tokens": 25, "output_tokens": 1,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(reply.stop_reason, None);
    assert!(reply.content.is_empty());
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));

    // An absent stop_reason is None too, and an absent usage stays absent.
    let reply = ModelResponse::from_value(json!({"content": []})).unwrap();
    assert_eq!(reply.stop_reason, None);
    assert_eq!(reply.usage, None);
    assert_eq!(
        serde_json::to_value(&reply).unwrap(),
        json!({"content": [], "stop_reason": null})
    );
}

#[test]
fn a_reply_that_is_not_an_object_is_an_error() {
    assert!(ModelResponse::from_value(json!("end_turn")).is_err());
    assert!(ModelResponse::from_value(json!([1, 2])).is_err());
    assert!(ModelResponse::from_value(json!({"stop_reason": "end_turn"})).is_err());
}

#[test]
fn user_message_with_bare_string_content_is_one_text_block() {
    let request = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "messages": [
            {"role": "user", "content": "Hello, Claude"}
        ]
    });
    let messages: Vec<Message> = serde_json::from_value(request["messages"].clone()).unwrap();
    assert_eq!(
        messages,
        vec![Message {
            role: Role::User,
            content: vec![Block::text("Hello, Claude")],
        }]
    );
    assert_eq!(messages[0], Message::user_text("Hello, Claude"));
    // It re-serializes in the block form, which the API also accepts.
    assert_eq!(
        serde_json::to_value(&messages[0]).unwrap(),
        json!({"role": "user", "content": [{"type": "text", "text": "Hello, Claude"}]})
    );
}

#[test]
fn multi_turn_request_messages_round_trip() {
    let messages = json!([
        {"role": "user", "content": [{"type": "text", "text": "Hello there."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi, I'm Claude. How can I help you?"}]},
        {"role": "user", "content": [{"type": "text", "text": "Can you explain LLMs in plain English?"}]}
    ]);
    let parsed: Vec<Message> = serde_json::from_value(messages.clone()).unwrap();
    assert_eq!(parsed.len(), 3);
    assert_eq!(parsed[1].role, Role::Assistant);
    assert_eq!(parsed[1].text(), "Hi, I'm Claude. How can I help you?");
    assert_eq!(serde_json::to_value(&parsed).unwrap(), messages);
}

#[test]
fn tool_result_with_string_content() {
    let message = json!({
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                "content": "15 degrees"
            }
        ]
    });
    let parsed: Message = serde_json::from_value(message.clone()).unwrap();
    assert_eq!(
        parsed.content,
        vec![Block::ToolResult {
            tool_use_id: ToolUseId::new("toolu_01A09q90qw90lq917835lq9"),
            content: ToolResultContent::Text("15 degrees".into()),
            is_error: false,
        }]
    );
    // `is_error: false` is omitted, as it was on input.
    assert_eq!(serde_json::to_value(&parsed).unwrap(), message);
}

#[test]
fn tool_result_with_block_content_and_is_error() {
    let message = json!({
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                "content": [
                    {"type": "text", "text": "ConnectionError: the weather service API is not available"},
                    {"type": "text", "text": "(HTTP 500)"}
                ],
                "is_error": true
            },
            {"type": "text", "text": "What should I do next?"}
        ]
    });
    let parsed: Message = serde_json::from_value(message.clone()).unwrap();
    let Block::ToolResult {
        tool_use_id,
        content,
        is_error,
    } = &parsed.content[0]
    else {
        panic!("expected a tool_result, got {:?}", parsed.content[0]);
    };
    assert_eq!(tool_use_id.as_str(), "toolu_01A09q90qw90lq917835lq9");
    assert!(*is_error);
    assert_eq!(
        content,
        &ToolResultContent::Blocks(vec![
            Block::text("ConnectionError: the weather service API is not available"),
            Block::text("(HTTP 500)"),
        ])
    );
    assert_eq!(
        content.text(),
        "ConnectionError: the weather service API is not available\n(HTTP 500)"
    );
    assert_eq!(parsed.text(), "What should I do next?");
    assert_eq!(serde_json::to_value(&parsed).unwrap(), message);
}

#[test]
fn tool_result_is_error_false_explicit_parses_and_is_dropped() {
    let block = json!({
        "type": "tool_result",
        "tool_use_id": "toolu_x",
        "content": "ok",
        "is_error": false
    });
    let parsed: Block = serde_json::from_value(block).unwrap();
    assert_eq!(
        serde_json::to_value(&parsed).unwrap(),
        json!({"type": "tool_result", "tool_use_id": "toolu_x", "content": "ok"})
    );
}

#[test]
fn unknown_block_type_is_unsupported_naming_the_kind() {
    let body = json!({
        "id": "msg_01Search",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "text", "text": "Let me search."},
            {
                "type": "server_tool_use",
                "id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
                "name": "web_search",
                "input": {"query": "claude shannon birth date"}
            }
        ],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 10,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    let reply = parse(&body);
    assert_eq!(
        reply.content[0],
        ReplyBlock::Known(Block::text("Let me search."))
    );
    match &reply.content[1] {
        ReplyBlock::Unsupported { kind, reason, raw } => {
            assert_eq!(kind, "server_tool_use");
            assert_eq!(reason, "block type not supported");
            assert_eq!(raw, &body["content"][1]);
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // Unsupported blocks re-serialize as received.
    assert_eq!(serde_json::to_value(&reply).unwrap(), kept_fields(&body));
}

#[test]
fn block_without_type_is_unsupported_missing() {
    let raw = json!({"text": "no type"});
    match ReplyBlock::from_value(raw.clone()) {
        ReplyBlock::Unsupported {
            kind, raw: kept, ..
        } => {
            assert_eq!(kind, "<missing>");
            assert_eq!(kept, raw);
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    match ReplyBlock::from_value(json!({"type": 7})) {
        ReplyBlock::Unsupported { kind, .. } => assert_eq!(kind, "<missing>"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    match ReplyBlock::from_value(json!("text")) {
        ReplyBlock::Unsupported { kind, .. } => assert_eq!(kind, "<missing>"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn tool_use_without_id_is_unsupported() {
    let raw = json!({"type": "tool_use", "name": "get_weather", "input": {"location": "Paris"}});
    match ReplyBlock::from_value(raw.clone()) {
        ReplyBlock::Unsupported {
            kind,
            reason,
            raw: kept,
        } => {
            assert_eq!(kind, "tool_use");
            assert!(reason.starts_with("malformed block"), "{reason}");
            assert!(reason.contains("id"), "{reason}");
            assert_eq!(kept, raw);
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn known_blocks_with_mistyped_fields_are_unsupported() {
    let cases = [
        json!({"type": "text", "text": 42}),
        json!({"type": "text"}),
        json!({"type": "tool_use", "id": 5, "name": "x", "input": {}}),
        json!({"type": "tool_use", "id": "toolu_1", "input": {}}),
        json!({"type": "thinking", "thinking": "hmm"}),
        json!({"type": "redacted_thinking"}),
    ];
    for raw in cases {
        let expected_kind = raw["type"].as_str().unwrap().to_owned();
        match ReplyBlock::from_value(raw.clone()) {
            ReplyBlock::Unsupported { kind, reason, .. } => {
                assert_eq!(kind, expected_kind, "{raw}");
                assert!(reason.starts_with("malformed block"), "{raw}: {reason}");
            }
            other => panic!("{raw}: expected Unsupported, got {other:?}"),
        }
    }
}

#[test]
fn tool_result_in_a_reply_is_unsupported() {
    let raw = json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"});
    match ReplyBlock::from_value(raw) {
        ReplyBlock::Unsupported { kind, reason, .. } => {
            assert_eq!(kind, "tool_result");
            assert!(reason.contains("tool results"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn usage_with_null_cache_fields_is_zero() {
    let usage: Usage = serde_json::from_value(json!({
        "input_tokens": 25,
        "output_tokens": 1,
        "cache_creation_input_tokens": null,
        "cache_read_input_tokens": null
    }))
    .unwrap();
    assert_eq!(usage, Usage::new(25, 1).with_cache(0, 0));
    // Extra fields the API adds (cache_creation breakdown, service_tier) are accepted.
    let usage: Usage = serde_json::from_value(json!({
        "input_tokens": 2095,
        "output_tokens": 503,
        "cache_creation_input_tokens": 2051,
        "cache_read_input_tokens": 17,
        "cache_creation": {"ephemeral_5m_input_tokens": 2051, "ephemeral_1h_input_tokens": 0},
        "server_tool_use": {"web_search_requests": 0},
        "service_tier": "standard"
    }))
    .unwrap();
    assert_eq!(usage, Usage::new(2095, 503).with_cache(2051, 17));
    assert_eq!(
        serde_json::to_value(usage).unwrap(),
        json!({
            "input_tokens": 2095,
            "output_tokens": 503,
            "cache_creation_input_tokens": 2051,
            "cache_read_input_tokens": 17
        })
    );
}

#[test]
fn assistant_history_message_with_thinking_and_tool_use_round_trips() {
    // What a host sends back: the assistant turn unchanged, then the tool results.
    let messages = json!([
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants weather.", "signature": "WaUjzkypQ2mUEVM36O2TxuC06KN8xyfbJwyem2dw3URve/op91XWHOEBLLqIOMfFG/UvLEczmEsUjavL"},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5"},
            {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"location": "Paris"}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "18 C, sunny"}
        ]}
    ]);
    let parsed: Vec<Message> = serde_json::from_value(messages.clone()).unwrap();
    assert_eq!(
        parsed[0],
        Message::user_text("What's the weather in Paris?")
    );
    assert_eq!(
        parsed[1]
            .content
            .iter()
            .map(Block::kind)
            .collect::<Vec<_>>(),
        vec!["thinking", "redacted_thinking", "tool_use"]
    );
    let mut expected = messages;
    expected[0]["content"] = json!([{"type": "text", "text": "What's the weather in Paris?"}]);
    assert_eq!(serde_json::to_value(&parsed).unwrap(), expected);
}
