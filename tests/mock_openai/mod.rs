//! Plays an OpenAI-compatible `/v1/chat/completions` server for tests, on
//! the loopback server of `mock_api`: requests are read back into the
//! crate's types, the demo models answer, and the answer goes out as a
//! `chat.completion` (or as its `chat.completion.chunk` stream).
#![allow(dead_code)]

use serde_json::{Value, json};
use subloop::Model;
use subloop::ModelResponse;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::ReplyBlock;
use subloop::core::protocol::Request;
use subloop::core::protocol::Role;
use subloop::core::protocol::StopReason;
use subloop::core::protocol::ToolDefinition;
use subloop::core::protocol::ToolResultContent;
use subloop::core::protocol::ToolUseId;
use subloop::providers::demo::{DemoChild, DemoParent};

use crate::mock_api::{Recorded, Reply};

/// A request body read back: system, attachment, tools, history.
pub struct Parsed {
    pub system: String,
    pub attachment: Option<String>,
    pub tools: Vec<ToolDefinition>,
    pub messages: Vec<Message>,
}

/// Reads a Chat Completions request body back into the crate's types.
pub fn parse_request(body: &Value) -> Parsed {
    let mut system = None;
    let mut attachment = None;
    let mut messages: Vec<Message> = Vec::new();
    for message in body["messages"].as_array().expect("messages") {
        let text = message["content"].as_str().unwrap_or_default().to_owned();
        match message["role"].as_str().expect("a role") {
            "system" if system.is_none() => system = Some(text),
            "system" => attachment = Some(text),
            "user" => messages.push(Message::user_text(text)),
            "assistant" => {
                let mut content = Vec::new();
                if !text.is_empty() {
                    content.push(Block::text(text));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let arguments = call["function"]["arguments"].as_str().expect("text");
                    let input = match serde_json::from_str::<Value>(arguments) {
                        Ok(object @ Value::Object(_)) => object,
                        _ => Value::String(arguments.to_owned()),
                    };
                    content.push(Block::tool_use(
                        call["id"].as_str().expect("an id"),
                        call["function"]["name"].as_str().expect("a name"),
                        input,
                    ));
                }
                messages.push(Message {
                    role: Role::Assistant,
                    content,
                });
            }
            "tool" => {
                let block = Block::ToolResult {
                    tool_use_id: ToolUseId::new(message["tool_call_id"].as_str().expect("id")),
                    content: ToolResultContent::Text(text.into()),
                    is_error: false,
                };
                match messages.last_mut() {
                    Some(last)
                        if last.role == Role::User
                            && matches!(last.content.first(), Some(Block::ToolResult { .. })) =>
                    {
                        last.content.push(block)
                    }
                    _ => messages.push(Message {
                        role: Role::User,
                        content: vec![block],
                    }),
                }
            }
            other => panic!("unexpected role {other}"),
        }
    }
    let tools = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|tool| ToolDefinition {
            name: tool["function"]["name"].as_str().expect("name").to_owned(),
            description: tool["function"]["description"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            input_schema: tool["function"]["parameters"].clone(),
        })
        .collect();
    Parsed {
        system: system.unwrap_or_default(),
        attachment,
        tools,
        messages,
    }
}

/// The usage figures every mock reply reports.
pub fn usage(cached: Option<u64>) -> Value {
    let mut usage = json!({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110});
    if let Some(cached) = cached {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached, "audio_tokens": 0});
        usage["completion_tokens_details"] = json!({"reasoning_tokens": 0});
    }
    usage
}

/// A crate reply as a `chat.completion` body.
pub fn completion(reply: &ModelResponse, id: &str, model: &Value) -> Value {
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
    let mut message = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": id, "object": "chat.completion", "created": 1_760_000_000, "model": model,
        "system_fingerprint": "fp_mock",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": usage(Some(40)),
    })
}

/// A `chat.completion` cut into the chunks a server streams: the role,
/// the text in two pieces, each call opened with its id and name and then
/// its arguments in 3-byte pieces, the calls' pieces interleaved, the
/// finish reason, the usage chunk, `[DONE]`.
pub fn chunks(completion: &Value) -> Vec<Value> {
    let head = |choices: Value| {
        // As OpenAI sends them: `usage` is null in every chunk but the last.
        json!({"id": completion["id"], "object": "chat.completion.chunk",
               "created": completion["created"], "model": completion["model"],
               "service_tier": "default", "system_fingerprint": "fp_mock",
               "choices": choices, "usage": null})
    };
    let delta = |delta: Value| head(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    let message = &completion["choices"][0]["message"];
    let mut out = vec![delta(
        json!({"role": "assistant", "content": "", "refusal": null, "tool_calls": null}),
    )];
    if let Some(text) = message["content"].as_str() {
        let cut = text
            .char_indices()
            .nth(text.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        out.push(delta(json!({"content": &text[..cut]})));
        out.push(delta(json!({"content": &text[cut..]})));
    }
    let calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut pieces: Vec<Vec<String>> = Vec::new();
    for (index, call) in calls.iter().enumerate() {
        out.push(delta(
            json!({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}]}),
        ));
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        let chars: Vec<char> = arguments.chars().collect();
        pieces.push(chars.chunks(3).map(|c| c.iter().collect()).collect());
    }
    let longest = pieces.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..longest {
        for (index, list) in pieces.iter().enumerate() {
            if let Some(piece) = list.get(round) {
                out.push(delta(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                ));
            }
        }
    }
    out.push(head(json!([{"index": 0, "delta": {},
        "finish_reason": completion["choices"][0]["finish_reason"]}])));
    let mut last = head(json!([]));
    last["usage"] = completion["usage"].clone();
    out.push(last);
    out
}

/// The body of a stream of `chunks`, with `[DONE]` at the end when `done`.
pub fn stream_body(chunks: &[Value], done: bool) -> Vec<u8> {
    let mut out: String = chunks
        .iter()
        .map(|chunk| format!("data: {chunk}\n\n"))
        .collect();
    if done {
        out.push_str("data: [DONE]\n\n");
    }
    out.into_bytes()
}

/// A stream reply.
pub fn sse(chunks: &[Value]) -> Reply {
    Reply::Full {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: stream_body(chunks, true),
    }
}

/// Plays the demo: the child model when the system prompt is the
/// child's, the parent model otherwise; streams when the request asks.
pub fn demo_handler() -> impl FnMut(&Recorded) -> Reply + Send + 'static {
    let mut parent = DemoParent;
    let mut child = DemoChild;
    let mut count = 0;
    move |recorded| {
        count += 1;
        let body = recorded.json();
        let parsed = parse_request(&body);
        let request = Request {
            system: &parsed.system,
            tools: &parsed.tools,
            messages: &parsed.messages,
            attachment: parsed.attachment.as_deref(),
            output: None,
        };
        let reply = if parsed.system == subloop::agent::subagent::SubagentConfig::CHILD_SYSTEM {
            child.respond(&request)
        } else {
            parent.respond(&request)
        }
        .expect("demo models do not fail");
        let completion = completion(&reply, &format!("chatcmpl-mock-{count}"), &body["model"]);
        if body["stream"] == true {
            sse(&chunks(&completion))
        } else {
            Reply::json(200, completion)
        }
    }
}
