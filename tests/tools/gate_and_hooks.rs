//! The permission gate and hooks: blocking, failing closed, after hooks,
//! warnings, the audit log, and deny winning over every hook.

use crate::common;
use crate::common::RunDriven;

use common::tool_results;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{RecordingModel, TempDir};
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::core::agent_id::AgentId;
use subloop::core::call::{CallDecision, Warning};
use subloop::core::conversation::ToolOutput;
use subloop::core::protocol::ToolUseId;
use subloop::policy::hooks::{AuditEntry, Hook, HookCall, HookError, Hooks, Phase, Verdict};
use subloop::policy::permission::{AllowAll, ApprovalRequest, Approver, Decision, DenyAll};
use subloop::tools::{Capability, ReadFile, RunMain, RunSettings, Tool, ToolContext};

/// A read-only tool that counts its runs.
#[derive(Clone)]
struct Counting {
    name: &'static str,
    capability: Capability,
    runs: Arc<AtomicUsize>,
}

impl Counting {
    fn new(name: &'static str, capability: Capability) -> Self {
        Self {
            name,
            capability,
            runs: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Tool for Counting {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        "counts its runs"
    }

    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }

    fn capability(&self) -> Capability {
        self.capability
    }

    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        self.runs.fetch_add(1, Ordering::SeqCst);
        ToolOutput::ok(format!("{} ran", self.name))
    }
}

/// What a hook saw of one call.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    phase: &'static str,
    agent: String,
    id: String,
    tool: String,
    input: Value,
    output: Option<ToolOutput>,
}

#[derive(Clone, Copy)]
enum Before {
    Continue,
    Block,
    Fail,
    Panic,
}

#[derive(Clone, Copy)]
enum After {
    Ok,
    Fail,
    Panic,
}

/// A configurable hook that records what it sees.
#[derive(Clone)]
struct TestHook {
    name: &'static str,
    before: Before,
    after: After,
    warn: bool,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TestHook {
    fn new(name: &'static str, before: Before, after: After) -> Self {
        Self {
            name,
            before,
            after,
            warn: false,
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn record(&self, phase: &'static str, call: &HookCall<'_>, output: Option<&ToolOutput>) {
        self.seen.lock().unwrap().push(Seen {
            phase,
            agent: call.agent.to_string(),
            id: call.id().to_string(),
            tool: call.tool().to_owned(),
            input: call.input().clone(),
            output: output.cloned(),
        });
    }
}

impl Hook for TestHook {
    fn name(&self) -> &str {
        self.name
    }

    fn before(
        &self,
        call: &HookCall<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<Verdict, HookError> {
        self.record("before", call, None);
        if self.warn {
            warnings.push(format!("{} saw {} before", self.name, call.id()));
        }
        match self.before {
            Before::Continue => Ok(Verdict::Continue),
            Before::Block => Ok(Verdict::Block("no reading today".to_owned())),
            Before::Fail => Err(HookError("policy file unreadable".to_owned())),
            Before::Panic => panic!("hook exploded"),
        }
    }

    fn after(
        &self,
        call: &HookCall<'_>,
        output: &ToolOutput,
        warnings: &mut Vec<String>,
    ) -> Result<(), HookError> {
        self.record("after", call, Some(output));
        if self.warn {
            warnings.push(format!("{} saw {} after", self.name, call.id()));
        }
        match self.after {
            After::Ok => Ok(()),
            After::Fail => Err(HookError("audit sink down".to_owned())),
            After::Panic => panic!("after hook exploded"),
        }
    }
}

/// What the approver was asked: (agent, call id, tool, action).
type Asked = (String, String, String, String);

/// An approver that counts what it is asked and answers `decision`.
struct CountingApprover {
    decision: Decision,
    asked: Arc<Mutex<Vec<Asked>>>,
}

impl Approver for CountingApprover {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        self.asked.lock().unwrap().push((
            request.agent.to_string(),
            request.call.id().to_string(),
            request.call.name().to_owned(),
            request.action.to_owned(),
        ));
        self.decision
    }
}

/// One tool reply with `calls`, then an answer.
fn run(builder: AgentBuilder, calls: Vec<(&'static str, &'static str, Value)>) -> RunReport {
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls(calls)),
        Ok(ModelResponse::answer("done")),
    ]);
    builder
        .build()
        .run_driven("go", Budget::new(3).unwrap(), &mut model)
        .unwrap()
}

