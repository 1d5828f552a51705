//! Calls in one reply run in reply order: only a run of consecutive `task`
//! calls runs as one (concurrent) batch, after every earlier call of the
//! reply has finished; later calls wait for the batch.

use crate::common;
use crate::common::RunDriven;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::ScriptedReply;
use common::{TempDir, tool_results};
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Hooks;
use subloop::Model;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::StatusKind;
use subloop::agent::subagent::SubagentConfig;
use subloop::core::agent_id::AgentId;
use subloop::core::call::{CallDecision, ToolRecord};
use subloop::core::conversation::ToolOutput;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Request;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedChildren;
use subloop::providers::scripted::ScriptedModel;
use subloop::run::BoxFuture;
use subloop::run::limits::{CancelHandle, Limits};
use subloop::run::model::{AsyncModel, ChildModels, Received};
use subloop::run::monitor::Event;
use subloop::run::monitor::Monitor;
use subloop::tools::{Capability, ReadFile, RunMain, RunSettings, Tool, ToolContext};

/// The file main.py writes, and what it writes there.
const MADE: &str = "made.txt";
const MADE_TEXT: &str = "made by main";

/// A workspace whose main.py writes [`MADE`].
fn workspace() -> TempDir {
    let dir = TempDir::new("call-order");
    dir.write(
        "main.py",
        format!("open('{MADE}', 'w').write('{MADE_TEXT}')\nprint('wrote')\n"),
    );
    dir
}

/// Every monitor call, as `agent kind detail`, in the order it arrived.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<String>>>);

