//! A Chat Completions stream (`chat.completion.chunk` lines) assembled into
//! the `chat.completion` a non-streaming call returns.
//!
//! `delta.content` pieces are appended (and shown as they arrive);
//! `delta.tool_calls` pieces are joined by their `index` (a call's arguments
//! arrive in many pieces, possibly interleaved with other calls'): the
//! first non-empty `id` and `type` win, name and arguments are appended.
//! With `stream_options.include_usage` the last chunk has no choices and
//! the usage. A stream is complete at `data: [DONE]` or once a
//! `finish_reason` arrived; one that ends before either is a failure.
//! The reply ends at its `finish_reason`: what later chunks say for it
//! (content, tool calls, another finish reason) is ignored, not shown and not
//! joined to the reply, as a client that stopped reading there would see it;
//! their `usage` is still read, since the usage chunk comes after the finish.
//! Every chunk costs time in its own size: the assembler is linear.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::reply::{error_parts, parse_completion};
use crate::core::error::{FailureKind, ModelFailure};
use crate::providers::failure::{api_kind, openai_code};
use crate::providers::http::sse::SseEvent;
use crate::providers::http::stream::StreamParser;
use crate::run::model::Received;

fn failure(message: impl Into<String>) -> ModelFailure {
    ModelFailure::with_kind(FailureKind::Stream, message)
}

#[derive(Default)]
struct CallState {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

/// Builds a `chat.completion` from its chunks.
#[derive(Default)]
pub struct ChunkAssembler {
    /// `id`, `model`, `created`, … of the first chunk.
    head: Map<String, Value>,
    role: Option<String>,
    content: String,
    refusal: String,
    /// Reasoning text (`reasoning_content`, `reasoning`), by field.
    reasoning: Vec<(String, String)>,
    calls: Vec<CallState>,
    /// The position in `calls` of each tool-call `index`.
    by_index: HashMap<u64, usize>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    saw_choice: bool,
    done: bool,
}

impl std::fmt::Debug for ChunkAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkAssembler")
            .field("calls", &self.calls.len())
            .field("finish_reason", &self.finish_reason)
            .field("done", &self.done)
            .finish()
    }
}

fn append_piece(target: &mut String, piece: Option<&Value>) {
    if let Some(text) = piece.and_then(Value::as_str) {
        target.push_str(text);
    }
}

