//! Compaction in runs: a history is compacted when its trigger says so or
//! when the server refuses a request for its length, through the
//! conversation's own transition, for the parent and each child; every
//! request sent afterwards keeps the protocol, the trace records each
//! compaction, `view --check` holds across it, `replay` reproduces it, and
//! `--resume` and follow-ups rebuild through it. With compaction off (or
//! blocked by a `PreCompact` hook) an overflow ends `context_overflow`,
//! never `model_error` and never a loop.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};
use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::core::compaction::{
    ClearToolResults, Compaction, Compactor, SlidingWindow, Threshold, Tiered,
};
use subloop::core::error::{FailureKind, ModelFailure};
use subloop::core::protocol::{Block, Message, Usage};
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedChildren;
use subloop::record::invariants::Policy;
use subloop::record::recorded::RecordedRun;
use subloop::record::replay::Replay;
use subloop::record::trace::TraceWriter;
use subloop::tools::ReadFile;
use subloop::{AgentBuilder, Approver, Budget, Hooks, ModelResponse, StatusKind};

use crate::common::{self, Driver, RecordingModel, RunDriven, ScriptedReply, TempDir};
use crate::host::{self, DecisionMode, Models, Settings};

/// Anthropic's refusal of a prompt too long for the window, as a failure.
fn too_long() -> ModelFailure {
    ModelFailure::with_kind(
        FailureKind::ContextWindow,
        "prompt is too long: 210000 tokens > 200000 maximum",
    )
}

fn read(id: &str, path: &str, tokens: u64) -> ModelResponse {
    let mut reply = ModelResponse::tool_calls([(id, "read_file", json!({"path": path}))]);
    reply.usage = Some(Usage::new(tokens, 10));
    reply
}

fn answer(text: &str) -> ModelResponse {
    let mut reply = ModelResponse::answer(text);
    reply.usage = Some(Usage::new(10, 5));
    reply
}

/// The pairing rule written apart from the library's
/// ([`common::keeps_the_protocol`]), and no call id asked twice.
fn keeps_the_protocol(history: &[Message]) -> Result<(), String> {
    common::keeps_the_protocol(history)?;
    let mut seen = std::collections::HashSet::new();
    for (index, message) in history.iter().enumerate() {
        for block in &message.content {
            if let Block::ToolUse { id, .. } = block
                && !seen.insert(id.to_string())
            {
                return Err(format!("message {index}: {id} asked twice"));
            }
        }
    }
    Ok(())
}

/// The workspace every run here reads: files of a few kilobytes.
fn workspace(dir: &TempDir) -> std::path::PathBuf {
    let root = dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    for (name, size) in [("a.txt", 3000), ("b.txt", 2000), ("c.txt", 1000)] {
        let text: String = (0..size)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(root.join(name), text).unwrap();
    }
    root
}

