//! Checking a replayed run against its trace: where a request the loop builds
//! now differs from the recorded one ([`Divergence`]), and the verdict over
//! the whole run ([`ReplayReport`]).
//!
//! Requests are compared through the crate's own type (the [`Request`] read
//! from the trace against the one built now), in this order: system prompt,
//! tool names, tool definitions, messages (role, then block by block), plan
//! attachment. The first difference found is the one reported; long texts are
//! shown as a bounded window around the first differing character.

use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};

use crate::agent::RunReport;
use crate::core::call::ToolRecord;
use crate::core::conversation::StatusKind;
use crate::core::protocol::{Block, Message, Request, ToolDefinition, ToolResultContent};

/// The most characters of a text a [`Difference`] keeps on each side.
pub(crate) const PREVIEW_CHARS: usize = 80;

/// Which part of a request differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "part", rename_all = "snake_case")]
pub enum Part {
    /// The system prompt.
    System,
    /// The names of the tools offered, in order.
    ToolNames,
    /// The definition (description or schema) of a tool offered under the same name.
    ToolDefinition {
        /// The tool's name.
        name: String,
    },
    /// The number of messages in the history.
    MessageCount,
    /// The role of a message (1-based).
    Role {
        /// The message's 1-based position.
        message: usize,
    },
    /// The number of blocks of a message.
    BlockCount {
        /// The message's 1-based position.
        message: usize,
    },
    /// The type of a block.
    BlockType {
        /// The message's 1-based position.
        message: usize,
        /// The block's 1-based position.
        block: usize,
    },
    /// The text of a text block.
    Text {
        /// The message's 1-based position.
        message: usize,
        /// The block's 1-based position.
        block: usize,
    },
    /// A field (`name`, `input`) of a tool_use block.
    ToolUse {
        /// The recorded call id.
        id: String,
        /// The differing field.
        field: &'static str,
    },
    /// A field (`tool_use_id`, `content`, `is_error`) of a tool_result block.
    ToolResult {
        /// The recorded call id it answers.
        id: String,
        /// The differing field.
        field: &'static str,
    },
    /// Any other block (thinking, redacted thinking), compared whole.
    Block {
        /// The message's 1-based position.
        message: usize,
        /// The block's 1-based position.
        block: usize,
    },
    /// The plan attached to the request.
    Attachment,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::System => f.write_str("system prompt"),
            Self::ToolNames => f.write_str("tools offered"),
            Self::ToolDefinition { name } => write!(f, "tool definition {name}"),
            Self::MessageCount => f.write_str("number of messages"),
            Self::Role { message } => write!(f, "message {message} role"),
            Self::BlockCount { message } => write!(f, "message {message} number of blocks"),
            Self::BlockType { message, block } => {
                write!(f, "message {message} block {block} type")
            }
            Self::Text { message, block } => write!(f, "message {message} text block {block}"),
            Self::ToolUse { id, field } => write!(f, "tool_use {id} {field}"),
            Self::ToolResult { id, field } => write!(f, "tool_result {id} {field}"),
            Self::Block { message, block } => write!(f, "message {message} block {block}"),
            Self::Attachment => f.write_str("plan attachment"),
        }
    }
}

/// What differs between the recorded run and the replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Difference {
    /// A part of the request differs; `None` means the part is absent on that side.
    Request {
        /// Which part.
        #[serde(flatten)]
        part: Part,
        /// The recorded value (a bounded preview).
        recorded: Option<String>,
        /// The value now (a bounded preview).
        now: Option<String>,
    },
    /// The replay made a request the trace does not hold.
    Unrecorded {
        /// How many requests of this agent the trace holds.
        recorded_calls: u32,
    },
    /// The trace holds this request but no reply to it (the recorded run ended there).
    NoReply,
    /// The replay asked for a summary to compact a history, and the trace
    /// holds no (further) summary of this agent.
    UnrecordedSummary,
    /// The agent made another number of requests than recorded.
    CallCount {
        /// Requests in the trace.
        recorded: u32,
        /// Requests made now.
        now: u32,
    },
    /// A tool call's record (`name`, `decision`, `is_error`, `content`)
    /// differs: this also covers a last round no later request carried.
    Tool {
        /// The recorded call id.
        id: String,
        /// The differing field.
        field: String,
        /// The recorded value (a bounded preview).
        recorded: String,
        /// The value now (a bounded preview).
        now: String,
    },
    /// The agent made another number of tool calls than recorded.
    ToolCount {
        /// Tool calls in the trace.
        recorded: usize,
        /// Tool calls made now.
        now: usize,
    },
    /// The run finished differently.
    Outcome {
        /// The recorded status and text.
        recorded: String,
        /// The status and text now.
        now: String,
    },
}