impl ChunkAssembler {
    /// Whether `[DONE]` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes one `data:` payload; `on_text` sees each content piece as it
    /// arrives. An `error` payload is the server's error.
    pub fn push(&mut self, data: &str, on_text: &mut dyn FnMut(&str)) -> Result<(), ModelFailure> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|err| failure(format!("a stream chunk is not JSON: {err}")))?;
        if let Some((name, message)) = error_parts(&chunk) {
            let name = name.unwrap_or_else(|| "api_error".to_owned());
            let kind = api_kind(&name, openai_code(&chunk), &message);
            return Err(ModelFailure::with_kind(kind, format!("{name}: {message}")));
        }
        let Value::Object(mut chunk) = chunk else {
            return Err(failure("a stream chunk is not a JSON object"));
        };
        if let Some(usage) = chunk.remove("usage").filter(|usage| !usage.is_null()) {
            self.usage = Some(usage);
        }
        let choices = chunk.remove("choices");
        if self.head.is_empty() {
            chunk.remove("object");
            self.head = chunk;
        }
        let Some(Value::Array(choices)) = choices else {
            return Ok(());
        };
        // One reply is asked for (`n` = 1): choice 0 is the reply.
        for choice in choices
            .iter()
            .filter(|choice| choice.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        {
            if self.finish_reason.is_some() {
                // The reply ended at its finish_reason: nothing a later chunk
                // says for it joins the reply or is shown.
                continue;
            }
            self.saw_choice = true;
            if let Some(delta) = choice.get("delta") {
                self.take_delta(delta, on_text);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        Ok(())
    }

    fn take_delta(&mut self, delta: &Value, on_text: &mut dyn FnMut(&str)) {
        if let Some(role) = delta.get("role").and_then(Value::as_str) {
            self.role = Some(role.to_owned());
        }
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            on_text(text);
            self.content.push_str(text);
        }
        append_piece(&mut self.refusal, delta.get("refusal"));
        for field in ["reasoning_content", "reasoning"] {
            if let Some(piece) = delta.get(field).and_then(Value::as_str) {
                match self.reasoning.iter_mut().find(|(name, _)| name == field) {
                    Some((_, text)) => text.push_str(piece),
                    None => self.reasoning.push((field.to_owned(), piece.to_owned())),
                }
            }
        }
        if let Some(Value::Array(calls)) = delta.get("tool_calls") {
            for call in calls {
                self.take_call(call);
            }
        }
    }

    fn take_call(&mut self, call: &Value) {
        fn text(value: Option<&Value>) -> &str {
            value.and_then(Value::as_str).unwrap_or("")
        }
        let id = text(call.get("id"));
        // A server that leaves out `index` sends each call whole (or its
        // pieces one after another): a new id starts a new call.
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| {
                let last = self.calls.len() as u64;
                match self.calls.last() {
                    Some(open) if id.is_empty() || open.id == id => last - 1,
                    _ => last,
                }
            });
        let position = *self.by_index.entry(index).or_insert_with(|| {
            self.calls.push(CallState::default());
            self.calls.len() - 1
        });
        let Some(state) = self.calls.get_mut(position) else {
            return;
        };
        if state.id.is_empty() {
            state.id = id.to_owned();
        }
        let kind = text(call.get("type"));
        if state.kind.is_empty() {
            state.kind = kind.to_owned();
        }
        let function = call.get("function");
        let name = text(function.and_then(|f| f.get("name")));
        // Some servers repeat the whole name in every piece.
        if name != state.name {
            state.name.push_str(name);
        }
        match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(piece)) => state.arguments.push_str(piece),
            Some(Value::Object(object)) => {
                state
                    .arguments
                    .push_str(&Value::Object(object.clone()).to_string());
            }
            _ => {}
        }
    }

    /// The assembled `chat.completion`; a stream that ended before `[DONE]`
    /// or a `finish_reason` is a failure.
    pub fn finish(self) -> Result<Value, ModelFailure> {
        if !self.done && self.finish_reason.is_none() {
            return Err(failure("the stream ended before [DONE] or a finish_reason"));
        }
        let mut completion = self.head;
        completion.insert("object".into(), json!("chat.completion"));
        let mut choices = Vec::new();
        if self.saw_choice {
            let mut message = Map::new();
            message.insert(
                "role".into(),
                json!(self.role.unwrap_or_else(|| "assistant".to_owned())),
            );
            let content = if self.content.is_empty() && !self.calls.is_empty() {
                Value::Null
            } else {
                Value::String(self.content)
            };
            message.insert("content".into(), content);
            if !self.refusal.is_empty() {
                message.insert("refusal".into(), Value::String(self.refusal));
            }
            for (field, text) in self.reasoning {
                message.insert(field, Value::String(text));
            }
            if !self.calls.is_empty() {
                let calls = self
                    .calls
                    .into_iter()
                    .map(|call| {
                        let kind = if call.kind.is_empty() {
                            "function".to_owned()
                        } else {
                            call.kind
                        };
                        json!({"id": call.id, "type": kind,
                               "function": {"name": call.name, "arguments": call.arguments}})
                    })
                    .collect();
                message.insert("tool_calls".into(), Value::Array(calls));
            }
            choices.push(json!({
                "index": 0,
                "message": message,
                "finish_reason": self.finish_reason,
            }));
        }
        completion.insert("choices".into(), Value::Array(choices));
        completion.insert("usage".into(), self.usage.unwrap_or(Value::Null));
        Ok(Value::Object(completion))
    }
}

/// Reads a whole stream into a reply and the `chat.completion` assembled from it.
#[cfg(test)]
fn read_stream(
    input: impl std::io::BufRead,
    on_text: &mut dyn FnMut(&str),
) -> Result<Received, ModelFailure> {
    crate::providers::http::stream::read_events(input, ChunkStream::default(), on_text)
}

/// A Chat Completions stream as a [`StreamParser`]: the chunks assembled,
/// then read as a reply.
#[derive(Debug, Default)]
pub struct ChunkStream(ChunkAssembler);