/// An agent with `read_file`, subagents from `children` and `compaction`.
fn agent(
    approver: Arc<dyn Approver>,
    root: &Path,
    children: Arc<dyn subloop::run::model::ChildModels>,
    compaction: Option<Compaction>,
) -> AgentBuilder {
    AgentBuilder::new(approver)
        .compaction(compaction)
        .read_only_tool(ReadFile::new(root, ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .subagents(
            SubagentConfig::new(children, Hooks::none()).budget(ChildBudget::new(6).unwrap()),
        )
        .unwrap()
}

/// One step of a generated script: a reply, or a refusal for length.
#[derive(Debug, Clone)]
enum Step {
    Read(Vec<&'static str>),
    Delegate,
    TooLong,
}

#[derive(Debug, Clone)]
struct Case {
    parent: Vec<Step>,
    child: Vec<Step>,
    compactor: u8,
    keep: usize,
    threshold: Option<u64>,
}

fn step(children: bool) -> impl Strategy<Value = Step> {
    let files = prop::collection::vec(
        prop_oneof![Just("a.txt"), Just("b.txt"), Just("c.txt")],
        1..3,
    );
    prop_oneof![
        4 => files.prop_map(Step::Read),
        (if children { 1 } else { 0 }) => Just(Step::Delegate),
        2 => Just(Step::TooLong),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(step(true), 0..8),
        prop::collection::vec(step(false), 0..4),
        0u8..3,
        0usize..3,
        proptest::option::of(300u64..3000),
    )
        .prop_map(|(parent, child, compactor, keep, threshold)| Case {
            parent,
            child,
            compactor,
            keep,
            threshold,
        })
}

fn script(steps: &[Step], prefix: &str) -> Vec<ScriptedReply> {
    let mut replies = Vec::new();
    let mut tokens = 100;
    for (n, step) in steps.iter().enumerate() {
        tokens += 700;
        replies.push(match step {
            Step::Read(files) => {
                let mut reply =
                    ModelResponse::tool_calls(files.iter().enumerate().map(|(i, f)| {
                        (format!("{prefix}{n}_{i}"), "read_file", json!({"path": f}))
                    }));
                reply.usage = Some(Usage::new(tokens, 10));
                Ok(reply)
            }
            Step::Delegate => {
                let mut reply = ModelResponse::tool_calls([(
                    format!("{prefix}{n}"),
                    "task",
                    json!({"task": "Read a.txt and say its first letter"}),
                )]);
                reply.usage = Some(Usage::new(tokens, 10));
                Ok(reply)
            }
            Step::TooLong => Err(too_long()),
        });
    }
    replies.push(Ok(answer("done")));
    replies
}

fn compaction_of(case: &Case) -> Compaction {
    let compactor: Arc<dyn Compactor> = match case.compactor {
        0 => Arc::new(ClearToolResults::new(case.keep)),
        1 => Arc::new(SlidingWindow::new(case.keep)),
        _ => Arc::new(Tiered::standard()),
    };
    let compaction = Compaction::shared(compactor);
    match case.threshold {
        Some(tokens) => compaction.when(Threshold::tokens(tokens)),
        None => compaction,
    }
}

/// Runs `case` with `driver`; returns the requests the parent sent, the
/// outcome's status and the trace's text.
fn run_case(case: &Case, driver: Driver, dir: &TempDir) -> (Vec<Vec<Message>>, StatusKind, String) {
    let root = workspace(dir);
    let trace = dir.path().join(format!("{driver:?}.jsonl"));
    let children = Arc::new(ScriptedChildren(vec![script(&case.child, "c"); 8]));
    let mut model = RecordingModel::new(script(&case.parent, "p"));
    let report = common::with_driver(driver, || {
        agent(
            Arc::new(AllowAll),
            &root,
            children,
            Some(compaction_of(case)),
        )
        .monitor(TraceWriter::create(&trace).unwrap())
        .build()
        .run_driven("Read the files.", Budget::new(30).unwrap(), &mut model)
        .unwrap()
    });
    let requests = model
        .requests()
        .into_iter()
        .map(|seen| seen.messages)
        .collect();
    (
        requests,
        report.outcome.status,
        std::fs::read_to_string(&trace).unwrap(),
    )
}

/// Every verdict `view --check` gives over `trace`, broken ones named.
fn broken_rules(trace: &str) -> Vec<String> {
    let run = RecordedRun::parse(trace).expect("the trace reads");
    Policy::default()
        .check(&run)
        .into_iter()
        .filter(|verdict| !verdict.held())
        .map(|verdict| format!("{:?}: {:?}", verdict.invariant, verdict.breaches))
        .collect()
}

fn replayed(trace_path: &Path, root: &Path, compaction: Compaction) -> bool {
    let report = Replay::load(trace_path)
        .unwrap()
        .run(
            Arc::new(AllowAll),
            Budget::new(30).unwrap(),
            |approver, children| {
                Ok::<_, Box<dyn std::error::Error>>(
                    agent(approver, root, children, Some(compaction.clone())).build(),
                )
            },
        )
        .unwrap();
    if !report.reproduced() {
        eprintln!("{:?}", report.lines(true));
    }
    report.reproduced()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(24),
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "proptest-regressions/compaction_runs.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// Arbitrary scripted runs, refused for length and compacted at
    /// arbitrary points, through both drivers: every request keeps the
    /// protocol, both drivers write the same trace, every invariant holds
    /// over it, and it replays reproduced.
    #[test]
    fn compacted_runs_keep_the_protocol_and_replay(case in case()) {
        let dir = TempDir::new("compaction-prop");
        let (requests, status, blocking) = run_case(&case, Driver::Blocking, &dir);
        let (_, async_status, awaited) = run_case(&case, Driver::Async, &dir);
        prop_assert_eq!(status, async_status);
        let per_agent = |trace: &str| {
            let mut lines = std::collections::BTreeMap::<String, Vec<Value>>::new();
            for line in trace.lines() {
                let mut value: Value = serde_json::from_str(line).unwrap();
                if let Some(map) = value.as_object_mut() {
                    map.remove("duration_ms");
                }
                lines.entry(value["agent"].as_str().unwrap_or("").to_owned()).or_default().push(value);
            }
            lines
        };
        prop_assert_eq!(per_agent(&blocking), per_agent(&awaited));
        for (index, request) in requests.iter().enumerate() {
            prop_assert!(keeps_the_protocol(request).is_ok(), "request {}: {:?}", index + 1, keeps_the_protocol(request));
        }
        // Budget 30 is never the limit: a refused request is compacted
        // (answered) or ends the run context_overflow.
        prop_assert!(matches!(status, StatusKind::Answered | StatusKind::ContextOverflow), "{status:?}");
        let broken = broken_rules(&blocking);
        prop_assert!(broken.is_empty(), "{broken:?}");
        let root = dir.path().join("ws");
        prop_assert!(replayed(&dir.path().join("Blocking.jsonl"), &root, compaction_of(&case)));
    }
}

/// The compaction lines of `trace`.
fn compactions(trace: &str) -> Vec<Value> {
    trace
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|value| value["kind"] == "compaction")
        .collect()
}

fn settings(dir: &TempDir, root: &Path, script: &[Value]) -> Settings {
    let script_path = dir.write("script.json", json!({"parent": script}).to_string());
    let mut settings = Settings::new(root.to_path_buf());
    settings.question = "Read the files.".to_owned();
    settings.decision = DecisionMode::Allow;
    settings.progress = false;
    settings.max_calls = 12;
    settings.script = Some(script_path);
    settings.trace = Some(dir.path().join("trace.jsonl"));
    settings
}

fn read_json(id: &str, path: &str) -> Value {
    json!({"content": [{"type": "tool_use", "id": id, "name": "read_file", "input": {"path": path}}],
           "stop_reason": "tool_use", "usage": {"input_tokens": 900, "output_tokens": 10}})
}

fn too_long_json() -> Value {
    json!({"error": {"type": "context_window_exceeded",
                     "message": "prompt is too long: 210000 tokens > 200000 maximum"}})
}

fn answer_json(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 50, "output_tokens": 5}})
}

