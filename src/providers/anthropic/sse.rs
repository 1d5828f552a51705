//! The assembler that turns the Messages API event stream (read by the
//! shared [`SseReader`](crate::providers::http::sse::SseReader)) into the same [`ModelResponse`] a non-streaming
//! call returns.
//!
//! Deltas: `text_delta`, `thinking_delta` and `signature_delta` are appended
//! to their field; `citations_delta` adds its citation to the block's
//! `citations`; `input_json_delta` pieces are joined and, at the block's
//! stop, parsed as the block's `input`, whatever the block's type (`tool_use`,
//! `server_tool_use`, `mcp_tool_use`, …: a block's start carries `input: {}`).

use serde_json::{Map, Value};

use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::ModelResponse;
use crate::run::model::Received;

use crate::providers::failure::api_kind;
use crate::providers::http::sse::SseEvent;
use crate::providers::http::stream::StreamParser;

struct BlockState {
    block: Value,
    partial_json: String,
}

/// Builds a reply from Messages API stream events.
#[derive(Default)]
pub struct StreamAssembler {
    blocks: Vec<BlockState>,
    /// The `message` of `message_start` (`id`, `model`, …), updated by each
    /// `message_delta`'s `delta` (`stop_reason`, `stop_sequence`, …).
    message: Map<String, Value>,
    usage: Map<String, Value>,
    started: bool,
    stopped: bool,
}

/// Merges usage figures into `usage`. A `null` figure means "no new
/// figure" (the API's `MessageDeltaUsage` allows it): the one already there,
/// from `message_start`, stays.
fn merge_usage(usage: &mut Map<String, Value>, figures: &Map<String, Value>) {
    for (key, value) in figures {
        if !value.is_null() {
            usage.insert(key.clone(), value.clone());
        }
    }
}

impl std::fmt::Debug for StreamAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamAssembler")
            .field("blocks", &self.blocks.len())
            .field("stopped", &self.stopped)
            .finish()
    }
}

fn failure(message: impl Into<String>) -> ModelFailure {
    ModelFailure::with_kind(FailureKind::Stream, message)
}

/// Appends `piece` to the string field `key` of a block, in place: the cost
/// of a delta is its own length, not the block's (no copy of the text so far).
fn append(target: &mut Value, key: &str, piece: &str) {
    if let Some(object) = target.as_object_mut() {
        match object.get_mut(key) {
            Some(Value::String(text)) => text.push_str(piece),
            _ => {
                object.insert(key.to_owned(), Value::String(piece.to_owned()));
            }
        }
    }
}

/// Appends a `citations_delta`'s citation to the block's `citations` list
/// (made when the block started without one).
fn push_citation(target: &mut Value, citation: Value) {
    if let Some(object) = target.as_object_mut() {
        match object.get_mut("citations") {
            Some(Value::Array(citations)) => citations.push(citation),
            _ => {
                object.insert("citations".to_owned(), Value::Array(vec![citation]));
            }
        }
    }
}

