//! Repair: a history made sendable again, in its own format, with every
//! change listed.
//!
//! One plan serves every format ([`plan`]): each call is given the result
//! that answers it — the one in the next message, else one further on
//! (moved back), else one on an entry off the resume chain (brought back
//! onto it), else a new one marked as an error ([`INTERRUPTED`]); the
//! results of a reply go right after it, in call order; a result that
//! answers no call, or a call already answered, is dropped; a call asked
//! twice in one reply is asked once; an empty id gets one. Then each
//! format applies the plan to its own text, editing only what the plan
//! changes: every other message, line and field is written back as it
//! was, byte for byte ([`super::json`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use thiserror::Error;

use super::claude_code::Session;
use super::json;
use super::{Answer, Finding, Format, History, ReadError, Speaker, Turn};

/// The text of the result a repair gives a call that has none.
pub const INTERRUPTED: &str = "interrupted: no result was recorded";

/// What a repair changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChangeKind {
    /// A call without a result got one, marked as an error:
    /// [`INTERRUPTED`].
    AddedResult,
    /// A result was moved to right after its call, or into call order.
    MovedResult,
    /// A result held by an entry off the chain a resume follows was
    /// brought back onto it, right after its call.
    BroughtBack,
    /// A result for a call no earlier reply asked for was dropped.
    DroppedOrphan,
    /// A second result for a call, or a call asked twice in one reply,
    /// was dropped.
    DroppedDuplicate,
    /// A call with an empty id was given one.
    NamedCall,
    /// (Claude Code) an entry whose parent was lost was linked to the
    /// entry before it, so the conversation before it is on the chain.
    Relinked,
    /// (Claude Code) the chain's last entry was moved to the end of the
    /// file, where a resume starts.
    MovedToEnd,
}

impl ChangeKind {
    /// Its name, as in `--json` (`added_result`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AddedResult => "added_result",
            Self::MovedResult => "moved_result",
            Self::BroughtBack => "brought_back",
            Self::DroppedOrphan => "dropped_orphan",
            Self::DroppedDuplicate => "dropped_duplicate",
            Self::NamedCall => "named_call",
            Self::Relinked => "relinked",
            Self::MovedToEnd => "moved_to_end",
        }
    }
}

impl std::fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One change a repair made, placed in the original file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Change {
    /// What changed.
    pub kind: ChangeKind,
    /// The message (turn) it is about, in the original's numbering.
    pub message: usize,
    /// The original file's line, for formats with one entry per line.
    pub line: Option<usize>,
    /// The call id it is about.
    pub id: String,
    /// What was done, in words.
    pub detail: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}, ")?;
        }
        write!(f, "message {}: {}", self.message, self.detail)
    }
}

/// A history repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Repaired {
    /// The format it was read and written in.
    pub format: Format,
    /// The repaired history, in that format.
    pub text: String,
    /// Every change, in the original's order.
    pub changes: Vec<Change>,
    /// What the check still finds in `text` (none when the repair made it
    /// hold).
    pub remaining: Vec<Finding>,
}

/// Why a history could not be repaired.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RepairError {
    /// It could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A message or line the plan edits is not of the shape its reader
    /// saw (the file changed under it, or a reader and the writer differ).
    #[error("could not rewrite {0}")]
    Rewrite(String),
}

/// Repairs `text`, read as `format` (or the format it is, when `None`):
/// the same format, made to hold [`pairing`](super::pairing), every
/// change listed. The text of every message is kept; only results that
/// answer nothing, second results and calls asked twice in one reply are
/// dropped. A Claude Code session's chain is mended too: an entry whose
/// parent was lost is relinked to the entry before it, a later line that
/// repeats a uuid the chain needs is dropped, and the chain's last entry
/// goes to the end of the file (a resume starts there). `text` itself is
/// not touched: the caller writes [`Repaired::text`] where it likes.
pub fn repair(text: &str, format: Option<Format>) -> Result<Repaired, RepairError> {
    let format = format.or_else(|| History::sniff(text));
    // Each format's repair, and what the check still finds in it.
    let found = |out: &str, format| -> Result<Vec<Finding>, RepairError> {
        Ok(History::read(out, Some(format))?.check())
    };
    let (format, out, changes, remaining) = match format {
        Some(Format::ClaudeCode) => {
            let (out, changes, remaining) = claude_code_repair(text)?;
            (Format::ClaudeCode, out, changes, remaining)
        }
        Some(Format::Codex) => {
            let history = super::codex::read(std::io::Cursor::new(text))?;
            let plan = plan(&history.turns, &[]);
            let out = unchanged(text, &plan)
                .or_else(|| codex(text, &history.turns, &plan).map(|(out, _)| out))
                .ok_or_else(|| RepairError::Rewrite("the rollout's lines".to_owned()))?;
            let remaining = found(&out, Format::Codex)?;
            (Format::Codex, out, plan.changes, remaining)
        }
        other => {
            let history = super::raw::read(text, other)?;
            let plan = plan(&history.turns, &[]);
            let out = unchanged(text, &plan)
                .or_else(|| raw(text, history.format, &history.turns, &plan))
                .ok_or_else(|| RepairError::Rewrite("the messages".to_owned()))?;
            let remaining = found(&out, history.format)?;
            (history.format, out, plan.changes, remaining)
        }
    };
    Ok(Repaired {
        format,
        text: out,
        changes,
        remaining,
    })
}

/// `text` itself, when the plan changes nothing.
fn unchanged(text: &str, plan: &Plan) -> Option<String> {
    plan.changes.is_empty().then(|| text.to_owned())
}

/// Where a result is: the `j`th of turn `t`, or the `f`th found off the
/// chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Turn(usize, usize),
    Floating(usize),
}