fn execute(settings: &Settings) -> subloop::RunReport {
    let script = std::fs::read_to_string(settings.script.as_ref().unwrap()).unwrap();
    let script = subloop::providers::scripted::Script::parse(&script).unwrap();
    host::execute(settings, Models::Script(script)).expect("the run runs")
}

#[test]
fn an_overflow_is_compacted_and_the_run_answers_and_replays() {
    let dir = TempDir::new("compaction-overflow");
    let root = workspace(&dir);
    let script = [
        read_json("t1", "a.txt"),
        read_json("t2", "b.txt"),
        read_json("t3", "c.txt"),
        too_long_json(),
        answer_json("The files hold the alphabet."),
    ];
    let settings = settings(&dir, &root, &script);
    let report = execute(&settings);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    let lines = compactions(&trace);
    assert_eq!(lines.len(), 1, "{trace}");
    assert_eq!(lines[0]["trigger"], "overflow");
    assert_eq!(lines[0]["call"], 5);
    // The cheapest tier: every result but the last two cleared, each call
    // still answered in place.
    let history: Vec<Message> = serde_json::from_value(lines[0]["history"].clone()).unwrap();
    assert_eq!(history.len(), 7);
    keeps_the_protocol(&history).unwrap();
    assert!(serde_json::to_string(&history).unwrap().contains(
        "[cleared to fit the context window: the result of read_file (3000 characters) was removed]"
    ));
    assert!(
        broken_rules(&trace).is_empty(),
        "{:?}",
        broken_rules(&trace)
    );
    let replay = host::replay(&settings, settings.trace.as_ref().unwrap(), false).unwrap();
    assert!(replay.reproduced(), "{:?}", replay.lines(true));
    // `view` shows it, in the terminal and on the page, and `--check` holds.
    let trace_path = settings.trace.as_ref().unwrap();
    let view = std::process::Command::new(common::bin())
        .args(["view", "--check"])
        .arg(trace_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&view.stdout);
    assert_eq!(view.status.code(), Some(0), "{text}");
    assert!(
        text.contains("parent history compacted before call 5 (overflow, tiered): 7 messages"),
        "{text}"
    );
    let page = dir.path().join("page.html");
    let view = std::process::Command::new(common::bin())
        .arg("view")
        .arg(trace_path)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    assert_eq!(view.status.code(), Some(0));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("\"compacted\":[{\"trigger\":\"overflow\""),
        "the page's data holds the compaction"
    );
    assert!(
        html.contains("\"histories\":["),
        "the page's data holds both histories"
    );
}

