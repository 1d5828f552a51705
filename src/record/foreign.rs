//! Other agents' histories as recorded runs, so `view` shows them (in a
//! terminal and as a page) as it shows subloop's own: a Claude Code
//! session (with its subagents as lanes of their own), a codex rollout, a
//! Messages API or Chat Completions request history.
//!
//! The history is written as a subloop trace: each reply is a model call
//! (a `request` with the messages added since the last one, a `response`),
//! each result a `tool` line, each subagent a child started by the call
//! whose result names it. Blocks subloop does not model (images,
//! documents, server tools) are shown as a word in brackets. The verdicts
//! are those of the rules that apply to any history: the pairing rules
//! ([`crate::record::history::pairing`], as `subloop check` finds them),
//! stop reasons that disagree with the content (where the file keeps
//! them), and a subagent that no call started.

use serde_json::{Value, json};

use crate::record::history::{Finding, Format, History, ReadError, Rule, Speaker};
use crate::record::invariants::{Breach, Invariant, Verdict};
use crate::record::recorded::RecordedRun;

/// A history of another program, read as a run.
#[derive(Debug)]
#[non_exhaustive]
pub struct Foreign {
    /// The format it was read from.
    pub format: Format,
    /// The run: the parent, and a child per subagent.
    pub run: RecordedRun,
    /// The rules that apply, and where each breaks.
    pub verdicts: Vec<Verdict>,
    /// The run as a subloop trace (JSON Lines): what `run` was read from.
    pub trace: String,
}

/// One message, as a subloop trace writes it.
struct Said {
    role: &'static str,
    blocks: Vec<Value>,
    stop_reason: Option<String>,
}