/// A result as the repaired history has it, after its call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placed {
    /// One the history holds.
    Found(Source),
    /// One the repair adds, for the call of this id.
    Missing(String),
}

/// What a repair does, whatever the format.
#[derive(Debug, Default)]
struct Plan {
    /// Per turn: for a reply with calls, their results in call order.
    results: Vec<Vec<Placed>>,
    /// Calls dropped, asked a second time in their reply: (turn, call).
    dropped_calls: HashSet<(usize, usize)>,
    /// Calls given an id: (turn, call) to the id.
    named: HashMap<(usize, usize), String>,
    /// Each result kept: the turn whose call it answers.
    claimed: HashMap<Source, usize>,
    changes: Vec<Change>,
}

/// The plan that makes `turns` hold, with `floating` results (off the
/// chain) to bring back for calls the chain does not answer.
fn plan(turns: &[Turn], floating: &[Answer]) -> Plan {
    let mut plan = Plan {
        results: vec![Vec::new(); turns.len()],
        ..Plan::default()
    };
    let taken: HashSet<&str> = turns
        .iter()
        .flat_map(|turn| turn.calls.iter().map(|call| call.id.as_str()))
        .collect();
    // Each call kept: its result, once found.
    let mut slots: BTreeMap<(usize, usize), Option<Source>> = BTreeMap::new();
    let mut ids: HashMap<(usize, usize), String> = HashMap::new();
    // The calls not answered yet, by id, in the order asked.
    let mut open: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
    let mut asked: HashSet<String> = HashSet::new();
    let change = |kind, message, line, id: &str, detail: String| Change {
        kind,
        message,
        line,
        id: id.to_owned(),
        detail,
    };
    for (t, turn) in turns.iter().enumerate() {
        match turn.speaker {
            Speaker::Assistant => {
                let mut in_reply = HashSet::new();
                for (k, call) in turn.calls.iter().enumerate() {
                    let line = call.line.or(turn.line);
                    let id = if call.id.is_empty() {
                        let mut id = format!("repaired-{}-{k}", turn.message);
                        while taken.contains(id.as_str()) {
                            id.push('x');
                        }
                        plan.changes.push(change(
                            ChangeKind::NamedCall,
                            turn.message,
                            line,
                            &id,
                            format!("a call of {} had an empty id: it is now {id}", call.name),
                        ));
                        plan.named.insert((t, k), id.clone());
                        id
                    } else {
                        call.id.clone()
                    };
                    if !in_reply.insert(id.clone()) {
                        plan.changes.push(change(
                            ChangeKind::DroppedDuplicate,
                            turn.message,
                            line,
                            &id,
                            format!(
                                "the call {id} was asked twice in this reply: the second is dropped"
                            ),
                        ));
                        plan.dropped_calls.insert((t, k));
                        continue;
                    }
                    slots.insert((t, k), None);
                    ids.insert((t, k), id.clone());
                    open.entry(id.clone()).or_default().push((t, k));
                    asked.insert(id);
                }
            }
            Speaker::User => {
                for (j, answer) in turn.results.iter().enumerate() {
                    let line = answer.line.or(turn.line);
                    let id = answer.id.as_str();
                    // The call it answers: the one right before, else the
                    // latest open one of that id.
                    let call = open.get_mut(id).and_then(|list| {
                        let at = list
                            .iter()
                            .position(|(at, _)| at + 1 == t)
                            .or_else(|| list.len().checked_sub(1))?;
                        Some(list.remove(at))
                    });
                    match call {
                        Some((at, k)) => {
                            slots.insert((at, k), Some(Source::Turn(t, j)));
                            plan.claimed.insert(Source::Turn(t, j), at);
                            if at + 1 != t {
                                let to = turns.get(at).map_or(0, |turn| turn.message);
                                plan.changes.push(change(
                                    ChangeKind::MovedResult,
                                    answer.message,
                                    line,
                                    id,
                                    format!("the result for {id} was moved to right after its call (message {to})"),
                                ));
                            }
                        }
                        None if asked.contains(id) => plan.changes.push(change(
                            ChangeKind::DroppedDuplicate,
                            answer.message,
                            line,
                            id,
                            format!("a second result for {id} was dropped"),
                        )),
                        None => plan.changes.push(change(
                            ChangeKind::DroppedOrphan,
                            answer.message,
                            line,
                            id,
                            format!(
                                "a result for {id}, which no earlier reply asked for, was dropped"
                            ),
                        )),
                    }
                }
            }
        }
    }
    for (f, answer) in floating.iter().enumerate() {
        let id = answer.id.as_str();
        let Some((at, k)) = open.get_mut(id).and_then(Vec::pop) else {
            continue;
        };
        slots.insert((at, k), Some(Source::Floating(f)));
        plan.claimed.insert(Source::Floating(f), at);
        let message = turns.get(at).map_or(0, |turn| turn.message);
        plan.changes.push(change(
            ChangeKind::BroughtBack,
            message,
            answer.line,
            id,
            format!(
                "the result for {id}, on an entry off the chain, was brought back onto it after its call"
            ),
        ));
    }
    for ((t, k), slot) in slots {
        let id = ids.get(&(t, k)).cloned().unwrap_or_default();
        let placed = match slot {
            Some(source) => Placed::Found(source),
            None => {
                let (message, line, name) = turns.get(t).map_or((0, None, ""), |turn| {
                    let call = turn.calls.get(k);
                    (
                        turn.message,
                        call.and_then(|call| call.line).or(turn.line),
                        call.map_or("", |call| call.name.as_str()),
                    )
                });
                plan.changes.push(change(
                    ChangeKind::AddedResult,
                    message,
                    line,
                    &id,
                    format!(
                        "the call {id} ({name}) had no result: one marked as an error was added after it (\"{INTERRUPTED}\")"
                    ),
                ));
                Placed::Missing(id)
            }
        };
        if let Some(results) = plan.results.get_mut(t) {
            results.push(placed);
        }
    }
    // Results of the next message out of call order.
    for (t, placed) in plan.results.iter().enumerate() {
        let order: Vec<usize> = placed
            .iter()
            .filter_map(|placed| match placed {
                Placed::Found(Source::Turn(u, j)) if *u == t + 1 => Some(*j),
                _ => None,
            })
            .collect();
        if order.windows(2).any(|pair| pair.first() > pair.get(1))
            && let Some(next) = turns.get(t + 1)
        {
            {
                plan.changes.push(change(
                    ChangeKind::MovedResult,
                    next.message,
                    next.line,
                    "",
                    "the results were put in the order of their calls".to_owned(),
                ));
            }
        }
    }
    plan.changes
        .sort_by_key(|change| (change.line, change.message));
    plan
}

