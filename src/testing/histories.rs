//! Generated histories of every format `record::history` reads — sound, or
//! broken by one mutation — for other projects' tests of their own
//! readers, checkers and repairs.
//!
//! A history is generated once in the abstract (a prompt; rounds of a
//! reply with 1–3 parallel calls, their results, and sometimes the user's
//! words; an answer), mutated there, then written in the format asked
//! for. Each [`GeneratedHistory`] says where its breach is, so a test can
//! ask that a checker reports it there:
//!
//! ```
//! use proptest::prelude::*;
//! use subloop::record::history::{History, repair};
//! use subloop::testing::{broken_history, every_format};
//!
//! proptest!(|(generated in every_format().prop_flat_map(broken_history))| {
//!     let breach = generated.breach.clone().expect("broken");
//!     let found = History::read(&generated.text, Some(generated.format)).unwrap().check();
//!     prop_assert!(found.iter().any(|finding| breach.is(finding)), "{breach:?} not in {found:?}");
//!     prop_assert!(repair(&generated.text, Some(generated.format)).unwrap().remaining.is_empty());
//! });
//! ```

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::record::history::{Finding, Format, Rule};

/// What was done to a sound history to break it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mutation {
    /// A result removed: its call has none.
    DropResult,
    /// A result written twice.
    DuplicateResult,
    /// Two results of one reply swapped.
    SwapResults,
    /// A result moved into the next message of results.
    MoveResultLate,
    /// A result for a call no reply asked for added.
    OrphanResult,
    /// The history cut right after a reply with calls (interrupted at the
    /// end).
    CutAtCall,
    /// (Claude Code) a result's entry re-parented off the resume chain.
    OffChain,
}

/// Where a generated history breaks, as a checker should report it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Breach {
    /// The mutation.
    pub mutation: Mutation,
    /// The rule it breaks.
    pub rule: Rule,
    /// The call id it is about (`None` for results out of order).
    pub id: Option<String>,
    /// The line, for the JSON Lines formats.
    pub line: Option<usize>,
    /// The message index, for request histories (where a JSON Lines
    /// format has lines, its findings count turns, and this is `None`).
    pub message: Option<usize>,
}

impl Breach {
    /// Whether `finding` reports this breach: its rule, id and place.
    pub fn is(&self, finding: &Finding) -> bool {
        finding.rule == self.rule
            && finding.id == self.id
            && self.line.is_none_or(|line| finding.line == Some(line))
            && self
                .message
                .is_none_or(|message| finding.message == message)
    }
}

/// A generated history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GeneratedHistory {
    /// Its format.
    pub format: Format,
    /// The file's text.
    pub text: String,
    /// Where it breaks; `None`: it holds.
    pub breach: Option<Breach>,
    /// Every text the user and the model wrote in it, results included:
    /// what a repair must keep.
    pub texts: Vec<String>,
}

/// Every format, one at a time.
pub fn every_format() -> impl Strategy<Value = Format> {
    prop_oneof![
        Just(Format::Anthropic),
        Just(Format::OpenAi),
        Just(Format::ClaudeCode),
        Just(Format::Codex),
    ]
}

/// One message of the abstract history.
#[derive(Debug, Clone)]
enum Said {
    User {
        text: Option<String>,
        results: Vec<(String, String)>,
    },
    Assistant {
        text: Option<String>,
        calls: Vec<(String, String)>,
    },
}

fn words() -> impl Strategy<Value = String> {
    "[a-z]{1,8}( [a-z]{1,8}){0,4}"
}

/// A sound abstract history: a prompt, rounds, an answer.
fn said() -> impl Strategy<Value = Vec<Said>> {
    let round = (
        prop::option::of(words()),
        prop::collection::vec(
            (
                prop_oneof![Just("read_file"), Just("Bash"), Just("mcp__notes__search")],
                words(),
            ),
            1..4,
        ),
        prop::option::weighted(0.3, words()),
    );
    (words(), prop::collection::vec(round, 1..5), words()).prop_map(|(prompt, rounds, answer)| {
        let mut said = vec![Said::User {
            text: Some(prompt),
            results: Vec::new(),
        }];
        let mut n = 0;
        for (text, calls, after) in rounds {
            let mut asked = Vec::new();
            let mut results = Vec::new();
            for (name, result) in calls {
                n += 1;
                let id = format!("call_{n:03}");
                asked.push((id.clone(), name.to_owned()));
                results.push((id, result));
            }
            said.push(Said::Assistant { text, calls: asked });
            said.push(Said::User {
                text: after,
                results,
            });
        }
        said.push(Said::Assistant {
            text: Some(answer),
            calls: Vec::new(),
        });
        said
    })
}

