//! `subloop view TRACE`: a recorded run as a compact timeline — one line per
//! model call and per tool call, each child indented under the `task` call
//! that started it, each follow-up question before the call it asked — then
//! the outcome, the counts, and the verdict of every loop invariant
//! ([`crate::record::invariants`]).
//!
//! Model and tool text is escaped as on stderr ([`crate::core::text::printable`]),
//! so a trace cannot drive the terminal. Colour only when asked for (the CLI
//! asks when stdout is a terminal and `NO_COLOR` is unset).

use serde_json::Value;

use crate::core::protocol::{Block, ReplyBlock, Role};
use crate::core::text::printable;
use crate::record::invariants::Verdict;
use crate::record::recorded::RecordedRun;

/// The longest tool result shown on a line, in characters.
const PREVIEW: usize = 60;

struct Paint(bool);

impl Paint {
    fn code(&self, code: &str, text: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    /// Green for what went as asked, red for refusals and failures, plain otherwise.
    fn mark(&self, word: &str) -> String {
        match word {
            "allowed" | "not_required" | "answered" | "held" | "allow" | "none" => {
                self.code("32", word)
            }
            "denied" | "blocked" | "over_limit" | "invalid" | "unregistered" | "stopped"
            | "broken" | "deny" | "block" | "failed" | "hook_failed" => self.code("31", word),
            _ => self.code("33", word),
        }
    }
}

impl RecordedRun {
    /// The run as a compact timeline, one line per model call and per tool
    /// call, each child indented under the `task` call that started it,
    /// then the outcome, the counts and the `verdicts` over it; `colour`
    /// adds ANSI colours. Model and tool text is escaped, so a trace cannot
    /// drive the terminal.
    pub fn timeline(&self, verdicts: &[Verdict], colour: bool) -> String {
        timeline(self, verdicts, colour)
    }
}

/// The timeline of `run` and the `verdicts` over it; `colour` adds ANSI colours.
fn timeline(run: &RecordedRun, verdicts: &[Verdict], colour: bool) -> String {
    let paint = Paint(colour);
    let mut out = String::new();
    let mut shown = Vec::new();
    agent_lines(run, "parent", 0, &paint, &mut out, &mut shown);
    // Children whose `task` call has no result line (the run was killed
    // while they ran) are shown after the parent.
    let unattached: Vec<String> = run
        .agents()
        .map(|(agent, _)| agent.to_owned())
        .filter(|agent| !shown.contains(agent))
        .collect();
    for agent in unattached {
        let from = run.started_by(&agent).map(printable).unwrap_or_default();
        out.push_str(&format!(
            "{agent} (started by {from}, whose result is not recorded):\n"
        ));
        agent_lines(run, &agent, 1, &paint, &mut out, &mut shown);
    }
    let agents = run.agents().count();
    let calls: u32 = run.agents().map(|(_, calls)| calls).sum();
    let tools: usize = run.agents().map(|(agent, _)| run.tools(agent).len()).sum();
    match run.recorded_outcome() {
        Some(outcome) => out.push_str(&format!(
            "outcome: {} — {}\n",
            paint.mark(outcome.status.as_str()),
            printable(&outcome.text)
        )),
        None => out.push_str("outcome: none recorded (the run did not finish)\n"),
    }
    out.push_str(&format!(
        "{agents} agent(s), {calls} model call(s), {tools} tool call(s)\n"
    ));
    out.push_str("invariants:\n");
    for verdict in verdicts {
        let word = if verdict.held() { "held" } else { "broken" };
        out.push_str(&format!(
            "  {} {}\n",
            paint.mark(word),
            verdict.invariant.rule()
        ));
        for breach in &verdict.breaches {
            let call = breach
                .call
                .map(|call| format!(" call {call}"))
                .unwrap_or_default();
            let id = breach
                .id
                .as_deref()
                .map(|id| format!(" {}", printable(id)))
                .unwrap_or_default();
            out.push_str(&format!(
                "      at {}{call}{id}: {}\n",
                breach.agent,
                printable(&breach.detail)
            ));
        }
    }
    out
}

/// The lines of one agent, `depth` levels in.
fn agent_lines(
    run: &RecordedRun,
    agent: &str,
    depth: usize,
    paint: &Paint,
    out: &mut String,
    shown: &mut Vec<String>,
) {
    if shown.iter().any(|done| done == agent) {
        return;
    }
    shown.push(agent.to_owned());
    let pad = "    ".repeat(depth);
    let calls = run.calls(agent);
    let hooks = run.hooks(agent);
    for line in hooks_of(
        hooks,
        &["SessionStart", "UserPromptSubmit", "SubagentStart"],
    ) {
        hook_line(line, &pad, paint, out);
    }
    if let Some(schema) = run.output_schema(agent) {
        out.push_str(&format!(
            "{pad}{agent} answers must match the output schema {}\n",
            preview(&schema.to_string())
        ));
    }
    for call in 1..=calls {
        for question in follow_ups(run, agent, call) {
            out.push_str(&format!(
                "{pad}{agent} follow-up question: {}\n",
                printable(&question)
            ));
        }
        for line in hooks_of(hooks, &["PreCompact"])
            .filter(|line| line.get("call").and_then(Value::as_u64) == Some(u64::from(call)))
        {
            hook_line(line, &pad, paint, out);
        }
        for (compaction, replaced, made) in run.compactions_before(agent, call) {
            let about = compaction
                .tokens
                .map(|tokens| format!(" (about {tokens} tokens)"))
                .unwrap_or_default();
            out.push_str(&format!(
                "{pad}{agent} history compacted before call {call} ({}, {}): {} messages{about} -> {} messages\n",
                compaction.trigger,
                printable(&compaction.compactor),
                replaced.len(),
                made.len()
            ));
        }
        let offered = run
            .request(agent, call)
            .map_or(0, |request| request.tools.len());
        let reply = match run.reply(agent, call) {
            Some(Ok(reply)) => {
                let stop = reply.stop_reason.as_ref().map_or_else(
                    || "no stop reason".to_owned(),
                    |reason| reason.as_str().to_owned(),
                );
                let usage = reply
                    .usage
                    .as_ref()
                    .map(|usage| {
                        format!(
                            ", {} in / {} out tokens",
                            usage.input_tokens, usage.output_tokens
                        )
                    })
                    .unwrap_or_default();
                let text: String = reply
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ReplyBlock::Known(Block::Text { text }) => Some(text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                let said = if text.is_empty() {
                    String::new()
                } else {
                    format!(": {}", preview(&text))
                };
                // The Messages API's own compaction (`--compact native`).
                let compacted = if reply
                    .content
                    .iter()
                    .any(|block| matches!(block, ReplyBlock::Known(Block::Compaction { .. })))
                {
                    " (the server summarized the history before it)"
                } else {
                    ""
                };
                format!("{stop}{usage}{compacted}{said}")
            }
            Some(Err(failure)) => {
                paint.code("31", &format!("failed: {}", printable(failure.message())))
            }
            None => "no reply recorded".to_owned(),
        };
        out.push_str(&format!(
            "{pad}{agent} call {call} ({offered} tools offered) -> {reply}\n"
        ));
        for line in hooks_of(hooks, &["Stop", "SubagentStop"])
            .filter(|line| line.get("call").and_then(Value::as_u64) == Some(u64::from(call)))
        {
            hook_line(line, &pad, paint, out);
        }
        if let Some(error) = run.invalid_answer(agent, call) {
            out.push_str(&format!(
                "{pad}{agent} answer {call} {}: {}; sent back\n",
                paint.code("33", "does not match the output schema"),
                printable(error)
            ));
        }
        // This reply's tool lines: those before the next reply's.
        let own = run.tools_of_reply(agent, call);
        for line in own {
            tool_line(line, &pad, paint, out);
            let id = line.get("id").and_then(Value::as_str).unwrap_or_default();
            for hook in hooks_of(hooks, &["PreToolUse", "PostToolUse"])
                .filter(|hook| hook.get("call_id").and_then(Value::as_str) == Some(id))
            {
                hook_line(hook, &format!("{pad}    "), paint, out);
            }
            if line
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| run.delegates(name))
                && agent == "parent"
            {
                let children: Vec<String> = run
                    .agents()
                    .filter(|(child, _)| {
                        run.started_by(child) == Some(id)
                            && run.delegation(child).map(|(at, _)| at) == Some(call)
                    })
                    .map(|(child, _)| child.to_owned())
                    .collect();
                for child in children {
                    agent_lines(run, &child, depth + 1, paint, out, shown);
                }
            }
        }
    }
    for line in hooks_of(hooks, &["SessionEnd"]) {
        hook_line(line, &pad, paint, out);
    }
}

/// The hook lines among `hooks` of one of `events`.
fn hooks_of<'a>(hooks: &'a [Value], events: &'a [&'a str]) -> impl Iterator<Item = &'a Value> {
    hooks.iter().filter(move |line| {
        line.get("event")
            .and_then(Value::as_str)
            .is_some_and(|event| events.contains(&event))
    })
}