impl Plan {
    /// Whether turn `t`'s results are the next turn's, all of them, in
    /// order, none added: nothing to move.
    fn in_place(&self, turns: &[Turn], t: usize) -> bool {
        let Some(placed) = self.results.get(t) else {
            return true;
        };
        let next = turns.get(t + 1).map_or(0, |turn| turn.results.len());
        placed.len() == next
            && placed
                .iter()
                .enumerate()
                .all(|(i, placed)| *placed == Placed::Found(Source::Turn(t + 1, i)))
    }

    /// The call's edit: dropped (`None`) or its id, renamed or not.
    fn call_id(&self, t: usize, k: usize) -> Option<Option<&str>> {
        if self.dropped_calls.contains(&(t, k)) {
            return None;
        }
        Some(self.named.get(&(t, k)).map(String::as_str))
    }
}

// ---------------------------------------------------------------------
// Raw histories: a Messages API or Chat Completions body, or its array.

/// The messages of a raw history as written, and how to put them back.
fn raw(text: &str, format: Format, turns: &[Turn], plan: &Plan) -> Option<String> {
    let trimmed = text.trim();
    let body = trimmed.starts_with('{');
    let list = if body {
        json::member(trimmed, "messages")?.0
    } else {
        trimmed
    };
    let messages = json::elements(list)?;
    let out = match format {
        Format::OpenAi => openai(&messages, turns, plan)?,
        _ => anthropic(&messages, turns, plan)?,
    };
    let array = json::array_like(list, &out);
    let start = text.len() - text.trim_start().len();
    let end = start + trimmed.len();
    let rebuilt = if body {
        json::replace(trimmed, "messages", &array)?
    } else {
        array
    };
    Some(format!(
        "{}{rebuilt}{}",
        text.get(..start)?,
        text.get(end..)?
    ))
}

/// The content blocks of a Messages API message, as written (a string
/// content is one text block).
fn blocks(message: &str) -> Option<Vec<Cow<'_, str>>> {
    let (content, _) = json::member(message, "content")?;
    if content.starts_with('"') {
        return Some(vec![Cow::Owned(format!(
            r#"{{"type":"text","text":{content}}}"#
        ))]);
    }
    Some(
        json::elements(content)?
            .into_iter()
            .map(Cow::Borrowed)
            .collect(),
    )
}

/// A `tool_result` block marked as an error, for the call `id`.
fn interrupted_block(id: &str) -> String {
    format!(
        r#"{{"type":"tool_result","tool_use_id":{},"content":{},"is_error":true}}"#,
        json::string(id),
        json::string(INTERRUPTED)
    )
}

/// The blocks of a reply with its calls edited by the plan (`None` when
/// none is).
fn edited_calls<'a>(
    blocks: &[Cow<'a, str>],
    turn: &Turn,
    t: usize,
    plan: &Plan,
    id_key: &str,
    line: Option<usize>,
) -> Option<Option<Vec<Cow<'a, str>>>> {
    let edits: Vec<(usize, Option<Option<&str>>)> = turn
        .calls
        .iter()
        .enumerate()
        .filter(|(_, call)| call.line == line)
        .map(|(k, call)| (call.block, plan.call_id(t, k)))
        .filter(|(_, edit)| *edit != Some(None))
        .collect();
    if edits.is_empty() {
        return Some(None);
    }
    let mut out = Vec::with_capacity(blocks.len());
    for (index, block) in blocks.iter().enumerate() {
        match edits
            .iter()
            .find(|(at, _)| *at == index)
            .map(|(_, edit)| *edit)
        {
            None => out.push(block.clone()),
            Some(None) => {}
            Some(Some(Some(id))) => {
                out.push(Cow::Owned(json::replace(block, id_key, &json::string(id))?));
            }
            Some(Some(None)) => out.push(block.clone()),
        }
    }
    Some(Some(out))
}