impl Recording {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// The position of the first line starting with `prefix`.
    fn first(&self, prefix: &str) -> usize {
        let lines = self.lines();
        lines
            .iter()
            .position(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with `{prefix}` in {lines:#?}"))
    }

    /// The position of the last line starting with `prefix`.
    fn last(&self, prefix: &str) -> usize {
        let lines = self.lines();
        lines
            .iter()
            .rposition(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with `{prefix}` in {lines:#?}"))
    }
}

impl Monitor for Recording {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        let line = match event {
            Event::Request { call, .. } => format!("{agent} request {call}"),
            Event::Response { call, .. } => format!("{agent} response {call}"),
            Event::ModelFailed { call, .. } => format!("{agent} model_failed {call}"),
            Event::ToolRequested { call } => format!("{agent} tool_requested {}", call.id()),
            Event::ToolFinished { call, .. } => format!("{agent} tool_finished {}", call.id()),
            Event::Finished { outcome } => format!("{agent} finished {}", outcome.status),
            Event::EmptyReplyContinued { call, .. } => format!("{agent} empty_reply {call}"),
            _ => format!("{agent} other event"),
        };
        self.0.lock().unwrap().push(line);
    }

    fn tool(&mut self, agent: &AgentId, record: &ToolRecord) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{agent} tool_record {}", record.id));
    }
}

fn run(
    dir: &TempDir,
    children: Arc<dyn ChildModels>,
    parent: Vec<ScriptedReply>,
) -> (RunReport, Recording) {
    let recording = Recording::default();
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(RunMain::new(dir.path(), RunSettings::default()).unwrap())
        .unwrap()
        .subagents(SubagentConfig::new(children, Hooks::none()))
        .unwrap()
        .monitor(recording.clone())
        .build();
    let report = agent
        .run_driven(
            "Run it, then check.",
            Budget::new(4).unwrap(),
            &mut ScriptedModel::new(parent),
        )
        .unwrap();
    (report, recording)
}

fn task(id: &str, n: usize) -> (String, String, Value) {
    (
        id.to_owned(),
        "task".to_owned(),
        json!({"task": format!("Read {MADE} (child {n}).")}),
    )
}

fn run_main(id: &str) -> (String, String, Value) {
    (id.to_owned(), "run_main".to_owned(), json!({}))
}

/// Child `n` reads [`MADE`], then answers.
fn reading_children(count: usize) -> Arc<dyn ChildModels> {
    Arc::new(ScriptedChildren(
        (1..=count)
            .map(|n| {
                vec![
                    Ok(ModelResponse::tool_calls([(
                        format!("c{n}_read"),
                        "read_file",
                        json!({"path": MADE}),
                    )])),
                    Ok(ModelResponse::answer(format!("child {n} read it"))),
                ]
            })
            .collect(),
    ))
}

/// What child `number` got from its read of [`MADE`].
fn child_read(report: &RunReport, number: usize) -> (String, bool) {
    let child = report
        .children
        .iter()
        .find(|child| child.agent.to_string() == format!("child-{number}"))
        .unwrap_or_else(|| panic!("no child-{number}"));
    let results = tool_results(&child.outcome.messages);
    assert_eq!(results.len(), 1, "{results:?}");
    let (_, content, is_error) = results.into_iter().next().unwrap();
    (content, is_error)
}

/// Child models that meet at a rendezvous on their first request (proving
/// that the batch still runs at once), then read [`MADE`], then answer.
struct MeetThenRead {
    arrived: Arc<AtomicUsize>,
    met: Arc<Mutex<Vec<bool>>>,
    expected: usize,
}

struct MeetThenReadModel {
    arrived: Arc<AtomicUsize>,
    met: Arc<Mutex<Vec<bool>>>,
    expected: usize,
    number: usize,
    step: usize,
}

impl MeetThenRead {
    fn model(&self, number: usize) -> MeetThenReadModel {
        MeetThenReadModel {
            arrived: self.arrived.clone(),
            met: self.met.clone(),
            expected: self.expected,
            number,
            step: 0,
        }
    }
}

/// Blocking runs get models that wait on their thread; async runs, models
/// that wait on the runtime's timer (children then meet on one task).
impl ChildModels for MeetThenRead {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        Box::new(self.model(number))
    }

    fn async_model_for(&self, number: usize) -> Box<dyn AsyncModel + Send> {
        Box::new(self.model(number))
    }
}

impl MeetThenReadModel {
    /// The reply once everyone is there (or the wait gave up); `None`
    /// while waiting.
    fn first_step(&mut self) -> Option<Result<ModelResponse, ModelFailure>> {
        self.step += 1;
        if self.step > 1 {
            return Some(Ok(ModelResponse::answer(format!(
                "child {} read it",
                self.number
            ))));
        }
        self.arrived.fetch_add(1, Ordering::SeqCst);
        None
    }

    fn after_meeting(&self) -> Result<ModelResponse, ModelFailure> {
        let all_there = self.arrived.load(Ordering::SeqCst) >= self.expected;
        self.met.lock().unwrap().push(all_there);
        Ok(ModelResponse::tool_calls([(
            format!("c{}_read", self.number),
            "read_file",
            json!({"path": MADE}),
        )]))
    }
}

impl Model for MeetThenReadModel {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        if let Some(reply) = self.first_step() {
            return reply;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.arrived.load(Ordering::SeqCst) < self.expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.after_meeting()
    }
}

impl AsyncModel for MeetThenReadModel {
    fn respond_async<'a>(
        &'a mut self,
        _request: &'a Request<'_>,
    ) -> BoxFuture<'a, Result<Received, ModelFailure>> {
        Box::pin(async move {
            let reply = match self.first_step() {
                Some(reply) => reply,
                None => {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while self.arrived.load(Ordering::SeqCst) < self.expected
                        && Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    self.after_meeting()
                }
            };
            reply.map(Received::parsed)
        })
    }
}

