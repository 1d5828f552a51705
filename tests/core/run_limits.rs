//! Run-wide limits (tool calls per reply, delegations, deadline, tokens) and cancellation.

use crate::common;
use crate::common::RunDriven;

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::ScriptedReply;
use common::TempDir;
use proptest::prelude::*;
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Hooks;
use subloop::Model;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::StatusKind;
use subloop::agent::subagent::SubagentConfig;
use subloop::core::call::CallDecision;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::Request;
use subloop::core::protocol::Role;
use subloop::core::protocol::Usage;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedChildren;
use subloop::providers::scripted::ScriptedModel;
use subloop::record::trace::TraceWriter;
use subloop::run::BoxFuture;
use subloop::run::limits::{CancelHandle, Limits};
use subloop::run::model::{AsyncModel, ChildModels, Received};
use subloop::tools::{ReadFile, RunMain, RunSettings};

fn workspace() -> TempDir {
    let dir = TempDir::new("limits");
    dir.write("main.py", "print(6 * 7)\n");
    dir.write("a.txt", "alpha\n");
    dir
}

fn agent(
    dir: &TempDir,
    limits: Limits,
    cancel: CancelHandle,
    children: Arc<dyn ChildModels>,
) -> AgentBuilder {
    AgentBuilder::new(Arc::new(AllowAll))
        .limits(limits, cancel)
        .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(
            RunMain::new(
                dir.path(),
                RunSettings::new(vec!["sh".into(), "-c".into(), "sleep 1; echo slept".into()])
                    .with_timeout(Duration::from_secs(5))
                    .with_output_cap(4096),
            )
            .unwrap(),
        )
        .unwrap()
        .subagents(SubagentConfig::new(children, Hooks::none()))
        .unwrap()
}

fn reads(prefix: &str, count: usize) -> ModelResponse {
    ModelResponse::tool_calls((0..count).map(|i| {
        (
            format!("{prefix}{i}"),
            "read_file",
            json!({"path": "a.txt"}),
        )
    }))
}

fn task(id: &str) -> ModelResponse {
    ModelResponse::tool_calls([(
        id,
        "task",
        json!({"task": "Read a.txt and say what it holds."}),
    )])
}

fn with_usage(mut reply: ModelResponse, input: u64, output: u64) -> ModelResponse {
    reply.usage = Some(Usage::new(input, output));
    reply
}

/// The tool results of the user message after assistant message `index`.
fn results_after(messages: &[Message], index: usize) -> Vec<(String, String, bool)> {
    messages[index + 1]
        .content
        .iter()
        .map(|block| match block {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => (tool_use_id.to_string(), content.text(), *is_error),
            other => panic!("not a result: {other:?}"),
        })
        .collect()
}

fn child_answers(count: usize) -> Arc<dyn ChildModels> {
    Arc::new(ScriptedChildren(
        (0..count)
            .map(|i| {
                vec![Ok(ModelResponse::answer(format!(
                    "child {} says alpha",
                    i + 1
                )))]
            })
            .collect(),
    ))
}

#[test]
fn forty_tools_in_one_reply_run_sixteen_and_refuse_twenty_four() {
    let dir = workspace();
    let agent = agent(
        &dir,
        Limits::default(),
        CancelHandle::new(),
        child_answers(0),
    )
    .build();
    let mut model = ScriptedModel::new(vec![Ok(reads("t", 40)), Ok(ModelResponse::answer("done"))]);
    let report = agent
        .run_driven("read", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    let results = results_after(&report.outcome.messages, 1);
    assert_eq!(results.len(), 40, "every id gets exactly one result");
    for (i, (id, text, is_error)) in results.iter().enumerate() {
        assert_eq!(id, &format!("t{i}"));
        if i < 16 {
            assert_eq!((text.as_str(), *is_error), ("alpha\n", false));
        } else {
            assert_eq!(
                text,
                "not executed: too many tool calls in one reply (limit 16)"
            );
            assert!(is_error);
        }
    }
    let over = report
        .tools
        .iter()
        .filter(|r| r.decision == CallDecision::OverLimit)
        .count();
    assert_eq!(over, 24);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.to_json()["accounting"]["parent"]["tool_calls"], 40);
}