fn with_counter(approver: Arc<dyn Approver>, counter: &Counting, hooks: Hooks) -> AgentBuilder {
    AgentBuilder::new(approver)
        .tool(counter.clone())
        .unwrap()
        .hooks(hooks)
}

#[test]
fn a_blocking_before_hook_stops_the_call() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let hook = TestHook::new("guard", Before::Block, After::Ok);
    let later = TestHook::new("later", Before::Continue, After::Ok);
    let builder = with_counter(
        Arc::new(AllowAll),
        &counter,
        Hooks::none().with(hook.clone()).with(later.clone()),
    );
    let report = run(builder, vec![("c1", "count", json!({"x": 1}))]);

    assert_eq!(
        tool_results(&report.outcome.messages),
        vec![(
            "c1".to_owned(),
            "not executed: blocked by hook guard: no reading today".to_owned(),
            true
        )]
    );
    assert_eq!(counter.runs(), 0);
    assert_eq!(report.tools[0].decision, CallDecision::Blocked);
    // The blocking hook saw only the before phase; later hooks saw nothing.
    let phases: Vec<&str> = hook.seen().iter().map(|s| s.phase).collect();
    assert_eq!(phases, ["before"]);
    assert!(later.seen().is_empty());
}

#[test]
fn a_before_hook_that_errors_fails_closed() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let hook = TestHook::new("policy", Before::Fail, After::Ok);
    let builder = with_counter(Arc::new(AllowAll), &counter, Hooks::none().with(hook));
    let report = run(builder, vec![("c1", "count", json!({}))]);

    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 1);
    let (_, text, is_error) = &results[0];
    assert!(is_error);
    assert!(text.starts_with("not executed: "), "{text}");
    assert!(text.contains("hook policy"), "{text}");
    assert!(text.contains("policy file unreadable"), "{text}");
    assert_eq!(counter.runs(), 0);
    assert_eq!(report.tools[0].decision, CallDecision::HookFailed);
}

#[test]
fn a_before_hook_that_panics_fails_closed() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let hook = TestHook::new("crashy", Before::Panic, After::Ok);
    let builder = with_counter(Arc::new(AllowAll), &counter, Hooks::none().with(hook));
    let report = run(
        builder,
        vec![("c1", "count", json!({})), ("c2", "count", json!({}))],
    );

    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 2);
    for (id, (got_id, text, is_error)) in ["c1", "c2"].iter().zip(&results) {
        assert_eq!(got_id, id);
        assert!(is_error);
        assert!(text.starts_with("not executed: "), "{text}");
        assert!(text.contains("hook crashy"), "{text}");
        assert!(text.contains("hook exploded"), "{text}");
    }
    assert_eq!(counter.runs(), 0);
    assert_eq!(report.outcome.status, subloop::StatusKind::Answered);
}

