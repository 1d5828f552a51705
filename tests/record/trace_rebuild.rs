//! The JSON Lines trace: every line tagged, children tied to the parent's
//! `task` id, the system prompt written once per agent, each message written
//! once, every request rebuilt exactly, and no API key in it.

use crate::common;
use crate::common::RunDriven;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::host::{self, DecisionMode, Models, Settings};
use serde_json::Value;
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Model;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::StatusKind;
use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Message;
use subloop::core::protocol::Request;
use subloop::policy::permission::{AllowAll, Approver, DenyAll};
use subloop::providers::demo::{DemoChild, DemoParent};
use subloop::record::trace::{RebuiltRequest, TraceWriter};
use subloop::run::model::ChildModels;
use subloop::tools::{ReadFile, RunMain, RunSettings};

use common::{SeenRequest, TempDir};

fn demo_workspace() -> std::path::PathBuf {
    common::examples().join("workspace")
}

fn lines(trace: &str) -> Vec<Value> {
    trace
        .lines()
        .map(|line| serde_json::from_str(line).expect("every trace line is JSON"))
        .collect()
}

/// Runs the demo through the library with a trace; returns the report and the trace text.
fn library_demo(decision: DecisionMode, child_budget: u32) -> (RunReport, String) {
    let dir = TempDir::new("trace-lib");
    let path = dir.path().join("trace.jsonl");
    let mut settings = Settings::new(demo_workspace());
    settings.question = DemoParent::QUESTION.to_owned();
    settings.decision = decision;
    settings.child_budget = child_budget;
    settings.trace = Some(path.clone());
    settings.progress = false;
    let report = host::execute(&settings, Models::Demo).expect("the demo runs");
    let trace = std::fs::read_to_string(&path).expect("the trace was written");
    (report, trace)
}