impl StreamParser for ChunkStream {
    fn event(
        &mut self,
        event: &SseEvent,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<bool, ModelFailure> {
        self.0.push(&event.data, on_text)?;
        Ok(self.0.is_done())
    }

    fn finish(self) -> Result<Received, ModelFailure> {
        let raw = self.0.finish()?;
        let response = parse_completion(&raw).map_err(|reason| {
            ModelFailure::with_kind(
                FailureKind::InvalidResponse,
                format!("the assembled stream is not a reply: {reason}"),
            )
        })?;
        Ok(Received {
            response,
            raw: Some(raw),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::protocol::{Block, StopReason};

    fn stream(chunks: &[Value], done: bool) -> String {
        let mut out: String = chunks
            .iter()
            .map(|chunk| format!("data: {chunk}\n\n"))
            .collect();
        if done {
            out.push_str("data: [DONE]\n\n");
        }
        out
    }

    fn chunk(delta: Value, finish: Value) -> Value {
        json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
               "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    #[test]
    fn interleaved_calls_are_joined_by_index_and_usage_comes_last() {
        let mut chunks = vec![chunk(
            json!({"role": "assistant", "content": null}),
            Value::Null,
        )];
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                "function": {"name": "read_file", "arguments": ""}}]}),
            Value::Null,
        ));
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function",
                "function": {"name": "read_file", "arguments": ""}}]}),
            Value::Null,
        ));
        let first = "{\"path\": \"main.py\"}";
        let second = "{\"path\": \"expected.txt\"}";
        let (mut a, mut b) = (first.chars(), second.chars());
        loop {
            let (x, y) = (a.next(), b.next());
            if x.is_none() && y.is_none() {
                break;
            }
            for (index, piece) in [(0, x), (1, y)] {
                if let Some(c) = piece {
                    chunks.push(chunk(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": c.to_string()}}]}),
                        Value::Null,
                    ));
                }
            }
        }
        chunks.push(chunk(json!({}), json!("tool_calls")));
        chunks.push(
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk",
            "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
        );
        let received =
            read_stream(stream(&chunks, true).as_bytes(), &mut |_| {}).expect("complete");
        assert_eq!(
            received.response.content,
            vec![
                Block::tool_use("call_0", "read_file", json!({"path": "main.py"})).into(),
                Block::tool_use("call_1", "read_file", json!({"path": "expected.txt"})).into(),
            ]
        );
        assert_eq!(received.response.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(received.response.usage.map(|u| u.input_tokens), Some(9));
        let raw = received.raw.expect("raw");
        assert_eq!(raw["object"], "chat.completion");
        assert_eq!(raw["id"], "chatcmpl-s");
    }

    #[test]
    fn text_pieces_are_shown_and_reasoning_is_kept_in_the_raw_reply() {
        let chunks = [
            chunk(
                json!({"role": "assistant", "reasoning_content": "think"}),
                Value::Null,
            ),
            chunk(json!({"reasoning_content": "ing"}), Value::Null),
            chunk(json!({"content": "4"}), Value::Null),
            chunk(json!({"content": "2"}), json!("stop")),
        ];
        let mut shown = String::new();
        let received = read_stream(stream(&chunks, false).as_bytes(), &mut |t| {
            shown.push_str(t)
        })
        .expect("a finish_reason completes the stream");
        assert_eq!(shown, "42");
        assert_eq!(received.response.content, vec![Block::text("42").into()]);
        assert_eq!(received.response.stop_reason, Some(StopReason::EndTurn));
        let raw = received.raw.expect("raw");
        assert_eq!(
            raw["choices"][0]["message"]["reasoning_content"],
            "thinking"
        );
    }

    #[test]
    fn a_cut_stream_and_an_error_chunk_are_failures() {
        let cut = [chunk(json!({"content": "par"}), Value::Null)];
        let failure = read_stream(stream(&cut, false).as_bytes(), &mut |_| {}).expect_err("cut");
        assert_eq!(failure.kind(), Some(&FailureKind::Stream));
        assert!(failure.message().contains("[DONE]"), "{failure}");
        let error =
            "data: {\"error\": {\"message\": \"overloaded\", \"type\": \"server_error\"}}\n\n";
        let failure = read_stream(error.as_bytes(), &mut |_| {}).expect_err("error");
        let server_error = FailureKind::Api("server_error".into());
        assert_eq!(failure.kind(), Some(&server_error));
        assert!(failure.message().contains("overloaded"));
        let empty =
            read_stream("data: [DONE]\n\n".as_bytes(), &mut |_| {}).expect_err("no choices");
        assert_eq!(empty.kind(), Some(&FailureKind::InvalidResponse));
    }

    #[test]
    fn deltas_after_the_finish_reason_are_ignored_but_usage_is_read() {
        let chunks = [
            chunk(json!({"role": "assistant", "content": "a"}), Value::Null),
            chunk(json!({}), json!("stop")),
            chunk(json!({"content": " INJECTED AFTER FINISH"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "late", "type": "function",
                    "function": {"name": "run_main", "arguments": "{}"}}]}),
                json!("tool_calls"),
            ),
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                   "model": "m", "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}),
        ];
        let mut shown = String::new();
        let received = read_stream(stream(&chunks, true).as_bytes(), &mut |t| shown.push_str(t))
            .expect("complete");
        assert_eq!(shown, "a");
        assert_eq!(received.response.content, vec![Block::text("a").into()]);
        assert_eq!(received.response.stop_reason, Some(StopReason::EndTurn));
        assert_eq!(received.response.usage.map(|u| u.input_tokens), Some(5));
        let raw = received.raw.expect("raw");
        assert_eq!(raw["choices"][0]["message"]["content"], "a");
        assert_eq!(raw["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn calls_without_an_index_and_repeated_names() {
        let chunks = [
            chunk(
                json!({"tool_calls": [{"id": "a", "function": {"name": "read_file", "arguments": "{\"path\":"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"function": {"name": "read_file", "arguments": "\"x\"}"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"id": "b", "function": {"name": "todo_write", "arguments": {"todos": []}}}]}),
                json!("tool_calls"),
            ),
        ];
        let received =
            read_stream(stream(&chunks, true).as_bytes(), &mut |_| {}).expect("complete");
        assert_eq!(
            received.response.content,
            vec![
                Block::tool_use("a", "read_file", json!({"path": "x"})).into(),
                Block::tool_use("b", "todo_write", json!({"todos": []})).into(),
            ]
        );
    }
}