/// A sound history of `format`.
pub fn sound_history(format: Format) -> impl Strategy<Value = GeneratedHistory> {
    said().prop_map(move |said| {
        let rendered = render(&said, format, None);
        GeneratedHistory {
            format,
            text: rendered.text,
            breach: None,
            texts: texts(&said),
        }
    })
}

/// A history of `format` broken by one mutation (for Claude Code, also
/// [`Mutation::OffChain`]), with where it breaks.
pub fn broken_history(format: Format) -> impl Strategy<Value = GeneratedHistory> {
    let mut mutations = vec![
        Mutation::DropResult,
        Mutation::DuplicateResult,
        Mutation::SwapResults,
        Mutation::MoveResultLate,
        Mutation::OrphanResult,
        Mutation::CutAtCall,
    ];
    if format == Format::ClaudeCode {
        mutations.push(Mutation::OffChain);
    }
    let mutations = prop::sample::select(mutations);
    (said(), mutations, any::<prop::sample::Index>()).prop_filter_map(
        "the mutation needs what the history lacks",
        move |(said, mutation, pick)| mutate(said, mutation, pick, format),
    )
}

/// The places of the abstract history's results: (message, result).
fn result_places(said: &[Said]) -> Vec<(usize, usize)> {
    said.iter()
        .enumerate()
        .flat_map(|(m, said)| match said {
            Said::User { results, .. } => (0..results.len()).map(|r| (m, r)).collect(),
            Said::Assistant { .. } => Vec::new(),
        })
        .collect()
}

fn results_mut(said: &mut [Said], m: usize) -> Option<&mut Vec<(String, String)>> {
    match said.get_mut(m)? {
        Said::User { results, .. } => Some(results),
        Said::Assistant { .. } => None,
    }
}

/// What a mutation is applied to and reported at.
enum Target {
    /// The `n`th result of the message (counted after the mutation).
    Result(usize, usize),
    /// The call of this id.
    Call(String),
    /// The message of results.
    Message(usize),
}

fn mutate(
    mut said: Vec<Said>,
    mutation: Mutation,
    pick: prop::sample::Index,
    format: Format,
) -> Option<GeneratedHistory> {
    let texts_before = texts(&said);
    let places = result_places(&said);
    let (m, r) = *pick.get(&places);
    let mut off_chain = None;
    let (rule, id, target) = match mutation {
        Mutation::DropResult => {
            let (id, _) = results_mut(&mut said, m)?.remove(r);
            (Rule::CallWithoutResult, Some(id.clone()), Target::Call(id))
        }
        Mutation::DuplicateResult => {
            let results = results_mut(&mut said, m)?;
            let copy = results.get(r)?.clone();
            results.insert(r + 1, copy.clone());
            (Rule::DuplicateId, Some(copy.0), Target::Result(m, r + 1))
        }
        Mutation::SwapResults => {
            let results = results_mut(&mut said, m)?;
            if results.len() < 2 {
                return None;
            }
            let other = if r + 1 < results.len() { r + 1 } else { r - 1 };
            results.swap(r, other);
            (Rule::ResultsOutOfOrder, None, Target::Message(m))
        }
        Mutation::MoveResultLate => {
            let later = places.iter().find(|(at, _)| *at > m)?.0;
            // A message left empty would join two replies into one turn
            // in the JSON Lines formats: another breach.
            let left = match said.get(m)? {
                Said::User { text, results } => text.is_some() || results.len() > 1,
                Said::Assistant { .. } => false,
            };
            if !left {
                return None;
            }
            let moved = results_mut(&mut said, m)?.remove(r);
            let results = results_mut(&mut said, later)?;
            results.push(moved.clone());
            let at = results.len() - 1;
            (
                Rule::ResultNotNext,
                Some(moved.0),
                Target::Result(later, at),
            )
        }
        Mutation::OrphanResult => {
            let results = results_mut(&mut said, m)?;
            results.push(("call_orphan".to_owned(), "stray".to_owned()));
            let at = results.len() - 1;
            (
                Rule::ResultWithoutCall,
                Some("call_orphan".to_owned()),
                Target::Result(m, at),
            )
        }
        Mutation::CutAtCall => {
            said.truncate(m);
            let first = match said.last()? {
                Said::Assistant { calls, .. } => calls.first()?.0.clone(),
                Said::User { .. } => return None,
            };
            (
                Rule::CallWithoutResult,
                Some(first.clone()),
                Target::Call(first),
            )
        }
        Mutation::OffChain => {
            if format != Format::ClaudeCode || r == 0 {
                return None;
            }
            off_chain = Some((m, r));
            let id = match said.get(m)? {
                Said::User { results, .. } => results.get(r)?.0.clone(),
                Said::Assistant { .. } => return None,
            };
            (Rule::ResultOffChain, Some(id), Target::Result(m, r))
        }
    };
    let rendered = render(&said, format, off_chain);
    let (message, line) = match target {
        Target::Call(id) => rendered
            .calls
            .iter()
            .find(|(call, _, _)| *call == id)
            .map(|(_, m, l)| (*m, *l))?,
        Target::Result(m, r) => rendered.results.get(&(m, r)).copied()?,
        Target::Message(m) => rendered.messages.get(m).copied()?,
    };
    let lines = matches!(format, Format::ClaudeCode | Format::Codex);
    // What the mutation removed is not asked of a repair.
    let kept = texts(&said);
    Some(GeneratedHistory {
        format,
        text: rendered.text,
        breach: Some(Breach {
            mutation,
            rule,
            id,
            line: if lines { line } else { None },
            message: if lines { None } else { Some(message) },
        }),
        texts: texts_before
            .into_iter()
            .filter(|text| kept.contains(text))
            .collect(),
    })
}

