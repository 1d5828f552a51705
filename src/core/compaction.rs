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
//! [`SlidingWindow`] (the oldest rounds go, whole, and the question stays);
//! [`Tiered`] tries several in turn.
//!
//! *When* to compact is separate from *how*: a run's [`Compaction`] holds a
//! compactor and, optionally, a [`Trigger`] (a [`Threshold`] of estimated
//! input tokens) that is asked before every request. A request the server
//! refuses for its length ([`crate::core::error::FailureKind::ContextWindow`])
//! forces a compaction whatever the trigger; a history that cannot be made
//! shorter finishes the conversation `context_overflow`.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::core::protocol::{Block, Message, Role, ToolResultContent, ToolUseId, Usage};

/// What set a compaction off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CompactTrigger {
    /// The run's [`Trigger`] said the next request would be too long.
    Auto,
    /// The server refused the last request: it does not fit the model's
    /// context window.
    Overflow,
    /// The host asked for it.
    Manual,
}

impl CompactTrigger {
    /// `auto`, `overflow` or `manual`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Overflow => "overflow",
            Self::Manual => "manual",
        }
    }
}

impl std::fmt::Display for CompactTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides, before a request, whether the history should be compacted
/// first.
pub trait Trigger: Send + Sync {
    /// Whether a request of about `tokens` input tokens is due a
    /// compaction.
    fn due(&self, tokens: u64) -> bool;

    /// The rule in words, for records (`over 6000 tokens`).
    fn describe(&self) -> String;

    /// Whether a compaction that brought the request to about `tokens`
    /// input tokens did enough: the run compacts again (a few times at
    /// most) until it did, so that a compactor whose savings shrink (old
    /// results already cleared) does not leave the history just under the
    /// line, to be compacted again a few turns later. The default: no
    /// longer due.
    fn relieved(&self, tokens: u64) -> bool {
        !self.due(tokens)
    }
}

/// Compact when the next request's input is estimated at more than a
/// number of tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    tokens: u64,
}

impl Threshold {
    /// The fraction of a known window [`Threshold::of_window`] compacts at.
    pub const DEFAULT_FRACTION: f64 = 0.8;

    /// Compacts when a request would hold more than `tokens` input tokens.
    pub fn tokens(tokens: u64) -> Self {
        Self { tokens }
    }

    /// Compacts past `fraction` (clamped to 0.05..=1) of a context window
    /// of `window` tokens, leaving the rest for the reply.
    pub fn of_window(window: u64, fraction: f64) -> Self {
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.05, 1.0)
        } else {
            Self::DEFAULT_FRACTION
        };
        // Exact for any window a model has (far below 2^52).
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        #[allow(clippy::cast_sign_loss)]
        let tokens = (window as f64 * fraction) as u64;
        Self { tokens }
    }

    /// The token count past which it compacts.
    pub fn limit(&self) -> u64 {
        self.tokens
    }
}

impl Trigger for Threshold {
    fn due(&self, tokens: u64) -> bool {
        tokens > self.tokens
    }

    fn describe(&self) -> String {
        format!("over {} tokens", self.tokens)
    }

    /// Half the threshold or less.
    fn relieved(&self, tokens: u64) -> bool {
        tokens <= self.tokens / 2
    }
}

/// An estimate of the tokens `messages` take: one per four bytes of their
/// JSON, the rule of thumb for English text and code. Replies' `usage`
/// replaces it wherever a run has it ([`TokenCount`]).
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    let bytes: usize = messages.iter().map(message_bytes).sum();
    (bytes as u64).div_ceil(4)
}

/// The JSON size of one message, counted without building the JSON.
fn message_bytes(message: &Message) -> usize {
    // `{"role":"assistant","content":[...]}` and the blocks' own keys.
    32 + message
        .content
        .iter()
        .map(|block| match block {
            Block::Text { text } => 24 + text.len(),
            Block::ToolUse { id, name, input } => {
                40 + id.as_str().len() + name.len() + input.to_string().len()
            }
            Block::ToolResult {
                tool_use_id,
                content,
                ..
            } => 56 + tool_use_id.as_str().len() + content_text(content).len(),
            other => serde_json::to_string(other).map_or(0, |text| text.len()),
        })
        .sum::<usize>()
}

/// The input tokens of the next request, as the driver tracks them: the
/// last reply's `usage` (its whole prompt and its output, both now part of
/// the history) plus an estimate of the messages added since; before any
/// reply reports usage, or after a compaction, an estimate of the whole
/// request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCount {
    /// Tokens reported by the last reply and the history length after it.
    reported: Option<(u64, usize)>,
    /// The fixed part of every request: system prompt and tool definitions.
    fixed: u64,
}

impl TokenCount {
    /// A count for requests whose system prompt and tool definitions take
    /// about `fixed` tokens.
    pub fn new(fixed: u64) -> Self {
        Self {
            reported: None,
            fixed,
        }
    }