/// Where a replay departed from its trace: agent, request number, what differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Divergence {
    /// `parent`, `child-1`, ...
    pub agent: String,
    /// The 1-based request number of that agent; `None` for whole-run differences.
    pub call: Option<u32>,
    /// What differs.
    pub difference: Difference,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.call {
            Some(call) => write!(f, "{} call {call}: ", self.agent)?,
            None => write!(f, "{}: ", self.agent)?,
        }
        match &self.difference {
            Difference::Request {
                part,
                recorded,
                now,
            } => {
                let show = |value: &Option<String>| match value {
                    Some(text) => text.clone(),
                    None => "none".to_owned(),
                };
                write!(
                    f,
                    "{part} differs: recorded {}, now {}",
                    show(recorded),
                    show(now)
                )
            }
            Difference::Unrecorded { recorded_calls } => write!(
                f,
                "this request is not in the trace (it holds {recorded_calls} request(s) of this agent)"
            ),
            Difference::NoReply => f.write_str(
                "the trace holds this request but no reply (the recorded run ended here)",
            ),
            Difference::UnrecordedSummary => f.write_str(
                "a compaction asked the model for a summary the trace does not hold (the recorded run compacted otherwise)",
            ),
            Difference::CallCount { recorded, now } => {
                write!(f, "recorded {recorded} request(s), now {now}")
            }
            Difference::Tool {
                id,
                field,
                recorded,
                now,
            } => write!(
                f,
                "tool {id} {field} differs: recorded {recorded}, now {now}"
            ),
            Difference::ToolCount { recorded, now } => {
                write!(f, "recorded {recorded} tool call(s), now {now}")
            }
            Difference::Outcome { recorded, now } => {
                write!(f, "outcome differs: recorded {recorded}, now {now}")
            }
        }
    }
}

/// The first difference between a recorded request and the one built now, if any.
#[cfg(test)]
fn compare(recorded: &Request<'_>, now: &Request<'_>) -> Option<Difference> {
    differences(recorded, now, 0).into_iter().next()
}

/// Every difference between a recorded request and the one built now, in
/// request order: system prompt, tools, the first differing block of each
/// message from message `from` on (0-based; a history only grows, so the
/// messages an earlier request of the same agent carried need no second
/// look), the number of messages, the plan attachment.
pub(crate) fn differences(
    recorded: &Request<'_>,
    now: &Request<'_>,
    from: usize,
) -> Vec<Difference> {
    let mut found = Vec::new();
    if recorded.system != now.system {
        found.push(texts(Part::System, recorded.system, now.system));
    }
    found.extend(compare_tools(recorded.tools, now.tools));
    found.extend(compare_messages(recorded.messages, now.messages, from));
    found.extend(compare_attachment(recorded.attachment, now.attachment));
    found
}

fn compare_attachment(recorded: Option<&str>, now: Option<&str>) -> Option<Difference> {
    if recorded != now {
        let (old, new) = match (recorded, now) {
            (Some(old), Some(new)) => {
                let (old, new) = previews(old, new);
                (Some(old), Some(new))
            }
            (old, new) => (
                old.map(|text| quote(text, 0)),
                new.map(|text| quote(text, 0)),
            ),
        };
        return Some(Difference::Request {
            part: Part::Attachment,
            recorded: old,
            now: new,
        });
    }
    None
}