#[test]
fn every_line_is_tagged_and_children_carry_the_task_id() {
    let (report, trace) = library_demo(DecisionMode::Allow, 4);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let task_id = report
        .tools
        .iter()
        .find(|tool| tool.name == "task")
        .expect("the parent delegated")
        .id
        .to_string();

    let values = lines(&trace);
    assert!(!values.is_empty());
    let mut kinds: BTreeMap<(String, String), usize> = BTreeMap::new();
    for value in &values {
        let agent = value["agent"].as_str().expect("agent is a string");
        let kind = value["kind"].as_str().expect("kind is a string");
        *kinds
            .entry((agent.to_owned(), kind.to_owned()))
            .or_default() += 1;
        match agent {
            "parent" => assert!(value.get("parent_tool_use_id").is_none(), "{value}"),
            "child-1" => assert_eq!(value["parent_tool_use_id"], task_id.as_str(), "{value}"),
            other => panic!("unexpected agent {other}"),
        }
    }
    let count = |agent: &str, kind: &str| {
        kinds
            .get(&(agent.to_owned(), kind.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(count("parent", "request"), 4);
    assert_eq!(count("parent", "response"), 4);
    assert_eq!(count("parent", "tool"), 3);
    assert_eq!(count("parent", "outcome"), 1);
    assert_eq!(count("child-1", "request"), 3);
    assert_eq!(count("child-1", "response"), 3);
    assert_eq!(count("child-1", "tool"), 2);
    assert_eq!(count("child-1", "outcome"), 1);

    // The child's three requests offer only read_file; the parent's offer all four.
    for value in &values {
        if value["kind"] != "request" {
            continue;
        }
        let tools: Vec<&str> = value["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool.as_str().unwrap())
            .collect();
        if value["agent"] == "child-1" {
            assert_eq!(tools, ["read_file"], "{value}");
        } else {
            assert_eq!(tools, ["read_file", "run_main", "todo_write", "task"]);
        }
    }

    // The parent's run_main tool line records the decision.
    let run_main = values
        .iter()
        .find(|value| value["kind"] == "tool" && value["name"] == "run_main")
        .expect("a run_main tool line");
    assert_eq!(run_main["decision"], "allowed");
    assert_eq!(run_main["is_error"], false);
    let outcome = values
        .iter()
        .find(|value| value["kind"] == "outcome" && value["agent"] == "child-1")
        .unwrap();
    assert_eq!(outcome["status"], "answered");
    assert_eq!(outcome["calls"], 3);
}

#[test]
fn the_system_prompt_is_written_on_each_agents_first_request_only() {
    let (_, trace) = library_demo(DecisionMode::Allow, 4);
    let mut seen = 0;
    for value in lines(&trace) {
        if value["kind"] != "request" {
            assert!(value.get("system").is_none(), "{value}");
            continue;
        }
        seen += 1;
        let first = value["call"] == 1;
        assert_eq!(value.get("system").is_some(), first, "{value}");
        assert_eq!(value.get("tool_definitions").is_some(), first, "{value}");
        if first {
            let expected = if value["agent"] == "parent" {
                AgentBuilder::PARENT_SYSTEM
            } else {
                SubagentConfig::CHILD_SYSTEM
            };
            assert_eq!(value["system"], expected);
        }
    }
    assert_eq!(seen, 7);
    assert_eq!(trace.matches(AgentBuilder::PARENT_SYSTEM).count(), 1);
    assert_eq!(trace.matches(SubagentConfig::CHILD_SYSTEM).count(), 1);
}

#[test]
fn the_trace_grows_linearly() {
    for (decision, budget) in [
        (DecisionMode::Allow, 4),
        (DecisionMode::Deny, 4),
        (DecisionMode::Allow, 1),
    ] {
        let (report, trace) = library_demo(decision, budget);
        let values = lines(&trace);
        let mut histories = vec![("parent".to_owned(), report.outcome.clone())];
        for child in &report.children {
            histories.push((child.agent.to_string(), child.outcome.clone()));
        }
        for (agent, outcome) in histories {
            let written: Vec<Message> = values
                .iter()
                .filter(|value| value["kind"] == "request" && value["agent"] == agent.as_str())
                .flat_map(|value| {
                    serde_json::from_value::<Vec<Message>>(value["messages"].clone()).unwrap()
                })
                .collect();
            // Each message of the history is written once, in order. The
            // history's tail after the last request (the final answer, or
            // the reply and results that spent the budget) was never sent.
            let unsent = match outcome.status {
                StatusKind::CallLimit => 2,
                _ => 1,
            };
            assert_eq!(
                written.len() + unsent,
                outcome.messages.len(),
                "{agent} ({decision:?}, {budget})"
            );
            assert_eq!(written[..], outcome.messages[..written.len()], "{agent}");
        }
        // The question is written exactly once.
        assert_eq!(trace.matches(DemoParent::QUESTION).count(), 1);
    }
}

// ------------------------------------------------------- exact rebuilding

/// Wraps a model and records every request it sees.
struct Recorder<M> {
    inner: M,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
}

impl<M: Model> Model for Recorder<M> {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.seen.lock().unwrap().push(SeenRequest {
            system: request.system.to_owned(),
            tools: request.tools.to_vec(),
            messages: request.messages.to_vec(),
            attachment: request.attachment.map(str::to_owned),
            output: request.output.cloned(),
        });
        self.inner.respond(request)
    }
}

/// Demo children, recorded per delegation number.
#[derive(Default)]
struct RecordedDemoChildren {
    logs: Mutex<BTreeMap<usize, Arc<Mutex<Vec<SeenRequest>>>>>,
}

impl ChildModels for RecordedDemoChildren {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        self.logs.lock().unwrap().insert(number, Arc::clone(&seen));
        Box::new(Recorder {
            inner: DemoChild,
            seen,
        })
    }
}

fn recorded_demo(
    workspace: &Path,
    approver: Arc<dyn Approver>,
    child_budget: u32,
) -> (RunReport, String, BTreeMap<String, Vec<SeenRequest>>) {
    let dir = TempDir::new("trace-rebuild");
    let path = dir.path().join("trace.jsonl");
    let children = Arc::new(RecordedDemoChildren::default());
    let agent = AgentBuilder::new(approver)
        .read_only_tool(ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(RunMain::new(workspace, RunSettings::default()).unwrap())
        .unwrap()
        .plan()
        .unwrap()
        .subagents(
            SubagentConfig::new(
                Arc::clone(&children) as Arc<dyn ChildModels>,
                subloop::policy::hooks::Hooks::none(),
            )
            .budget(ChildBudget::new(child_budget).unwrap()),
        )
        .unwrap()
        .monitor(TraceWriter::create(&path).unwrap())
        .build();
    let parent_seen = Arc::new(Mutex::new(Vec::new()));
    let mut parent = Recorder {
        inner: DemoParent,
        seen: Arc::clone(&parent_seen),
    };
    let report = agent
        .run_driven(DemoParent::QUESTION, Budget::new(8).unwrap(), &mut parent)
        .unwrap();
    let trace = std::fs::read_to_string(&path).unwrap();
    let mut seen = BTreeMap::new();
    seen.insert("parent".to_owned(), parent_seen.lock().unwrap().clone());
    for (number, log) in children.logs.lock().unwrap().iter() {
        seen.insert(format!("child-{number}"), log.lock().unwrap().clone());
    }
    (report, trace, seen)
}

fn assert_rebuilds_exactly(trace: &str, seen: &BTreeMap<String, Vec<SeenRequest>>) {
    let rebuilt = RebuiltRequest::from_trace(trace).expect("the trace rebuilds");
    let total: usize = seen.values().map(Vec::len).sum();
    assert_eq!(rebuilt.len(), total);
    for (agent, requests) in seen {
        let mine: Vec<_> = rebuilt.iter().filter(|r| &r.agent == agent).collect();
        assert_eq!(mine.len(), requests.len(), "{agent}");
        for (index, (rebuilt, original)) in mine.iter().zip(requests).enumerate() {
            assert_eq!(rebuilt.call, index as u64 + 1, "{agent}");
            assert_eq!(rebuilt.system, original.system, "{agent} #{index}: system");
            assert_eq!(rebuilt.tools, original.tools, "{agent} #{index}: tools");
            assert_eq!(
                rebuilt.messages, original.messages,
                "{agent} #{index}: messages"
            );
            assert_eq!(
                rebuilt.attachment, original.attachment,
                "{agent} #{index}: attachment"
            );
        }
    }
}

#[test]
fn the_trace_rebuilds_every_request_of_the_allow_run() {
    let (report, trace, seen) = recorded_demo(&demo_workspace(), Arc::new(AllowAll), 4);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert!(report.outcome.text.contains("matches"));
    assert_eq!(seen["parent"].len(), 4);
    assert_eq!(seen["child-1"].len(), 3);
    // What the models saw: the child only read_file, no plan; the parent a plan on every request.
    for request in &seen["child-1"] {
        let names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["read_file"]);
        assert_eq!(request.system, SubagentConfig::CHILD_SYSTEM);
        assert_eq!(request.attachment, None);
    }
    for request in &seen["parent"] {
        assert!(request.attachment.is_some());
    }
    assert_rebuilds_exactly(&trace, &seen);
}

#[test]
fn the_trace_rebuilds_every_request_of_the_deny_and_budget_runs() {
    let (report, trace, seen) = recorded_demo(&demo_workspace(), Arc::new(DenyAll), 4);
    assert!(report.outcome.text.contains("not run"));
    assert_eq!((seen["parent"].len(), seen["child-1"].len()), (4, 3));
    assert_rebuilds_exactly(&trace, &seen);

    let (report, trace, seen) = recorded_demo(&demo_workspace(), Arc::new(AllowAll), 1);
    assert_eq!(report.children[0].outcome.status, StatusKind::CallLimit);
    assert_eq!((seen["parent"].len(), seen["child-1"].len()), (2, 1));
    assert_rebuilds_exactly(&trace, &seen);
}

#[test]
fn a_cut_last_line_is_an_error_naming_it() {
    let (_, trace) = library_demo(DecisionMode::Deny, 4);
    let count = trace.lines().count();
    let cut = &trace[..trace.len() - 10];
    let err = RebuiltRequest::from_trace(cut).unwrap_err();
    assert!(err.starts_with(&format!("line {count}:")), "{err}");
}

/// (That no API key reaches a trace is checked on a `--live` run against
/// the mock API, in `tests/providers/live_api.rs`: the offline demo never reads one.)
#[test]
fn the_binary_s_trace_rebuilds_the_seven_demo_requests() {
    let dir = TempDir::new("trace-binary");
    let path = dir.path().join("trace.jsonl");
    let output = Command::new(common::bin())
        .args(["demo", "--decision", "allow", "--trace"])
        .arg(&path)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run subloop");
    assert_eq!(output.status.code(), Some(0));
    let trace = std::fs::read_to_string(&path).expect("the trace was written");
    let values = lines(&trace);
    assert_eq!(
        values
            .iter()
            .filter(|value| value["kind"] == "request")
            .count(),
        7
    );
    // The binary's trace rebuilds into the same seven requests.
    let rebuilt = RebuiltRequest::from_trace(&trace).unwrap();
    let agents: Vec<(&str, u64)> = rebuilt.iter().map(|r| (r.agent.as_str(), r.call)).collect();
    assert_eq!(
        agents,
        [
            ("parent", 1),
            ("child-1", 1),
            ("child-1", 2),
            ("child-1", 3),
            ("parent", 2),
            ("parent", 3),
            ("parent", 4),
        ]
    );
}

crate::async_twins!(
    every_line_is_tagged_and_children_carry_the_task_id,
    the_system_prompt_is_written_on_each_agents_first_request_only,
    the_trace_grows_linearly,
    the_trace_rebuilds_every_request_of_the_allow_run,
    the_trace_rebuilds_every_request_of_the_deny_and_budget_runs,
    a_cut_last_line_is_an_error_naming_it,
    the_binary_s_trace_rebuilds_the_seven_demo_requests,
);

// ------------------------------------------- a signal as the run finishes

/// Tells the host's shutdown that the process is ending (as the CLI's
/// signal handler does) when the parent's second request is sent, and
/// answers as the demo does.
struct SignalAtSecondRequest {
    inner: DemoParent,
    shutdown: Arc<subloop::run::shutdown::Shutdown>,
    calls: u32,
}

impl Model for SignalAtSecondRequest {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.calls += 1;
        if self.calls == 2 {
            self.shutdown
                .begin(&subloop::run::shutdown::Termination::by_signal(
                    libc::SIGINT,
                ));
        }
        self.inner.respond(request)
    }
}

/// A run that goes on finishing after the process began to end (its
/// programs were killed by the same signal, so the run sees them end)
/// ends its trace with the termination, once, and writes nothing after
/// it: the trace says what ended the run, whichever of the run and the
/// shutdown actions gets there first.
#[test]
fn a_run_finishing_while_the_process_ends_reports_the_termination() {
    let workspace = TempDir::new("trace-ending-ws");
    workspace.write("main.py", "print(42)\n");
    let dir = TempDir::new("trace-ending");
    let path = dir.path().join("trace.jsonl");
    let shutdown = subloop::run::shutdown::Shutdown::new();
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(workspace.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(RunMain::new(workspace.path(), RunSettings::default()).unwrap())
        .unwrap()
        .monitor(TraceWriter::create(&path).unwrap().on_shutdown(&shutdown))
        .build();
    let mut model = SignalAtSecondRequest {
        inner: DemoParent,
        shutdown: Arc::clone(&shutdown),
        calls: 0,
    };
    let report = agent
        .run_driven(DemoParent::QUESTION, Budget::new(8).unwrap(), &mut model)
        .unwrap();
    assert!(
        model.calls >= 2,
        "the run ended after {} calls",
        model.calls
    );
    // The run itself went on; only its trace speaks of the termination.
    assert_eq!(report.outcome.status, StatusKind::Answered);
    // The shutdown actions running now change nothing.
    shutdown.run(&subloop::run::shutdown::Termination::by_signal(
        libc::SIGINT,
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let outcomes: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "outcome").collect();
    assert_eq!(outcomes.len(), 1, "{text}");
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "outcome", "{text}");
    assert_eq!(last["status"], "cancelled", "{text}");
    assert!(
        last["text"].as_str().unwrap().contains("a second Ctrl-C"),
        "{text}"
    );
    // Nothing of the second round reached the trace.
    assert!(
        !lines
            .iter()
            .any(|l| l["kind"] == "response" && l["call"] == 2),
        "{text}"
    );
}