fn report_of(text: &str) -> Value {
    serde_json::from_str(text).expect("a task report")
}

#[test]
fn twelve_sequential_delegations_run_eight_children_and_refuse_four() {
    let dir = workspace();
    let agent = agent(
        &dir,
        Limits::default(),
        CancelHandle::new(),
        child_answers(12),
    )
    .build();
    let mut replies: Vec<ScriptedReply> = (0..12).map(|i| Ok(task(&format!("p{i}")))).collect();
    replies.push(Ok(ModelResponse::answer("done")));
    let report = agent
        .run_driven(
            "delegate",
            Budget::new(13).unwrap(),
            &mut ScriptedModel::new(replies),
        )
        .unwrap();
    assert_eq!(report.children.len(), 8);
    for i in 0..12 {
        let (id, text, is_error) = results_after(&report.outcome.messages, 1 + 2 * i).remove(0);
        assert_eq!(id, format!("p{i}"));
        let body = report_of(&text);
        if i < 8 {
            assert_eq!(body["status"], "answered");
            assert_eq!(body["summary"], format!("child {} says alpha", i + 1));
            assert!(!is_error);
        } else {
            assert_eq!(body["status"], "delegation_limit");
            assert_eq!(body["calls"], 0);
            assert!(
                body["summary"]
                    .as_str()
                    .unwrap()
                    .contains("delegation limit reached")
            );
            assert!(is_error);
        }
    }
    assert_eq!(report.to_json()["accounting"]["total"]["delegations"], 8);
}

#[test]
fn twelve_delegations_in_one_reply_run_the_first_eight() {
    let dir = workspace();
    let limits = Limits::default().with_max_delegations(8);
    let agent = agent(&dir, limits, CancelHandle::new(), child_answers(12)).build();
    let calls = ModelResponse::tool_calls(
        (0..12).map(|i| (format!("p{i}"), "task", json!({"task": format!("job {i}")}))),
    );
    let mut model = ScriptedModel::new(vec![Ok(calls), Ok(ModelResponse::answer("done"))]);
    let report = agent
        .run_driven("delegate", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    let results = results_after(&report.outcome.messages, 1);
    let statuses: Vec<Value> = results
        .iter()
        .map(|(_, text, _)| report_of(text)["status"].clone())
        .collect();
    assert_eq!(statuses[..8], vec![json!("answered"); 8][..]);
    assert_eq!(statuses[8..], vec![json!("delegation_limit"); 4][..]);
    let numbers: Vec<String> = report
        .children
        .iter()
        .map(|c| c.agent.to_string())
        .collect();
    assert_eq!(
        numbers,
        (1..=8).map(|n| format!("child-{n}")).collect::<Vec<_>>()
    );
}

#[test]
fn a_deadline_during_a_slow_tool_stops_the_run_at_the_next_boundary() {
    let dir = workspace();
    let limits = Limits::default().with_deadline(Duration::from_millis(300));
    let agent = agent(&dir, limits, CancelHandle::new(), child_answers(0)).build();
    let two_runs =
        ModelResponse::tool_calls([("r1", "run_main", json!({})), ("r2", "run_main", json!({}))]);
    let mut model = ScriptedModel::new(vec![
        Ok(two_runs),
        Ok(reads("t", 1)),
        Ok(ModelResponse::answer("done")),
    ]);
    let started = Instant::now();
    let report = agent
        .run_driven("run it", Budget::new(5).unwrap(), &mut model)
        .unwrap();
    let elapsed = started.elapsed();
    // Within the deadline plus the running tool's own timeout (5 s).
    assert!(
        elapsed < Duration::from_millis(300) + Duration::from_secs(5),
        "{elapsed:?}"
    );
    assert_eq!(report.outcome.status, StatusKind::Deadline);
    assert_eq!(
        report.outcome.calls, 1,
        "no model request after the deadline"
    );
    assert!(
        report.outcome.text.contains("deadline"),
        "{}",
        report.outcome.text
    );
    let results = results_after(&report.outcome.messages, 1);
    assert!(
        results[0].1.contains("slept"),
        "the running tool finished and was recorded: {:?}",
        results[0]
    );
    assert!(
        results[1]
            .1
            .starts_with("not executed: the run was stopped"),
        "{:?}",
        results[1]
    );
    assert_eq!(report.to_json()["status"], "deadline");
}

#[test]
fn a_token_budget_crossed_by_usage_stops_at_the_next_boundary() {
    let dir = workspace();
    let limits = Limits::default().with_max_tokens_total(1200);
    let agent = agent(&dir, limits, CancelHandle::new(), child_answers(0)).build();
    let replies: Vec<ScriptedReply> = (0..6)
        .map(|i| Ok(with_usage(reads(&format!("r{i}_"), 1), 400, 100)))
        .collect();
    let report = agent
        .run_driven(
            "read",
            Budget::new(8).unwrap(),
            &mut ScriptedModel::new(replies),
        )
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::TokenLimit);
    assert_eq!(
        report.outcome.calls, 3,
        "1000 tokens after two replies, 1500 after three"
    );
    assert!(
        report.outcome.text.contains("1500 tokens used"),
        "{}",
        report.outcome.text
    );
    // The third reply's tools still ran: every id is answered.
    assert_eq!(report.outcome.messages.len(), 7);
}

