//! Making a history shorter without breaking it: a [`Compactor`] proposes
//! a shorter history, and `Conversation::compact` (in
//! `core::conversation`) — a transition of a conversation waiting for the
//! model only, where every call has its result — takes it only
//! if it still keeps the protocol: it starts and ends with a user message,
//! every `tool_use` is answered by a `tool_result` in the very next
//! message, and no result answers a call that is not right before it.
//!
//! A compaction cannot split a call from its result: a conversation
//! waiting for tool results has no `compact`.
//!
//! ```compile_fail
//! use subloop::core::compaction::ClearToolResults;
//! use subloop::core::conversation::Reply;
//! use subloop::{Budget, Conversation, ModelResponse};
//! use serde_json::json;
//! let conversation = Conversation::start("hi", Budget::new(2).unwrap()).unwrap();
//! let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
//! let Reply::Tools(pending) = conversation.receive(reply) else { unreachable!() };
//! pending.compact(&ClearToolResults::new(0)); // AwaitingTools has no `compact`
//! ```
//!
//! Two built-ins ask no model: [`ClearToolResults`] (older results become a
//! short placeholder naming the tool and what was cleared) and
//! [`SlidingWindow`] (the oldest rounds go, whole, and the question stays).
//!

use std::collections::HashMap;

use crate::core::protocol::{Block, Message, Role, ToolResultContent, ToolUseId};

/// Proposes a shorter history.
pub trait Compactor: Send + Sync {
    /// The compactor's name, for records (`clear_tool_results`, `sliding_window`).
    fn name(&self) -> &str;

    /// A shorter history for `history` (which starts with the question and
    /// in which every call has its result), or `None` when this compactor
    /// cannot shorten it. What it returns is checked before it is used.
    fn compact(&self, history: &[Message]) -> Option<Vec<Message>>;
}

/// Replaces the content of every tool result but the last `keep_last`
/// with a placeholder that names the tool and how much was cleared. The
/// results of the tools in `keep_tools` (by default `task`: a child's
/// report is already bounded) stay whole. Asks no model.
#[derive(Debug, Clone)]
pub struct ClearToolResults {
    keep_last: usize,
    keep_tools: Vec<String>,
}

impl ClearToolResults {
    /// The text every placeholder starts with.
    pub const PLACEHOLDER: &'static str = "[cleared to fit the context window:";

    /// Keeps the last `keep_last` results whole, and every `task` result.
    pub fn new(keep_last: usize) -> Self {
        Self {
            keep_last,
            keep_tools: vec!["task".to_owned()],
        }
    }

    /// Keeps the results of the tools named in `names` whole (instead of `task`'s).
    #[must_use]
    pub fn keep_tools(mut self, names: &[&str]) -> Self {
        self.keep_tools = names.iter().map(|name| (*name).to_owned()).collect();
        self
    }
}

impl Compactor for ClearToolResults {
    fn name(&self) -> &str {
        "clear_tool_results"
    }

    fn compact(&self, history: &[Message]) -> Option<Vec<Message>> {
        let names: HashMap<&ToolUseId, &str> = history
            .iter()
            .flat_map(|message| &message.content)
            .filter_map(|block| match block {
                Block::ToolUse { id, name, .. } => Some((id, name.as_str())),
                _ => None,
            })
            .collect();
        let results = history
            .iter()
            .flat_map(|message| &message.content)
            .filter(|block| matches!(block, Block::ToolResult { .. }))
            .count();
        let clear = results.saturating_sub(self.keep_last);
        let mut seen = 0;
        let mut changed = false;
        let mut out = history.to_vec();
        for message in &mut out {
            for block in &mut message.content {
                let Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } = block
                else {
                    continue;
                };
                seen += 1;
                if seen > clear {
                    continue;
                }
                let tool = names.get(tool_use_id).copied().unwrap_or("a tool");
                if self.keep_tools.iter().any(|keep| keep == tool) {
                    continue;
                }
                let text = content_text(content);
                if text.starts_with(Self::PLACEHOLDER) {
                    continue;
                }
                *content = ToolResultContent::Text(
                    format!(
                        "{} the result of {tool} ({} characters) was removed]",
                        Self::PLACEHOLDER,
                        text.chars().count()
                    )
                    .into(),
                );
                changed = true;
            }
        }
        changed.then_some(out)
    }
}

/// The text of a result's content.
fn content_text(content: &ToolResultContent) -> String {
    match content {
        ToolResultContent::Text(text) => text.to_string(),
        ToolResultContent::Blocks(blocks) => crate::core::protocol::join_text(blocks.iter()),
    }
}

/// Keeps the question (the messages before the first reply) and the last
/// `keep_rounds` rounds, a round being a reply and the user messages after
/// it (its tool results among them), so a call and its result go or stay
/// together. The question gets a note saying how many rounds were removed.
/// Asks no model.
#[derive(Debug, Clone, Copy)]
pub struct SlidingWindow {
    keep_rounds: usize,
}

impl SlidingWindow {
    /// The text of the note the question gets.
    pub const NOTE: &'static str =
        "earlier rounds of this conversation were removed to fit the context window]";

    /// Keeps the last `keep_rounds` rounds (at least one).
    pub fn new(keep_rounds: usize) -> Self {
        Self {
            keep_rounds: keep_rounds.max(1),
        }
    }
}