#[test]
fn tasks_after_run_main_in_one_reply_see_what_it_wrote_and_still_run_at_once() {
    let dir = workspace();
    let met = Arc::new(Mutex::new(Vec::new()));
    let children = Arc::new(MeetThenRead {
        arrived: Arc::new(AtomicUsize::new(0)),
        met: met.clone(),
        expected: 2,
    });
    let parent = vec![
        Ok(ModelResponse::tool_calls([
            run_main("r1"),
            task("t1", 1),
            task("t2", 2),
        ])),
        Ok(ModelResponse::answer("done")),
    ];
    let (report, recording) = run(&dir, children, parent);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    // Both children read the file run_main wrote before they started.
    for number in 1..=2 {
        assert_eq!(child_read(&report, number), (MADE_TEXT.to_owned(), false));
    }
    // The two consecutive tasks still ran as one batch, at the same time.
    assert_eq!(*met.lock().unwrap(), vec![true, true]);
    // Events: run_main requested, finished and recorded before any child starts.
    let finished = recording.first("parent tool_finished r1");
    assert!(recording.first("parent tool_record r1") < finished);
    assert!(
        finished < recording.first("child-1 "),
        "{:#?}",
        recording.lines()
    );
    assert!(
        finished < recording.first("child-2 "),
        "{:#?}",
        recording.lines()
    );
    // Children numbered in call order; records and results in call order.
    let numbering: Vec<(String, String)> = report
        .children
        .iter()
        .map(|child| {
            (
                child.agent.to_string(),
                child.parent_tool_use_id.to_string(),
            )
        })
        .collect();
    assert_eq!(
        numbering,
        [
            ("child-1".to_owned(), "t1".to_owned()),
            ("child-2".to_owned(), "t2".to_owned())
        ]
    );
    let ids: Vec<&str> = report.tools.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["r1", "t1", "t2"]);
    let result_ids: Vec<String> = tool_results(&report.outcome.messages)
        .into_iter()
        .map(|(id, ..)| id)
        .collect();
    assert_eq!(result_ids, ["r1", "t1", "t2"]);
}

#[test]
fn a_call_between_two_tasks_splits_them_into_two_batches_of_one() {
    let dir = workspace();
    let parent = vec![
        Ok(ModelResponse::tool_calls([
            task("t1", 1),
            run_main("r1"),
            task("t2", 2),
        ])),
        Ok(ModelResponse::answer("done")),
    ];
    let (report, recording) = run(&dir, reading_children(2), parent);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    // The first task ran before run_main: nothing to read yet.
    let (first, first_error) = child_read(&report, 1);
    assert!(first_error, "child-1 read before main.py ran: {first}");
    // The second ran after it.
    assert_eq!(child_read(&report, 2), (MADE_TEXT.to_owned(), false));
    // child-1 is over before run_main starts; child-2 starts after run_main is done.
    let lines = recording.lines();
    assert!(
        recording.last("child-1 ") < recording.first("parent tool_requested r1"),
        "{lines:#?}"
    );
    assert!(
        recording.first("parent tool_finished r1") < recording.first("child-2 "),
        "{lines:#?}"
    );
    let numbering: Vec<String> = report
        .children
        .iter()
        .map(|child| format!("{} {}", child.agent, child.parent_tool_use_id))
        .collect();
    assert_eq!(numbering, ["child-1 t1", "child-2 t2"]);
}

#[test]
fn later_calls_wait_for_the_batch_before_them() {
    let dir = workspace();
    let parent = vec![
        Ok(ModelResponse::tool_calls([
            task("t1", 1),
            task("t2", 2),
            run_main("r1"),
            task("t3", 3),
            task("t4", 4),
        ])),
        Ok(ModelResponse::answer("done")),
    ];
    let (report, recording) = run(&dir, reading_children(4), parent);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    for number in 1..=2 {
        assert!(
            child_read(&report, number).1,
            "child-{number} ran before main.py"
        );
    }
    for number in 3..=4 {
        assert_eq!(child_read(&report, number), (MADE_TEXT.to_owned(), false));
    }
    let run_main_starts = recording.first("parent tool_requested r1");
    let run_main_done = recording.first("parent tool_finished r1");
    for number in 1..=2 {
        assert!(recording.last(&format!("child-{number} ")) < run_main_starts);
    }
    for number in 3..=4 {
        assert!(run_main_done < recording.first(&format!("child-{number} ")));
    }
    let ids: Vec<&str> = report.tools.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["t1", "t2", "r1", "t3", "t4"]);
}