#[test]
fn with_compaction_off_an_overflow_ends_context_overflow() {
    let dir = TempDir::new("compaction-off");
    let root = workspace(&dir);
    let script = [
        read_json("t1", "a.txt"),
        too_long_json(),
        answer_json("never"),
    ];
    let mut settings = settings(&dir, &root, &script);
    settings.compact = Some(host::compact::CompactPolicy::Off);
    let report = execute(&settings);
    assert_eq!(report.outcome.status, StatusKind::ContextOverflow);
    assert_eq!(report.outcome.calls, 2);
    assert!(
        report.outcome.text.contains("compaction is off"),
        "{}",
        report.outcome.text
    );
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    assert!(compactions(&trace).is_empty());
    assert!(
        broken_rules(&trace).is_empty(),
        "{:?}",
        broken_rules(&trace)
    );
    // A replay reads the recorded policy and ends the same way.
    let mut again = settings.clone();
    again.compact = None;
    let replay = host::replay(&again, settings.trace.as_ref().unwrap(), false).unwrap();
    assert!(replay.reproduced(), "{:?}", replay.lines(true));
}

/// One file larger than anything a compaction may remove: refused again
/// and again, each time shorter, until nothing is left to remove; then
/// `context_overflow`, never a loop.
#[test]
fn a_history_that_cannot_be_shortened_ends_context_overflow_after_a_bounded_number_of_tries() {
    let dir = TempDir::new("compaction-bounded");
    let root = workspace(&dir);
    let mut script = vec![read_json("t1", "a.txt"), read_json("t2", "b.txt")];
    script.extend(std::iter::repeat_n(too_long_json(), 20));
    let mut settings = settings(&dir, &root, &script);
    settings.max_calls = 30;
    let report = execute(&settings);
    assert_eq!(report.outcome.status, StatusKind::ContextOverflow);
    assert!(
        report.outcome.text.contains("cannot make it shorter"),
        "{}",
        report.outcome.text
    );
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    let made = compactions(&trace).len();
    assert!((1..=4).contains(&made), "{made} compactions");
    assert_eq!(report.outcome.calls as usize, 2 + made + 1);
    assert!(
        broken_rules(&trace).is_empty(),
        "{:?}",
        broken_rules(&trace)
    );
}