impl StreamAssembler {
    /// A fresh assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one event; `on_text` sees each text delta as it arrives. An
    /// `error` event is the API's error.
    pub fn push(
        &mut self,
        event: &SseEvent,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ModelFailure> {
        if event.data.is_empty() && event.event == "ping" {
            return Ok(());
        }
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|err| failure(format!("stream event `{}` is not JSON: {err}", event.event)))?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        match kind {
            "message_start" => {
                self.started = true;
                if let Some(Value::Object(message)) = data.get("message") {
                    self.message = message.clone();
                    if let Some(Value::Object(usage)) = self.message.remove("usage") {
                        merge_usage(&mut self.usage, &usage);
                    }
                }
            }
            "content_block_start" => {
                let block = data.get("content_block").cloned().unwrap_or(Value::Null);
                self.blocks.push(BlockState {
                    block,
                    partial_json: String::new(),
                });
            }
            "content_block_delta" => {
                let state = self.block_at(&data)?;
                // The delta is read in place: nothing of it is copied but the piece appended.
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let piece = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or_default();
                match delta
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                {
                    "text_delta" => {
                        let text = piece("text");
                        on_text(text);
                        append(&mut state.block, "text", text);
                    }
                    "input_json_delta" => state.partial_json.push_str(piece("partial_json")),
                    "thinking_delta" => append(&mut state.block, "thinking", piece("thinking")),
                    "signature_delta" => append(&mut state.block, "signature", piece("signature")),
                    "citations_delta" => {
                        if let Some(citation) = delta.get("citation") {
                            push_citation(&mut state.block, citation.clone());
                        }
                    }
                    // A server compaction's summary: each frame replaces
                    // the block's fields it names, not appends to them.
                    "compaction_delta" => {
                        if let (Some(block), Some(fields)) =
                            (state.block.as_object_mut(), delta.as_object())
                        {
                            for (key, value) in fields.iter().filter(|(key, _)| *key != "type") {
                                block.insert(key.clone(), value.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let state = self.block_at(&data)?;
                // Every block whose input streams (`tool_use`, `server_tool_use`,
                // `mcp_tool_use`, …) gets it from its pieces.
                if !state.partial_json.is_empty() {
                    // Broken input JSON would be sent back in the history and
                    // refused by the API, so it fails the request here.
                    let input: Value =
                        serde_json::from_str(&state.partial_json).map_err(|err| {
                            let kind = state
                                .block
                                .get("type")
                                .and_then(Value::as_str)
                                .unwrap_or("block");
                            failure(format!(
                                "the streamed {kind} input is not valid JSON: {err}"
                            ))
                        })?;
                    if let Some(object) = state.block.as_object_mut() {
                        object.insert("input".to_owned(), input);
                    }
                }
            }
            "message_delta" => {
                if let Some(Value::Object(delta)) = data.get("delta") {
                    self.message.extend(
                        delta
                            .iter()
                            .map(|(key, value)| (key.clone(), value.clone())),
                    );
                }
                if let Some(Value::Object(usage)) = data.get("usage") {
                    merge_usage(&mut self.usage, usage);
                }
                // What the API's context editing cleared, kept with the reply.
                if let Some(edits) = data.get("context_management") {
                    self.message
                        .insert("context_management".to_owned(), edits.clone());
                }
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let (name, message) = super::api_error(&data);
                let kind = api_kind(name, None, message);
                return Err(ModelFailure::with_kind(kind, format!("{name}: {message}")));
            }
            _ => {}
        }
        Ok(())
    }

    /// The block an event's `index` names; an index never started is a failure.
    fn block_at(&mut self, data: &Value) -> Result<&mut BlockState, ModelFailure> {
        let index = data
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        usize::try_from(index)
            .ok()
            .and_then(|index| self.blocks.get_mut(index))
            .ok_or_else(|| {
                failure(format!(
                    "event for content block {index}, which was never started"
                ))
            })
    }

    /// The assembled reply and the message it was parsed from: `message_start`'s
    /// message with every `message_delta` applied, its blocks and its usage.
    pub fn finish_received(self) -> Result<Received, ModelFailure> {
        if !self.started || !self.stopped {
            return Err(failure("the stream ended before message_stop"));
        }
        let content: Vec<Value> = self.blocks.into_iter().map(|state| state.block).collect();
        let mut message = self.message;
        message.insert("content".to_owned(), Value::Array(content));
        message.entry("stop_reason").or_insert(Value::Null);
        message.insert("usage".to_owned(), Value::Object(self.usage));
        let raw = Value::Object(message);
        let response = ModelResponse::from_value(raw.clone())
            .map_err(|err| failure(format!("assembled reply is not a message: {err}")))?;
        Ok(Received {
            response,
            raw: Some(raw),
        })
    }
}

impl StreamParser for StreamAssembler {
    fn event(
        &mut self,
        event: &SseEvent,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<bool, ModelFailure> {
        self.push(event, on_text).map(|()| false)
    }

    fn finish(self) -> Result<Received, ModelFailure> {
        self.finish_received()
    }
}

/// Reads a whole event stream into a reply and the message assembled from it.
#[cfg(test)]
fn read_stream(
    input: impl std::io::BufRead,
    on_text: &mut dyn FnMut(&str),
) -> Result<Received, ModelFailure> {
    crate::providers::http::stream::read_events(input, StreamAssembler::new(), on_text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::protocol::Block;

    #[test]
    fn deltas_for_blocks_never_started_are_failures() {
        let mut assembler = StreamAssembler::new();
        let delta = SseEvent {
            event: "content_block_delta".into(),
            data: r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}"#.into(),
        };
        let failure = assembler.push(&delta, &mut |_| {}).expect_err("no block 3");
        assert!(
            failure.message().contains("content block 3"),
            "{}",
            failure.message()
        );
        let not_json = SseEvent {
            event: "message_start".into(),
            data: "{".into(),
        };
        assert!(StreamAssembler::new().push(&not_json, &mut |_| {}).is_err());
    }

    /// 100k text deltas (and 20k tool input pieces) assemble in linear
    /// time: before, every delta copied the whole block text, so 100k deltas
    /// of 85 characters took minutes. The bound is generous (a debug build
    /// on a shared machine does this in about a second).
    #[test]
    fn a_hundred_thousand_deltas_assemble_in_linear_time() {
        const DELTAS: usize = 100_000;
        let piece = "abcdefghij".repeat(8) + "klmno";
        assert_eq!(piece.len(), 85);
        let mut stream = String::with_capacity(DELTAS * 250);
        let mut event = |data: &str| {
            stream.push_str("data: ");
            stream.push_str(data);
            stream.push_str("\n\n");
        };
        event(r#"{"type":"message_start","message":{"usage":{"input_tokens":1}}}"#);
        event(
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        );
        event(
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"read_file","input":{}}}"#,
        );
        event(
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \""}}"#,
        );
        let text_delta = format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{piece}"}}}}"#
        );
        let json_delta = format!(
            r#"{{"type":"content_block_delta","index":1,"delta":{{"type":"input_json_delta","partial_json":"{piece}"}}}}"#
        );
        for n in 0..DELTAS {
            event(&text_delta);
            if n % 5 == 0 {
                event(&json_delta);
            }
        }
        event(
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"}"}}"#,
        );
        event(r#"{"type":"content_block_stop","index":0}"#);
        event(r#"{"type":"content_block_stop","index":1}"#);
        event(
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":2}}"#,
        );
        event(r#"{"type":"message_stop"}"#);

        let started = std::time::Instant::now();
        let mut shown = 0usize;
        let reply = read_stream(stream.as_bytes(), &mut |text| shown += text.len()).expect("reply");
        let elapsed = started.elapsed();
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "{DELTAS} deltas took {elapsed:?}"
        );
        assert_eq!(shown, DELTAS * 85);
        let [
            crate::core::protocol::ReplyBlock::Known(crate::core::protocol::Block::Text { text }),
            crate::core::protocol::ReplyBlock::Known(crate::core::protocol::Block::ToolUse {
                input,
                ..
            }),
        ] = reply.response.content.as_slice()
        else {
            panic!(
                "a text block and a tool_use block: {:?}",
                reply.response.content.len()
            );
        };
        assert_eq!(text.len(), DELTAS * 85);
        assert!(text.starts_with(&piece) && text.ends_with(&piece));
        let path = input
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert_eq!(path.len(), DELTAS / 5 * 85);
    }

    /// A server compaction streams as a `compaction` block whose
    /// `compaction_delta` frames replace its fields; the block is kept
    /// whole, with the fields this crate does not read, and what context
    /// editing cleared comes with `message_delta`.
    #[test]
    fn a_streamed_server_compaction_is_kept_whole() {
        let stream = [
            r#"{"type":"message_start","message":{"usage":{"input_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"compaction","content":null}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Read a","encrypted_content":null}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Read a and b.","encrypted_content":"opaque=="}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Done."}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2},"context_management":{"applied_edits":[]}}"#,
            r#"{"type":"message_stop"}"#,
        ]
        .iter()
        .map(|data| format!("data: {data}\n\n"))
        .collect::<String>();
        let received = read_stream(stream.as_bytes(), &mut |_| {}).expect("a message");
        let first = received.response.content.first().expect("a block");
        let crate::core::protocol::ReplyBlock::Known(Block::Compaction { content, rest }) = first
        else {
            panic!("not a compaction block: {first:?}");
        };
        assert_eq!(content.as_deref(), Some("Read a and b."));
        assert_eq!(
            rest.get("encrypted_content"),
            Some(&serde_json::json!("opaque=="))
        );
        let raw = received.raw.expect("the assembled message");
        assert_eq!(
            raw["context_management"],
            serde_json::json!({"applied_edits": []})
        );
        // Sent back as received.
        let sent = serde_json::to_value(Block::Compaction {
            content: content.clone(),
            rest: rest.clone(),
        })
        .expect("a block serializes");
        assert_eq!(
            sent,
            serde_json::json!({"type": "compaction", "content": "Read a and b.", "encrypted_content": "opaque=="})
        );
    }

    #[test]
    fn broken_tool_input_json_fails_the_request() {
        let stream = [
            r#"{"type":"message_start","message":{"usage":{"input_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"read_file","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"pa"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":2}}"#,
            r#"{"type":"message_stop"}"#,
        ]
        .iter()
        .map(|data| format!("data: {data}\n\n"))
        .collect::<String>();
        let failure = read_stream(stream.as_bytes(), &mut |_| {}).expect_err("broken input");
        assert_eq!(failure.kind(), Some(&FailureKind::Stream));
        assert!(
            failure.message().contains("not valid JSON"),
            "{}",
            failure.message()
        );
    }
}