#[test]
fn a_child_s_tokens_count_against_the_run() {
    let dir = workspace();
    let limits = Limits::default().with_max_tokens_total(1000);
    let child: Arc<dyn ChildModels> = Arc::new(ScriptedChildren(vec![vec![
        Ok(with_usage(reads("c", 1), 900, 200)),
        Ok(ModelResponse::answer("never reached")),
    ]]));
    let agent = agent(&dir, limits, CancelHandle::new(), child).build();
    let mut model = ScriptedModel::new(vec![Ok(task("p0")), Ok(ModelResponse::answer("done"))]);
    let report = agent
        .run_driven("delegate", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.children[0].outcome.status, StatusKind::TokenLimit);
    assert_eq!(report.children[0].outcome.calls, 1);
    assert_eq!(report.outcome.status, StatusKind::TokenLimit);
    assert_eq!(report.outcome.calls, 1);
    let (_, text, is_error) = results_after(&report.outcome.messages, 1).remove(0);
    assert_eq!(report_of(&text)["status"], "token_limit");
    assert!(is_error);
}

/// A child model that tells the test it is running, then waits to be cancelled.
struct Waiting {
    started: Mutex<Option<mpsc::Sender<()>>>,
    cancel: CancelHandle,
}

impl ChildModels for Waiting {
    fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
        let signal = self.started.lock().unwrap().take();
        Box::new(WaitingModel {
            signal,
            cancel: self.cancel.clone(),
        })
    }
}

struct WaitingModel {
    signal: Option<mpsc::Sender<()>>,
    cancel: CancelHandle,
}

impl Model for WaitingModel {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        if let Some(signal) = self.signal.take() {
            let _ = signal.send(());
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.cancel.is_cancelled() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(reads("c", 2))
    }
}