#[test]
fn a_context_window_compacts_before_the_request_and_keeps_requests_flat() {
    let dir = TempDir::new("compaction-threshold");
    let root = workspace(&dir);
    // No usage reported: the run counts by its own estimate.
    let mut script: Vec<Value> = (0..12)
        .map(|n| {
            let mut reply = read_json(&format!("t{n}"), ["a.txt", "b.txt", "c.txt"][n % 3]);
            reply.as_object_mut().unwrap().remove("usage");
            reply
        })
        .collect();
    script.push(answer_json("Read them all."));
    let mut settings = settings(&dir, &root, &script);
    settings.max_calls = 20;
    settings.context_window = Some(4000);
    let report = execute(&settings);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    let lines = compactions(&trace);
    assert!(lines.len() >= 2, "{} compactions", lines.len());
    assert!(lines.iter().all(|line| line["trigger"] == "auto"));
    // Every request the run sent stayed near the threshold: none carried
    // more than twice the window's worth of bytes.
    let requests = subloop::record::trace::RebuiltRequest::from_trace(&trace).unwrap();
    assert_eq!(requests.len(), 13);
    for request in &requests {
        keeps_the_protocol(&request.messages).unwrap();
        let bytes = serde_json::to_string(&request.messages).unwrap().len();
        assert!(
            bytes < 4 * 4000,
            "request {} carried {bytes} bytes",
            request.call
        );
    }
    assert!(
        broken_rules(&trace).is_empty(),
        "{:?}",
        broken_rules(&trace)
    );
    let replay = host::replay(&settings, settings.trace.as_ref().unwrap(), false).unwrap();
    assert!(replay.reproduced(), "{:?}", replay.lines(true));
}

/// Cuts the trace after its first `kind` line past `after` lines of that
/// kind: the process died there.
fn cut_after(trace: &str, kind: &str, count: usize) -> String {
    let mut seen = 0;
    let mut kept = String::new();
    for line in trace.lines() {
        kept.push_str(line);
        kept.push('\n');
        if serde_json::from_str::<Value>(line).unwrap()["kind"] == kind {
            seen += 1;
            if seen == count {
                break;
            }
        }
    }
    kept
}

#[test]
fn a_run_killed_after_a_compaction_resumes_through_it() {
    let dir = TempDir::new("compaction-resume");
    let root = workspace(&dir);
    let script = [
        read_json("t1", "a.txt"),
        read_json("t2", "b.txt"),
        read_json("t3", "c.txt"),
        too_long_json(),
        read_json("t4", "a.txt"),
        answer_json("The files hold the alphabet."),
    ];
    let settings = settings(&dir, &root, &script);
    execute(&settings);
    let whole = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    // Killed right after the compaction (before the next request), and
    // right after the request that followed it.
    for (kind, count, left) in [("compaction", 1, 2), ("request", 5, 2)] {
        let cut = dir.write("cut.jsonl", cut_after(&whole, kind, count));
        let mut resumed = settings.clone();
        resumed.trace = None;
        resumed.resume = Some(cut.clone());
        let rest: Vec<Value> = script[script.len() - left..].to_vec();
        resumed.script = Some(dir.write("rest.json", json!({"parent": rest}).to_string()));
        let report = execute(&resumed);
        assert_eq!(
            report.outcome.status,
            StatusKind::Answered,
            "cut after {kind} {count}"
        );
        let trace = std::fs::read_to_string(&cut).unwrap();
        assert!(
            broken_rules(&trace).is_empty(),
            "cut after {kind}: {:?}",
            broken_rules(&trace)
        );
        // The resumed run sent what the uninterrupted one sent.
        let now = subloop::record::trace::RebuiltRequest::from_trace(&trace).unwrap();
        let then = subloop::record::trace::RebuiltRequest::from_trace(&whole).unwrap();
        let messages = |requests: &[subloop::record::trace::RebuiltRequest]| {
            requests
                .iter()
                .map(|r| r.messages.clone())
                .collect::<Vec<_>>()
        };
        let shape = |requests: &[subloop::record::trace::RebuiltRequest]| {
            requests
                .iter()
                .map(|r| (r.call, r.messages.len()))
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(&now), shape(&then), "cut after {kind} {count}");
        assert!(
            messages(&now) == messages(&then),
            "cut after {kind} {count}"
        );
    }
    // A follow-up on the answered, compacted run.
    let mut follow = settings.clone();
    follow.trace = None;
    follow.resume = settings.trace.clone();
    follow.follow_up = Some("And c.txt?".to_owned());
    follow.script = Some(dir.write(
        "follow.json",
        json!({"parent": [answer_json("Also the alphabet.")]}).to_string(),
    ));
    let report = execute(&follow);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.outcome.text, "Also the alphabet.");
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    assert!(
        broken_rules(&trace).is_empty(),
        "{:?}",
        broken_rules(&trace)
    );
    let requests = subloop::record::trace::RebuiltRequest::from_trace(&trace).unwrap();
    let last = requests.last().unwrap();
    keeps_the_protocol(&last.messages).unwrap();
    assert_eq!(last.messages.last().unwrap().text(), "And c.txt?");
}

