//! Nothing is lost in the last round: when a run stops right after a round
//! of tools (call_limit, deadline, token_limit, cancelled), every result of
//! that round is in `Outcome.messages` (the last message), in the trace's
//! `tool` line and in the `--json` output's `tools` entry.

use crate::common;
use crate::common::RunDriven;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::ScriptedReply;
use common::{TempDir, tool_results};
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Hooks;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::StatusKind;
use subloop::agent::subagent::SubagentConfig;
use subloop::core::call::ToolRecord;
use subloop::core::conversation::ToolOutput;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::Role;
use subloop::core::protocol::ToolResultContent;
use subloop::core::protocol::Usage;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedChildren;
use subloop::providers::scripted::ScriptedModel;
use subloop::record::trace::{RebuiltRequest, TraceWriter};
use subloop::run::limits::{CancelHandle, Limits};
use subloop::run::model::ChildModels;
use subloop::tools::{Capability, ReadFile, RunMain, RunSettings, Tool, ToolContext};

/// What main.py prints.
const PRINTED: &str = "main ran: 42";

fn workspace() -> TempDir {
    let dir = TempDir::new("last-round");
    dir.write("main.py", format!("print('{PRINTED}')\n"));
    dir.write("a.txt", "alpha\n");
    dir
}

/// A tool that cancels the run it is part of, then reports.
struct CancelRun(CancelHandle);

/// A tool that takes `0` to finish (so a short deadline passes while it runs).
struct Slow(Duration);

impl Tool for CancelRun {
    fn name(&self) -> &str {
        "cancel_run"
    }
    fn description(&self) -> &str {
        "Cancels the run."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }
    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        self.0.cancel();
        ToolOutput::ok("cancel requested")
    }
}

impl Tool for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "Takes its time."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }
    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        let started = Instant::now();
        while started.elapsed() < self.0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        ToolOutput::ok("slow work done")
    }
}

struct Case {
    limits: Limits,
    cancel: CancelHandle,
    budget: u32,
    parent: Vec<ScriptedReply>,
    children: Vec<Vec<ScriptedReply>>,
}

impl Case {
    fn new(budget: u32, parent: Vec<ScriptedReply>) -> Self {
        Self {
            limits: Limits::default(),
            cancel: CancelHandle::new(),
            budget,
            parent,
            children: Vec::new(),
        }
    }
}

/// Runs `case` with a trace; returns the report and the trace's lines.
fn run(dir: &TempDir, case: Case) -> (RunReport, Vec<Value>) {
    let trace_path = dir.path().join("trace.jsonl");
    let children: Arc<dyn ChildModels> = Arc::new(ScriptedChildren(case.children));
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .limits(case.limits, case.cancel.clone())
        .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(RunMain::new(dir.path(), RunSettings::default()).unwrap())
        .unwrap()
        .tool(CancelRun(case.cancel.clone()))
        .unwrap()
        .tool(Slow(Duration::from_millis(600)))
        .unwrap()
        .subagents(SubagentConfig::new(children, Hooks::none()))
        .unwrap()
        .monitor(TraceWriter::create(&trace_path).unwrap())
        .build();
    let report = agent
        .run_driven(
            "Run it.",
            Budget::new(case.budget).unwrap(),
            &mut ScriptedModel::new(case.parent),
        )
        .unwrap();
    let text = std::fs::read_to_string(&trace_path).unwrap();
    // The trace still rebuilds: a trailing round with no request after it is fine.
    let requests = RebuiltRequest::from_trace(&text).unwrap();
    assert_eq!(
        requests.iter().filter(|r| r.agent == "parent").count(),
        report.outcome.calls as usize
    );
    let lines = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (report, lines)
}

fn calls(list: &[(&str, &str, Value)]) -> ScriptedReply {
    Ok(ModelResponse::tool_calls(list.iter().cloned()))
}