#[test]
fn cancelling_from_another_thread_during_a_child_s_turn_stops_everything() {
    let dir = workspace();
    let cancel = CancelHandle::new();
    let (sender, receiver) = mpsc::channel();
    let children = Arc::new(Waiting {
        started: Mutex::new(Some(sender)),
        cancel: cancel.clone(),
    });
    let trace_path = dir.path().join("trace.jsonl");
    let agent = agent(&dir, Limits::default(), cancel.clone(), children)
        .monitor(TraceWriter::create(&trace_path).unwrap())
        .build();
    let canceller = std::thread::spawn(move || {
        receiver
            .recv_timeout(Duration::from_secs(20))
            .expect("the child started");
        cancel.cancel();
    });
    let mut model = ScriptedModel::new(vec![
        Ok(task("p0")),
        Ok(ModelResponse::answer("never reached")),
    ]);
    let report = agent
        .run_driven("delegate", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    canceller.join().unwrap();
    let child = &report.children[0];
    assert_eq!(child.outcome.status, StatusKind::Cancelled);
    // The child's reply was recorded, and its tools were answered without running.
    let results = results_after(&child.outcome.messages, 1);
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|(_, text, e)| *e && text.starts_with("not executed: the run was stopped"))
    );
    assert_eq!(report.outcome.status, StatusKind::Cancelled);
    assert_eq!(report.outcome.calls, 1);
    let (_, text, _) = results_after(&report.outcome.messages, 1).remove(0);
    assert_eq!(report_of(&text)["status"], "cancelled");
    let trace = std::fs::read_to_string(&trace_path).unwrap();
    let last: Value = serde_json::from_str(trace.lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["agent"].as_str(), last["kind"].as_str()),
        (Some("parent"), Some("outcome"))
    );
    assert_eq!(last["status"], "cancelled");
}

fn script_file(dir: &TempDir, parent: Vec<Value>, children: Vec<Vec<Value>>) -> std::path::PathBuf {
    dir.write(
        "script.json",
        json!({"parent": parent, "children": children}).to_string(),
    )
}

#[test]
fn the_cli_stops_delegating_at_the_limit_with_a_clear_message() {
    let dir = workspace();
    let mut parent: Vec<Value> = (0..10)
        .map(|i| json!({"content": [{"type": "tool_use", "id": format!("p{i}"), "name": "task", "input": {"task": "Read a.txt"}}], "stop_reason": "tool_use"}))
        .collect();
    parent.push(json!({"content": [{"type": "text", "text": "stopped delegating"}], "stop_reason": "end_turn"}));
    let children = (0..10)
        .map(|_| {
            vec![json!({"content": [{"type": "text", "text": "alpha"}], "stop_reason": "end_turn"})]
        })
        .collect();
    let script = script_file(&dir, parent, children);
    let output = Command::new(common::bin())
        .args([
            "run",
            "--json",
            "--decision",
            "deny",
            "--max-calls",
            "11",
            "--workspace",
        ])
        .arg(dir.path())
        .arg("--script")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["children"].as_array().unwrap().len(), 8);
    assert_eq!(json["accounting"]["total"]["delegations"], 8);
    assert_eq!(json["limits"]["max_delegations"], 8);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("delegation limit reached").count(),
        2,
        "{stderr}"
    );
    let limited = Command::new(common::bin())
        .args([
            "run",
            "--json",
            "--quiet",
            "--decision",
            "deny",
            "--max-calls",
            "11",
            "--max-delegations",
            "3",
            "--workspace",
        ])
        .arg(dir.path())
        .arg("--script")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&limited.stdout).unwrap();
    assert_eq!(json["children"].as_array().unwrap().len(), 3);
}

