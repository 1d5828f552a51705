//! `subloop view TRACE -o run.html`: a recorded run as one self-contained
//! HTML page — a lane per agent, every model call a box, every `tool_use`
//! linked to its result (coloured by decision), delegations linked both
//! ways, the plan of each parent request, a budget meter per agent, and the
//! invariants panel with a link to each breach.
//!
//! The page is the run's data (built here, from the [`RecordedRun`] and the
//! [`Verdict`]s of [`crate::invariants::check`], so the checks have one
//! definition) and a script that draws it. Everything is inline: no font,
//! script, style or image comes from anywhere else, and the page's content
//! security policy forbids any request. Text from the trace is only ever set
//! as text, never parsed as HTML, so a hostile trace cannot inject markup.
//!
//! When the script has drawn the page it marks the root element
//! `data-ready="1"` with the counts it drew (`data-lanes`, `data-calls`,
//! `data-links`): the browser check in the test suite reads them.

use serde_json::{Map, Value, json};

use crate::invariants::{Policy, Verdict};
use crate::model::replay::RecordedRun;
use crate::protocol::{Block, ReplyBlock};

mod output;

pub use output::{PageOutput, PageTrace, write_for_trace};

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// What the page counts, as the trace has it: the browser check compares
/// these with what the page drew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Agents that made a model call (parent and children).
    pub lanes: usize,
    /// Model calls of every agent.
    pub calls: usize,
    /// `tool_use` blocks whose result is on record (each is one link).
    pub links: usize,
}

/// The page for `run`: `verdicts` are its invariant checks, `policy` the
/// budgets they were checked against (shown on the meters), `title` names
/// the run (the trace's file name).
pub fn page(run: &RecordedRun, verdicts: &[Verdict], policy: &Policy, title: &str) -> String {
    let (data, _) = model(run, verdicts, policy, title);
    let json = script_safe(&data.to_string());
    let title = html_text(title);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>subloop run: {title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <noscript>This page draws the run with its inline script; enable JavaScript to see it.</noscript>\n\
         <script type=\"application/json\" id=\"subloop-run\">{json}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n"
    )
}

/// The counts of `run` the page draws.
pub fn counts(run: &RecordedRun) -> Counts {
    let (_, counts) = model(run, &[], &Policy::default(), "");
    counts
}

/// Lanes in order: the parent, then children by number.
fn lane_order(run: &RecordedRun) -> Vec<String> {
    let mut agents: Vec<String> = run.agents().map(|(agent, _)| agent.to_owned()).collect();
    agents.sort_by_key(|agent| {
        if agent == "parent" {
            (0, 0, String::new())
        } else {
            match agent
                .strip_prefix("child-")
                .and_then(|n| n.parse::<u64>().ok())
            {
                Some(n) => (1, n, String::new()),
                None => (2, 0, agent.clone()),
            }
        }
    });
    agents
}