#[test]
fn the_cli_prints_run_main_s_progress_before_the_children_s() {
    let dir = workspace();
    let child = |n: usize| {
        json!([
            {"content": [{"type": "tool_use", "id": format!("c{n}_read"), "name": "read_file", "input": {"path": MADE}}],
             "stop_reason": "tool_use"},
            {"content": [{"type": "text", "text": format!("child {n} read it")}], "stop_reason": "end_turn"}
        ])
    };
    let script = json!({
        "parent": [
            {"content": [
                {"type": "tool_use", "id": "r1", "name": "run_main", "input": {}},
                {"type": "tool_use", "id": "t1", "name": "task", "input": {"task": "Read made.txt."}},
                {"type": "tool_use", "id": "t2", "name": "task", "input": {"task": "Read made.txt too."}}
             ], "stop_reason": "tool_use"},
            {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}
        ],
        "children": [child(1), child(2)]
    });
    let script_path = dir.path().join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let output = Command::new(common::bin())
        .args(["run", "--decision", "allow", "--json", "--workspace"])
        .arg(dir.path())
        .arg("--script")
        .arg(&script_path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8(output.stderr).unwrap();
    let position = |needle: &str| {
        stderr
            .find(needle)
            .unwrap_or_else(|| panic!("`{needle}` not in stderr:\n{stderr}"))
    };
    let run_main_done = position("[parent]   run_main -> ok");
    assert!(position("[parent] tool run_main (r1)") < run_main_done);
    assert!(run_main_done < position("[child-1]"), "{stderr}");
    assert!(run_main_done < position("[child-2]"), "{stderr}");
    assert!(
        run_main_done < position("[parent] tool task (t1)"),
        "{stderr}"
    );
    // Both children read what main.py wrote.
    let report: Value = serde_json::from_str(&String::from_utf8(output.stdout).unwrap()).unwrap();
    let children = report["children"].as_array().unwrap();
    assert_eq!(children.len(), 2);
    for child in children {
        assert_eq!(child["status"], "answered", "{child}");
        assert_eq!(child["tools"][0]["is_error"], false, "{child}");
    }
}

/// A tool that cancels the run it is part of.
struct CancelRun(CancelHandle);

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

#[test]
fn a_stop_during_an_earlier_call_keeps_the_batch_after_it_from_starting() {
    let dir = workspace();
    let cancel = CancelHandle::new();
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .limits(Limits::default(), cancel.clone())
        .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(CancelRun(cancel))
        .unwrap()
        .subagents(SubagentConfig::new(reading_children(2), Hooks::none()))
        .unwrap()
        .build();
    let mut model = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("c1".to_owned(), "cancel_run".to_owned(), json!({})),
            task("t1", 1),
            task("t2", 2),
        ])),
        Ok(ModelResponse::answer("never asked")),
    ]);
    let report = agent
        .run_driven("Stop, then delegate.", Budget::new(4).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::Cancelled);
    assert!(
        report.children.is_empty(),
        "no child started after the stop"
    );
    let decisions: Vec<CallDecision> = report.tools.iter().map(|t| t.decision).collect();
    assert_eq!(
        decisions,
        [
            CallDecision::NotRequired,
            CallDecision::Stopped,
            CallDecision::Stopped
        ]
    );
    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 3);
    for (_, content, is_error) in &results[1..] {
        assert!(content.starts_with("not executed: the run was stopped") && *is_error);
    }
}

crate::async_twins!(
    tasks_after_run_main_in_one_reply_see_what_it_wrote_and_still_run_at_once,
    a_call_between_two_tasks_splits_them_into_two_batches_of_one,
    later_calls_wait_for_the_batch_before_them,
    the_cli_prints_run_main_s_progress_before_the_children_s,
    a_stop_during_an_earlier_call_keeps_the_batch_after_it_from_starting,
);
