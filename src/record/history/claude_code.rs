//! Claude Code sessions: JSON Lines of entries (`user`, `assistant`,
//! `system`, `summary`, and others) threaded by `uuid` and `parentUuid`.
//! A resume follows the chain from the last entry back to its root (a
//! compaction's boundary has no parent: the chain starts after it); that
//! chain is the history the next request sends. One API message may be
//! split over several `assistant` entries sharing `message.id` (a block
//! each), and parallel results over several `user` entries: consecutive
//! entries of one speaker are one turn, as they are sent.

use std::collections::HashMap;
use std::io::BufRead;

use serde_json::Value;

use super::{Answer, Call, Finding, Format, History, ReadError, Rule, Speaker, Turn};

/// One entry of the session, as much of it as the rules (and a repair)
/// need, small: a session has an entry per line, and only the chain's
/// ancestry (known at the end) says which matter. Ids are kept as 128-bit
/// keys ([`key`]); calls and results, which few entries hold, apart.
pub(super) struct Entry {
    /// Its `uuid`.
    pub(super) key: u128,
    /// Its `parentUuid` ([`NO_PARENT`]: none).
    pub(super) parent: u128,
    /// Its line, from 1.
    pub(super) line: usize,
    /// A hash of its `message.id` (0: none).
    message_id: u64,
    /// Its calls, results and links, when it has any.
    extra: Option<Box<Extra>>,
    pub(super) speaker: Option<Speaker>,
    pub(super) sidechain: bool,
    boundary: bool,
    /// Its `message.stop_reason`: an index into [`STOP_REASONS`] plus
    /// one (0: none, or one this reader does not know).
    stop: u8,
}

/// What few entries hold.
#[derive(Default)]
struct Extra {
    /// Its calls: id, name, block index.
    calls: Vec<(String, String, usize)>,
    /// Its results: the id answered, block index.
    results: Vec<(String, usize)>,
    /// Its `agentId` (every entry of a subagent's file has one).
    agent: Option<String>,
    /// The subagents its results name: (call id, agent id).
    links: Vec<(String, String)>,
}

/// The stop reasons an entry is read with.
const STOP_REASONS: [&str; 7] = [
    "tool_use",
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
];

/// The key of an entry without a parent.
pub(super) const NO_PARENT: u128 = 0;

/// The key of a `uuid`: its 128 bits when it is one, else a 128-bit hash
/// of the text (ids are compared by key).
pub(super) fn key(uuid: &str) -> u128 {
    let bytes = uuid.as_bytes();
    if bytes.len() == 36 {
        let mut value: u128 = 0;
        let mut digits = 0;
        for (at, byte) in bytes.iter().enumerate() {
            if matches!(at, 8 | 13 | 18 | 23) {
                if *byte != b'-' {
                    break;
                }
                continue;
            }
            let Some(digit) = (*byte as char).to_digit(16) else {
                break;
            };
            value = (value << 4) | u128::from(digit);
            digits += 1;
        }
        if digits == 32 && value != NO_PARENT {
            return value;
        }
    }
    let hash = |salt: u8| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut hasher);
        uuid.hash(&mut hasher);
        hasher.finish()
    };
    (u128::from(hash(1)) << 64) | u128::from(hash(2)) | 1
}

impl Entry {
    /// Its results: the id answered, block index.
    pub(super) fn results(&self) -> &[(String, usize)] {
        self.extra.as_ref().map_or(&[], |extra| &extra.results)
    }

    fn agent(&self) -> Option<&str> {
        self.extra.as_ref()?.agent.as_deref()
    }

    fn links(&self) -> &[(String, String)] {
        self.extra.as_ref().map_or(&[], |extra| &extra.links)
    }
}

/// A session read: its entries, and the chain a resume follows.
pub(super) struct Session {
    pub(super) entries: Vec<Entry>,
    /// The chain, as indices into `entries`, root first.
    pub(super) chain: Vec<usize>,
    /// For each entry, whether it is on the chain.
    pub(super) on_chain: Vec<bool>,
    /// The turn of each chain entry, in chain order (an index into the
    /// history's turns; `usize::MAX` for an entry that is no message).
    pub(super) turn_of: Vec<usize>,
    /// When the chain's first entry names a parent the file does not hold
    /// (a lost line) while conversation entries come before it: that
    /// entry, and the last of those (indices into `entries`).
    pub(super) lost: Option<(usize, usize)>,
}