#[test]
fn an_after_hook_sees_the_result() {
    let tmp = TempDir::new("hooks-after");
    tmp.write("a.txt", "alpha\n");
    let hook = TestHook::new("watch", Before::Continue, After::Ok);
    let builder = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(tmp.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .hooks(Hooks::none().with(hook.clone()));
    let report = run(
        builder,
        vec![
            ("r1", "read_file", json!({"path": "a.txt"})),
            ("r2", "read_file", json!({"path": "missing.txt"})),
        ],
    );

    let seen = hook.seen();
    let afters: Vec<&Seen> = seen.iter().filter(|s| s.phase == "after").collect();
    assert_eq!(afters.len(), 2);
    assert_eq!(afters[0].id, "r1");
    assert_eq!(afters[0].output, Some(ToolOutput::ok("alpha\n")));
    assert_eq!(afters[1].id, "r2");
    let missing = afters[1].output.clone().unwrap();
    assert!(missing.is_error);
    assert_eq!(missing.content, "read_file `missing.txt`: no such file");
    assert_eq!(
        tool_results(&report.outcome.messages)[0],
        ("r1".to_owned(), "alpha\n".to_owned(), false)
    );
}

#[test]
fn an_after_hook_that_errors_or_panics_marks_the_result_as_error() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let failing = TestHook::new("sink", Before::Continue, After::Fail);
    let builder = with_counter(Arc::new(AllowAll), &counter, Hooks::none().with(failing));
    let report = run(builder, vec![("c1", "count", json!({}))]);
    let results = tool_results(&report.outcome.messages);
    let (_, text, is_error) = &results[0];
    assert!(is_error);
    assert!(text.starts_with("count ran"), "{text}");
    assert!(
        text.contains("after hook sink failed: audit sink down"),
        "{text}"
    );
    assert!(report.tools[0].is_error);
    assert_eq!(counter.runs(), 1);
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.text.contains("after hook sink failed")),
        "{:?}",
        report.warnings
    );

    let counter = Counting::new("count", Capability::ReadOnly);
    let panicking = TestHook::new("boom", Before::Continue, After::Panic);
    let builder = with_counter(Arc::new(AllowAll), &counter, Hooks::none().with(panicking));
    let report = run(builder, vec![("c1", "count", json!({}))]);
    let results = tool_results(&report.outcome.messages);
    let (_, text, is_error) = &results[0];
    assert!(is_error);
    assert!(text.contains("after hook boom failed"), "{text}");
    assert!(text.contains("after hook exploded"), "{text}");
}

#[test]
fn hook_warnings_appear_in_the_report() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let mut hook = TestHook::new("noisy", Before::Continue, After::Ok);
    hook.warn = true;
    let builder = with_counter(Arc::new(AllowAll), &counter, Hooks::none().with(hook));
    let report = run(
        builder,
        vec![("c1", "count", json!({})), ("c2", "count", json!({}))],
    );
    let warning = |text: &str| Warning::new(AgentId::Parent, text);
    assert_eq!(
        report.warnings,
        vec![
            warning("noisy saw c1 before"),
            warning("noisy saw c1 after"),
            warning("noisy saw c2 before"),
            warning("noisy saw c2 after"),
        ]
    );
    let json = report.to_json();
    assert_eq!(json["warnings"][0]["text"], "noisy saw c1 before");
    assert_eq!(json["warnings"][0]["agent"], "parent");
}