/// Sets `key` of the object `value`.
fn put(value: &mut Value, key: &str, field: Value) {
    if let Some(object) = value.as_object_mut() {
        object.insert(key.to_owned(), field);
    }
}

fn texts(said: &[Said]) -> Vec<String> {
    let mut out = Vec::new();
    for said in said {
        match said {
            Said::User { text, results } => {
                out.extend(text.iter().cloned());
                out.extend(results.iter().map(|(_, result)| result.clone()));
            }
            Said::Assistant { text, .. } => out.extend(text.iter().cloned()),
        }
    }
    out
}

/// A history written out, with where each part went: (message index in
/// the file's own list, line).
struct Rendered {
    text: String,
    calls: Vec<(String, usize, Option<usize>)>,
    results: std::collections::HashMap<(usize, usize), (usize, Option<usize>)>,
    /// Each abstract message's (first) place.
    messages: Vec<(usize, Option<usize>)>,
}

fn render(said: &[Said], format: Format, off_chain: Option<(usize, usize)>) -> Rendered {
    let mut rendered = Rendered {
        text: String::new(),
        calls: Vec::new(),
        results: std::collections::HashMap::new(),
        messages: Vec::new(),
    };
    match format {
        Format::OpenAi => openai(said, &mut rendered),
        Format::ClaudeCode => claude_code(said, off_chain, &mut rendered),
        Format::Codex => codex(said, &mut rendered),
        _ => anthropic(said, &mut rendered),
    }
    rendered
}

fn anthropic(said: &[Said], out: &mut Rendered) {
    let mut messages = Vec::new();
    for (m, said) in said.iter().enumerate() {
        out.messages.push((m, None));
        match said {
            Said::User { text, results } => {
                let mut content: Vec<Value> = Vec::new();
                for (r, (id, result)) in results.iter().enumerate() {
                    out.results.insert((m, r), (m, None));
                    content
                        .push(json!({"type": "tool_result", "tool_use_id": id, "content": result}));
                }
                if let Some(text) = text {
                    content.push(json!({"type": "text", "text": text}));
                }
                messages.push(json!({"role": "user", "content": content}));
            }
            Said::Assistant { text, calls } => {
                let mut content: Vec<Value> = Vec::new();
                if let Some(text) = text {
                    content.push(json!({"type": "text", "text": text}));
                }
                for (id, name) in calls {
                    out.calls.push((id.clone(), m, None));
                    content.push(json!({"type": "tool_use", "id": id, "name": name, "input": {"path": "a.txt"}}));
                }
                messages.push(json!({"role": "assistant", "content": content}));
            }
        }
    }
    out.text =
        json!({"model": "claude-test", "max_tokens": 1024, "messages": messages}).to_string();
}

fn openai(said: &[Said], out: &mut Rendered) {
    let mut messages = vec![json!({"role": "system", "content": "You read files."})];
    for (m, said) in said.iter().enumerate() {
        out.messages.push((messages.len(), None));
        match said {
            Said::User { text, results } => {
                for (r, (id, result)) in results.iter().enumerate() {
                    out.results.insert((m, r), (messages.len(), None));
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                }
                if let Some(text) = text {
                    messages.push(json!({"role": "user", "content": text}));
                }
            }
            Said::Assistant { text, calls } => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    for (id, _) in calls {
                        out.calls.push((id.clone(), messages.len(), None));
                    }
                    let listed: Vec<Value> = calls
                        .iter()
                        .map(|(id, name)| {
                            json!({"id": id, "type": "function",
                            "function": {"name": name, "arguments": "{}"}})
                        })
                        .collect();
                    put(&mut message, "tool_calls", Value::Array(listed));
                }
                messages.push(message);
            }
        }
    }
    out.text = Value::Array(messages).to_string();
}