#[test]
fn a_child_compacts_within_its_own_budget_and_its_report_is_unchanged() {
    let dir = TempDir::new("compaction-child");
    let root = workspace(&dir);
    let trace = dir.path().join("trace.jsonl");
    let child = vec![
        Ok(read("c1", "a.txt", 900)),
        Ok(read("c2", "b.txt", 1800)),
        Ok(read("c3", "c.txt", 2700)),
        Err(too_long()),
        Ok(answer("It starts with a.")),
    ];
    let parent = vec![
        Ok(ModelResponse::tool_calls([(
            "p1",
            "task",
            json!({"task": "Read the files and say how a.txt starts"}),
        )])),
        Ok(answer("a.txt starts with a.")),
    ];
    let mut model = RecordingModel::new(parent);
    let report = agent(
        Arc::new(AllowAll),
        &root,
        Arc::new(ScriptedChildren(vec![child])),
        Some(Compaction::auto(None)),
    )
    .monitor(TraceWriter::create(&trace).unwrap())
    .build()
    .run_driven("How does a.txt start?", Budget::new(4).unwrap(), &mut model)
    .unwrap();
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let summary = &report.tools[0].content;
    let bounded: Value = serde_json::from_str(summary).unwrap();
    assert_eq!(bounded["status"], "answered");
    assert_eq!(bounded["summary"], "It starts with a.");
    assert_eq!(bounded["calls"], 5);
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines = compactions(&text);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["agent"], "child-1");
    assert!(broken_rules(&text).is_empty(), "{:?}", broken_rules(&text));
}

#[test]
fn a_pre_compact_hook_blocks_a_compaction() {
    let dir = TempDir::new("compaction-hook");
    let root = workspace(&dir);
    let log = dir.path().join("hook-input.json");
    let hook = format!("cat > {}; echo 'not now' >&2; exit 2", log.display());
    let settings_file = dir.write(
        "settings.json",
        json!({"hooks": {"PreCompact": [{"matcher": "auto", "hooks": [{"type": "command", "command": hook}]}]}})
            .to_string(),
    );
    let script = [
        read_json("t1", "a.txt"),
        read_json("t2", "b.txt"),
        read_json("t3", "c.txt"),
        too_long_json(),
        answer_json("never"),
    ];
    let mut settings = settings(&dir, &root, &script);
    settings.hooks = subloop::policy::command_hooks::CommandHooks::load(&settings_file).unwrap();
    let report = execute(&settings);
    assert_eq!(report.outcome.status, StatusKind::ContextOverflow);
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
    assert_eq!(input["hook_event_name"], "PreCompact");
    assert_eq!(input["trigger"], "auto");
    assert_eq!(input["custom_instructions"], "");
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    assert!(compactions(&trace).is_empty());
    assert!(trace.contains("\"event\":\"PreCompact\""));
    assert!(
        report
            .outcome
            .text
            .contains("a PreCompact hook blocked compaction: not now"),
        "{}",
        report.outcome.text
    );
    // With a window, the automatic compaction is blocked too: the run
    // goes on uncompacted, and answers.
    let script = [
        read_json("t1", "a.txt"),
        read_json("t2", "b.txt"),
        answer_json("Read."),
    ];
    let mut settings = self::settings(&dir, &root, &script);
    settings.hooks = subloop::policy::command_hooks::CommandHooks::load(&settings_file).unwrap();
    settings.context_window = Some(1000);
    let report = execute(&settings);
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let trace = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    assert!(compactions(&trace).is_empty());
    assert!(trace.contains("was not compacted: not now"), "{trace}");
}

