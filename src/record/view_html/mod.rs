//! `subloop view TRACE -o run.html`: a recorded run as one self-contained
//! HTML page — a lane per agent, every model call a box, every `tool_use`
//! linked to its result (coloured by decision), delegations linked both
//! ways, the plan of each parent request, a budget meter per agent, and the
//! invariants panel with a link to each breach. A follow-up question shows
//! at the top of the call that answers it.
//!
//! The page is the run's data (built here, from the [`RecordedRun`] and the
//! [`Verdict`]s of [`crate::record::invariants::Policy::check`], so the checks have one
//! definition) and a script that draws it. Everything is inline: no font,
//! script, style or image comes from anywhere else, and the page's content
//! security policy forbids any request. Text from the trace is only ever set
//! as text, never parsed as HTML, so a hostile trace cannot inject markup.
//!
//! A long lane is drawn by its ends: the calls between are folded, and the
//! script draws them from the data a chunk at a time when asked (a click on
//! the fold, or a link to a folded call), so a run of any length opens with
//! a bounded number of elements.
//!
//! When the script has drawn the page it marks the root element
//! `data-ready="1"` with the counts it drew or folded (`data-lanes`,
//! `data-calls`, `data-links`), the call boxes and elements actually drawn
//! (`data-drawn-calls`, `data-elements`): the browser check in the test
//! suite reads them.

use std::collections::HashMap;
use std::io::Write;

use serde::Serialize;
use serde_json::{Value, json};

use crate::core::protocol::{Block, Message, ModelResponse, ReplyBlock, ToolDefinition};
use crate::record::invariants::{Policy, Verdict};
use crate::record::recorded::{RecordedOutcome, RecordedRun};

mod output;

pub use output::{PageOutput, PageTrace};

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// What the page counts, as the trace has it: the browser check compares
/// these with what the page drew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Counts {
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
#[cfg(any(test, feature = "testing"))]
pub(crate) fn page(
    run: &RecordedRun,
    verdicts: &[Verdict],
    policy: &Policy,
    title: &str,
) -> String {
    let mut out = Vec::new();
    // Writing to memory cannot fail.
    let _ = write_page(&mut out, run, verdicts, policy, title);
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes the page of [`page`] to `out` as it is made, without holding it
/// whole in memory.
fn write_page(
    out: &mut impl Write,
    run: &RecordedRun,
    verdicts: &[Verdict],
    policy: &Policy,
    title: &str,
) -> std::io::Result<()> {
    let (data, _) = model(run, verdicts, policy, title);
    let title = html_text(title);
    write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>subloop run: {title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <noscript>This page draws the run with its inline script; enable JavaScript to see it.</noscript>\n\
         <script type=\"application/json\" id=\"subloop-run\">"
    )?;
    serde_json::to_writer(ScriptSafe(&mut *out), &data)?;
    write!(
        out,
        "</script>\n<script>\n{SCRIPT}</script>\n</body>\n</html>\n"
    )
}

/// Lanes in order: the parent, then children by number.
fn lane_order(run: &RecordedRun) -> Vec<&str> {
    let mut agents: Vec<&str> = run.agents().map(|(agent, _)| agent).collect();
    agents.sort_by_key(|agent| {
        if *agent == "parent" {
            (0, 0, *agent)
        } else {
            match agent
                .strip_prefix("child-")
                .and_then(|n| n.parse::<u64>().ok())
            {
                Some(n) => (1, n, ""),
                None => (2, 0, *agent),
            }
        }
    });
    agents
}

/// The page's data: borrowed from the run, serialized once, straight into
/// the page.
#[derive(Serialize)]
struct PageData<'a> {
    title: &'a str,
    question: Option<String>,
    outcome: Option<OutcomeData<'a>>,
    lanes: Vec<LaneData<'a>>,
    verdicts: Vec<Value>,
    counts: Counts,
    /// The tools whose calls start a child.
    delegating: &'a [String],
}

#[derive(Serialize)]
struct OutcomeData<'a> {
    status: &'a str,
    text: &'a str,
}

/// One agent's lane.
#[derive(Serialize)]
struct LaneData<'a> {
    agent: &'a str,
    questions: usize,
    most_in_a_question: u32,
    started_by: Option<&'a str>,
    started_in: Option<u32>,
    budget: Option<u32>,
    system: Option<&'a str>,
    tools: Option<&'a [ToolDefinition]>,
    /// The first history; each compaction's is in `histories`.
    history: &'a [Message],
    /// Every history the lane had (the first, then each compaction's),
    /// when it was compacted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    histories: Vec<&'a [Message]>,
    calls: Vec<CallData<'a>>,
    report: Option<Value>,
}

