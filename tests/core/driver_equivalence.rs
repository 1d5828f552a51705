//! The blocking and the async driver are one loop: arbitrary scripted runs
//! (a parent, children, `read_file`, `run_main` allowed or denied, unknown
//! tools, per-reply, delegation and token limits) give the same transcript,
//! the same report and the same trace lines, agent by agent, whichever
//! drives them.

use std::sync::Arc;

use crate::common::ScriptedReply;
use proptest::prelude::*;
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Approver;
use subloop::Budget;
use subloop::Hooks;
use subloop::ModelResponse;
use subloop::agent::subagent::SubagentConfig;
use subloop::core::protocol::Usage;
use subloop::policy::permission::{AllowAll, DenyAll};
use subloop::providers::scripted::{ScriptedChildren, ScriptedModel};
use subloop::record::trace::TraceWriter;
use subloop::run::limits::{CancelHandle, Limits};
use subloop::run::model::Blocking;
use subloop::tools::{ReadFile, RunMain, RunSettings};

use crate::common::{TempDir, runtime};

/// One reply: an answer, or up to five calls of the tools the agent has
/// (and one it has not), with some tokens spent.
fn reply() -> impl Strategy<Value = ModelResponse> {
    let call = prop_oneof![
        3 => Just(("read_file", json!({"path": "a.txt"}))),
        1 => Just(("read_file", json!({"path": "../outside"}))),
        3 => Just(("task", json!({"task": "Read a.txt"}))),
        2 => Just(("run_main", json!({}))),
        1 => Just(("todo_write", json!({"items": [{"text": "look", "status": "in_progress"}]}))),
        1 => Just(("nope", json!({}))),
    ];
    (prop::collection::vec(call, 0..5), 0u64..200).prop_map(|(calls, tokens)| {
        let mut reply = if calls.is_empty() {
            ModelResponse::answer("done")
        } else {
            ModelResponse::tool_calls(
                calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, input))| (format!("t{i}"), name, input)),
            )
        };
        reply.usage = Some(Usage::new(tokens, 10));
        reply
    })
}

#[derive(Debug, Clone)]
struct Case {
    parent: Vec<ModelResponse>,
    children: Vec<Vec<ModelResponse>>,
    allow: bool,
    max_tools: usize,
    max_delegations: usize,
    tokens: Option<u64>,
    budget: u32,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(reply(), 1..6),
        prop::collection::vec(prop::collection::vec(reply(), 1..3), 0..4),
        any::<bool>(),
        1usize..5,
        0usize..4,
        proptest::option::of(100u64..1000),
        1u32..6,
    )
        .prop_map(
            |(parent, children, allow, max_tools, max_delegations, tokens, budget)| Case {
                parent,
                children,
                allow,
                max_tools,
                // Children of one batch run at the same time in a blocking
                // run (a thread each), so under a shared token budget which
                // of them finds it spent first is a race there, in a real
                // run as here; the async driver polls them in call order.
                // With a token budget, a run has at most one child.
                max_delegations: if tokens.is_some() {
                    max_delegations.min(1)
                } else {
                    max_delegations
                },
                tokens,
                budget,
            },
        )
}

/// What a run leaves: its report (times taken out) and its trace lines,
/// grouped by agent in the order each agent wrote them (children of one
/// batch run side by side, so their lines interleave differently).
#[derive(Debug, PartialEq)]
struct Left {
    report: Value,
    trace: std::collections::BTreeMap<String, Vec<Value>>,
}

fn without_times(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|key, _| !key.contains("elapsed") && key != "duration_ms");
            map.values_mut().for_each(without_times);
        }
        Value::Array(items) => items.iter_mut().for_each(without_times),
        _ => {}
    }
}