/// The property's driver compacts: a fixed case with refusals and a
/// threshold leaves compaction lines of both triggers, in both drivers.
#[test]
fn the_property_runs_compact() {
    let case = Case {
        parent: vec![
            Step::Read(vec!["a.txt", "b.txt"]),
            Step::Delegate,
            Step::Read(vec!["c.txt"]),
            Step::TooLong,
            Step::Read(vec!["a.txt"]),
        ],
        child: vec![Step::Read(vec!["a.txt"]), Step::TooLong],
        compactor: 2,
        keep: 1,
        threshold: Some(1500),
    };
    for driver in [Driver::Blocking, Driver::Async] {
        let dir = TempDir::new("compaction-fixed");
        let (requests, status, trace) = run_case(&case, driver, &dir);
        assert_eq!(status, StatusKind::Answered);
        let lines = compactions(&trace);
        let triggers: std::collections::BTreeSet<&str> = lines
            .iter()
            .filter_map(|line| line["trigger"].as_str())
            .collect();
        assert_eq!(
            triggers,
            ["auto", "overflow"].into_iter().collect(),
            "{driver:?}"
        );
        assert!(lines.iter().any(|line| line["agent"] == "child-1"));
        for request in &requests {
            keeps_the_protocol(request).unwrap();
        }
        assert!(
            broken_rules(&trace).is_empty(),
            "{:?}",
            broken_rules(&trace)
        );
    }
}