    /// A reply reported `usage`; the history is `history_len` messages long
    /// with the reply in it.
    pub fn replied(&mut self, usage: Option<&Usage>, history_len: usize) {
        self.reported = usage
            .map(|usage| {
                usage
                    .input_tokens
                    .saturating_add(usage.cache_creation_input_tokens)
                    .saturating_add(usage.cache_read_input_tokens)
                    .saturating_add(usage.output_tokens)
            })
            .filter(|tokens| *tokens > 0)
            .map(|tokens| (tokens, history_len));
    }

    /// The history was replaced: counts start again from an estimate.
    pub fn reset(&mut self) {
        self.reported = None;
    }

    /// The estimated input tokens of a request carrying `history`.
    pub fn of(&self, history: &[Message]) -> u64 {
        match self.reported {
            Some((tokens, len)) if len <= history.len() => {
                tokens.saturating_add(estimate_tokens(history.get(len..).unwrap_or_default()))
            }
            _ => self.fixed.saturating_add(estimate_tokens(history)),
        }
    }
}

/// Replaces the older rounds of a history with a summary the model
/// writes (a request of its own, with a handoff prompt and no tools): the
/// question stays first, with the summary after it, and the last
/// `keep_rounds` rounds stay whole. When the summary request is itself too
/// long for the window, the oldest rounds it would summarize are dropped
/// (half of them each time) and it is asked again, at most
/// [`Summarize::ATTEMPTS`] times. A run uses it through
/// [`Compaction::summarizing`]; the history it proposes is checked like
/// any compactor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summarize {
    keep_rounds: usize,
}

impl Summarize {
    /// The system prompt of a summary request.
    pub const SYSTEM: &'static str = "You write handoff summaries of a coding agent's work. \
Another instance of the agent continues from your summary alone, so keep every fact it needs: \
what was asked, what each tool call found (file contents that matter, program output, errors), \
what was decided and what is left to do. Do not call tools. Do not add anything that did not happen.";

    /// The request that ends a summary request's messages.
    pub const ASK: &str = "Summarize the conversation above for whoever continues it, as the \
system prompt says. Reply with the summary only.";

    /// The text the summary starts with in the compacted history.
    pub const PREFIX: &'static str =
        "[summary of the earlier rounds of this conversation, written to fit the context window]";

    /// How many summary requests one compaction makes at most.
    pub const ATTEMPTS: usize = 3;

    /// Keeps the last `keep_rounds` rounds (at least one) whole.
    pub fn new(keep_rounds: usize) -> Self {
        Self {
            keep_rounds: keep_rounds.max(1),
        }
    }

    /// Where the question ends and the kept rounds start in `history`,
    /// when there is anything before them to summarize.
    fn split(&self, history: &[Message]) -> Option<(usize, usize)> {
        older_rounds(history, self.keep_rounds).map(|(first, keep_from, _)| (first, keep_from))
    }

    /// The messages of a summary request for `history`, its oldest
    /// `dropped` rounds left out (after a request too long for the
    /// window); `None` when nothing is left to summarize.
    pub fn request(&self, history: &[Message], dropped: usize) -> Option<Vec<Message>> {
        let (first, keep_from) = self.split(history)?;
        let rounds: Vec<usize> = (first..keep_from)
            .filter(|index| {
                history
                    .get(*index)
                    .is_some_and(|message| message.role == Role::Assistant)
            })
            .collect();
        if dropped >= rounds.len() {
            return None;
        }
        let from = *rounds.get(dropped)?;
        let mut messages: Vec<Message> = history.get(..first)?.to_vec();
        messages.extend(history.get(from..keep_from)?.iter().cloned());
        // The ask goes last on the last user message (after any results,
        // which come first), so user and assistant still alternate.
        let last = messages.last_mut()?;
        last.content.push(Block::Text {
            text: Self::ASK.to_owned(),
        });
        Some(messages)
    }

    /// How many rounds a summary of `history` would cover.
    pub fn rounds(&self, history: &[Message]) -> usize {
        self.split(history).map_or(0, |(first, keep_from)| {
            history
                .get(first..keep_from)
                .unwrap_or_default()
                .iter()
                .filter(|message| message.role == Role::Assistant)
                .count()
        })
    }

    /// The compacted history: the question with `summary` after it (in
    /// place of an earlier summary or note), then the kept rounds.
    pub fn apply(&self, history: &[Message], summary: &str) -> Option<Vec<Message>> {
        let (first, keep_from) = self.split(history)?;
        let mut question: Vec<Message> = history.get(..first)?.to_vec();
        let last = question.last_mut()?;
        if let [_, .., Block::Text { text }] = last.content.as_slice()
            && (text.starts_with(Self::PREFIX) || note_count(text).is_some())
        {
            last.content.pop();
        }
        last.content.push(Block::Text {
            text: format!("{}\n{}", Self::PREFIX, summary.trim()),
        });
        question.extend(history.get(keep_from..)?.iter().cloned());
        Some(question)
    }
}

/// When and how a run compacts its histories (the parent's and every
/// child's, each under its own budget).
#[derive(Clone)]
pub struct Compaction {
    compactor: Arc<dyn Compactor>,
    trigger: Option<Arc<dyn Trigger>>,
    summarize: Option<Summarize>,
}