/// One model call of a lane. A field left out is not on record (no
/// request, no reply); one written as `null` is on record as nothing.
#[derive(Serialize)]
struct CallData<'a> {
    call: u32,
    /// Follow-up questions asked before this call, after an answer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    asked: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<usize>,
    /// Which of the lane's `histories` the request's messages begin.
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<usize>,
    /// The compactions before this request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    compacted: Vec<CompactionData<'a>>,
    /// The request's history, when it is not a prefix of the lane's.
    #[serde(skip_serializing_if = "Option::is_none")]
    own_messages: Option<&'a [Message]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<Option<&'a str>>,
    /// The request's tools, when they are not the lane's first request's.
    #[serde(skip_serializing_if = "Option::is_none")]
    own_tools: Option<&'a [ToolDefinition]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    offered: Option<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply: Option<&'a ModelResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<Option<[u64; 2]>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure: Option<&'a str>,
    /// Why the answer was sent back (it did not match the output schema).
    #[serde(skip_serializing_if = "Option::is_none")]
    sent_back: Option<&'a str>,
    uses: Vec<UseData<'a>>,
    results: &'a [Value],
}

/// One compaction before a request.
#[derive(Serialize)]
struct CompactionData<'a> {
    trigger: &'static str,
    compactor: &'a str,
    tokens: Option<u64>,
    replaced: usize,
    kept: usize,
}

/// One `tool_use` of a reply: the index of its result among the call's
/// results, and the child its `task` started.
#[derive(Serialize)]
struct UseData<'a> {
    id: &'a str,
    name: &'a str,
    input: &'a Value,
    result: Option<usize>,
    child: Option<&'a str>,
}