#[test]
fn the_audit_log_has_a_before_and_an_after_entry_per_call() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let guard = TestHook::new("guard", Before::Continue, After::Ok);
    let builder = with_counter(Arc::new(DenyAll), &counter, Hooks::none().with(guard));
    let tmp = TempDir::new("hooks-audit");
    let builder = builder
        .tool(RunMain::new(tmp.path(), RunSettings::default()).unwrap())
        .unwrap();
    let report = run(
        builder,
        vec![
            ("c1", "count", json!({})),
            ("c2", "run_main", json!({})),
            ("c3", "nope", json!({})),
            ("c4", "count", json!("not an object")),
        ],
    );

    let entry = |id: &str, tool: &str, phase: Phase, after: Option<(CallDecision, bool)>| {
        (
            AgentId::Parent,
            ToolUseId::new(id),
            tool.to_owned(),
            phase,
            after.map(|(d, _)| d),
            after.map(|(_, e)| e),
            None,
        )
    };
    let audit: Vec<_> = report
        .audit
        .iter()
        .map(|e: &AuditEntry| {
            (
                e.agent.clone(),
                e.call_id.clone(),
                e.tool.clone(),
                e.phase,
                e.decision,
                e.is_error,
                e.hook.clone(),
            )
        })
        .collect();
    assert_eq!(
        audit,
        vec![
            entry("c1", "count", Phase::Before, None),
            entry(
                "c1",
                "count",
                Phase::After,
                Some((CallDecision::NotRequired, false))
            ),
            entry("c2", "run_main", Phase::Before, None),
            entry(
                "c2",
                "run_main",
                Phase::After,
                Some((CallDecision::Denied, true))
            ),
            entry("c3", "nope", Phase::Before, None),
            entry(
                "c3",
                "nope",
                Phase::After,
                Some((CallDecision::Unregistered, true))
            ),
            entry("c4", "count", Phase::Before, None),
            entry(
                "c4",
                "count",
                Phase::After,
                Some((CallDecision::Invalid, true))
            ),
        ]
    );
    let decisions: Vec<CallDecision> = report.tools.iter().map(|t| t.decision).collect();
    assert_eq!(
        decisions,
        [
            CallDecision::NotRequired,
            CallDecision::Denied,
            CallDecision::Unregistered,
            CallDecision::Invalid
        ]
    );
    let json = serde_json::to_value(&report.audit[1]).unwrap();
    assert_eq!(
        json,
        json!({"agent": "parent", "call_id": "c1", "tool": "count", "phase": "after",
               "decision": "not_required", "is_error": false})
    );
}

#[test]
fn deny_wins_over_hooks() {
    let tmp = TempDir::new("hooks-deny");
    let marker = tmp.path().join("marker");
    let tool = RunMain::new(
        tmp.path(),
        RunSettings::new(vec!["sh".into(), "-c".into(), "touch marker".into()]),
    )
    .unwrap();
    // Even a hook that would let everything through, or block everything, is never asked.
    let open = TestHook::new("open", Before::Continue, After::Ok);
    let builder = AgentBuilder::new(Arc::new(DenyAll))
        .tool(tool)
        .unwrap()
        .hooks(Hooks::none().with(open.clone()));
    let report = run(builder, vec![("c1", "run_main", json!({}))]);

    assert_eq!(
        tool_results(&report.outcome.messages),
        vec![(
            "c1".to_owned(),
            "not executed: permission denied".to_owned(),
            true
        )]
    );
    assert!(open.seen().is_empty(), "{:?}", open.seen());
    assert_eq!(report.tools[0].decision, CallDecision::Denied);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists());
}