impl std::fmt::Debug for Compaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compaction")
            .field("compactor", &self.compactor.name())
            .field("trigger", &self.trigger.as_ref().map(|t| t.describe()))
            .field("summarize", &self.summarize)
            .finish()
    }
}

impl Compaction {
    /// Compacts with `compactor` when a request is refused for its length
    /// (and, with [`Compaction::when`], before a request its trigger says
    /// is due).
    pub fn new(compactor: impl Compactor + 'static) -> Self {
        Self {
            compactor: Arc::new(compactor),
            trigger: None,
            summarize: None,
        }
    }

    /// [`Compaction::new`] with a shared compactor.
    pub fn shared(compactor: Arc<dyn Compactor>) -> Self {
        Self {
            compactor,
            trigger: None,
            summarize: None,
        }
    }

    /// The default: [`Tiered::standard`] (old tool results cleared first,
    /// then the oldest rounds dropped), on an overflow and, when the window
    /// is known, past [`Threshold::DEFAULT_FRACTION`] of it.
    pub fn auto(window: Option<u64>) -> Self {
        let compaction = Self::new(Tiered::standard());
        match window {
            Some(window) => {
                compaction.when(Threshold::of_window(window, Threshold::DEFAULT_FRACTION))
            }
            None => compaction,
        }
    }

    /// Also compacts before a request `trigger` says is due.
    #[must_use]
    pub fn when(mut self, trigger: impl Trigger + 'static) -> Self {
        self.trigger = Some(Arc::new(trigger));
        self
    }

    /// First asks the model for a summary ([`Summarize`]); the compactor
    /// is used when there is nothing to summarize or no summary came back.
    #[must_use]
    pub fn summarizing(mut self, summarize: Summarize) -> Self {
        self.summarize = Some(summarize);
        self
    }

    /// The compactor.
    pub fn compactor(&self) -> &dyn Compactor {
        self.compactor.as_ref()
    }

    /// The summary it asks for first, if any.
    pub fn summarize(&self) -> Option<&Summarize> {
        self.summarize.as_ref()
    }

    /// The trigger, if any.
    pub fn trigger(&self) -> Option<&dyn Trigger> {
        self.trigger.as_deref()
    }
}

/// Tries compactors in turn: the first that shortens the history wins.
pub struct Tiered {
    tiers: Vec<Arc<dyn Compactor>>,
}

impl std::fmt::Debug for Tiered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.tiers.iter().map(|tier| tier.name()))
            .finish()
    }
}

impl Tiered {
    /// Tries `tiers` in order.
    pub fn new(tiers: Vec<Arc<dyn Compactor>>) -> Self {
        Self { tiers }
    }

    /// The default tiers, cheapest loss first, none asking a model: every
    /// tool result but the last two cleared; then the oldest rounds
    /// dropped down to the last four, then to the last one; then the last
    /// results cleared too.
    pub fn standard() -> Self {
        Self::new(vec![
            Arc::new(ClearToolResults::new(2)),
            Arc::new(SlidingWindow::new(4)),
            Arc::new(SlidingWindow::new(1)),
            Arc::new(ClearToolResults::new(0)),
        ])
    }
}

impl Compactor for Tiered {
    fn name(&self) -> &str {
        "tiered"
    }

    fn compact(&self, history: &[Message]) -> Option<Vec<Message>> {
        self.tiers.iter().find_map(|tier| tier.compact(history))
    }
}

/// Proposes one given history: how a recorded compaction is taken again
/// when a trace is rebuilt, and a summary once the model wrote it, through
/// the same transition.
pub(crate) struct Recorded<'a> {
    pub(crate) name: &'a str,
    pub(crate) history: &'a [Message],
}

impl<'a> Recorded<'a> {
    /// Proposes `history`, under `name`.
    pub(crate) fn new(name: &'a str, history: &'a [Message]) -> Self {
        Self { name, history }
    }
}

impl Compactor for Recorded<'_> {
    fn name(&self) -> &str {
        self.name
    }

    fn compact(&self, _history: &[Message]) -> Option<Vec<Message>> {
        Some(self.history.to_vec())
    }
}

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
        let (first, keep_from, drop) = older_rounds(history, self.keep_rounds)?;
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

/// The rounds of `history` (a round is a reply and the user messages
/// after it) before its last `keep`: where the question ends (the first
/// reply), where the kept rounds start, and how many rounds come before
/// them; `None` when none may go. The round that holds the current
/// question (a follow-up asked after an answer) always stays.
fn older_rounds(history: &[Message], keep: usize) -> Option<(usize, usize, usize)> {
    let starts: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, message)| message.role == Role::Assistant)
        .map(|(index, _)| index)
        .collect();
    let first = *starts.first()?;
    let question_at = current_question(history)?;
    // Rounds that start before the current question; the last of them
    // holds it.
    let before = starts.iter().filter(|start| **start < question_at).count();
    let droppable = if before == 0 {
        starts.len()
    } else {
        before - 1
    };
    let older = starts.len().saturating_sub(keep).min(droppable);
    if older == 0 {
        return None;
    }
    Some((first, *starts.get(older)?, older))
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