/// The last round is on record everywhere: the history ends with its user
/// message answering every call of the last assistant message, and each
/// result's content and flag are in the trace's `tool` line and the JSON
/// `tools` entry. Returns `(id, content, is_error)` of the round.
fn last_round_on_record(
    report: &RunReport,
    lines: &[Value],
    agent: &str,
) -> Vec<(String, String, bool)> {
    let (messages, json_tools) = if agent == "parent" {
        (&report.outcome.messages, report.to_json()["tools"].clone())
    } else {
        let number: usize = agent.trim_start_matches("child-").parse().unwrap();
        let json = report.to_json();
        (
            &report.children[number - 1].outcome.messages,
            json["children"][number - 1]["tools"].clone(),
        )
    };
    let records = if agent == "parent" {
        &report.tools
    } else {
        let number: usize = agent.trim_start_matches("child-").parse().unwrap();
        &report.children[number - 1].tools
    };
    shared_with_the_history(records, messages);
    let last = messages.last().expect("a history");
    assert_eq!(last.role, Role::User, "the history ends with the results");
    let asked: Vec<String> = messages[messages.len() - 2]
        .content
        .iter()
        .filter_map(|block| match block {
            Block::ToolUse { id, .. } => Some(id.to_string()),
            _ => None,
        })
        .collect();
    let round = tool_results(std::slice::from_ref(last));
    assert_eq!(round.len(), last.content.len(), "only results: {last:?}");
    let answered: Vec<String> = round.iter().map(|(id, ..)| id.clone()).collect();
    assert_eq!(answered, asked, "every call of the last reply answered");
    for (id, content, is_error) in &round {
        let line = lines
            .iter()
            .find(|line| line["kind"] == "tool" && line["agent"] == agent && line["id"] == **id)
            .unwrap_or_else(|| panic!("no tool line for {agent} {id}"));
        assert_eq!(line["content"], **content, "trace content of {id}: {line}");
        assert_eq!(
            line["is_error"], *is_error,
            "trace is_error of {id}: {line}"
        );
        let entry = json_tools
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["id"] == **id)
            .unwrap_or_else(|| panic!("no JSON tools entry for {id}"));
        assert_eq!(entry["content"], **content, "JSON content of {id}: {entry}");
        assert_eq!(
            entry["is_error"], *is_error,
            "JSON is_error of {id}: {entry}"
        );
    }
    round
}

/// Each record's content is the history's text itself (one allocation),
/// not a copy: a long run holds what its tools said once.
fn shared_with_the_history(records: &[ToolRecord], messages: &[Message]) {
    assert!(!records.is_empty());
    for record in records {
        let in_history = messages
            .iter()
            .flat_map(|message| &message.content)
            .find_map(|block| match block {
                Block::ToolResult {
                    tool_use_id,
                    content: ToolResultContent::Text(text),
                    ..
                } if *tool_use_id == record.id => Some(text),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no result for {} in the history", record.id));
        assert_eq!(*in_history, record.content);
        assert!(
            in_history.ptr_eq(&record.content),
            "the record of {} holds a copy of the history's text",
            record.id
        );
    }
}

fn find<'a>(round: &'a [(String, String, bool)], id: &str) -> &'a (String, String, bool) {
    round
        .iter()
        .find(|(result, ..)| result == id)
        .unwrap_or_else(|| panic!("no result for {id}: {round:?}"))
}

#[test]
fn call_limit_keeps_the_last_round() {
    let dir = workspace();
    let case = Case::new(
        1,
        vec![calls(&[
            ("r1", "run_main", json!({})),
            ("f1", "read_file", json!({"path": "a.txt"})),
        ])],
    );
    let (report, lines) = run(&dir, case);
    assert_eq!(report.outcome.status, StatusKind::CallLimit);
    let round = last_round_on_record(&report, &lines, "parent");
    let (_, run_main, is_error) = find(&round, "r1");
    assert!(run_main.contains(PRINTED) && !is_error, "{run_main}");
    assert_eq!(find(&round, "f1").1, "alpha\n");
}

#[test]
fn cancelled_keeps_the_last_round_with_budget_left() {
    let dir = workspace();
    let case = Case::new(
        4,
        vec![
            calls(&[
                ("r1", "run_main", json!({})),
                ("c1", "cancel_run", json!({})),
                ("f1", "read_file", json!({"path": "a.txt"})),
            ]),
            Ok(ModelResponse::answer("never asked")),
        ],
    );
    let (report, lines) = run(&dir, case);
    assert_eq!(report.outcome.status, StatusKind::Cancelled);
    let round = last_round_on_record(&report, &lines, "parent");
    assert!(find(&round, "r1").1.contains(PRINTED));
    assert_eq!(find(&round, "c1").1, "cancel requested");
    let (_, skipped, is_error) = find(&round, "f1");
    assert!(skipped.starts_with("not executed: the run was stopped") && *is_error);
}

#[test]
fn cancelled_in_the_last_budgeted_round_keeps_it() {
    let dir = workspace();
    let case = Case::new(
        1,
        vec![calls(&[
            ("r1", "run_main", json!({})),
            ("c1", "cancel_run", json!({})),
            ("f1", "read_file", json!({"path": "a.txt"})),
        ])],
    );
    let (report, lines) = run(&dir, case);
    assert_eq!(report.outcome.status, StatusKind::Cancelled);
    let round = last_round_on_record(&report, &lines, "parent");
    assert!(find(&round, "r1").1.contains(PRINTED));
    assert!(find(&round, "f1").2, "f1 was not run");
}