#[test]
fn read_only_tools_never_reach_the_approver() {
    let tmp = TempDir::new("hooks-approver");
    tmp.write("a.txt", "alpha\n");
    let asked = Arc::new(Mutex::new(Vec::new()));
    let approver = CountingApprover {
        decision: Decision::Allow,
        asked: Arc::clone(&asked),
    };
    let counter = Counting::new("count", Capability::ReadOnly);
    let builder = AgentBuilder::new(Arc::new(approver))
        .read_only_tool(ReadFile::new(tmp.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(counter.clone())
        .unwrap()
        .plan()
        .unwrap()
        .tool(
            RunMain::new(
                tmp.path(),
                RunSettings::new(vec!["sh".into(), "-c".into(), "echo ran".into()]),
            )
            .unwrap(),
        )
        .unwrap();
    let report = run(
        builder,
        vec![
            ("c1", "read_file", json!({"path": "a.txt"})),
            ("c2", "count", json!({})),
            (
                "c3",
                "todo_write",
                json!({"items": [{"id": "1", "text": "read", "status": "pending"}]}),
            ),
            ("c4", "run_main", json!({})),
        ],
    );

    assert_eq!(
        *asked.lock().unwrap(),
        vec![(
            "parent".to_owned(),
            "c4".to_owned(),
            "run_main".to_owned(),
            "sh -c echo ran".to_owned()
        )]
    );
    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 4);
    assert!(
        results.iter().all(|(_, _, is_error)| !is_error),
        "{results:?}"
    );
    assert!(
        results[3].1.contains("\"stdout\":\"ran\\n\""),
        "{}",
        results[3].1
    );
    let decisions: Vec<CallDecision> = report.tools.iter().map(|t| t.decision).collect();
    assert_eq!(
        decisions,
        [
            CallDecision::NotRequired,
            CallDecision::NotRequired,
            CallDecision::NotRequired,
            CallDecision::Allowed
        ]
    );
    assert_eq!(counter.runs(), 1);
}

#[test]
fn hook_payloads_carry_the_agent_and_the_call() {
    let counter = Counting::new("count", Capability::ReadOnly);
    let hook = TestHook::new("spy", Before::Continue, After::Ok);
    let builder = with_counter(
        Arc::new(AllowAll),
        &counter,
        Hooks::none().with(hook.clone()),
    );
    let _report = run(
        builder,
        vec![
            ("toolu_01", "count", json!({"a": [1, 2], "b": "x"})),
            ("toolu_02", "count", json!({})),
        ],
    );
    let seen = hook.seen();
    let summary: Vec<(&str, &str, &str, &str, &Value)> = seen
        .iter()
        .map(|s| {
            (
                s.phase,
                s.agent.as_str(),
                s.id.as_str(),
                s.tool.as_str(),
                &s.input,
            )
        })
        .collect();
    let first = json!({"a": [1, 2], "b": "x"});
    let second = json!({});
    assert_eq!(
        summary,
        vec![
            ("before", "parent", "toolu_01", "count", &first),
            ("after", "parent", "toolu_01", "count", &first),
            ("before", "parent", "toolu_02", "count", &second),
            ("after", "parent", "toolu_02", "count", &second),
        ]
    );
    assert_eq!(seen[1].output, Some(ToolOutput::ok("count ran")));
    assert_eq!(counter.runs(), 2);
}

/// An approver that panics on every call.
struct PanickingApprover;

impl Approver for PanickingApprover {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        panic!("approval service unreachable")
    }
}

#[test]
fn an_approver_that_panics_fails_closed_and_the_run_goes_on() {
    let counter = Counting::new("exec", Capability::Executes);
    let reader = Counting::new("look", Capability::ReadOnly);
    let builder = with_counter(Arc::new(PanickingApprover), &counter, Hooks::none())
        .tool(reader.clone())
        .unwrap();
    let report = run(
        builder,
        vec![("c1", "exec", json!({})), ("c2", "look", json!({}))],
    );

    assert_eq!(report.outcome.text, "done");
    let results = tool_results(&report.outcome.messages);
    assert_eq!(
        results[0],
        (
            "c1".to_owned(),
            "not executed: approval failed".to_owned(),
            true
        )
    );
    assert_eq!(counter.runs(), 0, "the call ran without approval");
    assert_eq!(report.tools[0].decision, CallDecision::Denied);
    // The next call of the same reply still runs.
    assert_eq!(reader.runs(), 1);
    assert!(!results[1].2);
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert_eq!(report.warnings[0].agent, AgentId::Parent);
    assert!(
        report.warnings[0]
            .text
            .contains("approval service unreachable"),
        "{:?}",
        report.warnings
    );
}

/// An approver that takes long enough for the run to be stopped meanwhile
/// (a Ctrl-C or a passing deadline while a `y/N` prompt waits), then allows.
struct SlowApprover(subloop::run::limits::CancelHandle);

impl Approver for SlowApprover {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        self.0.cancel();
        Decision::Allow
    }
}