/// A summary the model writes: the summary request that is itself too
/// long is asked again without the oldest half of its rounds, the summary
/// replaces the older rounds after the question, the trace records it
/// (with its requests and tokens), the run goes on, replays reproduced and
/// resumes through it.
#[test]
fn a_summary_replaces_older_rounds_even_when_its_own_request_overflows() {
    use subloop::core::compaction::Summarize;
    let dir = TempDir::new("compaction-summary");
    let root = workspace(&dir);
    let trace = dir.path().join("trace.jsonl");
    let mut summary_reply = answer("Read a, b and c: each is the alphabet repeated.");
    summary_reply.usage = Some(Usage::new(500, 40));
    let parent = vec![
        Ok(read("t1", "a.txt", 900)),
        Ok(read("t2", "b.txt", 1800)),
        Ok(read("t3", "c.txt", 2700)),
        Ok(read("t4", "a.txt", 3600)),
        Err(too_long()),
        // The summary request of three rounds: too long too.
        Err(too_long()),
        // Of the newest one only (the oldest half dropped): the summary.
        Ok(summary_reply),
        Ok(answer("The files hold the alphabet.")),
    ];
    let compaction = || Compaction::new(Tiered::standard()).summarizing(Summarize::new(1));
    let build = |approver: Arc<dyn Approver>, children| {
        agent(approver, &root, children, Some(compaction()))
    };
    let mut model = RecordingModel::new(parent);
    let report = build(Arc::new(AllowAll), Arc::new(ScriptedChildren(Vec::new())))
        .monitor(TraceWriter::create(&trace).unwrap())
        .build()
        .run_driven("Read the files.", Budget::new(10).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let requests = model.requests();
    // Six requests of the run (the fifth refused), and two summary requests.
    assert_eq!(requests.len(), 8);
    let summaries: Vec<_> = requests
        .iter()
        .filter(|request| request.system == Summarize::SYSTEM)
        .collect();
    assert_eq!(summaries.len(), 2);
    assert!(summaries.iter().all(|request| request.tools.is_empty()));
    // The first summarized the three older rounds, the second the newest of them.
    assert_eq!(summaries[0].messages.len(), 7);
    assert_eq!(summaries[1].messages.len(), 3);
    for request in &requests {
        keeps_the_protocol(&request.messages).unwrap();
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines = compactions(&text);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["compactor"], "summarize");
    assert_eq!(lines[0]["summary"]["requests"], 2);
    assert_eq!(lines[0]["summary"]["usage"]["input_tokens"], 500);
    let history: Vec<Message> = serde_json::from_value(lines[0]["history"].clone()).unwrap();
    // The question and its summary, then the last round.
    assert_eq!(history.len(), 3);
    assert!(history[0].text().contains(Summarize::PREFIX));
    assert!(history[0].text().contains("each is the alphabet repeated"));
    // The request after the summary carries it and the last round.
    let last = &requests.last().unwrap().messages;
    assert_eq!(last, &history);
    assert!(broken_rules(&text).is_empty(), "{:?}", broken_rules(&text));
    // A replay serves the summary from the trace, refusal included.
    let replay = Replay::load(&trace)
        .unwrap()
        .run(
            Arc::new(AllowAll),
            Budget::new(10).unwrap(),
            |approver, children| {
                Ok::<_, Box<dyn std::error::Error>>(build(approver, children).build())
            },
        )
        .unwrap();
    assert!(replay.reproduced(), "{:?}", replay.lines(true));
    // The tokens a summary spent count as the run's.
    let recorded = RecordedRun::parse(&text).unwrap();
    assert_eq!(recorded.spent_tokens(), report.total_usage().billed());
}

crate::async_twins!(
    a_child_compacts_within_its_own_budget_and_its_report_is_unchanged,
    a_summary_replaces_older_rounds_even_when_its_own_request_overflows,
);

/// A hand-edited compaction line: a history that splits a call from its
/// result is a broken rule `view --check` names and a trace `--resume`
/// refuses; a line of the wrong shape is refused with its line number;
/// neither panics.
#[test]
fn a_hand_broken_compaction_is_named_not_resumed() {
    let dir = TempDir::new("compaction-broken");
    let root = workspace(&dir);
    let script = [
        read_json("t1", "a.txt"),
        read_json("t2", "b.txt"),
        read_json("t3", "c.txt"),
        too_long_json(),
        read_json("t4", "a.txt"),
        answer_json("Done."),
    ];
    let settings = settings(&dir, &root, &script);
    execute(&settings);
    let whole = std::fs::read_to_string(settings.trace.as_ref().unwrap()).unwrap();
    // The compaction's history loses its last message (a result): its call
    // is left without one. Cut after that line, as if the run died there.
    let mut broken = String::new();
    let mut number = 0;
    for line in whole.lines() {
        let mut value: Value = serde_json::from_str(line).unwrap();
        if value["kind"] == "compaction" {
            value["history"].as_array_mut().unwrap().pop();
            number = broken.lines().count() + 1;
            broken.push_str(&value.to_string());
            broken.push('\n');
            break;
        }
        broken.push_str(line);
        broken.push('\n');
    }
    assert!(number > 0);
    let path = dir.write("broken.jsonl", &broken);
    let check = std::process::Command::new(common::bin())
        .args(["view", "--check"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{text}");
    assert!(text.contains("broken"), "{text}");
    let mut resumed = settings.clone();
    resumed.trace = None;
    resumed.resume = Some(path.clone());
    let script = std::fs::read_to_string(resumed.script.as_ref().unwrap()).unwrap();
    let script = subloop::providers::scripted::Script::parse(&script).unwrap();
    let err = host::execute(&resumed, Models::Script(script)).expect_err("refused");
    assert!(err.to_string().contains("compaction"), "{err}");
    // A compaction line of the wrong shape.
    let mut shape = String::new();
    for line in whole.lines() {
        let mut value: Value = serde_json::from_str(line).unwrap();
        if value["kind"] == "compaction" {
            value["history"] = json!(7);
        }
        shape.push_str(&value.to_string());
        shape.push('\n');
    }
    let path = dir.write("shape.jsonl", &shape);
    let check = std::process::Command::new(common::bin())
        .args(["view", "--check"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("line {number}: a `compaction` line")),
        "{stderr}"
    );
}