fn run(case: &Case, driver: crate::common::Driver) -> Left {
    let dir = TempDir::new("equivalence");
    dir.write("a.txt", "alpha");
    let trace_path = dir.path().join("trace.jsonl");
    let mut limits = Limits::default()
        .with_max_tools_per_reply(case.max_tools)
        .with_max_delegations(case.max_delegations);
    limits.max_tokens_total = case.tokens;
    let approver: Arc<dyn Approver> = if case.allow {
        Arc::new(AllowAll)
    } else {
        Arc::new(DenyAll)
    };
    let settings = RunSettings::new(vec!["true".to_owned()]);
    let children: Vec<Vec<ScriptedReply>> = case
        .children
        .iter()
        .map(|script| script.iter().cloned().map(Ok).collect())
        .collect();
    let agent = AgentBuilder::new(approver)
        .limits(limits, CancelHandle::new())
        .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(RunMain::new(dir.path(), settings).unwrap())
        .unwrap()
        .plan()
        .unwrap()
        .subagents(SubagentConfig::new(
            Arc::new(ScriptedChildren(children)),
            Hooks::none(),
        ))
        .unwrap()
        .monitor(TraceWriter::create(&trace_path).unwrap())
        .build();
    let mut model = ScriptedModel::new(case.parent.iter().cloned().map(Ok).collect());
    let budget = Budget::new(case.budget).unwrap();
    let report = match driver {
        crate::common::Driver::Blocking => agent.run("go", budget, &mut model).unwrap(),
        crate::common::Driver::Async => runtime()
            .block_on(agent.run_async("go", budget, &mut Blocking(&mut model)))
            .unwrap(),
    };
    let mut report = report.to_json();
    without_times(&mut report);
    let mut trace = std::collections::BTreeMap::<String, Vec<Value>>::new();
    for line in std::fs::read_to_string(&trace_path).unwrap().lines() {
        let mut line: Value = serde_json::from_str(line).unwrap();
        without_times(&mut line);
        let agent = line["agent"].as_str().unwrap_or("header").to_owned();
        trace.entry(agent).or_default().push(line);
    }
    Left { report, trace }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(48),
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "proptest-regressions/driver_equivalence.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn both_drivers_leave_the_same_transcript_report_and_trace(case in case()) {
        let blocking = run(&case, crate::common::Driver::Blocking);
        let awaited = run(&case, crate::common::Driver::Async);
        prop_assert_eq!(&blocking.report["outcome"], &awaited.report["outcome"]);
        prop_assert_eq!(blocking.report, awaited.report);
        prop_assert_eq!(blocking.trace, awaited.trace);
    }
}

/// The future of an async run is `Send` with a `Send` model: it can be
/// spawned on a multi-threaded runtime, and here is, many at once.
#[test]
fn async_runs_are_send_and_run_side_by_side_on_a_multi_threaded_runtime() {
    fn assert_send<T: Send>(value: T) -> T {
        value
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = TempDir::new("send");
    dir.write("a.txt", "alpha");
    let handles: Vec<_> = (0..64)
        .map(|i| {
            let agent = AgentBuilder::new(Arc::new(DenyAll))
                .read_only_tool(ReadFile::new(dir.path(), ReadFile::DEFAULT_LIMIT).unwrap())
                .unwrap()
                .subagents(SubagentConfig::new(
                    Arc::new(ScriptedChildren(vec![vec![Ok(ModelResponse::answer(
                        format!("child of {i}"),
                    ))]])),
                    Hooks::none(),
                ))
                .unwrap()
                .build();
            let model: Box<dyn subloop::run::model::AsyncModel + Send> =
                Box::new(Blocking(ScriptedModel::new(vec![
                    Ok(ModelResponse::tool_calls([
                        ("r".to_owned(), "read_file", json!({"path": "a.txt"})),
                        ("t".to_owned(), "task", json!({"task": "look"})),
                    ])),
                    Ok(ModelResponse::answer(format!("run {i}"))),
                ])));
            runtime.spawn(assert_send(async move {
                let mut model = model;
                agent
                    .run_async("go", Budget::new(3).unwrap(), &mut *model)
                    .await
            }))
        })
        .collect();
    for (i, handle) in handles.into_iter().enumerate() {
        let report = runtime.block_on(handle).unwrap().unwrap();
        assert_eq!(report.outcome.text, format!("run {i}"));
        assert_eq!(report.children.len(), 1);
        assert_eq!(report.children[0].report.summary, format!("child of {i}"));
    }
}