#[test]
fn ctrl_c_cancels_the_cli_run_and_the_trace_ends_with_an_outcome() {
    let dir = workspace();
    let parent: Vec<Value> = (0..200)
        .map(|i| json!({"content": [{"type": "tool_use", "id": format!("r{i}"), "name": "run_main", "input": {}}], "stop_reason": "tool_use"}))
        .collect();
    let script = script_file(&dir, parent, vec![]);
    // The trace may not live in the workspace, where the program could read it.
    let outside = TempDir::new("limits-trace");
    let trace = outside.path().join("trace.jsonl");
    let child = common::default_signals(&mut Command::new(common::bin()))
        .args([
            "run",
            "--quiet",
            "--decision",
            "allow",
            "--max-calls",
            "200",
            "--run-command",
            "sleep 0.05",
            "--workspace",
        ])
        .arg(dir.path())
        .arg("--script")
        .arg(&script)
        .arg("--trace")
        .arg(&trace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&trace)
        .unwrap_or_default()
        .lines()
        .count()
        < 12
    {
        assert!(Instant::now() < deadline, "the run did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = std::fs::read_to_string(&trace).unwrap();
    // SAFETY: sends SIGINT to the child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "cancelled is not answered");
    assert!(String::from_utf8_lossy(&output.stdout).contains("cancelled"));
    let after = std::fs::read_to_string(&trace).unwrap();
    assert!(after.starts_with(&before[..before.rfind('\n').unwrap() + 1]));
    let last: Value = serde_json::from_str(after.lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["status"].as_str()),
        (Some("outcome"), Some("cancelled"))
    );
}

fn check_pairs(messages: &[Message]) -> Result<(), TestCaseError> {
    for (index, message) in messages.iter().enumerate() {
        if message.role != Role::Assistant {
            continue;
        }
        let asked: Vec<String> = message
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, .. } => Some(id.to_string()),
                _ => None,
            })
            .collect();
        if asked.is_empty() {
            continue;
        }
        prop_assert!(index + 1 < messages.len(), "unanswered calls");
        let answered: Vec<String> = results_after(messages, index)
            .into_iter()
            .map(|(id, ..)| id)
            .collect();
        prop_assert_eq!(answered, asked);
    }
    Ok(())
}

fn run_case(report: &RunReport, limits: &Limits) -> Result<(), TestCaseError> {
    check_pairs(&report.outcome.messages)?;
    for child in &report.children {
        check_pairs(&child.outcome.messages)?;
    }
    prop_assert!(report.children.len() <= limits.max_delegations);
    // Per reply, at most max_tools_per_reply calls were let through.
    let mut records = report.tools.iter();
    for message in report
        .outcome
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
    {
        let calls = message
            .content
            .iter()
            .filter(|b| matches!(b, Block::ToolUse { .. }))
            .count();
        let ran = records
            .by_ref()
            .take(calls)
            .filter(|r| !matches!(r.decision, CallDecision::OverLimit | CallDecision::Stopped))
            .count();
        prop_assert!(ran <= limits.max_tools_per_reply);
    }
    if let Some(max) = limits.max_tokens_total {
        // Each agent stops at its next turn boundary once the budget is
        // spent, so each may overshoot it by the one request it had in
        // flight: children of one batch run side by side (in a blocking
        // run, on threads of their own), and each can be mid-request when
        // another spends the last tokens.
        let spent = |calls: &[subloop::core::protocol::Usage]| -> (u64, u64) {
            let all: Vec<u64> = calls
                .iter()
                .map(|u| u.input_tokens + u.output_tokens)
                .collect();
            (all.iter().sum(), all.iter().copied().max().unwrap_or(0))
        };
        let (mut total, mut overshoot) = spent(&report.usage_per_call);
        for child in &report.children {
            let (child_total, child_largest) = spent(&child.usage_per_call);
            total += child_total;
            overshoot += child_largest;
        }
        prop_assert!(
            total < max + overshoot.max(1),
            "ran on past the token budget: {total} of {max}"
        );
    }
    Ok(())
}