fn compare_tools(recorded: &[ToolDefinition], now: &[ToolDefinition]) -> Option<Difference> {
    let old_names: Vec<&str> = recorded.iter().map(|tool| tool.name.as_str()).collect();
    let new_names: Vec<&str> = now.iter().map(|tool| tool.name.as_str()).collect();
    if old_names != new_names {
        return Some(Difference::Request {
            part: Part::ToolNames,
            recorded: Some(format!("[{}]", old_names.join(", "))),
            now: Some(format!("[{}]", new_names.join(", "))),
        });
    }
    recorded.iter().zip(now).find_map(|(old, new)| {
        let part = || Part::ToolDefinition {
            name: old.name.clone(),
        };
        if old.description != new.description {
            Some(texts(part(), &old.description, &new.description))
        } else if old.input_schema != new.input_schema {
            Some(texts(
                part(),
                &old.input_schema.to_string(),
                &new.input_schema.to_string(),
            ))
        } else {
            None
        }
    })
}

/// The first difference of each message from `from` on, then the difference in count.
fn compare_messages(recorded: &[Message], now: &[Message], from: usize) -> Vec<Difference> {
    let mut found: Vec<Difference> = recorded
        .iter()
        .zip(now)
        .enumerate()
        .skip(from)
        .filter_map(|(index, (old, new))| compare_message(index + 1, old, new))
        .collect();
    found.extend(count_difference(recorded, now));
    found
}

fn compare_message(message: usize, old: &Message, new: &Message) -> Option<Difference> {
    if old.role != new.role {
        return Some(Difference::Request {
            part: Part::Role { message },
            recorded: Some(json!(old.role).to_string()),
            now: Some(json!(new.role).to_string()),
        });
    }
    for (index, (old, new)) in old.content.iter().zip(&new.content).enumerate() {
        if let Some(difference) = compare_blocks(message, index + 1, old, new) {
            return Some(difference);
        }
    }
    (old.content.len() != new.content.len()).then(|| Difference::Request {
        part: Part::BlockCount { message },
        recorded: Some(old.content.len().to_string()),
        now: Some(new.content.len().to_string()),
    })
}

fn count_difference(recorded: &[Message], now: &[Message]) -> Option<Difference> {
    (recorded.len() != now.len()).then(|| Difference::Request {
        part: Part::MessageCount,
        recorded: Some(recorded.len().to_string()),
        now: Some(now.len().to_string()),
    })
}

fn compare_blocks(message: usize, block: usize, old: &Block, new: &Block) -> Option<Difference> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Block::Text { text: old }, Block::Text { text: new }) => {
            Some(texts(Part::Text { message, block }, old, new))
        }
        (
            Block::ToolUse {
                id: old_id,
                name: old_name,
                input: old_input,
            },
            Block::ToolUse {
                id: new_id,
                name: new_name,
                input: new_input,
            },
        ) => {
            let part = |field| Part::ToolUse {
                id: old_id.to_string(),
                field,
            };
            Some(if old_id != new_id {
                texts(part("id"), old_id.as_str(), new_id.as_str())
            } else if old_name != new_name {
                texts(part("name"), old_name, new_name)
            } else {
                texts(
                    part("input"),
                    &old_input.to_string(),
                    &new_input.to_string(),
                )
            })
        }
        (
            Block::ToolResult {
                tool_use_id: old_id,
                content: old_content,
                is_error: old_error,
            },
            Block::ToolResult {
                tool_use_id: new_id,
                content: new_content,
                is_error: new_error,
            },
        ) => {
            let part = |field| Part::ToolResult {
                id: old_id.to_string(),
                field,
            };
            Some(if old_id != new_id {
                texts(part("tool_use_id"), old_id.as_str(), new_id.as_str())
            } else if old_content != new_content {
                texts(
                    part("content"),
                    &content_text(old_content),
                    &content_text(new_content),
                )
            } else {
                Difference::Request {
                    part: part("is_error"),
                    recorded: Some(old_error.to_string()),
                    now: Some(new_error.to_string()),
                }
            })
        }
        _ if old.kind() != new.kind() => Some(Difference::Request {
            part: Part::BlockType { message, block },
            recorded: Some(quote(old.kind(), 0)),
            now: Some(quote(new.kind(), 0)),
        }),
        _ => Some(texts(
            Part::Block { message, block },
            &json!(old).to_string(),
            &json!(new).to_string(),
        )),
    }
}