fn anthropic<'a>(messages: &[&'a str], turns: &[Turn], plan: &Plan) -> Option<Vec<Cow<'a, str>>> {
    let result_block = |source: Source| -> Option<Cow<'a, str>> {
        let Source::Turn(t, j) = source else {
            return None;
        };
        let answer = turns.get(t)?.results.get(j)?;
        blocks(messages.get(answer.message)?)?
            .into_iter()
            .nth(answer.block)
    };
    // The blocks of message `m` that are no result (the reader says which
    // are).
    let others = |m: usize| -> Option<Vec<Cow<'a, str>>> {
        let results: HashSet<usize> = turns
            .get(m)?
            .results
            .iter()
            .map(|answer| answer.block)
            .collect();
        Some(
            blocks(messages.get(m)?)?
                .into_iter()
                .enumerate()
                .filter(|(at, _)| !results.contains(at))
                .map(|(_, block)| block)
                .collect(),
        )
    };
    let mut out: Vec<Cow<'a, str>> = Vec::with_capacity(messages.len() + 1);
    let mut consumed = HashSet::new();
    for (m, raw) in messages.iter().copied().enumerate() {
        if consumed.contains(&m) {
            continue;
        }
        let turn = turns.get(m)?;
        match turn.speaker {
            Speaker::Assistant => {
                match edited_calls(&blocks(raw)?, turn, m, plan, "id", None)? {
                    None => out.push(Cow::Borrowed(raw)),
                    Some(edited) => {
                        out.push(Cow::Owned(json::replace(
                            raw,
                            "content",
                            &json::array(&edited),
                        )?));
                    }
                }
                let placed = plan.results.get(m)?;
                if placed.is_empty() {
                    continue;
                }
                if plan.in_place(turns, m) {
                    continue; // the next message is kept as it is
                }
                let mut content = Vec::new();
                for placed in placed {
                    content.push(match placed {
                        Placed::Found(source) => result_block(*source)?,
                        Placed::Missing(id) => Cow::Owned(interrupted_block(id)),
                    });
                }
                let next = turns
                    .get(m + 1)
                    .filter(|next| next.speaker == Speaker::User)
                    .and_then(|_| messages.get(m + 1).copied());
                match next {
                    Some(next) => {
                        consumed.insert(m + 1);
                        content.extend(others(m + 1)?);
                        out.push(Cow::Owned(json::replace(
                            next,
                            "content",
                            &json::array(&content),
                        )?));
                    }
                    None => out.push(Cow::Owned(format!(
                        r#"{{"role":"user","content":{}}}"#,
                        json::array(&content)
                    ))),
                }
            }
            Speaker::User => {
                let kept_in_place = m
                    .checked_sub(1)
                    .is_some_and(|previous| plan.in_place(turns, previous));
                if turn.results.is_empty() || kept_in_place {
                    out.push(Cow::Borrowed(raw));
                    continue;
                }
                // Its results went after their calls, or were dropped.
                let others = others(m)?;
                if !others.is_empty() {
                    out.push(Cow::Owned(json::replace(
                        raw,
                        "content",
                        &json::array(&others),
                    )?));
                }
            }
        }
    }
    Some(out)
}

fn openai<'a>(messages: &[&'a str], turns: &[Turn], plan: &Plan) -> Option<Vec<Cow<'a, str>>> {
    let replies: HashMap<usize, usize> = turns
        .iter()
        .enumerate()
        .filter(|(_, turn)| turn.speaker == Speaker::Assistant)
        .map(|(t, turn)| (turn.message, t))
        .collect();
    // The `tool` messages: every result the reader found is one.
    let tools: HashSet<usize> = turns
        .iter()
        .flat_map(|turn| turn.results.iter().map(|answer| answer.message))
        .collect();
    let mut out: Vec<Cow<'a, str>> = Vec::with_capacity(messages.len() + 1);
    for (m, raw) in messages.iter().copied().enumerate() {
        match replies.get(&m) {
            // Each goes after the call it answers, or is dropped.
            _ if tools.contains(&m) => continue,
            Some(&t) => {
                let turn = turns.get(t)?;
                match json::member(raw, "tool_calls") {
                    Some((calls, _)) if calls.starts_with('[') => {
                        let calls: Vec<Cow<'a, str>> = json::elements(calls)?
                            .into_iter()
                            .map(Cow::Borrowed)
                            .collect();
                        match edited_calls(&calls, turn, t, plan, "id", None)? {
                            None => out.push(Cow::Borrowed(raw)),
                            Some(edited) => out.push(Cow::Owned(json::replace(
                                raw,
                                "tool_calls",
                                &json::array(&edited),
                            )?)),
                        }
                    }
                    _ => out.push(Cow::Borrowed(raw)),
                }
                for placed in plan.results.get(t)? {
                    out.push(match placed {
                        Placed::Found(Source::Turn(u, j)) => {
                            let answer = turns.get(*u)?.results.get(*j)?;
                            Cow::Borrowed(*messages.get(answer.message)?)
                        }
                        Placed::Found(Source::Floating(_)) => return None,
                        Placed::Missing(id) => Cow::Owned(format!(
                            r#"{{"role":"tool","tool_call_id":{},"content":{}}}"#,
                            json::string(id),
                            json::string(INTERRUPTED)
                        )),
                    });
                }
            }
            None => out.push(Cow::Borrowed(raw)),
        }
    }
    Some(out)
}

// ---------------------------------------------------------------------
// JSON Lines: the text's lines, edited, dropped and added to.

