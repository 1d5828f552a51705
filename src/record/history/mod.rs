//! Any agent's history, as the loop's pairing rules see it, and those
//! rules checked over it: one rule set for subloop's own traces (the
//! `answered_once` invariant of `view --check`) and for histories other
//! programs keep (a Messages API request body or `messages` array, a Chat
//! Completions `messages` array, a Claude Code session, a codex rollout).
//!
//! A history is read into [`Turn`]s: who spoke, which calls a reply
//! asked for, which results a user turn carries, and where each is in the
//! file (message index, line). Everything else of a message (text, images,
//! thinking, fields this crate does not know) is left alone: reading needs
//! only the ids, so a history with blocks of any type is read.
//!
//! [`pairing`] is the rule set: each `tool_use` is answered by a
//! `tool_result` in the very next message, once, in call order, and no
//! result answers a call that was not asked right before it. Each breach
//! is a [`Finding`] naming its [`Rule`], the message, the id and what to do
//! about it.
//!
//! [`repair`] makes a broken history hold again, in its own format,
//! editing only what breaks a rule and listing each [`Change`].

mod claude_code;
mod codex;
mod json;
mod raw;
mod repair;
mod rules;

pub use raw::ReadError;
pub use repair::{Change, ChangeKind, INTERRUPTED, RepairError, Repaired, repair};
pub use rules::{Finding, Rule, pairing};

use serde::Serialize;

/// Who wrote a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Speaker {
    /// The user (or the host, carrying tool results).
    User,
    /// The model.
    Assistant,
}

/// One call a reply asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Call {
    /// Its id (`tool_use.id`, `tool_calls[].id`).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The file's line that holds it, for formats with one entry per line.
    pub line: Option<usize>,
    /// Where in its message or entry it is (the block's index in the
    /// content, the call's in `tool_calls`): what a repair edits.
    #[serde(skip)]
    pub(crate) block: usize,
}

impl Call {
    /// A call of `name` under `id`, at no particular line.
    pub fn new(id: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            line: None,
            block: 0,
        }
    }
}

/// One result a user turn carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Answer {
    /// The id of the call it answers.
    pub id: String,
    /// The index of the message that holds it in the file's own list (for
    /// a Chat Completions history, each `tool` message is one).
    pub message: usize,
    /// The file's line that holds it, for formats with one entry per line.
    pub line: Option<usize>,
    /// Where in its message or entry it is (the block's index in the
    /// content).
    #[serde(skip)]
    pub(crate) block: usize,
}

impl Answer {
    /// A result for the call `id`, held by message `message`.
    pub fn new(id: impl Into<String>, message: usize) -> Self {
        Self {
            id: id.into(),
            message,
            line: None,
            block: 0,
        }
    }
}

/// One turn of a history: a message, or (Chat Completions) an assistant
/// message's `tool` messages taken together as the user turn that answers
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Turn {
    /// Who wrote it.
    pub speaker: Speaker,
    /// The index of its (first) message in the file's own list.
    pub message: usize,
    /// The file's line, for formats with one message per line.
    pub line: Option<usize>,
    /// The calls it asks for, in order (an assistant turn).
    pub calls: Vec<Call>,
    /// The results it carries, in order (a user turn).
    pub results: Vec<Answer>,
    /// The stop reason the file keeps for it (a reply of a Claude Code
    /// session: the last its entries name), when it keeps one.
    pub stop_reason: Option<String>,
    /// The file's line of its last entry, for formats with one entry per
    /// line (where a repair puts what comes right after it).
    #[serde(skip)]
    pub(crate) last_line: Option<usize>,
}

impl Turn {
    /// A turn of `speaker` at message `message`, with nothing in it.
    pub fn new(speaker: Speaker, message: usize) -> Self {
        Self {
            speaker,
            message,
            line: None,
            calls: Vec::new(),
            results: Vec::new(),
            stop_reason: None,
            last_line: None,
        }
    }
}

/// The formats a history is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Format {
    /// A Messages API request body (`{"messages": [...]}`) or its
    /// `messages` array.
    Anthropic,
    /// A Chat Completions request body or its `messages` array.
    OpenAi,
    /// A Claude Code session (`~/.claude/projects/PROJECT/SESSION.jsonl`):
    /// the chain of entries a resume follows, from the last one back.
    ClaudeCode,
    /// A codex rollout (`~/.codex/sessions/Y/M/D/rollout-*.jsonl`): its
    /// `response_item` lines, calls paired with outputs by `call_id`.
    Codex,
}

impl Format {
    /// `anthropic` or `openai`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::ClaudeCode => "claude-code",
            Self::Codex => "codex",
        }
    }

    /// The format named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "anthropic" => Some(Self::Anthropic),
            "openai" => Some(Self::OpenAi),
            "claude-code" => Some(Self::ClaudeCode),
            "codex" => Some(Self::Codex),
            _ => None,
        }
    }
}