/// The first difference between an agent's recorded `tool` lines and its
/// tool records now: a field of a call, else the number of calls.
pub(crate) fn compare_tools_run(recorded: &[Value], now: &[ToolRecord]) -> Option<Difference> {
    for (old, new) in recorded.iter().zip(now) {
        let new = json!(new);
        for field in ["id", "name", "decision", "is_error", "content"] {
            let (old_value, new_value) = (old.get(field), new.get(field));
            if old_value != new_value {
                let show = |value: Option<&Value>| match value {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => "none".to_owned(),
                };
                let (recorded, now) = previews(&show(old_value), &show(new_value));
                return Some(Difference::Tool {
                    id: show(old.get("id")),
                    field: field.to_owned(),
                    recorded,
                    now,
                });
            }
        }
    }
    (recorded.len() != now.len()).then_some(Difference::ToolCount {
        recorded: recorded.len(),
        now: now.len(),
    })
}

/// A tool result's content as text: the string, or the blocks as JSON.
fn content_text(content: &ToolResultContent) -> String {
    match content {
        ToolResultContent::Text(text) => text.to_string(),
        ToolResultContent::Blocks(blocks) => json!(blocks).to_string(),
    }
}

fn texts(part: Part, recorded: &str, now: &str) -> Difference {
    let (recorded, now) = previews(recorded, now);
    Difference::Request {
        part,
        recorded: Some(recorded),
        now: Some(now),
    }
}

/// Both texts, quoted, each cut to a window of at most [`PREVIEW_CHARS`]
/// characters starting a little before their first differing character.
pub(crate) fn previews(recorded: &str, now: &str) -> (String, String) {
    let first_difference = recorded
        .chars()
        .zip(now.chars())
        .take_while(|(a, b)| a == b)
        .count();
    // A difference near the start shows both texts from their beginning.
    let start = if first_difference < PREVIEW_CHARS / 2 {
        0
    } else {
        first_difference - PREVIEW_CHARS / 4
    };
    (quote(recorded, start), quote(now, start))
}

/// `text` from character `start`, at most [`PREVIEW_CHARS`] characters, as a
/// JSON string literal, with `…` marking what was left out.
fn quote(text: &str, start: usize) -> String {
    let total = text.chars().count();
    let start = start.min(total);
    let window: String = text.chars().skip(start).take(PREVIEW_CHARS).collect();
    let literal = Value::String(window).to_string();
    let before = if start > 0 { "…" } else { "" };
    let after = if start + PREVIEW_CHARS < total {
        "…"
    } else {
        ""
    };
    format!("{before}{literal}{after}")
}

/// The result of replaying a trace: the run as it went now, and every way it
/// departed from the recording.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The replayed run.
    pub run: RunReport,
    /// The recorded parent status (`None` when the trace has no outcome line).
    pub recorded_status: Option<crate::core::conversation::StatusKind>,
    /// Requests (all agents) the trace holds.
    pub recorded_requests: usize,
    /// Every divergence found, in the order found (without `--keep-going`, at most one request divergence).
    pub divergences: Vec<Divergence>,
}

impl ReplayReport {
    /// Whether every request matched and the run finished as recorded.
    pub fn reproduced(&self) -> bool {
        self.divergences.is_empty()
    }

    /// Success for the CLI: reproduced, and the recorded status was `answered`.
    pub fn success(&self) -> bool {
        self.reproduced() && self.run.outcome.status == StatusKind::Answered
    }

    /// The verdict lines the CLI prints: one saying the run was reproduced,
    /// or the first divergence (every divergence with `all`) and a count of the rest.
    pub fn lines(&self, all: bool) -> Vec<String> {
        if self.reproduced() {
            let agents = 1 + self.run.children.len();
            return vec![format!(
                "reproduced: all {} recorded request(s) of {agents} agent(s) matched; status {} as recorded",
                self.recorded_requests, self.run.outcome.status
            )];
        }
        let shown = if all { self.divergences.len() } else { 1 };
        let mut lines: Vec<String> = self
            .divergences
            .iter()
            .take(shown)
            .map(|divergence| format!("diverged: {divergence}"))
            .collect();
        let rest = self.divergences.len().saturating_sub(shown);
        if rest > 0 {
            lines.push(format!(
                "({rest} more divergence(s); a replay that keeps going lists them all)"
            ));
        }
        lines
    }