/// The page's data, and its counts.
fn model<'a>(
    run: &'a RecordedRun,
    verdicts: &[Verdict],
    policy: &Policy,
    title: &'a str,
) -> (PageData<'a>, Counts) {
    let mut counts = Counts {
        lanes: 0,
        calls: 0,
        links: 0,
    };
    // The child each of the parent's `task` calls started, by the parent's
    // call and the task id: found once, not once per `task` call.
    let mut children: HashMap<(u32, &str), &str> = HashMap::new();
    for (child, _) in run.agents() {
        if let (Some(id), Some((call, _))) = (run.started_by(child), run.delegation(child)) {
            children.entry((call, id)).or_insert(child);
        }
    }
    let mut lanes = Vec::new();
    for agent in lane_order(run) {
        let (lane, links) = lane(run, agent, policy, &children);
        counts.lanes += 1;
        counts.calls += usize::try_from(run.calls(agent)).unwrap_or(usize::MAX);
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
                    "agent": breach.agent,
                    "call": breach.call,
                    "id": breach.id,
                    "detail": breach.detail,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let outcome = run
        .recorded_outcome()
        .map(|outcome: &RecordedOutcome| OutcomeData {
            status: outcome.status.as_str(),
            text: &outcome.text,
        });
    let data = PageData {
        title,
        question: run.question(),
        outcome,
        lanes,
        verdicts,
        counts,
        delegating: run.delegating(),
    };
    (data, counts)
}

/// One agent's lane, and how many of its calls have a result on record;
/// `children` are the children the parent's `task` calls started.
fn lane<'a>(
    run: &'a RecordedRun,
    agent: &'a str,
    policy: &Policy,
    children: &HashMap<(u32, &'a str), &'a str>,
) -> (LaneData<'a>, usize) {
    let total = run.calls(agent);
    let histories = run.histories(agent);
    let history = histories.first().copied().unwrap_or_default();
    let first = run.request(agent, 1);
    // Which history each request begins (its index in `histories`).
    let mut segment = 0;
    let mut calls = Vec::new();
    let mut links = 0;
    for call in 1..=total {
        let request = run.request(agent, call);
        let mut entry = CallData {
            call,
            asked: crate::record::view::follow_ups(run, agent, call),
            messages: None,
            history: None,
            compacted: Vec::new(),
            own_messages: None,
            plan: None,
            own_tools: None,
            offered: None,
            reply: None,
            stop: None,
            tokens: None,
            text: None,
            failure: None,
            sent_back: run.invalid_answer(agent, call),
            uses: Vec::new(),
            results: &[],
        };
        for (compaction, replaced, made) in run.compactions_before(agent, call) {
            segment += 1;
            entry.compacted.push(CompactionData {
                trigger: compaction.trigger.as_str(),
                compactor: &compaction.compactor,
                tokens: compaction.tokens,
                replaced: replaced.len(),
                kept: made.len(),
            });
        }
        if let Some(request) = &request {
            entry.messages = Some(request.messages.len());
            let lane_history = histories.get(segment).copied().unwrap_or_default();
            if segment > 0 {
                entry.history = Some(segment);
            }
            // A request whose history is not a prefix of the agent's (only a
            // hand-made trace) carries its own.
            if !is_prefix(lane_history, request.messages) {
                entry.own_messages = Some(request.messages);
            }
            entry.plan = Some(request.attachment);
            // The tools offered changed (an MCP server's list did): this
            // request's own definitions, for its full request.
            if call > 1
                && first
                    .as_ref()
                    .is_some_and(|first| !same_slice(first.tools, request.tools))
            {
                entry.own_tools = Some(request.tools);
            }
            entry.offered = Some(
                request
                    .tools
                    .iter()
                    .map(|tool| tool.name.as_str())
                    .collect(),
            );
        }
        let mut uses = Vec::new();
        match run.reply(agent, call) {
            Some(Ok(reply)) => {
                entry.reply = Some(reply);
                entry.stop = Some(reply.stop_reason.as_ref().map(|reason| reason.as_str()));
                entry.tokens = Some(
                    reply
                        .usage
                        .as_ref()
                        .map(|usage| [usage.input_tokens, usage.output_tokens]),
                );
                let text: Vec<&str> = reply
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ReplyBlock::Known(Block::Text { text }) => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                entry.text = Some(text.join("\n"));
                for block in &reply.content {
                    if let ReplyBlock::Known(Block::ToolUse { id, name, input }) = block {
                        uses.push((id.as_str(), name.as_str(), input));
                    }
                }
            }
            Some(Err(failure)) => entry.failure = Some(failure.message()),
            None => {}
        }
        // This reply's tool lines: those recorded after it and before the next reply's.
        let own = run.tools_of_reply(agent, call);
        let mut taken = vec![false; own.len()];
        for (id, name, input) in uses {
            let result = own.iter().enumerate().position(|(index, line)| {
                !taken.get(index).copied().unwrap_or(true)
                    && line.get("id").and_then(Value::as_str) == Some(id)
            });
            if let Some(index) = result {
                if let Some(slot) = taken.get_mut(index) {
                    *slot = true;
                }
                links += 1;
            }
            let child = if run.delegates(name) && agent == "parent" {
                children.get(&(call, id)).copied()
            } else {
                None
            };
            entry.uses.push(UseData {
                id,
                name,
                input,
                result,
                child,
            });
        }
        entry.results = own;
        calls.push(entry);
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
            Some(Ok(reply)) if reply.stop_reason == Some(crate::core::protocol::StopReason::EndTurn)
        );
        if answered && call < total && agent == "parent" {
            questions += 1;
            used = 0;
        }
    }
    let lane = LaneData {
        agent,
        questions,
        most_in_a_question: most,
        started_by,
        started_in: delegated,
        budget,
        system: first.as_ref().map(|first| first.system),
        tools: first.as_ref().map(|first| first.tools),
        history,
        histories: if histories.len() > 1 {
            histories
        } else {
            Vec::new()
        },
        calls,
        report,
    };
    (lane, links)
}

/// A writer that passes JSON on with every `<` written as `\u003c`, so the
/// JSON is safe inside an HTML `<script>` element (no `</script>`, no
/// `<!--`). JSON never needs a raw `<`, and outside its strings none can
/// occur, so the JSON is unchanged.
struct ScriptSafe<W>(W);

impl<W: Write> Write for ScriptSafe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for (index, part) in buf.split(|&byte| byte == b'<').enumerate() {
            if index > 0 {
                self.0.write_all(b"\\u003c")?;
            }
            self.0.write_all(part)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Whether `messages` is a prefix of `history`. The reader hands out each
/// request's messages as a slice of its agent's history, so the usual
/// answer needs no message compared: comparing them would cost the length
/// of the history for every call, the square of the run's length in all.
fn is_prefix<T: PartialEq>(history: &[T], messages: &[T]) -> bool {
    (std::ptr::eq(history.as_ptr(), messages.as_ptr()) && messages.len() <= history.len())
        || history.starts_with(messages)
}

/// Whether `a` and `b` hold the same items: the same slice, or equal ones.
fn same_slice<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    std::ptr::eq(a, b) || a == b
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