impl Foreign {
    /// Reads `text` as `format` (or by its content), with the files of its
    /// subagents (`(file name, text)`, a Claude Code session's
    /// `SESSION/subagents/agent-*.jsonl`).
    pub fn read(
        text: &str,
        format: Option<Format>,
        subagents: &[(String, String)],
    ) -> Result<Self, ReadError> {
        let (history, system, said) = read(text, format)?;
        let format = history.format;
        let mut children = Vec::new();
        let mut pairing: Vec<(String, Vec<Finding>)> = Vec::new();
        pairing.push(("parent".to_owned(), history.check()));
        // Subagents shown as no child: why, each.
        let mut unlinked: Vec<String> = Vec::new();
        for (name, child_text) in subagents {
            let (child, _, child_said) = match read(child_text, Some(Format::ClaudeCode)) {
                Ok(read) => read,
                Err(err) => {
                    unlinked.push(format!("the subagent {name} could not be read: {err}"));
                    continue;
                }
            };
            let agent = child.agent.clone().or_else(|| {
                name.strip_prefix("agent-")
                    .and_then(|rest| rest.strip_suffix(".jsonl"))
                    .map(str::to_owned)
            });
            let call = agent.as_deref().and_then(|agent| {
                history
                    .children
                    .iter()
                    .find(|link| link.agent == agent)
                    .map(|link| link.call.clone())
            });
            match call {
                Some(call) => children.push((call, child_said, child.check())),
                None => unlinked.push(format!(
                    "the subagent {name} was started by no call of this session: no result names it"
                )),
            }
        }
        // Side chains in the session's own file (where Claude Code kept a
        // subagent's run before it wrote a file for each): each a child of
        // the `Task` call whose prompt it starts with.
        if format == Format::ClaudeCode {
            for side in side_chains(text) {
                let used: Vec<&str> = children.iter().map(|(call, _, _)| call.as_str()).collect();
                let call = said
                    .iter()
                    .flat_map(|said| &said.blocks)
                    .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool_use"))
                    .find(|block| {
                        block
                            .pointer("/input/prompt")
                            .and_then(Value::as_str)
                            .map(str::trim)
                            == Some(side.prompt.trim())
                            && block
                                .get("id")
                                .and_then(Value::as_str)
                                .is_some_and(|id| !used.contains(&id))
                    })
                    .and_then(|block| block.get("id").and_then(Value::as_str))
                    .map(str::to_owned);
                match (call, read(&side.text, Some(Format::ClaudeCode))) {
                    (Some(call), Ok((child, _, child_said))) => {
                        // Its findings, placed in the session's lines.
                        let found = child
                            .check()
                            .into_iter()
                            .map(|mut finding| {
                                finding.line = finding.line.and_then(|line| {
                                    side.lines.get(line.checked_sub(1)?).copied()
                                });
                                finding
                            })
                            .collect();
                        children.push((call, child_said, found));
                    }
                    (None, _) => unlinked.push(format!(
                        "the side chain that starts on line {} was started by no call of this session: no `Task` call's prompt is its first message",
                        side.first
                    )),
                    (Some(_), Err(err)) => unlinked.push(format!(
                        "the side chain that starts on line {} could not be read: {err}",
                        side.first
                    )),
                }
            }
        }
        let mut lines = Vec::new();
        let mut next_child = 0;
        write_agent(
            "parent",
            None,
            system.as_deref(),
            &said,
            &children,
            &mut next_child,
            &mut pairing,
            &mut lines,
        );
        let trace: String = lines.iter().map(|line| format!("{line}\n")).collect();
        let mut run = RecordedRun::parse(&trace).map_err(|reason| ReadError::NotAHistory {
            format: format.as_str(),
            reason: format!("it cannot be shown as a run: {reason}"),
        })?;
        // The tools that started the subagents (Claude Code's `Task`).
        for block in said.iter().flat_map(|said| &said.blocks) {
            let id = block.get("id").and_then(Value::as_str);
            if children
                .iter()
                .any(|(call, _, _)| Some(call.as_str()) == id)
                && let Some(name) = block.get("name").and_then(Value::as_str)
            {
                run.delegate_with(name);
            }
        }
        // The findings of `rules` (or of every other rule), as breaches.
        let breaches = |findings: &[(String, Vec<Finding>)], stop: bool| -> Vec<Breach> {
            findings
                .iter()
                .flat_map(|(agent, found)| {
                    found
                        .iter()
                        .filter(move |finding| (finding.rule == Rule::StopReason) == stop)
                        .map(move |finding| Breach {
                            agent: agent.clone(),
                            call: None,
                            id: finding.id.clone(),
                            detail: format!("{finding} [{}]", finding.rule),
                        })
                })
                .collect()
        };
        let mut verdicts = vec![Verdict {
            invariant: Invariant::AnsweredOnce,
            breaches: breaches(&pairing, false),
        }];
        if format == Format::ClaudeCode {
            // Stop reasons are kept by Claude Code's entries only.
            verdicts.push(Verdict {
                invariant: Invariant::StopReasons,
                breaches: breaches(&pairing, true),
            });
        }
        if !subagents.is_empty() || !unlinked.is_empty() {
            verdicts.push(Verdict {
                invariant: Invariant::Consistent,
                breaches: unlinked
                    .into_iter()
                    .map(|detail| Breach {
                        agent: "parent".to_owned(),
                        call: None,
                        id: None,
                        detail,
                    })
                    .collect(),
            });
        }
        Ok(Self {
            format,
            run,
            verdicts,
            trace,
        })
    }
}

/// A side chain of a Claude Code session's own file: a tree of
/// `isSidechain` entries.
struct SideChain {
    /// The line of its first entry.
    first: usize,
    /// Its first message's text (a subagent's prompt).
    prompt: String,
    /// Its lines, in file order, as a session of their own.
    text: String,
    /// The session's line of each of them.
    lines: Vec<usize>,
}

