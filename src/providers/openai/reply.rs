//! A Chat Completions reply (`chat.completion`) as the crate's [`ModelResponse`].
//!
//! * `choices[0].message.content` → a text block (a list of content parts:
//!   their `text`s joined); a non-empty `refusal` → a text block and stop
//!   reason `refusal`;
//! * each of `message.tool_calls` → a `tool_use` block with the server's id
//!   (missing → empty, which the conversation rejects as `protocol_error`);
//!   `function.arguments` that parse as a JSON object are the input; empty
//!   arguments are `{}`; anything else is kept as a JSON string holding the
//!   text exactly as received, which the executor answers `not executed:
//!   arguments are not valid JSON (…)` (or, for JSON of another kind such as
//!   `[1,2]`, `not executed: arguments are JSON but not an object: an
//!   array`) and the next request sends back unchanged; a call whose `type` is not `function` is an unsupported block;
//! * `finish_reason`: `stop` → `end_turn`, `tool_calls` → `tool_use`,
//!   `length` → `max_tokens`, `content_filter` → `refusal`, others kept as an
//!   unknown stop reason;
//! * `usage.prompt_tokens` minus `prompt_tokens_details.cached_tokens` →
//!   `input_tokens`, the cached tokens → `cache_read_input_tokens`,
//!   `completion_tokens` → `output_tokens`;
//! * no `choices` is not a reply at all: the request fails (`model_error`).
//!
//! Reasoning fields some servers add (`reasoning_content`, `reasoning`) are
//! not mapped: they stay in the raw reply the trace writes, and are not sent
//! back (Chat Completions has no field for them in a request; servers that
//! produce them do not need them back).

use serde_json::{Map, Value, json};

use crate::core::protocol::{Block, ModelResponse, ReplyBlock, StopReason, Usage};

/// The crate's stop reason for a `finish_reason`.
pub fn stop_reason(finish_reason: &str) -> StopReason {
    match finish_reason {
        "stop" => StopReason::EndTurn,
        "tool_calls" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        "content_filter" => StopReason::Refusal,
        other => StopReason::Other(other.to_owned()),
    }
}

/// The input of a call from its `function.arguments`: a JSON object as
/// is, empty text as `{}`, anything else the text itself as a JSON string.
pub fn arguments_input(arguments: Option<&Value>) -> Value {
    match arguments {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(text)) if text.trim().is_empty() => json!({}),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(object @ Value::Object(_)) => object,
            _ => Value::String(text.clone()),
        },
        // Some servers send the arguments as an object rather than as text.
        Some(object @ Value::Object(_)) => object.clone(),
        Some(other) => Value::String(other.to_string()),
    }
}

fn tool_call_block(call: &Value) -> ReplyBlock {
    let kind = call
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function");
    if kind != "function" {
        return ReplyBlock::Unsupported {
            kind: format!("tool_call:{kind}"),
            reason: format!("tool call type `{kind}` is not supported"),
            raw: call.clone(),
        };
    }
    let text = |value: Option<&Value>| value.and_then(Value::as_str).unwrap_or("").to_owned();
    let function = call.get("function");
    Block::tool_use(
        text(call.get("id")),
        text(function.and_then(|f| f.get("name"))),
        arguments_input(function.and_then(|f| f.get("arguments"))),
    )
    .into()
}

fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The crate's usage figures of a `usage` object.
pub fn usage(usage: &Map<String, Value>) -> Usage {
    let figure = |value: Option<&Value>| value.and_then(Value::as_u64).unwrap_or(0);
    let prompt = figure(usage.get("prompt_tokens"));
    let cached = figure(
        usage
            .get("prompt_tokens_details")
            .and_then(|details| details.get("cached_tokens")),
    );
    Usage {
        input_tokens: prompt.saturating_sub(cached),
        output_tokens: figure(usage.get("completion_tokens")),
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cached,
    }
}

/// Maps a `chat.completion` body; an error says why it is not a reply.
pub fn parse_completion(value: &Value) -> Result<ModelResponse, String> {
    let Some(object) = value.as_object() else {
        return Err("a reply must be a JSON object".to_owned());
    };
    let choice = match object.get("choices") {
        Some(Value::Array(choices)) => match choices.first() {
            Some(choice) => choice,
            None => return Err("the reply has no choices".to_owned()),
        },
        _ => return Err("the reply has no `choices` list".to_owned()),
    };
    let message = match choice.get("message") {
        Some(Value::Object(message)) => message,
        _ => return Err("the reply's first choice has no `message` object".to_owned()),
    };
    let mut content: Vec<ReplyBlock> = Vec::new();
    let text = content_text(message.get("content"));
    if !text.is_empty() {
        content.push(Block::text(text).into());
    }
    let refusal = message
        .get("refusal")
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty());
    if let Some(refusal) = refusal {
        content.push(Block::text(refusal).into());
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        content.extend(calls.iter().map(tool_call_block));
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    let stop_reason = match (refusal, finish) {
        (Some(_), None | Some("stop")) => Some(StopReason::Refusal),
        (_, finish) => finish.map(stop_reason),
    };
    Ok(ModelResponse {
        content,
        stop_reason,
        usage: object.get("usage").and_then(Value::as_object).map(usage),
    })
}