/// Whether `text` reads as a Claude Code session: one of its first 20
/// lines is a JSON object with a `type` and a `uuid`, `parentUuid` or
/// `sessionId` (a session may begin with snapshot or summary lines).
pub(super) fn looks_like(text: &str) -> bool {
    super::any_head_line(text, |value| {
        value.get("type").is_some_and(Value::is_string)
            && ["uuid", "parentUuid", "sessionId"]
                .iter()
                .any(|key| value.get(*key).is_some())
    })
}

fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The entry of line `line`, or `None` for a line that is no entry with
/// a `uuid` (a `summary`, a snapshot, a queue operation, a type this
/// reader does not know: kept out, not an error).
fn entry(value: &Value, line: usize) -> Option<Entry> {
    let uuid = key(text(value, "uuid")?);
    let kind = text(value, "type").unwrap_or_default();
    let message = value.get("message");
    let speaker = match (kind, message.and_then(|m| text(m, "role"))) {
        ("user", _) | (_, Some("user")) if message.is_some() => Some(Speaker::User),
        ("assistant", _) | (_, Some("assistant")) if message.is_some() => Some(Speaker::Assistant),
        _ => None,
    };
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut links = Vec::new();
    if let Some(Value::Array(blocks)) = message.and_then(|m| m.get("content")) {
        for (position, block) in blocks.iter().enumerate() {
            match text(block, "type") {
                Some("tool_use") => calls.push((
                    text(block, "id").unwrap_or_default().to_owned(),
                    text(block, "name").unwrap_or_default().to_owned(),
                    position,
                )),
                Some("tool_result") => {
                    let id = text(block, "tool_use_id").unwrap_or_default().to_owned();
                    let named = value
                        .get("toolUseResult")
                        .and_then(|result| text(result, "agentId"))
                        .map(str::to_owned)
                        .or_else(|| agent_named(block.get("content")?));
                    if let Some(agent) = named {
                        links.push((id.clone(), agent));
                    }
                    results.push((id, position));
                }
                _ => {}
            }
        }
    }
    let agent = text(value, "agentId").map(str::to_owned);
    let extra = (!calls.is_empty() || !results.is_empty() || agent.is_some()).then(|| {
        Box::new(Extra {
            calls,
            results,
            agent,
            links,
        })
    });
    Some(Entry {
        key: uuid,
        parent: text(value, "parentUuid").map_or(NO_PARENT, key),
        line,
        message_id: message
            .and_then(|m| text(m, "id"))
            .map_or(0, |id| (key(id) as u64) | 1),
        extra,
        speaker,
        sidechain: value.get("isSidechain").and_then(Value::as_bool) == Some(true),
        boundary: kind == "system" && text(value, "subtype") == Some("compact_boundary"),
        stop: message
            .and_then(|m| text(m, "stop_reason"))
            .and_then(|stop| STOP_REASONS.iter().position(|known| *known == stop))
            .and_then(|at| u8::try_from(at + 1).ok())
            .unwrap_or(0),
    })
}

/// The subagent a `Task` result's content names (`agentId: ID`, as
/// Claude Code ends the result of a subagent's run).
fn agent_named(content: &Value) -> Option<String> {
    let named = |text: &str| {
        let (_, after) = text.split_once("agentId: ")?;
        let id: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '@' | '.'))
            .collect();
        (!id.is_empty()).then_some(id)
    };
    match content {
        Value::String(text) => named(text),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .find_map(named),
        _ => None,
    }
}

/// Reads a session from `reader`, line by line.
pub(super) fn read(reader: impl BufRead) -> Result<History, ReadError> {
    session(reader, false).map(|(history, _)| history)
}