/// The side chains of the session `text`, when it also has a
/// conversation (a subagent's own file is one side chain: no child of
/// itself).
fn side_chains(text: &str) -> Vec<SideChain> {
    let mut side: Vec<(usize, &str, String, Option<String>)> = Vec::new();
    let mut conversation = false;
    for (index, line) in text.lines().enumerate() {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let uuid = value.get("uuid").and_then(Value::as_str);
        if value.get("isSidechain").and_then(Value::as_bool) == Some(true) {
            if let Some(uuid) = uuid {
                let parent = value
                    .get("parentUuid")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                side.push((index + 1, line, uuid.to_owned(), parent));
            }
        } else if value.get("message").is_some() && uuid.is_some() {
            conversation = true;
        }
    }
    if !conversation || side.is_empty() {
        return Vec::new();
    }
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (position, (_, _, uuid, _)) in side.iter().enumerate() {
        at.insert(uuid.as_str(), position);
    }
    // Each entry's root: up through side chain parents (at most as many
    // steps as entries: a cycle stops there).
    let root_of = |mut position: usize| {
        for _ in 0..side.len() {
            match side
                .get(position)
                .and_then(|(_, _, _, parent)| parent.as_deref())
                .and_then(|parent| at.get(parent))
            {
                Some(&up) if up != position => position = up,
                _ => break,
            }
        }
        position
    };
    let mut trees: std::collections::BTreeMap<usize, Vec<usize>> =
        std::collections::BTreeMap::new();
    for position in 0..side.len() {
        trees.entry(root_of(position)).or_default().push(position);
    }
    trees
        .into_iter()
        .filter_map(|(root, members)| {
            let (first, first_line, _, _) = side.get(root)?;
            let prompt = serde_json::from_str::<Value>(first_line)
                .ok()
                .and_then(|value| {
                    value
                        .get("message")
                        .and_then(|m| m.get("content"))
                        .map(text_of)
                })
                .unwrap_or_default();
            let mut text = String::new();
            let mut lines = Vec::new();
            for position in members {
                let (line, raw, _, _) = side.get(position)?;
                text.push_str(raw);
                text.push('\n');
                lines.push(*line);
            }
            Some(SideChain {
                first: *first,
                prompt,
                text,
                lines,
            })
        })
        .collect()
}