/// The lines of `text` with their ends; line `n` (from 1) is at `n - 1`.
fn lines_of(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// Writes `lines` (line `n` at `n - 1`) without the `skip`ped ones, each
/// `edit`ed one replaced, and the `after` ones added after their line;
/// with, for each line written, the line of `lines` it comes from (`None`
/// for one added).
fn write_lines(
    lines: &[&str],
    skip: &HashSet<usize>,
    edit: &HashMap<usize, String>,
    after: &BTreeMap<usize, Vec<String>>,
) -> (String, Vec<Option<usize>>) {
    let mut origins = Vec::with_capacity(lines.len());
    let mut out = String::with_capacity(lines.iter().map(|line| line.len()).sum::<usize>() + 256);
    let put = |out: &mut String, line: &str| {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(line);
    };
    for (index, line) in lines.iter().enumerate() {
        let number = index + 1;
        if !skip.contains(&number) {
            origins.push(Some(number));
            match edit.get(&number) {
                Some(edited) => {
                    put(&mut out, edited);
                    // The line's own end (`\r\n` stays `\r\n`).
                    if !edited.ends_with('\n') {
                        let body = line.trim_end_matches(['\n', '\r']);
                        out.push_str(line.get(body.len()..).unwrap_or_default());
                    }
                }
                None => put(&mut out, line),
            }
        }
        for added in after.get(&number).into_iter().flatten() {
            origins.push(None);
            put(&mut out, added);
            if !added.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    (out, origins)
}

/// A line's value as JSON, when it is one.
fn value(line: &str) -> Option<serde_json::Value> {
    serde_json::from_str(line).ok()
}

fn codex(text: &str, turns: &[Turn], plan: &Plan) -> Option<(String, Vec<Option<usize>>)> {
    let lines = lines_of(text);
    let line = |n: usize| lines.get(n.checked_sub(1)?).copied();
    // A `compacted` line's replacement history is left as it is.
    let frozen = |n: usize| {
        line(n).and_then(value).is_some_and(|value| {
            value.get("type").and_then(|kind| kind.as_str()) == Some("compacted")
        })
    };
    let mut skip = HashSet::new();
    let mut edit = HashMap::new();
    let mut after: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (t, turn) in turns.iter().enumerate() {
        for (k, call) in turn.calls.iter().enumerate() {
            let Some(n) = call.line.filter(|n| !frozen(*n)) else {
                continue;
            };
            match plan.call_id(t, k) {
                None => {
                    skip.insert(n);
                }
                Some(Some(id)) => {
                    let raw = line(n)?;
                    let body = raw.trim_end();
                    let (payload, _) = json::member(body, "payload")?;
                    let payload = json::replace(payload, "call_id", &json::string(id))?;
                    edit.insert(n, json::replace(body, "payload", &payload)?);
                }
                Some(None) => {}
            }
        }
        for (j, answer) in turn.results.iter().enumerate() {
            let Some(n) = answer.line.filter(|n| !frozen(*n)) else {
                continue;
            };
            if !plan.claimed.contains_key(&Source::Turn(t, j)) {
                skip.insert(n);
            }
        }
    }
    for (t, placed) in plan.results.iter().enumerate() {
        let Some(turn) = turns.get(t) else { continue };
        let Some(mut anchor) = turn.last_line else {
            continue;
        };
        let in_order = {
            let mut last = 0;
            placed.iter().all(|placed| match placed {
                Placed::Found(Source::Turn(u, j)) => {
                    let n = turns
                        .get(*u)
                        .and_then(|turn| turn.results.get(*j))
                        .and_then(|answer| answer.line)
                        .unwrap_or(0);
                    let ok = *u == t + 1 && n > last;
                    last = n;
                    ok
                }
                Placed::Found(Source::Floating(_)) => false,
                Placed::Missing(_) => true,
            })
        };
        let timestamp = line(anchor)
            .and_then(|raw| json::member(raw.trim_end(), "timestamp").map(|(ts, _)| ts.to_owned()));
        for placed in placed {
            match placed {
                Placed::Found(Source::Turn(u, j)) => {
                    let n = turns.get(*u)?.results.get(*j)?.line?;
                    if in_order {
                        anchor = n;
                    } else if !frozen(n) {
                        skip.insert(n);
                        after.entry(anchor).or_default().push(line(n)?.to_owned());
                    }
                }
                Placed::Found(Source::Floating(_)) => return None,
                Placed::Missing(id) => {
                    let kind = turn
                        .calls
                        .iter()
                        .find(|call| call.id == *id)
                        .and_then(|call| call.line)
                        .and_then(line)
                        .and_then(value)
                        .and_then(|value| {
                            value
                                .pointer("/payload/type")
                                .and_then(|kind| kind.as_str())
                                .map(str::to_owned)
                        });
                    let output = if kind.as_deref() == Some("custom_tool_call") {
                        "custom_tool_call_output"
                    } else {
                        "function_call_output"
                    };
                    let stamp = timestamp
                        .as_deref()
                        .map(|ts| format!(r#""timestamp":{ts},"#))
                        .unwrap_or_default();
                    after.entry(anchor).or_default().push(format!(
                        r#"{{{stamp}"type":"response_item","payload":{{"type":"{output}","call_id":{},"output":{}}}}}"#,
                        json::string(id),
                        json::string(INTERRUPTED)
                    ));
                }
            }
        }
    }
    Some(write_lines(&lines, &skip, &edit, &after))
}

// ---------------------------------------------------------------------
// Claude Code: the resume chain rebuilt, then relinked by `parentUuid`.

/// Repairs a Claude Code session: relinks a chain cut off by a lost line
/// to the conversation before it, then applies the plan; again (at most
/// three passes) while what it wrote still breaks a rule (dropping a
/// chain's last entries makes another entry the one a resume starts
/// from). Every change is placed in `text`'s lines.
fn claude_code_repair(text: &str) -> Result<(String, Vec<Change>, Vec<Finding>), RepairError> {
    let mut changes = Vec::new();
    let mut remaining = Vec::new();
    let mut current = text.to_owned();
    // Where each line of `current` comes from in `text`.
    let mut origin: Vec<Option<usize>> = (1..=current.lines().count()).map(Some).collect();
    let place = |origin: &[Option<usize>], line: usize| -> Option<usize> {
        origin.get(line.checked_sub(1)?).copied().flatten()
    };
    for _ in 0..3 {
        // Each relink moves the chain's start further back, and reads the
        // session again: a bounded number of them (a chain cut in more
        // places stays broken, and says so).
        for _ in 0..RELINKS {
            let (_, session) =
                super::claude_code::session(std::io::Cursor::new(current.as_str()), false)?;
            let Some((root, before)) = session.lost else {
                break;
            };
            let (Some(entry), Some(earlier)) =
                (session.entries.get(root), session.entries.get(before))
            else {
                break;
            };
            let lines = lines_of(&current);
            let line_of = |entry: &super::claude_code::Entry| -> Option<&str> {
                Some(
                    lines
                        .get(entry.line.checked_sub(1)?)?
                        .trim_end_matches(['\n', '\r']),
                )
            };
            let uuid = json::member(line_of(earlier).ok_or_else(rewrite)?, "uuid")
                .map(|(uuid, _)| uuid.to_owned())
                .ok_or_else(rewrite)?;
            let edited = json::replace(line_of(entry).ok_or_else(rewrite)?, "parentUuid", &uuid)
                .ok_or_else(rewrite)?;
            changes.push(Change {
                kind: ChangeKind::Relinked,
                message: 0,
                line: place(&origin, entry.line),
                id: String::new(),
                detail: format!(
                    "the parent of this entry was lost: it now follows the entry on line {}, so the conversation before it is on the chain again",
                    place(&origin, earlier.line).unwrap_or(earlier.line)
                ),
            });
            let mut edit = HashMap::new();
            edit.insert(entry.line, edited);
            current = write_lines(&lines, &HashSet::new(), &edit, &BTreeMap::new()).0;
        }
        let (history, session) =
            super::claude_code::session(std::io::Cursor::new(current.as_str()), true)?;
        let floating = floating(&session);
        let plan = plan(&history.turns, &floating.answers);
        if plan.changes.is_empty() {
            remaining = history.check();
            break;
        }
        let (out, more, origins) =
            claude_code(&current, &history.turns, &session, &floating, &plan)
                .ok_or_else(rewrite)?;
        for mut change in plan.changes.into_iter().chain(more) {
            change.line = change.line.and_then(|line| place(&origin, line));
            changes.push(change);
        }
        origin = origins
            .into_iter()
            .map(|from| from.and_then(|line| place(&origin, line)))
            .collect();
        current = out;
        remaining = match History::read(&current, Some(Format::ClaudeCode)) {
            Ok(history) => history.check(),
            // Every entry dropped (each held only results that answered
            // nothing): an empty session, which breaks no rule.
            Err(_) if !has_entry(&current) => Vec::new(),
            Err(err) => return Err(err.into()),
        };
        if remaining.is_empty() {
            break;
        }
    }
    changes.sort_by_key(|change| (change.line, change.message));
    Ok((current, changes, remaining))
}

/// Whether a line of `text` is an entry of a session (it has a `uuid`).
fn has_entry(text: &str) -> bool {
    text.lines().any(|line| {
        value(line).is_some_and(|value| value.get("uuid").is_some_and(serde_json::Value::is_string))
    })
}

/// How many lost lines a repair relinks past.
const RELINKS: usize = 64;

fn rewrite() -> RepairError {
    RepairError::Rewrite("the session's entries".to_owned())
}

/// Results held by entries off the chain (not side chains): what a
/// repair may bring back.
struct Floating {
    answers: Vec<Answer>,
    /// Each one's entry and block.
    at: Vec<(usize, usize)>,
}

fn floating(session: &Session) -> Floating {
    let mut answers = Vec::new();
    let mut at = Vec::new();
    for (index, entry) in session.entries.iter().enumerate() {
        if entry.sidechain || session.on_chain.get(index).copied().unwrap_or(true) {
            continue;
        }
        for (id, block) in entry.results() {
            answers.push(Answer {
                line: Some(entry.line),
                block: *block,
                ..Answer::new(id.clone(), 0)
            });
            at.push((index, *block));
        }
    }
    Floating { answers, at }
}

/// One entry of the repaired chain.
enum Unit {
    /// An entry of the session, with the blocks it loses and the calls it
    /// renames.
    Entry {
        index: usize,
        drop: Vec<usize>,
        rename: Vec<(usize, String)>,
    },
    /// A new entry: a result block (`interrupted`: one the repair made).
    New { block: String, interrupted: bool },
}

/// A uuid for the `n`th entry a repair adds, not one of `taken` (keys).
fn new_uuid(seed: &str, n: usize, taken: &HashSet<u128>) -> String {
    let mut salt = 0u64;
    loop {
        let hash = |key: u64| {
            let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ key;
            for byte in seed
                .bytes()
                .chain(n.to_le_bytes())
                .chain(salt.to_le_bytes())
            {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
            hash
        };
        let (high, low) = (hash(1), hash(2));
        let uuid = format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0xfff,
            0x8000 | ((low >> 48) & 0x3fff),
            low & 0xffff_ffff_ffff
        );
        if !taken.contains(&super::claude_code::key(&uuid)) {
            return uuid;
        }
        salt += 1;
    }
}

fn claude_code(
    text: &str,
    turns: &[Turn],
    session: &Session,
    floating: &Floating,
    plan: &Plan,
) -> Option<(String, Vec<Change>, Vec<Option<usize>>)> {
    let lines = lines_of(text);
    let raw_line = |entry: usize| -> Option<&str> {
        let line = session.entries.get(entry)?.line;
        Some(
            lines
                .get(line.checked_sub(1)?)?
                .trim_end_matches(['\n', '\r']),
        )
    };
    let by_line: HashMap<usize, usize> = session
        .entries
        .iter()
        .enumerate()
        .map(|(index, entry)| (entry.line, index))
        .collect();
    let locate = |source: Source| -> Option<(usize, usize)> {
        match source {
            Source::Turn(t, j) => {
                let answer = turns.get(t)?.results.get(j)?;
                Some((*by_line.get(&answer.line?)?, answer.block))
            }
            Source::Floating(f) => floating.at.get(f).copied(),
        }
    };
    let content_of = |entry: usize| -> Option<Vec<&str>> {
        let (message, _) = json::member(raw_line(entry)?, "message")?;
        json::elements(json::member(message, "content")?.0)
    };
    // The chain's entries of each turn.
    let mut of_turn: Vec<Vec<usize>> = vec![Vec::new(); turns.len()];
    for (&index, &t) in session.chain.iter().zip(&session.turn_of) {
        if t != usize::MAX {
            of_turn.get_mut(t)?.push(index);
        }
    }
    // Whether entry `index` goes whole into turn `t`'s results: each of
    // its results answers a call of `t`, in a row, in the entry's order.
    let whole = |index: usize, t: usize| -> bool {
        let Some(entry) = session.entries.get(index) else {
            return false;
        };
        let positions: Option<Vec<usize>> = entry
            .results()
            .iter()
            .map(|(_, block)| {
                plan.results.get(t)?.iter().position(|placed| {
                    matches!(placed, Placed::Found(source) if locate(*source) == Some((index, *block)))
                })
            })
            .collect();
        positions.is_some_and(|positions| {
            !positions.is_empty()
                && positions
                    .windows(2)
                    .all(|pair| pair.get(1).copied() == pair.first().map(|p| p + 1))
        })
    };
    let result_blocks = |index: usize| -> Vec<usize> {
        session
            .entries
            .get(index)
            .map(|entry| entry.results().iter().map(|(_, block)| *block).collect())
            .unwrap_or_default()
    };
    let mut chain: Vec<Unit> = Vec::new();
    let mut placed_entries: HashSet<usize> = HashSet::new();
    let mut keep_next = false;
    for (t, turn) in turns.iter().enumerate() {
        let entries = of_turn.get(t)?;
        match turn.speaker {
            Speaker::Assistant => {
                keep_next = false;
                for &index in entries {
                    let line = session.entries.get(index)?.line;
                    let mut drop = Vec::new();
                    let mut rename = Vec::new();
                    for (k, call) in turn.calls.iter().enumerate() {
                        if call.line != Some(line) {
                            continue;
                        }
                        match plan.call_id(t, k) {
                            None => drop.push(call.block),
                            Some(Some(id)) => rename.push((call.block, id.to_owned())),
                            Some(None) => {}
                        }
                    }
                    let blocks = content_of(index).map_or(0, |blocks| blocks.len());
                    if !drop.is_empty() && drop.len() >= blocks {
                        continue; // nothing of it is left
                    }
                    placed_entries.insert(index);
                    chain.push(Unit::Entry {
                        index,
                        drop,
                        rename,
                    });
                }
                let placed = plan.results.get(t)?;
                if placed.is_empty() {
                    continue;
                }
                if plan.in_place(turns, t) {
                    keep_next = true;
                    continue;
                }
                for placed in placed {
                    match placed {
                        Placed::Found(source) => {
                            let (index, block) = locate(*source)?;
                            if whole(index, t) {
                                if placed_entries.insert(index) {
                                    chain.push(Unit::Entry {
                                        index,
                                        drop: Vec::new(),
                                        rename: Vec::new(),
                                    });
                                }
                            } else {
                                let block = content_of(index)?.get(block)?.to_string();
                                chain.push(Unit::New {
                                    block,
                                    interrupted: false,
                                });
                            }
                        }
                        Placed::Missing(id) => chain.push(Unit::New {
                            block: interrupted_block(id),
                            interrupted: true,
                        }),
                    }
                }
            }
            Speaker::User => {
                let keep = std::mem::take(&mut keep_next);
                for &index in entries {
                    if placed_entries.contains(&index) {
                        continue;
                    }
                    let results = result_blocks(index);
                    if keep || results.is_empty() {
                        placed_entries.insert(index);
                        chain.push(Unit::Entry {
                            index,
                            drop: Vec::new(),
                            rename: Vec::new(),
                        });
                        continue;
                    }
                    // Its results are after their calls, or dropped.
                    let blocks = content_of(index).map_or(0, |blocks| blocks.len());
                    if results.len() < blocks {
                        placed_entries.insert(index);
                        chain.push(Unit::Entry {
                            index,
                            drop: results,
                            rename: Vec::new(),
                        });
                    }
                }
            }
        }
    }
    // An entry of the chain whose `uuid` a later line repeats would be
    // hidden by it (a `parentUuid` names the last entry of its `uuid`):
    // the later lines go (a line written twice, or edited apart).
    let mut changes = Vec::new();
    let mut last_of: HashMap<u128, usize> = HashMap::new();
    for (index, entry) in session.entries.iter().enumerate() {
        last_of.insert(entry.key, index);
    }
    let mut hidden: HashSet<usize> = HashSet::new();
    for unit in &chain {
        let Unit::Entry { index, .. } = unit else {
            continue;
        };
        let Some(entry) = session.entries.get(*index) else {
            continue;
        };
        if last_of.get(&entry.key) == Some(index) {
            continue;
        }
        for (later, other) in session.entries.iter().enumerate().skip(index + 1) {
            if other.key == entry.key && !placed_entries.contains(&later) && hidden.insert(later) {
                changes.push(Change {
                    kind: ChangeKind::DroppedDuplicate,
                    message: session
                        .turn_of
                        .get(session.chain.iter().position(|at| at == index).unwrap_or(usize::MAX))
                        .copied()
                        .unwrap_or(0),
                    line: Some(other.line),
                    id: String::new(),
                    detail: format!(
                        "line {} repeats the uuid of the entry on line {}, which it would hide from the chain: dropped",
                        other.line, entry.line
                    ),
                });
            }
        }
    }
    // Relink: each entry's parent is the one before it.
    let taken: HashSet<u128> = session.entries.iter().map(|entry| entry.key).collect();
    let mut uuids = Vec::with_capacity(chain.len());
    for (n, unit) in chain.iter().enumerate() {
        uuids.push(match unit {
            Unit::Entry { index, .. } => {
                let (uuid, _) = json::member(raw_line(*index)?, "uuid")?;
                serde_json::from_str(uuid).ok()?
            }
            Unit::New { block, .. } => new_uuid(block, n, &taken),
        });
    }
    let mut skip: HashSet<usize> = session
        .chain
        .iter()
        .filter(|index| !placed_entries.contains(index))
        .chain(hidden.iter())
        .filter_map(|index| session.entries.get(*index).map(|entry| entry.line))
        .collect();
    let mut edit: HashMap<usize, String> = HashMap::new();
    let mut after: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut anchor: Option<usize> = None; // the entry a new one follows
    // The chain's first entry's parent (JSON), for the first entry kept
    // when those before it were dropped.
    let root = session.chain.first().copied();
    let root_parent = root.and_then(|root| {
        json::member(raw_line(root)?, "parentUuid").map(|(raw, _)| raw.to_owned())
    });
    for (n, unit) in chain.iter().enumerate() {
        // The parent each entry must name, as JSON: the one before it; the
        // first keeps its own, or takes the dropped root's.
        let parent: Option<String> = match n.checked_sub(1) {
            Some(previous) => uuids.get(previous).map(|uuid| json::string(uuid)),
            None => match unit {
                Unit::Entry { index, .. } if Some(*index) != root => root_parent.clone(),
                _ => None,
            },
        };
        match unit {
            Unit::Entry {
                index,
                drop,
                rename,
            } => {
                anchor = Some(*index);
                let entry = session.entries.get(*index)?;
                let mut line = Cow::Borrowed(raw_line(*index)?);
                if !drop.is_empty() || !rename.is_empty() {
                    let (message, _) = json::member(&line, "message")?;
                    let mut content: Vec<Cow<'_, str>> = Vec::new();
                    for (position, block) in content_of(*index)?.into_iter().enumerate() {
                        if drop.contains(&position) {
                            continue;
                        }
                        match rename.iter().find(|(at, _)| *at == position) {
                            Some((_, id)) => {
                                content.push(Cow::Owned(json::replace(
                                    block,
                                    "id",
                                    &json::string(id),
                                )?));
                            }
                            None => content.push(Cow::Borrowed(block)),
                        }
                    }
                    let message = json::replace(message, "content", &json::array(&content))?;
                    line = Cow::Owned(json::replace(&line, "message", &message)?);
                }
                let named = |raw: &str| {
                    serde_json::from_str::<String>(raw)
                        .map_or(super::claude_code::NO_PARENT, |uuid| {
                            super::claude_code::key(&uuid)
                        })
                };
                if let Some(parent) = parent.filter(|parent| entry.parent != named(parent)) {
                    line = Cow::Owned(match json::replace(&line, "parentUuid", &parent) {
                        Some(line) => line,
                        None => format!("{{\"parentUuid\":{parent},{}", line.strip_prefix('{')?),
                    });
                }
                if let Cow::Owned(line) = line {
                    edit.insert(entry.line, line);
                    skip.remove(&entry.line);
                }
            }
            Unit::New { block, interrupted } => {
                let template = raw_line(anchor?)?;
                let mut fields = String::new();
                for key in [
                    "userType",
                    "cwd",
                    "sessionId",
                    "version",
                    "gitBranch",
                    "timestamp",
                ] {
                    if let Some((value, _)) = json::member(template, key) {
                        fields.push_str(&format!("{}:{value},", json::string(key)));
                    }
                }
                let parent = parent.unwrap_or_else(|| "null".to_owned());
                let result = if *interrupted {
                    format!(
                        ",\"toolUseResult\":{}",
                        json::string(&format!("Error: {INTERRUPTED}"))
                    )
                } else {
                    String::new()
                };
                let line = session.entries.get(anchor?)?.line;
                after.entry(line).or_default().push(format!(
                    r#"{{"parentUuid":{parent},"isSidechain":false,{fields}"type":"user","message":{{"role":"user","content":[{block}]}},"uuid":{}{result}}}"#,
                    json::string(uuids.get(n)?)
                ));
            }
        }
    }
    // A resume starts from the file's last entry of the conversation: the
    // chain's last must be it. When a later line would be, the chain's
    // last goes to the end of the file.
    let last_line = session
        .entries
        .iter()
        .filter(|entry| !entry.sidechain && entry.speaker.is_some() && !skip.contains(&entry.line))
        .map(|entry| entry.line)
        .max();
    let mut moved: Option<(Option<usize>, String)> = None;
    match chain.last() {
        Some(Unit::Entry { index, .. }) => {
            let entry = session.entries.get(*index)?;
            if last_line.is_some_and(|last| last > entry.line) {
                let text = match edit.remove(&entry.line) {
                    Some(edited) => edited,
                    None => raw_line(*index)?.to_owned(),
                };
                skip.insert(entry.line);
                moved = Some((Some(entry.line), text));
            }
        }
        Some(Unit::New { .. }) => {
            let at = session.entries.get(anchor?)?.line;
            if last_line.is_some_and(|last| last > at) {
                let text = after.get_mut(&at)?.pop()?;
                moved = Some((None, text));
            }
        }
        None => {}
    }
    let (mut out, mut origins) = write_lines(&lines, &skip, &edit, &after);
    if let Some((from, text)) = moved {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&text);
        out.push('\n');
        origins.push(from);
        if let Some(line) = from {
            changes.push(Change {
                kind: ChangeKind::MovedToEnd,
                message: 0,
                line: Some(line),
                id: String::new(),
                detail: format!(
                    "the entry on line {line}, the chain's last, was moved to the end of the file, where a resume starts"
                ),
            });
        }
    }
    Some((out, changes, origins))
}