/// One command hook's run, under what it decided: its event, command,
/// decision, exit and duration, and its reason.
fn hook_line(line: &Value, pad: &str, paint: &Paint, out: &mut String) {
    let text = |name: &str| line.get(name).and_then(Value::as_str).unwrap_or_default();
    let exit = match (
        line.get("exit_code").and_then(Value::as_i64),
        line.get("timed_out"),
    ) {
        (_, Some(Value::Bool(true))) => "timed out".to_owned(),
        (Some(code), _) => format!("exit {code}"),
        (None, _) => "no exit code".to_owned(),
    };
    let millis = line
        .get("duration_ms")
        .and_then(Value::as_u64)
        .unwrap_or_default();
    let reason = match text("reason") {
        "" => String::new(),
        reason => format!(": {}", preview(reason)),
    };
    out.push_str(&format!(
        "{pad}    hook {} `{}` [{}] {exit}, {millis} ms{reason}\n",
        printable(text("event")),
        preview(text("command")),
        paint.mark(text("decision")),
    ));
}

/// The follow-up questions asked before request `call` of `agent`: after
/// the reply to the call before it answered (it asked for no tool and said
/// something), the user messages of text alone that this request added to
/// the history. An empty reply answered with a prompt to continue asked no
/// question.
pub(crate) fn follow_ups(run: &RecordedRun, agent: &str, call: u32) -> Vec<String> {
    let Some(earlier) = call.checked_sub(1).filter(|&earlier| earlier > 0) else {
        return Vec::new();
    };
    // An answer sent back for not matching the output schema was followed
    // by the reason, not by a question; so was one a stop hook blocked.
    if run.invalid_answer(agent, earlier).is_some() || stop_blocked(run, agent, earlier) {
        return Vec::new();
    }
    let answered = match run.reply(agent, earlier) {
        Some(Ok(reply)) => {
            let mut said = false;
            for block in &reply.content {
                match block {
                    ReplyBlock::Known(Block::ToolUse { .. }) => return Vec::new(),
                    ReplyBlock::Known(Block::Text { text }) if !text.trim().is_empty() => {
                        said = true;
                    }
                    _ => {}
                }
            }
            said
        }
        _ => false,
    };
    let (Some(before), Some(_)) = (run.request(agent, earlier), run.request(agent, call)) else {
        return Vec::new();
    };
    if !answered {
        return Vec::new();
    }
    // What followed the answer in its history (a compaction after it
    // replaced that history, so the next request may not carry it).
    run.history_of(agent, earlier)
        .get(before.messages.len()..)
        .unwrap_or_default()
        .iter()
        .filter(|message| {
            message.role == Role::User
                && !message.content.is_empty()
                && message
                    .content
                    .iter()
                    .all(|block| matches!(block, Block::Text { .. }))
        })
        .map(crate::core::protocol::Message::text)
        .collect()
}

/// Whether a stop hook blocked the answer to request `call` of `agent`
/// (the next user message is its reason, and the agent went on).
fn stop_blocked(run: &RecordedRun, agent: &str, call: u32) -> bool {
    run.hooks(agent).iter().any(|line| {
        line.get("call").and_then(Value::as_u64) == Some(u64::from(call))
            && line.get("decision").and_then(Value::as_str) == Some("block")
    })
}

fn tool_line(line: &Value, pad: &str, paint: &Paint, out: &mut String) {
    let text = |name: &str| line.get(name).and_then(Value::as_str).unwrap_or_default();
    let error = if line.get("is_error").and_then(Value::as_bool) == Some(true) {
        " error"
    } else {
        ""
    };
    out.push_str(&format!(
        "{pad}    tool {} {} [{}{error}]: {}\n",
        printable(text("name")),
        printable(text("id")),
        paint.mark(text("decision")),
        preview(text("content"))
    ));
}

/// The first [`PREVIEW`] characters of `text` on one line, escaped.
fn preview(text: &str) -> String {
    let shown = printable(text);
    match shown.char_indices().nth(PREVIEW) {
        Some((cut, _)) => format!("{}…", shown.get(..cut).unwrap_or_default()),
        None => shown,
    }
}