impl Compactor for SlidingWindow {
    fn name(&self) -> &str {
        "sliding_window"
    }

    fn compact(&self, history: &[Message]) -> Option<Vec<Message>> {
        let starts: Vec<usize> = history
            .iter()
            .enumerate()
            .filter(|(_, message)| message.role == Role::Assistant)
            .map(|(index, _)| index)
            .collect();
        let first = *starts.first()?;
        // The current question (a follow-up asked after an answer) is never
        // dropped: only rounds before the one that holds it may go.
        let question_at = current_question(history)?;
        // Rounds that start before the current question; the last of them
        // holds it.
        let before = starts.iter().filter(|start| **start < question_at).count();
        let droppable = if before == 0 {
            starts.len()
        } else {
            before - 1
        };
        let drop = starts.len().saturating_sub(self.keep_rounds).min(droppable);
        if drop == 0 {
            return None;
        }
        let keep_from = *starts.get(drop)?;
        let mut question: Vec<Message> = history.get(..first)?.to_vec();
        // The note goes last on the question's last message, after the
        // question's own blocks; an earlier note's count is added to.
        let last = question.last_mut()?;
        let earlier = match last.content.as_slice() {
            [_, .., Block::Text { text }] => note_count(text),
            _ => None,
        };
        if earlier.is_some() {
            last.content.pop();
        }
        last.content.push(Block::Text {
            text: format!(
                "[{} {}",
                earlier.unwrap_or(0).saturating_add(drop),
                Self::NOTE
            ),
        });
        question.extend(history.get(keep_from..)?.iter().cloned());
        Some(question)
    }
}

/// The count of a note [`SlidingWindow`] wrote (`[N earlier rounds …]`).
fn note_count(text: &str) -> Option<usize> {
    let rest = text.strip_prefix('[')?;
    let (count, note) = rest.split_once(' ')?;
    if note != SlidingWindow::NOTE || count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    count.parse().ok()
}

/// The index of the current question: the last user message that holds no
/// tool result (the question, a follow-up, or a prompt the conversation
/// added), if any.
pub(crate) fn current_question(history: &[Message]) -> Option<usize> {
    history.iter().rposition(|message| {
        message.role == Role::User
            && !message
                .content
                .iter()
                .any(|block| matches!(block, Block::ToolResult { .. }))
    })
}

/// Why a proposed history was refused ([`check`]).
pub(crate) fn check(history: &[Message]) -> Result<(), String> {
    match history.first() {
        Some(message) if message.role == Role::User => {}
        Some(_) => return Err("the history does not start with a user message".to_owned()),
        None => return Err("the history is empty".to_owned()),
    }
    if history.last().map(|message| message.role) != Some(Role::User) {
        return Err("the history does not end with a user message".to_owned());
    }
    for (index, message) in history.iter().enumerate() {
        if message.content.is_empty() {
            return Err(format!("message {index} has no content"));
        }
        let calls: Vec<&ToolUseId> = message
            .content
            .iter()
            .filter_map(|block| match block {
                Block::ToolUse { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        let results: Vec<&ToolUseId> = message
            .content
            .iter()
            .filter_map(|block| match block {
                Block::ToolResult { tool_use_id, .. } => Some(tool_use_id),
                _ => None,
            })
            .collect();
        let mut unique = std::collections::HashSet::new();
        if let Some(twice) = calls.iter().chain(&results).find(|id| !unique.insert(**id)) {
            return Err(format!("message {index}: {twice} appears twice"));
        }
        // Results come first in their message, as the API asks.
        let first_other = message
            .content
            .iter()
            .position(|block| !matches!(block, Block::ToolResult { .. }));
        let last_result = message
            .content
            .iter()
            .rposition(|block| matches!(block, Block::ToolResult { .. }));
        if let (Some(other), Some(result)) = (first_other, last_result)
            && other < result
        {
            return Err(format!(
                "message {index}: a tool result after other content"
            ));
        }
        match message.role {
            Role::Assistant if !results.is_empty() => {
                return Err(format!("message {index}: a reply holds tool results"));
            }
            Role::User if !calls.is_empty() => {
                return Err(format!("message {index}: a user message holds tool calls"));
            }
            _ => {}
        }
        // Every result answers a call of the message right before it.
        if !results.is_empty() {
            let before = index
                .checked_sub(1)
                .and_then(|i| history.get(i))
                .filter(|m| m.role == Role::Assistant);
            let asked: Vec<&ToolUseId> = before
                .map(|m| {
                    m.content
                        .iter()
                        .filter_map(|block| match block {
                            Block::ToolUse { id, .. } => Some(id),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(orphan) = results.iter().find(|id| !asked.contains(id)) {
                return Err(format!(
                    "message {index}: the result for {orphan} answers no call right before it"
                ));
            }
        }
        // Every call is answered in the very next message.
        if !calls.is_empty() {
            let after: Vec<&ToolUseId> = history
                .get(index + 1)
                .map(|m| {
                    m.content
                        .iter()
                        .filter_map(|block| match block {
                            Block::ToolResult { tool_use_id, .. } => Some(tool_use_id),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(unanswered) = calls.iter().find(|id| !after.contains(id)) {
                return Err(format!(
                    "message {index}: the call {unanswered} has no result right after it"
                ));
            }
        }
    }
    Ok(())
}