/// The kind and message of an error body, if it holds one: `{"error":
/// {"message", "type", "code"}}`, `{"error": "text"}`, or a bare
/// `{"message", "type"}` object as some servers send.
#[cfg(any(feature = "live", test))]
pub fn error_parts(body: &Value) -> Option<(Option<String>, String)> {
    let error = match body.get("error") {
        Some(Value::String(message)) => return Some((None, message.clone())),
        Some(error @ Value::Object(_)) => error,
        _ if body.get("object").and_then(Value::as_str) == Some("error") => body,
        _ => return None,
    };
    let message = error.get("message").and_then(Value::as_str)?.to_owned();
    let kind = ["type", "code"].iter().find_map(|key| {
        error
            .get(*key)
            .and_then(Value::as_str)
            .filter(|kind| !kind.is_empty())
            .map(str::to_owned)
    });
    Some((kind, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(message: Value, finish: Value, usage: Value) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "model": "m", "system_fingerprint": null,
            "choices": [{"index": 0, "message": message, "logprobs": null,
                         "finish_reason": finish}],
            "usage": usage,
        })
    }

    #[test]
    fn text_and_tool_calls_with_server_ids() {
        let reply = completion(
            json!({"role": "assistant", "content": "reading", "refusal": null,
                   "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "read_file", "arguments": "{\"path\": \"main.py\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "read_file", "arguments": "{\"path\": \"x\""}},
                {"id": "call_c", "type": "function",
                 "function": {"name": "todo_write", "arguments": ""}},
            ]}),
            json!("tool_calls"),
            json!({"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57,
                   "prompt_tokens_details": {"cached_tokens": 20, "audio_tokens": 0}}),
        );
        let parsed = parse_completion(&reply).expect("a reply");
        assert_eq!(
            parsed.content,
            vec![
                Block::text("reading").into(),
                Block::tool_use("call_a", "read_file", json!({"path": "main.py"})).into(),
                Block::tool_use("call_b", "read_file", json!("{\"path\": \"x\"")).into(),
                Block::tool_use("call_c", "todo_write", json!({})).into(),
            ]
        );
        assert_eq!(parsed.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(
            parsed.usage,
            Some(Usage {
                input_tokens: 30,
                output_tokens: 7,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 20,
            })
        );
    }

    #[test]
    fn every_finish_reason_maps() {
        for (finish, reason) in [
            ("stop", StopReason::EndTurn),
            ("tool_calls", StopReason::ToolUse),
            ("length", StopReason::MaxTokens),
            ("content_filter", StopReason::Refusal),
            ("function_call", StopReason::Other("function_call".into())),
            ("eos", StopReason::Other("eos".into())),
        ] {
            let reply = completion(
                json!({"role": "assistant", "content": "x"}),
                json!(finish),
                Value::Null,
            );
            let parsed = parse_completion(&reply).expect("a reply");
            assert_eq!(parsed.stop_reason, Some(reason), "{finish}");
            assert_eq!(parsed.usage, None);
        }
        let missing = completion(json!({"content": "x"}), Value::Null, json!({}));
        assert_eq!(
            parse_completion(&missing).expect("a reply").stop_reason,
            None
        );
    }

    #[test]
    fn a_refusal_is_a_refusal_and_no_choices_is_no_reply() {
        let refused = completion(
            json!({"role": "assistant", "content": null, "refusal": "I can't help with that."}),
            json!("stop"),
            Value::Null,
        );
        let parsed = parse_completion(&refused).expect("a reply");
        assert_eq!(parsed.stop_reason, Some(StopReason::Refusal));
        assert_eq!(
            parsed.content,
            vec![Block::text("I can't help with that.").into()]
        );
        for body in [
            json!({"id": "x", "choices": []}),
            json!({"id": "x"}),
            json!([1]),
            json!({"choices": [{"index": 0, "finish_reason": "stop"}]}),
        ] {
            assert!(parse_completion(&body).is_err(), "{body}");
        }
    }

    #[test]
    fn arguments_that_are_not_an_object_are_kept_as_received() {
        assert_eq!(arguments_input(Some(&json!("[1, 2]"))), json!("[1, 2]"));
        assert_eq!(arguments_input(Some(&json!("  "))), json!({}));
        assert_eq!(arguments_input(None), json!({}));
        assert_eq!(
            arguments_input(Some(&json!({"path": "a"}))),
            json!({"path": "a"})
        );
        assert_eq!(arguments_input(Some(&json!(5))), json!("5"));
        let custom = completion(
            json!({"tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "x", "input": "y"}}]}),
            json!("tool_calls"),
            Value::Null,
        );
        let parsed = parse_completion(&custom).expect("a reply");
        assert!(matches!(
            &parsed.content[..],
            [ReplyBlock::Unsupported { kind, .. }] if kind == "tool_call:custom"
        ));
    }

    #[test]
    fn error_bodies_of_several_servers() {
        let openai = json!({"error": {"message": "Incorrect API key provided",
            "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}});
        assert_eq!(
            error_parts(&openai),
            Some((
                Some("invalid_request_error".into()),
                "Incorrect API key provided".into()
            ))
        );
        let coded = json!({"error": {"code": 401, "message": "Invalid API Key", "type": null}});
        assert_eq!(error_parts(&coded), Some((None, "Invalid API Key".into())));
        let bare =
            json!({"object": "error", "message": "bad", "type": "BadRequestError", "code": 400});
        assert_eq!(
            error_parts(&bare),
            Some((Some("BadRequestError".into()), "bad".into()))
        );
        assert_eq!(
            error_parts(&json!({"error": "model not found"})),
            Some((None, "model not found".into()))
        );
        assert_eq!(error_parts(&json!({"choices": []})), None);
    }
}