/// One agent's history, read from a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct History {
    /// The format it was read from.
    pub format: Format,
    /// Its turns, in order.
    pub turns: Vec<Turn>,
    /// What the reader found besides the turns: results held by entries
    /// left off the chain a resume follows (Claude Code).
    pub off_chain: Vec<Finding>,
    /// How many compactions the history went through (its turns are
    /// those after the last).
    pub compactions: usize,
    /// The agent whose history this is, when the file says (a Claude Code
    /// subagent's `agentId`).
    pub agent: Option<String>,
    /// The subagents its calls started, as its results name them (a
    /// Claude Code `Task` result's `agentId`).
    pub children: Vec<ChildLink>,
}

/// A call that started a subagent, and the subagent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ChildLink {
    /// The call's id.
    pub call: String,
    /// The subagent's id (its file is `agent-ID.jsonl`).
    pub agent: String,
}

impl History {
    /// Reads `text` as `format`, or as whichever format it is when `None`
    /// (a codex rollout is JSON Lines of `payload`s; a Claude Code session
    /// JSON Lines of entries with `uuid`s; a Chat Completions history has `tool` messages, `tool_calls` or a
    /// `system` role; otherwise it is read as the Messages API's).
    pub fn read(text: &str, format: Option<Format>) -> Result<Self, ReadError> {
        let format = format.or_else(|| Self::sniff(text));
        match format {
            Some(Format::ClaudeCode) => claude_code::read(std::io::Cursor::new(text)),
            Some(Format::Codex) => codex::read(std::io::Cursor::new(text)),
            other => raw::read(text, other),
        }
    }

    /// The JSON Lines format the first lines of a file (`head`) say it
    /// is: a Claude Code session or a codex rollout; `None` for anything
    /// else (a request history is told by its whole text).
    pub fn sniff(head: &str) -> Option<Format> {
        if codex::looks_like(head) {
            Some(Format::Codex)
        } else if claude_code::looks_like(head) {
            Some(Format::ClaudeCode)
        } else {
            None
        }
    }

    /// Reads a codex rollout from `reader`, line by line.
    pub fn read_codex(reader: impl std::io::BufRead) -> Result<Self, ReadError> {
        codex::read(reader)
    }

    /// Reads a Claude Code session from `reader`, line by line: memory
    /// grows with the number of entries and their ids, not with the
    /// text they hold.
    pub fn read_claude_code(reader: impl std::io::BufRead) -> Result<Self, ReadError> {
        claude_code::read(reader)
    }

    /// Every place the pairing rules break, in file order, with what the
    /// reader found.
    pub fn check(&self) -> Vec<Finding> {
        let mut found = pairing(&self.turns, false);
        found.extend(rules::stop_reasons(&self.turns));
        found.extend(self.off_chain.iter().cloned());
        found.sort_by_key(|finding| (finding.line, finding.message));
        found
    }
}

/// Reads a Claude Code session: its history, and the messages on the
/// chain a resume follows, root first, each as its line and the turn
/// (an index into the history's turns) it is part of.
pub(crate) fn claude_code_session(
    reader: impl std::io::BufRead,
) -> Result<(History, Vec<(usize, usize)>), ReadError> {
    let (history, session) = claude_code::session(reader, false)?;
    let lines = session
        .chain
        .iter()
        .zip(&session.turn_of)
        .filter(|(_, turn)| **turn != usize::MAX)
        .filter_map(|(index, turn)| Some((session.entries.get(*index)?.line, *turn)))
        .collect();
    Ok((history, lines))
}

/// The items of a codex rollout's history (after its last compaction), in
/// order, each with the side it is on (`None`: not sent, as a developer
/// message).
pub(crate) fn codex_items(
    text: &str,
) -> Result<Vec<(serde_json::Value, Option<Speaker>)>, ReadError> {
    let mut items = Vec::new();
    codex::visit(std::io::Cursor::new(text), |event| match event {
        codex::Event::Item { payload, .. } => items.push((payload.clone(), codex::side(payload))),
        codex::Event::Compacted => items.clear(),
    })?;
    Ok(items)
}

/// Whether one of the first 20 lines of `text` that are not blank is a
/// JSON object `is` says yes to: how the JSON Lines formats are told.
pub(super) fn any_head_line(text: &str, is: impl Fn(&serde_json::Value) -> bool) -> bool {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .take(20)
        .any(|line| serde_json::from_str::<serde_json::Value>(line).is_ok_and(|value| is(&value)))
}

/// The turns of a history of this crate's messages (message `i` is turn
/// `i`).
pub(crate) fn turns_of(messages: &[crate::core::protocol::Message]) -> Vec<Turn> {
    use crate::core::protocol::{Block, Role};
    messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let speaker = match message.role {
                Role::User => Speaker::User,
                Role::Assistant => Speaker::Assistant,
            };
            let mut turn = Turn::new(speaker, index);
            for (position, block) in message.content.iter().enumerate() {
                match block {
                    Block::ToolUse { id, name, .. } => turn.calls.push(Call {
                        block: position,
                        ..Call::new(id.to_string(), name.clone())
                    }),
                    Block::ToolResult { tool_use_id, .. } => turn.results.push(Answer {
                        block: position,
                        ..Answer::new(tool_use_id.to_string(), index)
                    }),
                    _ => {}
                }
            }
            turn
        })
        .collect()
}