/// Writes agent `agent`'s lines (and its children's, each after the reply
/// whose call started it).
#[allow(clippy::too_many_arguments)]
fn write_agent(
    agent: &str,
    parent_call: Option<&str>,
    system: Option<&str>,
    said: &[Said],
    children: &[(String, Vec<Said>, Vec<Finding>)],
    next_child: &mut usize,
    pairing: &mut Vec<(String, Vec<Finding>)>,
    lines: &mut Vec<Value>,
) {
    let with_parent = |mut line: Value| {
        if let (Some(call), Some(object)) = (parent_call, line.as_object_mut()) {
            object.insert("parent_tool_use_id".to_owned(), json!(call));
        }
        line
    };
    let message = |said: &Said| json!({"role": said.role, "content": said.blocks});
    let mut sent = 0;
    let mut call = 0u32;
    for (index, reply) in said.iter().enumerate() {
        if reply.role != "assistant" {
            continue;
        }
        call += 1;
        let mut request = json!({"agent": agent, "kind": "request", "call": call, "tools": [],
            "messages": said.get(sent..index).unwrap_or_default().iter().map(message).collect::<Vec<_>>()});
        if call == 1 {
            first_request(&mut request, agent, system);
        }
        lines.push(with_parent(request));
        sent = index;
        let calls: Vec<(&str, &str)> = reply
            .blocks
            .iter()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool_use"))
            .map(|block| {
                (
                    block.get("id").and_then(Value::as_str).unwrap_or_default(),
                    block
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                )
            })
            .collect();
        let stop = reply.stop_reason.clone().unwrap_or_else(|| {
            if calls.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            }
            .to_owned()
        });
        lines.push(with_parent(
            json!({"agent": agent, "kind": "response", "call": call,
            "response": {"content": reply.blocks, "stop_reason": stop}}),
        ));
        for (id, _) in &calls {
            for (child_call, child_said, findings) in children {
                if child_call != id {
                    continue;
                }
                *next_child += 1;
                let name = format!("child-{next_child}");
                pairing.push((name.clone(), findings.clone()));
                write_agent(
                    &name,
                    Some(id),
                    None,
                    child_said,
                    &[],
                    next_child,
                    pairing,
                    lines,
                );
            }
        }
        // The results the next message holds for these calls.
        let Some(next) = said.get(index + 1).filter(|next| next.role == "user") else {
            continue;
        };
        for block in &next.blocks {
            if block.get("type").and_then(Value::as_str) != Some("tool_result") {
                continue;
            }
            let id = block
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some((_, name)) = calls.iter().find(|(call, _)| *call == id) else {
                continue;
            };
            lines.push(with_parent(
                json!({"agent": agent, "kind": "tool", "name": name, "id": id,
                "decision": "not_required",
                "is_error": block.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                "content": block.get("content").cloned().unwrap_or(json!(""))}),
            ));
        }
    }
    if sent < said.len()
        && said
            .get(sent..)
            .is_some_and(|rest| rest.len() > 1 || call == 0)
    {
        // Messages after the last reply: a request not answered.
        let rest: Vec<Value> = said
            .get(sent..)
            .unwrap_or_default()
            .iter()
            .map(message)
            .collect();
        let mut request = json!({"agent": agent, "kind": "request", "call": call + 1, "tools": [],
            "messages": rest});
        if call == 0 {
            first_request(&mut request, agent, system);
        }
        lines.push(with_parent(request));
        return;
    }
    // A history that ends on a reply without calls: its answer.
    if let Some(last) = said.last().filter(|last| last.role == "assistant") {
        let asks = last
            .blocks
            .iter()
            .any(|block| block.get("type").and_then(Value::as_str) == Some("tool_use"));
        if !asks {
            let text: Vec<&str> = last
                .blocks
                .iter()
                .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|block| block.get("text").and_then(Value::as_str))
                .collect();
            lines.push(with_parent(
                json!({"agent": agent, "kind": "outcome", "status": "answered",
                "text": text.join("\n"), "calls": call}),
            ));
        }
    }
}