/// The page's data, and its counts.
fn model(run: &RecordedRun, verdicts: &[Verdict], policy: &Policy, title: &str) -> (Value, Counts) {
    let mut counts = Counts {
        lanes: 0,
        calls: 0,
        links: 0,
    };
    let mut lanes = Vec::new();
    for agent in lane_order(run) {
        let (lane, links) = lane(run, &agent, policy);
        counts.lanes += 1;
        counts.calls += usize::try_from(run.calls(&agent)).unwrap_or(usize::MAX);
        counts.links += links;
        lanes.push(lane);
    }
    let verdicts: Vec<Value> = verdicts
        .iter()
        .map(|verdict| {
            json!({
                "invariant": verdict.invariant,
                "rule": verdict.invariant.rule(),
                "held": verdict.held(),
                "breaches": verdict.breaches.iter().map(|breach| json!({
                    "agent": breach.at.agent,
                    "call": breach.at.call,
                    "id": breach.at.id,
                    "detail": breach.detail,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let outcome = run
        .outcome()
        .map(|outcome| json!({"status": outcome.status, "text": outcome.text}));
    let data = json!({
        "title": title,
        "question": run.question(),
        "outcome": outcome,
        "lanes": lanes,
        "verdicts": verdicts,
        "counts": {"lanes": counts.lanes, "calls": counts.calls, "links": counts.links},
    });
    (data, counts)
}

/// One agent's lane, and how many of its calls have a result on record.
fn lane(run: &RecordedRun, agent: &str, policy: &Policy) -> (Value, usize) {
    let total = run.calls(agent);
    let history = run.messages(agent);
    let mut calls = Vec::new();
    let mut links = 0;
    let mut system = Value::Null;
    let mut tools = Value::Null;
    for call in 1..=total {
        let request = run.request(agent, call);
        if let (Some(request), true) = (&request, call == 1) {
            system = json!(request.system);
            tools = json!(request.tools);
        }
        let mut entry = Map::new();
        entry.insert("call".into(), json!(call));
        if let Some(request) = &request {
            entry.insert("messages".into(), json!(request.messages.len()));
            // A request whose history is not a prefix of the agent's (only a
            // hand-made trace) carries its own.
            if !history.starts_with(request.messages) {
                entry.insert("own_messages".into(), json!(request.messages));
            }
            entry.insert("plan".into(), json!(request.attachment));
            // The tools offered changed (an MCP server's list did): this
            // request's own definitions, for its full request.
            if call > 1
                && run
                    .request(agent, 1)
                    .is_some_and(|first| first.tools != request.tools)
            {
                entry.insert("own_tools".into(), json!(request.tools));
            }
            entry.insert(
                "offered".into(),
                json!(
                    request
                        .tools
                        .iter()
                        .map(|tool| tool.name.as_str())
                        .collect::<Vec<_>>()
                ),
            );
        }
        let mut uses = Vec::new();
        match run.reply(agent, call) {
            Some(Ok(reply)) => {
                entry.insert("reply".into(), json!(reply));
                entry.insert(
                    "stop".into(),
                    json!(reply.stop_reason.as_ref().map(|reason| reason.as_str())),
                );
                entry.insert(
                    "tokens".into(),
                    json!(
                        reply
                            .usage
                            .as_ref()
                            .map(|usage| [usage.input_tokens, usage.output_tokens])
                    ),
                );
                let text: Vec<&str> = reply
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ReplyBlock::Known(Block::Text { text }) => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                entry.insert("text".into(), json!(text.join("\n")));
                for block in &reply.content {
                    if let ReplyBlock::Known(Block::ToolUse { id, name, input }) = block {
                        uses.push((id.as_str().to_owned(), name.clone(), input.clone()));
                    }
                }
            }
            Some(Err(failure)) => {
                entry.insert("failure".into(), json!(failure.message));
            }
            None => {}
        }
        // This reply's tool lines: those recorded after it and before the next reply's.
        let own = run.tools_of_reply(agent, call);
        let mut taken = vec![false; own.len()];
        let mut use_values = Vec::new();
        for (id, name, input) in uses {
            let result = own.iter().enumerate().position(|(index, line)| {
                !taken.get(index).copied().unwrap_or(true)
                    && line.get("id").and_then(Value::as_str) == Some(id.as_str())
            });
            if let Some(index) = result {
                if let Some(slot) = taken.get_mut(index) {
                    *slot = true;
                }
                links += 1;
            }
            let child = if name == "task" && agent == "parent" {
                run.agents()
                    .map(|(child, _)| child)
                    .find(|child| {
                        run.started_by(child) == Some(id.as_str())
                            && run.delegation(child).map(|(at, _)| at) == Some(call)
                    })
                    .map(str::to_owned)
            } else {
                None
            };
            use_values.push(json!({
                "id": id,
                "name": name,
                "input": input,
                "result": result,
                "child": child,
            }));
        }
        entry.insert("uses".into(), Value::Array(use_values));
        entry.insert("results".into(), json!(own));
        calls.push(Value::Object(entry));
    }
    let budget = if agent == "parent" {
        policy.parent_calls
    } else {
        policy.child_calls
    };
    let started_by = run.started_by(agent);
    // The report the parent received for this child's task call: the
    // result of that call, in the parent's round of that reply.
    let delegated = run.delegation(agent).map(|(call, _)| call);
    let report = started_by.zip(delegated).and_then(|(id, call)| {
        run.tools_of_reply("parent", call)
            .iter()
            .find(|line| line.get("id").and_then(Value::as_str) == Some(id))
            .and_then(|line| line.get("content").and_then(Value::as_str))
            .map(|content| {
                serde_json::from_str::<Value>(content).unwrap_or_else(|_| json!(content))
            })
    });
    // The parent's budget is per question (follow-ups start a new one):
    // the meter shows the most calls one question used.
    let mut questions = 1;
    let mut most = 0;
    let mut used = 0;
    for call in 1..=total {
        used += 1;
        most = most.max(used);
        let answered = matches!(
            run.reply(agent, call),
            Some(Ok(reply)) if reply.stop_reason == Some(crate::protocol::StopReason::EndTurn)
        );
        if answered && call < total && agent == "parent" {
            questions += 1;
            used = 0;
        }
    }
    let lane = json!({
        "agent": agent,
        "questions": questions,
        "most_in_a_question": most,
        "started_by": started_by,
        "started_in": delegated,
        "budget": budget,
        "system": system,
        "tools": tools,
        "history": history,
        "calls": calls,
        "report": report,
    });
    (lane, links)
}

/// `text` safe inside an HTML `<script>` element: JSON never needs a raw
/// `<`, so every one is written as `\u003c` (no `</script>`, no `<!--`).
/// Outside JSON strings `<` cannot occur, so the JSON is unchanged.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c")
}

/// `text` as HTML text content.
fn html_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_text_cannot_close_the_element() {
        let run = RecordedRun::parse(concat!(
            r#"{"agent":"parent","call":1,"kind":"request","messages":[{"role":"user","content":"</script><script>alert(1)</script><!--"}],"system":"s","tool_definitions":[],"tools":[]}"#,
            "\n",
            r#"{"agent":"parent","call":1,"kind":"response","response":{"content":[{"type":"text","text":"</SCRIPT>"}],"stop_reason":"end_turn"}}"#,
            "\n"
        ))
        .expect("trace parses");
        let page = page(&run, &[], &Policy::default(), "</title><b>x");
        assert_eq!(page.matches("</script>").count(), 2, "{page}");
        assert!(!page.contains("</SCRIPT>"));
        assert!(!page.contains("<!--"));
        assert!(page.contains("subloop run: &lt;/title&gt;&lt;b&gt;x"));
        // The data still reads back as the same JSON.
        let start = page
            .find("id=\"subloop-run\">")
            .map(|at| at + 17)
            .unwrap_or(0);
        let end = page[start..].find("</script>").map_or(0, |at| start + at);
        let data: Value = serde_json::from_str(&page[start..end]).expect("data parses");
        assert_eq!(data["lanes"][0]["calls"][0]["text"], "</SCRIPT>");
    }

    #[test]
    fn nothing_is_fetched() {
        let page = page(&RecordedRun::default(), &[], &Policy::default(), "t");
        for fetch in ["http:", "https:", "src=", "<link", "@import", "url("] {
            assert!(!page.contains(fetch), "the page holds {fetch}");
        }
    }
}
