//! codex rollouts (`~/.codex/sessions/Y/M/D/rollout-*.jsonl`): JSON Lines
//! of `{"timestamp", "type", "payload"}`. The history is the
//! `response_item` lines: messages, and calls (`function_call`,
//! `custom_tool_call`, `local_shell_call`) paired with their outputs by
//! `call_id`. Consecutive items of one side are one turn, as a request
//! sends them: a reply's text, reasoning and calls; then the outputs and
//! the user's next words. A `compacted` line replaces the history before
//! it (with its `replacement_history`, when it has one).

use std::io::BufRead;

use serde_json::Value;

use super::{Answer, Call, Format, History, ReadError, Speaker, Turn};

/// Whether `text` reads as a codex rollout: one of its first 20 lines is a
/// JSON object with a rollout `type` and a `payload` object.
pub(super) fn looks_like(text: &str) -> bool {
    super::any_head_line(text, |value| {
        value.get("payload").is_some_and(Value::is_object)
            && matches!(
                value.get("type").and_then(Value::as_str),
                Some("session_meta" | "response_item" | "turn_context" | "event_msg" | "compacted")
            )
    })
}

fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// Which side an item is on and what it adds.
enum Item {
    Call(Call),
    Output(Answer),
    /// Words of a side (a message, reasoning), no call or output.
    Words(Speaker),
    /// Not part of the history sent (developer and system messages,
    /// server-side calls, types this reader does not know).
    Other,
}

/// The item `payload` of line `line`.
fn item(payload: &Value, line: usize) -> Item {
    let call_id = || text(payload, "call_id").unwrap_or_default().to_owned();
    match text(payload, "type") {
        Some("message") => match text(payload, "role") {
            Some("user") => Item::Words(Speaker::User),
            Some("assistant") => Item::Words(Speaker::Assistant),
            _ => Item::Other,
        },
        Some("reasoning") => Item::Words(Speaker::Assistant),
        Some("function_call" | "custom_tool_call") => Item::Call(Call {
            line: Some(line),
            ..Call::new(call_id(), text(payload, "name").unwrap_or_default())
        }),
        Some("local_shell_call") => Item::Call(Call {
            line: Some(line),
            ..Call::new(call_id(), "local_shell")
        }),
        Some("function_call_output" | "custom_tool_call_output" | "local_shell_call_output") => {
            Item::Output(Answer {
                line: Some(line),
                ..Answer::new(call_id(), 0)
            })
        }
        _ => Item::Other,
    }
}

/// Adds `item` to `turns`: to the last turn when it is of the same side.
/// `block`: its index in a `compacted` line's `replacement_history`.
fn push(turns: &mut Vec<Turn>, item: Item, line: usize, block: usize) {
    let speaker = match &item {
        Item::Call(_) | Item::Words(Speaker::Assistant) => Speaker::Assistant,
        Item::Output(_) | Item::Words(Speaker::User) => Speaker::User,
        Item::Other => return,
    };
    if turns.last().is_none_or(|turn| turn.speaker != speaker) {
        let mut turn = Turn::new(speaker, turns.len());
        turn.line = Some(line);
        turns.push(turn);
    }
    let message = turns.len().saturating_sub(1);
    if let Some(turn) = turns.last_mut() {
        turn.last_line = Some(line);
        match item {
            Item::Call(mut call) => {
                call.block = block;
                turn.calls.push(call);
            }
            Item::Output(mut answer) => {
                answer.message = message;
                answer.block = block;
                turn.results.push(answer);
            }
            Item::Words(_) | Item::Other => {}
        }
    }
}

/// What a rollout's line gives its history.
pub(super) enum Event<'a> {
    /// An item of it (`block`: its index in a `compacted` line's
    /// `replacement_history`).
    Item {
        payload: &'a Value,
        line: usize,
        block: usize,
    },
    /// A compaction: what came before is replaced by the items after.
    Compacted,
}

/// The side of the history an item is on (`None`: it is not sent).
pub(super) fn side(payload: &Value) -> Option<Speaker> {
    match item(payload, 0) {
        Item::Call(_) | Item::Words(Speaker::Assistant) => Some(Speaker::Assistant),
        Item::Output(_) | Item::Words(Speaker::User) => Some(Speaker::User),
        Item::Other => None,
    }
}

/// Reads a rollout from `reader`, line by line.
pub(super) fn read(reader: impl BufRead) -> Result<History, ReadError> {
    let mut turns: Vec<Turn> = Vec::new();
    let mut compactions = 0;
    visit(reader, |event| match event {
        Event::Item {
            payload,
            line,
            block,
        } => push(&mut turns, item(payload, line), line, block),
        Event::Compacted => {
            compactions += 1;
            turns.clear();
        }
    })?;
    Ok(History {
        format: Format::Codex,
        turns,
        off_chain: Vec::new(),
        agent: None,
        children: Vec::new(),
        compactions,
    })
}

/// Reads a rollout from `reader`, line by line, telling `on` of each item
/// of its history and each compaction, in order.
pub(super) fn visit(reader: impl BufRead, mut on: impl FnMut(Event<'_>)) -> Result<(), ReadError> {
    let mut rollout = false;
    for (index, line) in reader.lines().enumerate() {
        let number = index + 1;
        let line = line.map_err(|err| ReadError::NotAHistory {
            format: "codex",
            reason: format!("line {number}: {err}"),
        })?;
        // A line cut short or not JSON is no item.
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(payload) = value.get("payload") else {
            continue;
        };
        rollout = true;
        match text(&value, "type") {
            Some("response_item") => on(Event::Item {
                payload,
                line: number,
                block: 0,
            }),
            Some("compacted") => {
                on(Event::Compacted);
                if let Some(Value::Array(items)) = payload.get("replacement_history") {
                    for (block, replaced) in items.iter().enumerate() {
                        on(Event::Item {
                            payload: replaced,
                            line: number,
                            block,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    if !rollout {
        return Err(ReadError::NotAHistory {
            format: "codex",
            reason: "no line with a `payload`".to_owned(),
        });
    }
    Ok(())
}