/// What an agent's first request carries: its system prompt, its tool
/// definitions (none known), and on the parent's, the trace's version.
fn first_request(request: &mut Value, agent: &str, system: Option<&str>) {
    if let Some(object) = request.as_object_mut() {
        object.insert("system".to_owned(), json!(system.unwrap_or_default()));
        object.insert("tool_definitions".to_owned(), json!([]));
        if agent == "parent" {
            object.insert("version".to_owned(), json!(1));
        }
    }
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text" | "input_text" | "output_text") => part
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                Some(other) => format!("[{other}]"),
                None => text_of(part),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A Messages API block as subloop models it (or a word in brackets).
fn block(value: &Value) -> Value {
    let field = |key: &str| value.get(key).cloned().unwrap_or(json!(""));
    match value.get("type").and_then(Value::as_str) {
        Some("text") => json!({"type": "text", "text": text_of(&field("text"))}),
        Some("tool_use") => json!({"type": "tool_use", "id": text_of(&field("id")),
            "name": text_of(&field("name")), "input": value.get("input").cloned().unwrap_or(json!({}))}),
        Some("tool_result") => {
            let mut result = json!({"type": "tool_result", "tool_use_id": text_of(&field("tool_use_id")),
                "content": text_of(&field("content"))});
            if value.get("is_error").and_then(Value::as_bool) == Some(true)
                && let Some(object) = result.as_object_mut()
            {
                object.insert("is_error".to_owned(), json!(true));
            }
            result
        }
        Some("thinking") => json!({"type": "thinking", "thinking": text_of(&field("thinking")),
            "signature": text_of(&field("signature"))}),
        Some("redacted_thinking") => {
            json!({"type": "redacted_thinking", "data": text_of(&field("data"))})
        }
        Some(other) => json!({"type": "text", "text": format!("[{other}]")}),
        None => json!({"type": "text", "text": text_of(value)}),
    }
}

/// The blocks of a Messages API `content` (a string is one text block).
fn blocks(content: Option<&Value>) -> Vec<Value> {
    match content {
        Some(Value::Array(items)) => items.iter().map(block).collect(),
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    }
}

/// Adds `blocks` of `role` to `said`: to the last message when `join`
/// and it is of the same role (one turn, as `record::history` reads the
/// format).
fn push(
    said: &mut Vec<Said>,
    role: &'static str,
    blocks: Vec<Value>,
    stop: Option<String>,
    join: bool,
) {
    match said.last_mut() {
        Some(last) if join && last.role == role => {
            last.blocks.extend(blocks);
            if stop.is_some() {
                last.stop_reason = stop;
            }
        }
        _ => said.push(Said {
            role,
            blocks,
            stop_reason: stop,
        }),
    }
}

/// The system prompt (if the file has one) and the messages of `text`.
/// The history of `text` read as `format` (or by its content), its
/// system prompt, and its messages: a Claude Code session read once, its
/// messages grouped by the turns its reader made.
fn read(
    text: &str,
    format: Option<Format>,
) -> Result<(History, Option<String>, Vec<Said>), ReadError> {
    let claude_code = format == Some(Format::ClaudeCode)
        || (format.is_none() && History::sniff(text) == Some(Format::ClaudeCode));
    if !claude_code {
        let history = History::read(text, format)?;
        let (system, said) = messages(text, history.format)?;
        return Ok((history, system, said));
    }
    let (history, chain) = crate::record::history::claude_code_session(std::io::Cursor::new(text))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut said = Vec::new();
    let mut last_turn = None;
    for (line, turn) in chain {
        let Some(value) = lines
            .get(line.saturating_sub(1))
            .and_then(|line| serde_json::from_str::<Value>(line).ok())
        else {
            continue;
        };
        let Some(of) = history.turns.get(turn) else {
            continue;
        };
        let role = match of.speaker {
            Speaker::Assistant => "assistant",
            Speaker::User => "user",
        };
        let content = value
            .get("message")
            .and_then(|message| message.get("content"));
        push(
            &mut said,
            role,
            blocks(content),
            of.stop_reason.clone(),
            last_turn == Some(turn),
        );
        last_turn = Some(turn);
    }
    Ok((history, None, said))
}

/// The system prompt (if the file has one) and the messages of `text`, a
/// request history or a codex rollout.
fn messages(text: &str, format: Format) -> Result<(Option<String>, Vec<Said>), ReadError> {
    let mut said = Vec::new();
    let mut system = None;
    let not = |reason: &str| ReadError::NotAHistory {
        format: format.as_str(),
        reason: reason.to_owned(),
    };
    match format {
        Format::Anthropic | Format::OpenAi => {
            let value: Value =
                serde_json::from_str(text).map_err(|err| ReadError::NotJson(err.to_string()))?;
            let list = match &value {
                Value::Array(list) => list,
                Value::Object(body) => {
                    if let Some(prompt) = body.get("system") {
                        system = Some(text_of(prompt));
                    }
                    match body.get("messages") {
                        Some(Value::Array(list)) => list,
                        _ => return Err(not("no `messages` array")),
                    }
                }
                _ => return Err(not("no `messages` array")),
            };
            let mut in_results = false;
            for message in list {
                let role = message
                    .get("role")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if format == Format::Anthropic {
                    let role = if role == "assistant" {
                        "assistant"
                    } else {
                        "user"
                    };
                    push(&mut said, role, blocks(message.get("content")), None, false);
                    continue;
                }
                match role {
                    "system" | "developer" => {
                        system = Some(text_of(message.get("content").unwrap_or(&Value::Null)));
                        in_results = false;
                    }
                    "assistant" => {
                        let mut out = Vec::new();
                        let words = text_of(message.get("content").unwrap_or(&Value::Null));
                        if !words.is_empty() {
                            out.push(json!({"type": "text", "text": words}));
                        }
                        for call in message
                            .get("tool_calls")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            let function = call.get("function");
                            let arguments = function
                                .and_then(|function| function.get("arguments"))
                                .map(|arguments| match arguments {
                                    Value::String(raw) => {
                                        serde_json::from_str(raw).unwrap_or_else(|_| json!(raw))
                                    }
                                    other => other.clone(),
                                })
                                .unwrap_or(json!({}));
                            out.push(json!({"type": "tool_use",
                                "id": text_of(call.get("id").unwrap_or(&Value::Null)),
                                "name": function.and_then(|f| f.get("name")).map(text_of).unwrap_or_default(),
                                "input": arguments}));
                        }
                        push(&mut said, "assistant", out, None, false);
                        in_results = false;
                    }
                    "tool" => {
                        push(
                            &mut said,
                            "user",
                            vec![json!({"type": "tool_result",
                            "tool_use_id": text_of(message.get("tool_call_id").unwrap_or(&Value::Null)),
                            "content": text_of(message.get("content").unwrap_or(&Value::Null))})],
                            None,
                            in_results,
                        );
                        in_results = true;
                    }
                    _ => {
                        push(
                            &mut said,
                            "user",
                            vec![
                                json!({"type": "text", "text": text_of(message.get("content").unwrap_or(&Value::Null))}),
                            ],
                            None,
                            false,
                        );
                        in_results = false;
                    }
                }
            }
        }
        // Read with its history, by `read`.
        Format::ClaudeCode => {}
        Format::Codex => {
            // The items and their sides are the reader's; only how each
            // looks is decided here.
            for (item, side) in crate::record::history::codex_items(text)? {
                let field = |key: &str| item.get(key).unwrap_or(&Value::Null);
                let call_id = text_of(field("call_id"));
                let kind = item.get("type").and_then(Value::as_str);
                let Some(side) = side else {
                    // Not sent: a developer or system message is the
                    // system prompt.
                    if kind == Some("message") {
                        system = Some(text_of(field("content")));
                    }
                    continue;
                };
                let block = match kind {
                    Some("reasoning") => {
                        json!({"type": "thinking", "thinking": text_of(field("summary")), "signature": ""})
                    }
                    Some("function_call") => {
                        let arguments = match field("arguments") {
                            Value::String(raw) => {
                                serde_json::from_str(raw).unwrap_or_else(|_| json!(raw))
                            }
                            other => other.clone(),
                        };
                        json!({"type": "tool_use", "id": call_id,
                            "name": text_of(field("name")), "input": arguments})
                    }
                    Some("custom_tool_call") => json!({"type": "tool_use", "id": call_id,
                        "name": text_of(field("name")), "input": {"input": field("input")}}),
                    Some("local_shell_call") => json!({"type": "tool_use", "id": call_id,
                        "name": "local_shell", "input": field("action")}),
                    Some(
                        "function_call_output"
                        | "custom_tool_call_output"
                        | "local_shell_call_output",
                    ) => {
                        let output = match field("output") {
                            Value::Object(object) => object
                                .get("content")
                                .or_else(|| object.get("output"))
                                .map(text_of)
                                .unwrap_or_default(),
                            other => text_of(other),
                        };
                        json!({"type": "tool_result", "tool_use_id": call_id, "content": output})
                    }
                    // A message of either side.
                    _ => json!({"type": "text", "text": text_of(field("content"))}),
                };
                let role = match side {
                    Speaker::Assistant => "assistant",
                    Speaker::User => "user",
                };
                push(&mut said, role, vec![block], None, true);
            }
        }
    }
    Ok((system, said))
}