    /// The CLI's `--json` object: the run's object with a `replay` entry
    /// (`reproduced`, `recorded_status`, `recorded_requests`, `divergences`).
    pub fn to_json(&self) -> Value {
        let mut object = self.run.to_json();
        let divergences = self.divergences.iter().map(|divergence| {
            let mut entry = json!(divergence);
            if let Some(fields) = entry.as_object_mut() {
                fields.insert("message".into(), json!(divergence.to_string()));
            }
            entry
        });
        let replay = json!({
            "reproduced": self.reproduced(),
            "recorded_status": self.recorded_status,
            "recorded_requests": self.recorded_requests,
            "divergences": divergences.collect::<Vec<_>>(),
        });
        if let Some(fields) = object.as_object_mut() {
            fields.insert("replay".into(), replay);
        }
        object
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::protocol::Role;

    fn recorded(messages: &[Message]) -> Request<'_> {
        Request {
            system: "sys",
            tools: &[],
            messages,
            attachment: None,
            output: None,
        }
    }

    fn result(id: &str, text: &str) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: crate::core::protocol::ToolUseId::new(id),
                content: ToolResultContent::Text(text.into()),
                is_error: false,
            }],
        }
    }

    fn divergence(old: &Request<'_>, now: &Request<'_>) -> String {
        Divergence {
            agent: "parent".into(),
            call: Some(3),
            difference: compare(old, now).expect("a difference"),
        }
        .to_string()
    }

    #[test]
    fn a_tool_result_difference_names_the_id_and_both_contents() {
        let old = [Message::user_text("q"), result("toolu_02", "42")];
        let old = recorded(&old);
        let messages = [Message::user_text("q"), result("toolu_02", "43")];
        let now = Request {
            system: "sys",
            tools: &[],
            messages: &messages,
            attachment: None,
            output: None,
        };
        assert_eq!(
            divergence(&old, &now),
            r#"parent call 3: tool_result toolu_02 content differs: recorded "42", now "43""#
        );
        let same = [Message::user_text("q"), result("toolu_02", "42")];
        assert_eq!(
            compare(
                &old,
                &Request {
                    messages: &same,
                    ..now
                }
            ),
            None
        );
    }

    #[test]
    fn system_attachment_and_history_length_are_compared() {
        let old = [Message::user_text("q")];
        let old = recorded(&old);
        let messages = [Message::user_text("q")];
        let now = Request {
            system: "other",
            tools: &[],
            messages: &messages,
            attachment: None,
            output: None,
        };
        assert!(divergence(&old, &now).contains("system prompt differs"));
        let plan = Request {
            system: "sys",
            attachment: Some("plan"),
            output: None,
            ..now
        };
        assert_eq!(
            divergence(&old, &plan),
            r#"parent call 3: plan attachment differs: recorded none, now "plan""#
        );
        let longer = [Message::user_text("q"), Message::user_text("more")];
        let longer = Request {
            system: "sys",
            messages: &longer,
            ..now
        };
        assert!(divergence(&old, &longer).contains("number of messages differs"));
    }

    #[test]
    fn messages_before_from_are_not_compared_again() {
        let old = [Message::user_text("q"), result("toolu_02", "42")];
        let old = recorded(&old);
        let messages = [Message::user_text("q"), result("toolu_02", "43")];
        let now = Request {
            messages: &messages,
            ..old
        };
        assert_eq!(differences(&old, &now, 1).len(), 1);
        assert_eq!(differences(&old, &now, 2), Vec::new());
    }

    #[test]
    fn long_texts_are_shown_as_a_bounded_window_around_the_difference() {
        let old = format!("{}A{}", "x".repeat(5000), "y".repeat(5000));
        let new = format!("{}B{}", "x".repeat(5000), "y".repeat(5000));
        let (a, b) = previews(&old, &new);
        assert!(a.chars().count() <= PREVIEW_CHARS + 4, "{a}");
        assert!(a.contains('A') && b.contains('B'));
        assert!(a.starts_with('…') && a.ends_with('…'));
    }
}