fn limited_reply() -> impl Strategy<Value = ModelResponse> {
    let call = prop_oneof![
        Just(("read_file", json!({"path": "a.txt"}))),
        Just(("task", json!({"task": "Read a.txt"}))),
        Just(("nope", json!({}))),
    ];
    (prop::collection::vec(call, 0..6), 0u64..300).prop_map(|(calls, tokens)| {
        let reply = if calls.is_empty() {
            ModelResponse::answer("done")
        } else {
            ModelResponse::tool_calls(
                calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (n, input))| (format!("t{i}"), n, input)),
            )
        };
        with_usage(reply, tokens, 10)
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(48),
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "proptest-regressions/run_limits.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn under_arbitrary_limits_every_id_is_answered_once_and_no_limit_is_exceeded(
        parent in prop::collection::vec(limited_reply(), 1..6),
        children in prop::collection::vec(prop::collection::vec(limited_reply(), 1..3), 0..6),
        max_tools in 1usize..5,
        max_delegations in 0usize..4,
        tokens in proptest::option::of(100u64..1500),
    ) {
        let dir = workspace();
        let mut limits = Limits::default().with_max_tools_per_reply(max_tools).with_max_delegations(max_delegations);
        limits.max_tokens_total = tokens;
        let children: Vec<Vec<ScriptedReply>> = children.into_iter().map(|c| c.into_iter().map(Ok).collect()).collect();
        let agent = AgentBuilder::new(Arc::new(AllowAll))
            .limits(limits, CancelHandle::new())
            .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap()).unwrap()
            .subagents(SubagentConfig::new(Arc::new(ScriptedChildren(children)), Hooks::none())).unwrap()
            .build();
        let mut model = ScriptedModel::new(parent.into_iter().map(Ok).collect());
        let report = agent.run_driven("go", Budget::new(6).unwrap(), &mut model).unwrap();
        run_case(&report, &limits)?;
    }
}

/// Children that take `delay` before answering.
struct Slow(Duration);

/// Blocking runs get models that sleep on their thread; async runs, models
/// that wait on the runtime's timer.
impl ChildModels for Slow {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        Box::new(SlowModel(self.0, number))
    }

    fn async_model_for(&self, number: usize) -> Box<dyn AsyncModel + Send> {
        Box::new(SlowModel(self.0, number))
    }
}

struct SlowModel(Duration, usize);

impl Model for SlowModel {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        std::thread::sleep(self.0);
        Ok(ModelResponse::answer(format!("child {} finished", self.1)))
    }
}

impl AsyncModel for SlowModel {
    fn respond_async<'a>(
        &'a mut self,
        _request: &'a Request<'_>,
    ) -> BoxFuture<'a, Result<Received, ModelFailure>> {
        Box::pin(async move {
            tokio::time::sleep(self.0).await;
            Ok(Received::parsed(ModelResponse::answer(format!(
                "child {} finished",
                self.1
            ))))
        })
    }
}

#[test]
fn parallel_children_that_finished_keep_their_reports_when_the_deadline_passes() {
    let dir = workspace();
    let limits = Limits::default().with_deadline(Duration::from_millis(150));
    let children: Arc<dyn ChildModels> = Arc::new(Slow(Duration::from_millis(400)));
    let agent = agent(&dir, limits, CancelHandle::new(), children).build();
    let two = ModelResponse::tool_calls([
        ("p1", "task", json!({"task": "first"})),
        ("p2", "task", json!({"task": "second"})),
    ]);
    let mut model = ScriptedModel::new(vec![Ok(two), Ok(ModelResponse::answer("never reached"))]);
    let report = agent
        .run_driven("delegate", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::Deadline);
    let results = results_after(&report.outcome.messages, 1);
    for (i, (id, text, is_error)) in results.iter().enumerate() {
        assert_eq!(id, &format!("p{}", i + 1));
        let body = report_of(text);
        assert_eq!(
            body["status"], "answered",
            "the child's finished report is kept: {text}"
        );
        assert_eq!(body["summary"], format!("child {} finished", i + 1));
        assert!(!is_error);
    }
    assert_eq!(report.tools.len(), 2, "both calls are on record");
}

#[test]
fn tools_answered_because_the_run_stopped_are_on_record() {
    let dir = workspace();
    let limits = Limits::default().with_max_tokens_total(10);
    let agent = agent(&dir, limits, CancelHandle::new(), child_answers(0)).build();
    let mut model = ScriptedModel::new(vec![Ok(with_usage(reads("t", 3), 50, 5))]);
    let report = agent
        .run_driven("read", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::TokenLimit);
    let decisions: Vec<CallDecision> = report.tools.iter().map(|r| r.decision).collect();
    assert_eq!(decisions, vec![CallDecision::Stopped; 3]);
    assert_eq!(
        report.audit.len(),
        6,
        "a before and an after entry per call"
    );
    assert!(
        report
            .outcome
            .text
            .contains("stopped before model request 2"),
        "{}",
        report.outcome.text
    );
}

