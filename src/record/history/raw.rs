//! Raw histories: a Messages API or Chat Completions request body, or its
//! `messages` array.

use serde_json::Value;
use thiserror::Error;

use super::{Answer, Call, Format, History, Speaker, Turn};

/// Why a file could not be read as a history.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError {
    /// The text is not JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// The JSON is not a history of the format.
    #[error("not a {format} history: {reason}")]
    NotAHistory {
        /// The format it was read as.
        format: &'static str,
        /// What is missing.
        reason: String,
    },
    /// A message of the history has the wrong shape.
    #[error("message {index}: {reason}")]
    BadMessage {
        /// Its index in the `messages` array.
        index: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Reads `text` as `format` (or the format it is, when `None`).
pub(super) fn read(text: &str, format: Option<Format>) -> Result<History, ReadError> {
    let value: Value =
        serde_json::from_str(text).map_err(|err| ReadError::NotJson(err.to_string()))?;
    let messages = match &value {
        Value::Array(messages) => messages,
        Value::Object(body) => match body.get("messages") {
            Some(Value::Array(messages)) => messages,
            _ => {
                return Err(ReadError::NotAHistory {
                    format: format.map_or("request", Format::as_str),
                    reason: "an object without a `messages` array".to_owned(),
                });
            }
        },
        _ => {
            return Err(ReadError::NotAHistory {
                format: format.map_or("request", Format::as_str),
                reason: "neither a request body nor a `messages` array".to_owned(),
            });
        }
    };
    let format = match format {
        Some(Format::ClaudeCode | Format::Codex) | None => detect(messages),
        Some(format) => format,
    };
    let turns = match format {
        Format::OpenAi => openai(messages)?,
        _ => anthropic(messages)?,
    };
    Ok(History {
        format,
        turns,
        off_chain: Vec::new(),
        agent: None,
        children: Vec::new(),
        compactions: 0,
    })
}

/// A Chat Completions history says so: a `tool` message, `tool_calls`, a
/// `system` or `developer` message.
fn detect(messages: &[Value]) -> Format {
    let openai = messages.iter().any(|message| {
        matches!(
            message.get("role").and_then(Value::as_str),
            Some("tool" | "system" | "developer")
        ) || message.get("tool_calls").is_some()
    });
    if openai {
        Format::OpenAi
    } else {
        Format::Anthropic
    }
}

fn bad(index: usize, reason: impl Into<String>) -> ReadError {
    ReadError::BadMessage {
        index,
        reason: reason.into(),
    }
}

fn text_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// Messages API messages: `{"role", "content"}`, content a string or
/// blocks; `tool_use` blocks are calls, `tool_result` blocks results.
fn anthropic(messages: &[Value]) -> Result<Vec<Turn>, ReadError> {
    let mut turns = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let speaker = match text_field(message, "role") {
            Some("user") => Speaker::User,
            Some("assistant") => Speaker::Assistant,
            Some(other) => {
                return Err(bad(
                    index,
                    format!("role {other:?}: a Messages API message is `user` or `assistant`"),
                ));
            }
            None => return Err(bad(index, "no `role`")),
        };
        let mut turn = Turn::new(speaker, index);
        match message.get("content") {
            Some(Value::String(_)) => {}
            Some(Value::Array(blocks)) => {
                for (position, block) in blocks.iter().enumerate() {
                    match text_field(block, "type") {
                        Some("tool_use") => turn.calls.push(Call {
                            block: position,
                            ..Call::new(
                                text_field(block, "id").unwrap_or_default(),
                                text_field(block, "name").unwrap_or_default(),
                            )
                        }),
                        Some("tool_result") => turn.results.push(Answer {
                            block: position,
                            ..Answer::new(
                                text_field(block, "tool_use_id").unwrap_or_default(),
                                index,
                            )
                        }),
                        _ => {}
                    }
                }
            }
            _ => return Err(bad(index, "`content` is neither text nor a list of blocks")),
        }
        turns.push(turn);
    }
    Ok(turns)
}

/// Chat Completions messages: an assistant message's `tool_calls` are
/// calls; the `tool` messages after it, by `tool_call_id`, one user turn
/// of results; `system` and `developer` messages are not turns.
fn openai(messages: &[Value]) -> Result<Vec<Turn>, ReadError> {
    let mut turns: Vec<Turn> = Vec::with_capacity(messages.len());
    let mut in_results = false;
    for (index, message) in messages.iter().enumerate() {
        let role = text_field(message, "role").ok_or_else(|| bad(index, "no `role`"))?;
        match role {
            "system" | "developer" => in_results = false,
            "user" => {
                turns.push(Turn::new(Speaker::User, index));
                in_results = false;
            }
            "assistant" => {
                let mut turn = Turn::new(Speaker::Assistant, index);
                match message.get("tool_calls") {
                    None | Some(Value::Null) => {}
                    Some(Value::Array(calls)) => {
                        for (position, call) in calls.iter().enumerate() {
                            turn.calls.push(Call {
                                block: position,
                                ..Call::new(
                                    text_field(call, "id").unwrap_or_default(),
                                    call.get("function")
                                        .and_then(|function| text_field(function, "name"))
                                        .unwrap_or_default(),
                                )
                            });
                        }
                    }
                    Some(_) => return Err(bad(index, "`tool_calls` is not a list")),
                }
                turns.push(turn);
                in_results = false;
            }
            "tool" => {
                let id = text_field(message, "tool_call_id")
                    .ok_or_else(|| bad(index, "a `tool` message without `tool_call_id`"))?;
                if !in_results {
                    turns.push(Turn::new(Speaker::User, index));
                    in_results = true;
                }
                if let Some(turn) = turns.last_mut() {
                    turn.results.push(Answer::new(id, index));
                }
            }
            other => {
                return Err(bad(
                    index,
                    format!(
                        "role {other:?}: a Chat Completions message is `system`, `developer`, `user`, `assistant` or `tool`"
                    ),
                ));
            }
        }
    }
    Ok(turns)
}