#[test]
fn a_run_stopped_while_the_approver_decides_does_not_start_the_tool() {
    let counter = Counting::new("exec", Capability::Executes);
    let cancel = subloop::run::limits::CancelHandle::new();
    let builder = with_counter(
        Arc::new(SlowApprover(cancel.clone())),
        &counter,
        Hooks::none(),
    )
    .limits(subloop::run::limits::Limits::default(), cancel);
    let report = run(builder, vec![("c1", "exec", json!({}))]);

    assert_eq!(
        counter.runs(),
        0,
        "the tool started after the run was stopped"
    );
    assert_eq!(report.tools[0].decision, CallDecision::Stopped);
    let results = tool_results(&report.outcome.messages);
    assert!(
        results[0]
            .1
            .starts_with("not executed: the run was stopped"),
        "{results:?}"
    );
    assert!(results[0].2);
    assert_eq!(report.outcome.status, subloop::StatusKind::Cancelled);
}

crate::async_twins!(
    a_blocking_before_hook_stops_the_call,
    a_before_hook_that_errors_fails_closed,
    a_before_hook_that_panics_fails_closed,
    an_after_hook_sees_the_result,
    an_after_hook_that_errors_or_panics_marks_the_result_as_error,
    hook_warnings_appear_in_the_report,
    the_audit_log_has_a_before_and_an_after_entry_per_call,
    deny_wins_over_hooks,
    read_only_tools_never_reach_the_approver,
    hook_payloads_carry_the_agent_and_the_call,
    an_approver_that_panics_fails_closed_and_the_run_goes_on,
    a_run_stopped_while_the_approver_decides_does_not_start_the_tool,
);

/// An approver whose answer comes from elsewhere: an async run awaits
/// `decide_async` (here, a channel another task answers later); `decide`,
/// which a blocking run would ask, must not be reached.
struct RemoteApprover {
    answer: Mutex<Option<tokio::sync::oneshot::Receiver<Decision>>>,
    asked: Arc<AtomicUsize>,
}

impl Approver for RemoteApprover {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        panic!("an async run asked the blocking approver")
    }

    fn decide_async<'a>(
        &'a self,
        _request: &'a ApprovalRequest<'a>,
    ) -> subloop::run::BoxFuture<'a, Decision> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer.lock().unwrap().take();
        Box::pin(async move {
            match answer {
                Some(answer) => answer.await.unwrap_or(Decision::Deny),
                None => Decision::Deny,
            }
        })
    }
}

#[test]
fn an_async_run_awaits_the_approvers_async_answer() {
    for decision in [Decision::Allow, Decision::Deny] {
        let counter = Counting::new("exec", Capability::Executes);
        let (send, receive) = tokio::sync::oneshot::channel();
        let asked = Arc::new(AtomicUsize::new(0));
        let approver = RemoteApprover {
            answer: Mutex::new(Some(receive)),
            asked: Arc::clone(&asked),
        };
        let agent = with_counter(Arc::new(approver), &counter, Hooks::none()).build();
        let mut model = RecordingModel::new(vec![
            Ok(ModelResponse::tool_calls(vec![("c1", "exec", json!({}))])),
            Ok(ModelResponse::answer("done")),
        ]);
        let runtime = common::runtime();
        let report = runtime.block_on(async {
            let answering = {
                let asked = Arc::clone(&asked);
                tokio::spawn(async move {
                    // The run is waiting on the approver, not blocked in it.
                    while asked.load(Ordering::SeqCst) == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    send.send(decision).unwrap();
                })
            };
            let mut model = subloop::run::model::Blocking(&mut model);
            let report = agent
                .run_async("go", Budget::new(3).unwrap(), &mut model)
                .await
                .unwrap();
            answering.await.unwrap();
            report
        });
        assert_eq!(report.outcome.text, "done");
        let results = tool_results(&report.outcome.messages);
        match decision {
            Decision::Allow => {
                assert_eq!(counter.runs(), 1);
                assert_eq!(report.tools[0].decision, CallDecision::Allowed);
            }
            _ => {
                assert_eq!(counter.runs(), 0);
                assert_eq!(results[0].1, "not executed: permission denied");
                assert_eq!(report.tools[0].decision, CallDecision::Denied);
            }
        }
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    }
}