fn claude_code(said: &[Said], off_chain: Option<(usize, usize)>, out: &mut Rendered) {
    let mut lines: Vec<Value> = Vec::new();
    let mut parent: Option<String> = None;
    let entry = |kind: &str, uuid: &str, parent: &Option<String>, message: Value| {
        json!({"parentUuid": parent, "isSidechain": false, "userType": "external",
               "cwd": "/home/user/project", "sessionId": "generated", "version": "2.1.0",
               "type": kind, "message": message, "uuid": uuid,
               "timestamp": "2026-12-01T10:00:00.000Z"})
    };
    // The entry a re-parented result's successor takes as its parent.
    let mut skip_to: Option<Option<String>> = None;
    let mut reply_end: Option<String> = None;
    for (m, said) in said.iter().enumerate() {
        out.messages.push((m, Some(lines.len() + 1)));
        match said {
            Said::User { text, results } => {
                for (r, (id, result)) in results.iter().enumerate() {
                    let uuid = format!("r-{m}-{r}");
                    out.results.insert((m, r), (m, Some(lines.len() + 1)));
                    let mut line = entry(
                        "user",
                        &uuid,
                        &parent,
                        json!({"role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": id, "content": result}]}),
                    );
                    put(&mut line, "toolUseResult", json!({"stdout": result}));
                    if off_chain == Some((m, r)) {
                        // Off the chain: a sibling of the result before it.
                        put(&mut line, "parentUuid", json!(reply_end));
                        skip_to = Some(parent.clone());
                        lines.push(line);
                        continue;
                    }
                    if let Some(previous) = skip_to.take() {
                        put(&mut line, "parentUuid", json!(previous));
                    }
                    lines.push(line);
                    parent = Some(uuid);
                }
                if let Some(text) = text {
                    let uuid = format!("u-{m}");
                    let mut line = entry(
                        "user",
                        &uuid,
                        &parent,
                        json!({"role": "user", "content": text}),
                    );
                    if let Some(previous) = skip_to.take() {
                        put(&mut line, "parentUuid", json!(previous));
                    }
                    lines.push(line);
                    parent = Some(uuid);
                }
            }
            Said::Assistant { text, calls } => {
                let mut blocks: Vec<Value> = Vec::new();
                if let Some(text) = text {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for (id, name) in calls {
                    out.calls
                        .push((id.clone(), m, Some(lines.len() + blocks.len() + 1)));
                    blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
                }
                for (b, block) in blocks.into_iter().enumerate() {
                    let uuid = format!("a-{m}-{b}");
                    let mut line = entry(
                        "assistant",
                        &uuid,
                        &parent,
                        json!({"id": format!("msg_{m}"),
                        "type": "message", "role": "assistant", "model": "claude-test",
                        "content": [block], "stop_reason": null}),
                    );
                    if let Some(previous) = skip_to.take() {
                        put(&mut line, "parentUuid", json!(previous));
                    }
                    lines.push(line);
                    parent = Some(uuid);
                }
                reply_end = parent.clone();
            }
        }
    }
    out.text = lines.iter().map(|line| format!("{line}\n")).collect();
}

fn codex(said: &[Said], out: &mut Rendered) {
    let item = |payload: Value| json!({"timestamp": "2026-12-01T10:00:00.000Z", "type": "response_item", "payload": payload});
    let mut lines = vec![
        json!({"timestamp": "t", "type": "session_meta", "payload": {"id": "generated", "cwd": "/home/user/project"}}),
        json!({"timestamp": "t", "type": "turn_context", "payload": {"model": "gpt-test"}}),
    ];
    for (m, said) in said.iter().enumerate() {
        out.messages.push((m, Some(lines.len() + 1)));
        match said {
            Said::User { text, results } => {
                for (r, (id, result)) in results.iter().enumerate() {
                    out.results.insert((m, r), (m, Some(lines.len() + 1)));
                    lines.push(item(
                        json!({"type": "function_call_output", "call_id": id, "output": result}),
                    ));
                }
                if let Some(text) = text {
                    lines.push(item(json!({"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": text}]})));
                }
            }
            Said::Assistant { text, calls } => {
                if let Some(text) = text {
                    lines.push(item(json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]})));
                }
                for (id, name) in calls {
                    out.calls.push((id.clone(), m, Some(lines.len() + 1)));
                    lines.push(item(json!({"type": "function_call", "name": name,
                        "arguments": "{}", "call_id": id})));
                }
            }
        }
    }
    out.text = lines.iter().map(|line| format!("{line}\n")).collect();
}