/// Reads a session from `reader`, line by line: the history, and the
/// session it was read from; with `keep`, the chain's entries keep their
/// calls and results (a repair needs them; a check moves them into the
/// turns).
pub(super) fn session(reader: impl BufRead, keep: bool) -> Result<(History, Session), ReadError> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut by_uuid: HashMap<u128, usize> = HashMap::new();
    let mut any_line = false;
    for (index, line) in reader.lines().enumerate() {
        let number = index + 1;
        let line = line.map_err(|err| ReadError::NotAHistory {
            format: "claude-code",
            reason: format!("line {number}: {err}"),
        })?;
        if line.trim().is_empty() {
            continue;
        }
        any_line = true;
        // A line cut short (a session killed while writing) or not JSON:
        // not an entry; the chain is followed without it.
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(entry) = entry(&value, number) {
            by_uuid.insert(entry.key, entries.len());
            entries.push(entry);
        }
    }
    if !any_line || entries.is_empty() {
        return Err(ReadError::NotAHistory {
            format: "claude-code",
            reason: "no entry with a `uuid`".to_owned(),
        });
    }
    // A subagent's own file is one side chain: read as a conversation.
    if entries.iter().all(|entry| entry.sidechain) {
        for entry in &mut entries {
            entry.sidechain = false;
        }
    }
    let agent = entries
        .iter()
        .find_map(|entry| entry.agent().map(str::to_owned));
    // The chain a resume follows: from the last entry of the conversation
    // (not a side chain), back through its parents.
    let leaf = entries
        .iter()
        .rposition(|entry| !entry.sidechain && (entry.speaker.is_some() || entry.boundary));
    let mut on_chain = vec![false; entries.len()];
    let mut chain = Vec::new();
    let mut at = leaf;
    while let Some(index) = at {
        let Some(flag) = on_chain.get_mut(index) else {
            break;
        };
        if *flag {
            break; // a cycle: stop where it closes
        }
        *flag = true;
        chain.push(index);
        at = entries
            .get(index)
            .filter(|entry| entry.parent != NO_PARENT)
            .and_then(|entry| by_uuid.get(&entry.parent))
            .copied();
    }
    chain.reverse();
    // A chain cut off by a lost line: its first entry's parent is not in
    // the file, and the conversation before it is left out.
    // So is a chain that closes on itself: its first entry's parent is on
    // it already (a cycle).
    let lost = chain.first().and_then(|&root| {
        let entry = entries.get(root)?;
        let parent = by_uuid.get(&entry.parent);
        let cut = parent.is_none_or(|&at| on_chain.get(at).copied().unwrap_or(false));
        if entry.parent == NO_PARENT || entry.boundary || !cut {
            return None;
        }
        // The last entry of the conversation before it that a
        // `parentUuid` would find (another uuid, not repeated later).
        let before = entries
            .get(..root)?
            .iter()
            .enumerate()
            .rposition(|(at, earlier)| {
                !earlier.sidechain
                    && earlier.speaker.is_some()
                    && earlier.key != entry.key
                    && !on_chain.get(at).copied().unwrap_or(true)
                    && by_uuid.get(&earlier.key) == Some(&at)
            })?;
        Some((root, before))
    });
    let compactions = entries.iter().filter(|entry| entry.boundary).count();
    let mut turns: Vec<Turn> = Vec::new();
    let mut turn_of = Vec::with_capacity(chain.len());
    let mut last_message_id = 0u64;
    for &index in &chain {
        let Some(entry) = entries.get_mut(index) else {
            continue;
        };
        let Some(speaker) = entry.speaker else {
            turn_of.push(usize::MAX);
            continue;
        };
        let same_turn = match (turns.last(), speaker) {
            (Some(turn), Speaker::User) => turn.speaker == Speaker::User,
            (Some(turn), Speaker::Assistant) => {
                turn.speaker == Speaker::Assistant
                    && entry.message_id != 0
                    && entry.message_id == last_message_id
            }
            (None, _) => false,
        };
        if !same_turn {
            let mut turn = Turn::new(speaker, turns.len());
            turn.line = Some(entry.line);
            turns.push(turn);
        }
        last_message_id = entry.message_id;
        let message = turns.len().saturating_sub(1);
        turn_of.push(message);
        let line = entry.line;
        let (calls, results) = match entry.extra.take() {
            Some(extra) if keep => {
                let both = (extra.calls.clone(), extra.results.clone());
                entry.extra = Some(extra);
                both
            }
            // Moved into the turn; what else it holds stays (a chain
            // entry's calls and results are not read again).
            Some(mut extra) => {
                let both = (
                    std::mem::take(&mut extra.calls),
                    std::mem::take(&mut extra.results),
                );
                if extra.agent.is_some() || !extra.links.is_empty() {
                    entry.extra = Some(extra);
                }
                both
            }
            None => (Vec::new(), Vec::new()),
        };
        let stop = entry.stop;
        if let Some(turn) = turns.last_mut() {
            turn.last_line = Some(line);
            if let Some(known) = usize::from(stop)
                .checked_sub(1)
                .and_then(|at| STOP_REASONS.get(at))
            {
                turn.stop_reason = Some((*known).to_owned());
            }
            turn.calls
                .extend(calls.into_iter().map(|(id, name, block)| Call {
                    line: Some(line),
                    block,
                    ..Call::new(id, name)
                }));
            turn.results
                .extend(results.into_iter().map(|(id, block)| Answer {
                    line: Some(line),
                    block,
                    ..Answer::new(id, message)
                }));
        }
    }
    // Results the chain left out: an entry off it (not a side chain) that
    // answers a call on it.
    let asked: HashMap<&str, usize> = turns
        .iter()
        .flat_map(|turn| {
            turn.calls
                .iter()
                .map(move |call| (call.id.as_str(), turn.message))
        })
        .collect();
    let answered: std::collections::HashSet<&str> = turns
        .iter()
        .flat_map(|turn| turn.results.iter().map(|answer| answer.id.as_str()))
        .collect();
    let mut off_chain = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        if entry.sidechain || on_chain.get(index).copied().unwrap_or(true) {
            continue;
        }
        for (id, _) in entry.results() {
            if answered.contains(id.as_str()) {
                continue; // an abandoned branch's copy: the chain has its own
            }
            if let Some(message) = asked.get(id.as_str()) {
                off_chain.push(Finding {
                    rule: Rule::ResultOffChain,
                    message: *message,
                    line: Some(entry.line),
                    id: Some(id.clone()),
                    detail: format!(
                        "the result for {id} is on line {}, an entry off the chain a resume follows (its parent is not on it): the call in message {message} gets no result",
                        entry.line
                    ),
                });
            }
        }
    }
    let children = chain
        .iter()
        .filter_map(|index| entries.get(*index))
        .flat_map(|entry| entry.links().iter())
        .map(|(call, agent)| super::ChildLink {
            call: call.clone(),
            agent: agent.clone(),
        })
        .collect();
    if let Some(entry) = lost.and_then(|(root, _)| entries.get(root)) {
        let root = chain.first().copied().unwrap_or(0);
        let left = entries.get(..root).map_or(0, |before| {
            before
                .iter()
                .enumerate()
                .filter(|(at, earlier)| {
                    !earlier.sidechain
                        && earlier.speaker.is_some()
                        && !on_chain.get(*at).copied().unwrap_or(true)
                })
                .count()
        });
        let why = if by_uuid.contains_key(&entry.parent) {
            "is an entry after it on the chain (a cycle)"
        } else {
            "is not in the file (a lost line)"
        };
        off_chain.push(Finding {
            rule: Rule::LostParent,
            message: 0,
            line: Some(entry.line),
            id: None,
            detail: format!(
                "the parent of the entry on line {} {why}: the chain a resume follows starts there, and the {left} entries of the conversation before it are left out",
                entry.line
            ),
        });
    }
    let history = History {
        format: Format::ClaudeCode,
        turns,
        off_chain,
        compactions,
        agent,
        children,
    };
    Ok((
        history,
        Session {
            entries,
            chain,
            on_chain,
            turn_of,
            lost,
        },
    ))
}