#[test]
fn deadline_keeps_the_last_round() {
    let dir = workspace();
    let mut case = Case::new(
        4,
        vec![
            calls(&[
                ("s1", "slow", json!({})),
                ("f1", "read_file", json!({"path": "a.txt"})),
            ]),
            Ok(ModelResponse::answer("never asked")),
        ],
    );
    // The slow tool takes 600 ms; the deadline passes while it runs.
    case.limits.deadline = Some(Duration::from_millis(300));
    let (report, lines) = run(&dir, case);
    assert_eq!(report.outcome.status, StatusKind::Deadline);
    let round = last_round_on_record(&report, &lines, "parent");
    assert_eq!(find(&round, "s1").1, "slow work done");
    assert!(find(&round, "f1").1.starts_with("not executed"));
}

#[test]
fn token_limit_keeps_the_last_round() {
    let dir = workspace();
    let mut case = Case::new(
        4,
        vec![
            calls(&[
                ("t1", "task", json!({"task": "Say something long."})),
                ("f1", "read_file", json!({"path": "a.txt"})),
            ]),
            Ok(ModelResponse::answer("never asked")),
        ],
    );
    // The child's reply spends the run's tokens: the parent's next call is not run.
    let mut long = ModelResponse::answer("a long answer");
    long.usage = Some(Usage::new(400, 400));
    case.children = vec![vec![Ok(long)]];
    case.limits.max_tokens_total = Some(100);
    let (report, lines) = run(&dir, case);
    assert_eq!(report.outcome.status, StatusKind::TokenLimit);
    let round = last_round_on_record(&report, &lines, "parent");
    assert!(find(&round, "t1").1.contains("a long answer"));
    assert!(find(&round, "f1").1.starts_with("not executed"));
}

#[test]
fn a_child_s_last_round_is_on_record_too() {
    let dir = workspace();
    let mut case = Case::new(
        2,
        vec![
            calls(&[("t1", "task", json!({"task": "Read a.txt twice."}))]),
            Ok(ModelResponse::answer("done")),
        ],
    );
    // The child's budget is 4; it spends the last on a round of reads.
    case.children = vec![
        (0..4)
            .map(|i| {
                calls(&[(
                    format!("c{i}").as_str(),
                    "read_file",
                    json!({"path": "a.txt"}),
                )])
            })
            .collect(),
    ];
    let (report, lines) = run(&dir, case);
    assert_eq!(report.children[0].outcome.status, StatusKind::CallLimit);
    let round = last_round_on_record(&report, &lines, "child-1");
    assert_eq!(round, [("c3".to_owned(), "alpha\n".to_owned(), false)]);
}

/// The case through the binary: a run_main that really ran in the
/// last budgeted round leaves its output in the trace and in `--json`.
#[test]
fn the_cli_keeps_run_main_s_output_when_the_budget_is_spent() {
    let dir = workspace();
    let script = json!({"parent": [
        {"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}],
         "stop_reason": "tool_use"}
    ]});
    // The script and the trace live outside the workspace (a trace inside
    // it is refused).
    let outside = workspace();
    let script_path = outside.path().join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let trace_path: PathBuf = outside.path().join("trace.jsonl");
    let output = Command::new(common::bin())
        .args([
            "run",
            "--quiet",
            "--json",
            "--decision",
            "allow",
            "--max-calls",
            "1",
            "--workspace",
        ])
        .arg(dir.path())
        .arg("--script")
        .arg(&script_path)
        .arg("--trace")
        .arg(&trace_path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["status"], "call_limit");
    let tool = &report["tools"][0];
    assert_eq!(tool["id"], "r1");
    assert_eq!(tool["decision"], "allowed");
    let content = tool["content"]
        .as_str()
        .expect("the JSON carries the content");
    let run: Value = serde_json::from_str(content).unwrap();
    assert_eq!(run["stdout"], format!("{PRINTED}\n"));
    let trace = std::fs::read_to_string(&trace_path).unwrap();
    let line: Value = trace
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|line| line["kind"] == "tool")
        .expect("a tool line");
    assert_eq!(line["content"], content);
    assert_eq!(line["is_error"], false);
}

crate::async_twins!(
    call_limit_keeps_the_last_round,
    cancelled_keeps_the_last_round_with_budget_left,
    cancelled_in_the_last_budgeted_round_keeps_it,
    deadline_keeps_the_last_round,
    token_limit_keeps_the_last_round,
    a_child_s_last_round_is_on_record_too,
    the_cli_keeps_run_main_s_output_when_the_budget_is_spent,
);