#[test]
fn limits_set_after_subagents_still_bind_the_children() {
    let dir = workspace();
    let limits = Limits::default().with_max_delegations(1);
    // `.limits()` after `.subagents()`: the task tool must see the same guard.
    let agent = agent(
        &dir,
        Limits::default(),
        CancelHandle::new(),
        child_answers(3),
    )
    .limits(limits, CancelHandle::new())
    .build();
    let three =
        ModelResponse::tool_calls((0..3).map(|i| (format!("p{i}"), "task", json!({"task": "go"}))));
    let mut model = ScriptedModel::new(vec![Ok(three), Ok(ModelResponse::answer("done"))]);
    let report = agent
        .run_driven("delegate", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.children.len(), 1);
}

#[test]
fn a_second_ctrl_c_kills_the_running_program_before_exiting() {
    let dir = workspace();
    let parent = vec![
        json!({"content": [{"type": "tool_use", "id": "r0", "name": "run_main", "input": {}}], "stop_reason": "tool_use"}),
    ];
    let script = script_file(&dir, parent, vec![]);
    let pid_file = dir.path().join("group.pid");
    let child = common::default_signals(&mut Command::new(common::bin()))
        .args([
            "run",
            "--quiet",
            "--decision",
            "allow",
            "--run-timeout",
            "60",
            "--run-command",
        ])
        .arg(format!(
            "sh -c 'echo $$ > {}; sleep 30'",
            pid_file.display()
        ))
        .arg("--workspace")
        .arg(dir.path())
        .arg("--script")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let group: libc::pid_t = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the program did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    for _ in 0..2 {
        // SAFETY: signals the child we spawned.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(130));
    // The program's whole group is gone (or only zombies await their reaper).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: signal 0 only checks whether the group exists.
        let alive = unsafe { libc::kill(-group, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{group}/stat"))
            .map(|stat| stat.contains(") Z "))
            .unwrap_or(true);
        if !alive || zombie {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the program's group outlived a double Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stop_during_the_last_budgeted_round_reports_the_stop_not_the_budget() {
    let dir = workspace();
    let limits = Limits::default().with_max_tokens_total(10);
    let agent = agent(&dir, limits, CancelHandle::new(), child_answers(0)).build();
    let mut model = ScriptedModel::new(vec![Ok(with_usage(reads("t", 2), 50, 5))]);
    let report = agent
        .run_driven("read", Budget::new(1).unwrap(), &mut model)
        .unwrap();
    assert_eq!(
        report.outcome.status,
        StatusKind::TokenLimit,
        "{}",
        report.outcome.text
    );
    let decisions: Vec<CallDecision> = report.tools.iter().map(|r| r.decision).collect();
    assert_eq!(decisions, vec![CallDecision::Stopped; 2]);
}

crate::async_twins!(
    forty_tools_in_one_reply_run_sixteen_and_refuse_twenty_four,
    twelve_sequential_delegations_run_eight_children_and_refuse_four,
    twelve_delegations_in_one_reply_run_the_first_eight,
    a_deadline_during_a_slow_tool_stops_the_run_at_the_next_boundary,
    a_token_budget_crossed_by_usage_stops_at_the_next_boundary,
    a_child_s_tokens_count_against_the_run,
    cancelling_from_another_thread_during_a_child_s_turn_stops_everything,
    the_cli_stops_delegating_at_the_limit_with_a_clear_message,
    ctrl_c_cancels_the_cli_run_and_the_trace_ends_with_an_outcome,
    parallel_children_that_finished_keep_their_reports_when_the_deadline_passes,
    tools_answered_because_the_run_stopped_are_on_record,
    limits_set_after_subagents_still_bind_the_children,
    a_second_ctrl_c_kills_the_running_program_before_exiting,
    a_stop_during_the_last_budgeted_round_reports_the_stop_not_the_budget,
);
