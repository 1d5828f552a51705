//! The `task` tool: a subagent with a fresh history, a whitelist, its own
//! budget and hooks, the parent's gate, and a bounded report under the
//! original tool_use id.

use crate::common;
use crate::common::RunDriven;

use common::tool_results;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::common::ScriptedReply;
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Model;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::StatusKind;
use subloop::agent::subagent::{ChildBudget, SubagentConfig, TaskTool};
use subloop::core::call::CallDecision;
use subloop::core::conversation::ToolOutput;
use subloop::core::error::ModelFailure;
use subloop::core::error::SetupError;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::ReplyBlock;
use subloop::core::protocol::StopReason;
use subloop::policy::hooks::{Hook, HookCall, HookError, Hooks, Verdict};
use subloop::policy::permission::{AllowAll, ApprovalRequest, Approver, Decision, DenyAll};
use subloop::providers::scripted::ScriptedChildren;
use subloop::run::BoxFuture;
use subloop::run::model::{AsyncModel, ChildModels, Received};
use subloop::tools::{Capability, ReadFile, ReadOnlyTool, RunMain, RunSettings, Tool, ToolContext};

use common::{RecordingModel, SeenRequest, TempDir};

// ---------------------------------------------------------------- helpers

/// Child models that are RecordingModels, one per delegation number, created
/// on demand from `scripts[number - 1]` (an empty script when missing).
struct RecordingChildren {
    scripts: Vec<Vec<ScriptedReply>>,
    created: Mutex<Vec<(usize, RecordingModel)>>,
}

impl RecordingChildren {
    fn new(scripts: Vec<Vec<ScriptedReply>>) -> Arc<Self> {
        Arc::new(Self {
            scripts,
            created: Mutex::new(Vec::new()),
        })
    }

    fn created(&self) -> Vec<(usize, RecordingModel)> {
        self.created.lock().unwrap().clone()
    }

    /// The requests the `number`-th child's model saw.
    fn requests(&self, number: usize) -> Vec<SeenRequest> {
        self.created()
            .into_iter()
            .find(|(n, _)| *n == number)
            .map(|(_, model)| model.requests())
            .unwrap_or_else(|| panic!("no child model {number} was created"))
    }

    fn total_requests(&self) -> usize {
        self.created()
            .iter()
            .map(|(_, model)| model.requests().len())
            .sum()
    }
}

impl ChildModels for RecordingChildren {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        let replies = self.scripts.get(number - 1).cloned().unwrap_or_default();
        let model = RecordingModel::new(replies);
        self.created.lock().unwrap().push((number, model.clone()));
        Box::new(model)
    }
}

fn as_child_models(children: &Arc<RecordingChildren>) -> Arc<dyn ChildModels> {
    Arc::clone(children) as Arc<dyn ChildModels>
}

/// An approver that counts and records every question, answering `answer`.
struct CountingApprover {
    answer: Decision,
    asked: Mutex<Vec<(String, String)>>,
}

impl CountingApprover {
    fn new(answer: Decision) -> Arc<Self> {
        Arc::new(Self {
            answer,
            asked: Mutex::new(Vec::new()),
        })
    }

    /// `(agent, tool)` of every question, in order.
    fn asked(&self) -> Vec<(String, String)> {
        self.asked.lock().unwrap().clone()
    }
}

impl Approver for CountingApprover {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        self.asked
            .lock()
            .unwrap()
            .push((request.agent.to_string(), request.call.name().to_owned()));
        self.answer
    }
}

/// What a hook saw of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    phase: &'static str,
    agent: String,
    parent_tool_use_id: Option<String>,
    tool: String,
    id: String,
}

/// A hook that records every call it sees.
struct RecordingHook {
    name: &'static str,
    log: Arc<Mutex<Vec<Seen>>>,
}

impl RecordingHook {
    fn new(name: &'static str) -> (Self, Arc<Mutex<Vec<Seen>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        (
            Self {
                name,
                log: Arc::clone(&log),
            },
            log,
        )
    }

    fn push(&self, phase: &'static str, call: &HookCall<'_>) {
        self.log.lock().unwrap().push(Seen {
            phase,
            agent: call.agent.to_string(),
            parent_tool_use_id: call.agent.parent_tool_use_id().map(|id| id.to_string()),
            tool: call.tool().to_owned(),
            id: call.id().to_string(),
        });
    }
}

impl Hook for RecordingHook {
    fn name(&self) -> &str {
        self.name
    }

    fn before(&self, call: &HookCall<'_>, _: &mut Vec<String>) -> Result<Verdict, HookError> {
        self.push("before", call);
        Ok(Verdict::Continue)
    }

    fn after(
        &self,
        call: &HookCall<'_>,
        _: &ToolOutput,
        _: &mut Vec<String>,
    ) -> Result<(), HookError> {
        self.push("after", call);
        Ok(())
    }
}

/// A second read-only tool, to show the whitelist picks exactly what it names.
struct Echo;

impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echo the input back."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    }
    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }
    fn run(&self, input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        ToolOutput::ok(input["text"].as_str().unwrap_or_default())
    }
}

impl ReadOnlyTool for Echo {}

const MARKER: &str = "marker.txt";

/// A workspace whose main.py leaves a marker file when it runs.
fn workspace() -> TempDir {
    let dir = TempDir::new("subagent");
    dir.write(
        "main.py",
        format!("open('{MARKER}', 'w').write('ran')\nprint(6 * 7)\n"),
    );
    dir.write("expected.txt", "42\n");
    dir.write("notes.txt", "the answer is 42\n");
    dir
}

fn marker(dir: &TempDir) -> PathBuf {
    dir.path().join(MARKER)
}

/// The full parent tool set: read_file (read-only), run_main, todo_write.
fn builder(ws: &Path, approver: Arc<dyn Approver>) -> AgentBuilder {
    AgentBuilder::new(approver)
        .read_only_tool(ReadFile::new(ws, ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(RunMain::new(ws, RunSettings::default()).unwrap())
        .unwrap()
        .plan()
        .unwrap()
}

fn run(
    ws: &Path,
    approver: Arc<dyn Approver>,
    config: SubagentConfig,
    parent: &RecordingModel,
) -> RunReport {
    let agent = builder(ws, approver).subagents(config).unwrap().build();
    let mut model = parent.clone();
    agent
        .run_driven("Check the workspace.", Budget::new(8).unwrap(), &mut model)
        .unwrap()
}

fn task_call(id: &str, task: impl Into<String>) -> ScriptedReply {
    Ok(ModelResponse::tool_calls([(
        id,
        "task",
        json!({"task": task.into()}),
    )]))
}

fn call(id: &str, name: &str, input: Value) -> ScriptedReply {
    Ok(ModelResponse::tool_calls([(id, name, input)]))
}

fn answer(text: impl Into<String>) -> ScriptedReply {
    Ok(ModelResponse::answer(text))
}

/// The one tool_result under `id` in a history.
fn result_for(messages: &[Message], id: &str) -> (String, bool) {
    let found: Vec<_> = tool_results(messages)
        .into_iter()
        .filter(|(result_id, ..)| result_id == id)
        .collect();
    assert_eq!(found.len(), 1, "exactly one result for {id}: {found:?}");
    let (_, content, is_error) = found.into_iter().next().unwrap();
    (content, is_error)
}

fn report_json(content: &str) -> Value {
    let value: Value = serde_json::from_str(content).expect("the report is JSON");
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        ["calls", "status", "summary"],
        "report keys: {content}"
    );
    value
}

fn names(request: &SeenRequest) -> Vec<&str> {
    request
        .tools
        .iter()
        .map(|tool| tool.name.as_str())
        .collect()
}

// ------------------------------------------------------- fresh histories

#[test]
fn parent_and_child_histories_are_separate() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![
        task_call(
            "toolu_task_1",
            "  \n Read main.py and say what it prints.\t ",
        ),
        answer("The subagent says 42."),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        answer("CHILD-ONLY: main.py prints 42"),
    ]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );

    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.children.len(), 1);
    let child = &report.children[0];
    assert_eq!(child.outcome.status, StatusKind::Answered);
    assert_eq!(child.outcome.calls, 2);
    assert_eq!(child.task, "Read main.py and say what it prints.");

    // The child's first request: exactly [user: trimmed task], its own system, no plan.
    let seen = children.requests(1);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].messages,
        vec![Message::user_text("Read main.py and say what it prints.")]
    );
    for request in &seen {
        assert_eq!(request.system, SubagentConfig::CHILD_SYSTEM);
        assert_ne!(request.system, AgentBuilder::PARENT_SYSTEM);
        assert_eq!(request.attachment, None, "no plan for the child");
    }
    // The child's second request holds only its own messages.
    assert_eq!(seen[1].messages.len(), 3);
    assert_eq!(seen[1].messages[..], child.outcome.messages[..3]);

    // The parent's requests carry the parent's system prompt and its plan.
    let parent_seen = parent.requests();
    assert_eq!(parent_seen.len(), 2);
    for request in &parent_seen {
        assert_eq!(request.system, AgentBuilder::PARENT_SYSTEM);
        assert!(
            request.attachment.is_some(),
            "the plan is attached to the parent"
        );
    }

    // No child message appears in the parent's history (or its requests).
    assert_eq!(report.outcome.messages.len(), 4);
    assert_eq!(child.outcome.messages.len(), 4);
    for message in &child.outcome.messages {
        assert!(
            !report.outcome.messages.contains(message),
            "child message leaked into the parent: {message:?}"
        );
        for request in &parent_seen {
            assert!(!request.messages.contains(message));
        }
    }
    let parent_text = serde_json::to_string(&report.outcome.messages).unwrap();
    assert!(!parent_text.contains("toolu_c1"));
    // Only the summary comes back, inside the report.
    let (content, is_error) = result_for(&report.outcome.messages, "toolu_task_1");
    assert!(!is_error);
    assert_eq!(
        content,
        r#"{"status":"answered","summary":"CHILD-ONLY: main.py prints 42","calls":2}"#
    );
}

// -------------------------------------------------------------- whitelist

/// Today's input schema of each built-in tool, byte for byte, as the model
/// sees it: a tool whose schema becomes generated from a Rust type (a typed
/// tool) must keep offering exactly these bytes.
const BUILTIN_SCHEMAS: [(&str, &str); 4] = [
    (
        "read_file",
        r#"{"additionalProperties":false,"properties":{"path":{"description":"Path relative to the workspace root","maxLength":4096,"minLength":1,"type":"string"}},"required":["path"],"type":"object"}"#,
    ),
    (
        "run_main",
        r#"{"additionalProperties":false,"properties":{},"type":"object"}"#,
    ),
    (
        "todo_write",
        r#"{"additionalProperties":false,"properties":{"items":{"items":{"additionalProperties":false,"properties":{"id":{"maxLength":64,"minLength":1,"type":"string"},"status":{"enum":["pending","in_progress","completed"],"type":"string"},"text":{"maxLength":200,"minLength":1,"type":"string"}},"required":["id","text","status"],"type":"object"},"maxItems":20,"type":"array"}},"required":["items"],"type":"object"}"#,
    ),
    (
        "task",
        r#"{"additionalProperties":false,"properties":{"task":{"description":"The sub-question, 1 to 600 characters, self-contained","minLength":1,"type":"string"}},"required":["task"],"type":"object"}"#,
    ),
];

#[test]
fn the_builtin_tools_offer_the_same_schemas_byte_for_byte() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![answer("done")]);
    let children = RecordingChildren::new(Vec::new());
    run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let offered: Vec<(String, String)> = parent.requests()[0]
        .tools
        .iter()
        .map(|def| {
            (
                def.name.clone(),
                serde_json::to_string(&def.input_schema).unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = BUILTIN_SCHEMAS
        .iter()
        .map(|(name, schema)| ((*name).to_owned(), (*schema).to_owned()))
        .collect();
    assert_eq!(offered, expected);
}

#[test]
fn child_tool_definitions_are_exactly_the_default_whitelist() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![
        task_call("toolu_t", "Read two files."),
        answer("done"),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        call("toolu_c2", "read_file", json!({"path": "expected.txt"})),
        answer("read both"),
    ]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    assert_eq!(report.children[0].outcome.calls, 3);

    let parent_defs = parent.requests()[0].tools.clone();
    let parent_names: Vec<&str> = parent_defs.iter().map(|def| def.name.as_str()).collect();
    assert_eq!(
        parent_names,
        ["read_file", "run_main", "todo_write", "task"]
    );
    let read_file_def = parent_defs
        .iter()
        .find(|def| def.name == "read_file")
        .unwrap();

    let seen = children.requests(1);
    assert_eq!(seen.len(), 3);
    for request in &seen {
        assert_eq!(names(request), ["read_file"]);
        assert_eq!(request.tools, vec![read_file_def.clone()]);
    }
}

#[test]
fn child_tool_definitions_follow_a_custom_whitelist() {
    let ws = workspace();
    let make = |whitelist: &[&str]| {
        let parent = RecordingModel::new(vec![task_call("toolu_t", "Echo."), answer("done")]);
        let children = RecordingChildren::new(vec![vec![
            call("toolu_c1", "echo", json!({"text": "hi"})),
            answer("echoed"),
        ]]);
        let agent = builder(ws.path(), Arc::new(AllowAll))
            .read_only_tool(Echo)
            .unwrap()
            .subagents(
                SubagentConfig::new(as_child_models(&children), Hooks::none()).whitelist(whitelist),
            )
            .unwrap()
            .build();
        let mut model = parent.clone();
        let report = agent
            .run_driven("q", Budget::new(4).unwrap(), &mut model)
            .unwrap();
        (report, children)
    };

    // Only echo: read_file is not offered and not dispatched.
    let (report, children) = make(&["echo"]);
    for request in children.requests(1) {
        assert_eq!(names(&request), ["echo"]);
    }
    assert_eq!(
        report.children[0].tools[0].decision,
        CallDecision::NotRequired
    );
    let (content, is_error) = result_for(&report.children[0].outcome.messages, "toolu_c1");
    assert_eq!((content.as_str(), is_error), ("hi", false));

    // Both, in whitelist order.
    let (_, children) = make(&["echo", "read_file"]);
    for request in children.requests(1) {
        assert_eq!(names(&request), ["echo", "read_file"]);
    }

    // Only read_file: echo is unregistered for the child even though the parent has it.
    let (report, children) = make(&["read_file"]);
    for request in children.requests(1) {
        assert_eq!(names(&request), ["read_file"]);
    }
    let (content, is_error) = result_for(&report.children[0].outcome.messages, "toolu_c1");
    assert_eq!(content, "not executed: unregistered tool echo");
    assert!(is_error);
}

#[test]
fn child_cannot_run_main_delegate_or_plan_even_with_allow_all() {
    let ws = workspace();
    let approver = CountingApprover::new(Decision::Allow);
    let parent = RecordingModel::new(vec![
        task_call("toolu_t", "Try everything."),
        answer("done"),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "run_main", json!({})),
        call("toolu_c2", "task", json!({"task": "recurse"})),
        call(
            "toolu_c3",
            "todo_write",
            json!({"todos": [{"id": "1", "text": "x", "status": "pending"}]}),
        ),
        Ok(ModelResponse::tool_calls([
            ("toolu_c4", "run_main", json!({})),
            ("toolu_c5", "task", json!({"task": "recurse again"})),
            ("toolu_c6", "todo_write", json!({"todos": []})),
        ])),
        answer("I could not do any of it"),
    ]]);
    let report = run(
        ws.path(),
        approver.clone(),
        SubagentConfig::new(as_child_models(&children), Hooks::none())
            .budget(ChildBudget::new(8).unwrap()),
        &parent,
    );

    let child = &report.children[0];
    assert_eq!(child.outcome.status, StatusKind::Answered);
    for (id, tool) in [
        ("toolu_c1", "run_main"),
        ("toolu_c2", "task"),
        ("toolu_c3", "todo_write"),
        ("toolu_c4", "run_main"),
        ("toolu_c5", "task"),
        ("toolu_c6", "todo_write"),
    ] {
        let (content, is_error) = result_for(&child.outcome.messages, id);
        assert_eq!(content, format!("not executed: unregistered tool {tool}"));
        assert!(is_error);
    }
    assert_eq!(child.tools.len(), 6);
    assert!(
        child
            .tools
            .iter()
            .all(|record| record.decision == CallDecision::Unregistered && record.is_error)
    );

    // Nothing ran: no process, no approval asked, no nested child, no plan change.
    assert!(!marker(&ws).exists(), "main.py must not have run");
    assert!(approver.asked().is_empty());
    assert_eq!(children.created().len(), 1, "no grandchild was created");
    assert_eq!(report.children.len(), 1);
    let parent_seen = parent.requests();
    assert_eq!(parent_seen[0].attachment, parent_seen[1].attachment);
    assert!(
        !parent_seen[1]
            .attachment
            .as_deref()
            .unwrap()
            .contains("[ ]")
    );
}

#[test]
fn control_the_marker_appears_when_the_parent_runs_main() {
    // Shows the marker check above can fail: the same workspace does leave it.
    let ws = workspace();
    let approver = CountingApprover::new(Decision::Allow);
    let parent = RecordingModel::new(vec![call("toolu_r", "run_main", json!({})), answer("ran")]);
    let children = RecordingChildren::new(vec![]);
    let report = run(
        ws.path(),
        approver.clone(),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    assert_eq!(report.tools[0].decision, CallDecision::Allowed);
    assert!(marker(&ws).exists());
    assert_eq!(
        approver.asked(),
        [("parent".to_owned(), "run_main".to_owned())]
    );
}

// ------------------------------------------------------------------ budget

#[test]
fn budget_one_gives_call_limit_and_an_error_report() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![
        task_call("toolu_t", "Read main.py."),
        answer("the child ran out"),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        answer("never asked"),
    ]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none())
            .budget(ChildBudget::new(1).unwrap()),
        &parent,
    );

    assert_eq!(children.requests(1).len(), 1);
    let child = &report.children[0];
    assert_eq!(child.outcome.status, StatusKind::CallLimit);
    assert_eq!(child.outcome.calls, 1);
    // The last reply's tool still ran.
    let (content, is_error) = result_for(&child.outcome.messages, "toolu_c1");
    assert!(content.contains("print(6 * 7)"));
    assert!(!is_error);

    let (raw, is_error) = result_for(&report.outcome.messages, "toolu_t");
    assert!(is_error);
    let value = report_json(&raw);
    assert_eq!(value["status"], "call_limit");
    assert_eq!(value["calls"], 1);
    assert_eq!(value["summary"], child.outcome.text.as_str());
    // Key order on the wire: status, summary, calls.
    assert!(
        raw.starts_with(r#"{"status":"call_limit","summary":"#),
        "{raw}"
    );
    assert!(raw.ends_with(r#","calls":1}"#), "{raw}");
    let status = raw.find("\"status\"").unwrap();
    let summary = raw.find("\"summary\"").unwrap();
    let calls = raw.rfind("\"calls\"").unwrap();
    assert!(status < summary && summary < calls);

    assert!(child.report.is_error);
    assert_eq!(child.report.calls, 1);
    assert_eq!(child.report.status, StatusKind::CallLimit);
    assert_eq!(report.tools[0].name, "task");
    assert!(report.tools[0].is_error);
}

#[test]
fn child_budget_outside_one_to_eight_is_an_error() {
    assert_eq!(ChildBudget::new(0), Err(SetupError::ChildBudget(0)));
    assert_eq!(ChildBudget::new(9), Err(SetupError::ChildBudget(9)));
    assert_eq!(ChildBudget::new(1).unwrap().get().get(), 1);
    assert_eq!(ChildBudget::new(8).unwrap().get().get(), 8);
    assert_eq!(ChildBudget::default().get().get(), 4);
}

#[test]
fn default_child_budget_is_four_calls() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![task_call("toolu_t", "Loop."), answer("done")]);
    let looping: Vec<ScriptedReply> = (1..=6)
        .map(|n| {
            call(
                &format!("toolu_c{n}"),
                "read_file",
                json!({"path": "main.py"}),
            )
        })
        .collect();
    let children = RecordingChildren::new(vec![looping]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    assert_eq!(children.requests(1).len(), 4);
    assert_eq!(report.children[0].outcome.status, StatusKind::CallLimit);
    let (raw, is_error) = result_for(&report.outcome.messages, "toolu_t");
    assert!(is_error);
    assert_eq!(report_json(&raw)["calls"], 4);
}

// ------------------------------------------------------- summary length

fn summary_run(text: String) -> (String, bool, RunReport) {
    let ws = workspace();
    let parent = RecordingModel::new(vec![task_call("toolu_t", "Say a lot."), answer("ok")]);
    let children = RecordingChildren::new(vec![vec![answer(text)]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let (raw, is_error) = result_for(&report.outcome.messages, "toolu_t");
    (raw, is_error, report)
}

#[test]
fn a_summary_of_1201_characters_is_truncated_and_flagged() {
    assert_eq!(TaskTool::MAX_SUMMARY_CHARS, 1200);
    assert_eq!(
        TaskTool::TRUNCATION_NOTE,
        "(summary too long, truncated; narrow the task)"
    );
    let text: String = (0..1201)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let (raw, is_error, report) = summary_run(text.clone());
    assert!(is_error);
    let value = report_json(&raw);
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 1);
    let summary = value["summary"].as_str().unwrap();
    let expected = format!(
        "{}(summary too long, truncated; narrow the task)",
        &text[..1200]
    );
    assert_eq!(summary, expected);
    assert_eq!(
        summary.chars().count(),
        1200 + TaskTool::TRUNCATION_NOTE.chars().count()
    );
    // The child's own outcome keeps the whole text; only the report is cut.
    assert_eq!(report.children[0].outcome.text, text);
    assert_eq!(report.children[0].report.status, StatusKind::Answered);
    assert!(report.children[0].report.is_error);
}

#[test]
fn a_summary_of_1200_characters_passes_whole() {
    let text = "z".repeat(1200);
    let (raw, is_error, _) = summary_run(text.clone());
    assert!(!is_error);
    let value = report_json(&raw);
    assert_eq!(value["status"], "answered");
    assert_eq!(value["summary"], text.as_str());
}

#[test]
fn multibyte_summaries_are_cut_at_character_boundaries() {
    // 1201 characters of 2, 3 and 4 bytes.
    let cycle = ['é', '€', '😀', 'ß'];
    let text: String = (0..1201).map(|i| cycle[i % cycle.len()]).collect();
    assert!(text.len() > 1200 * 2);
    let (raw, is_error, _) = summary_run(text.clone());
    assert!(is_error);
    let summary = report_json(&raw)["summary"].as_str().unwrap().to_owned();
    let kept: String = text.chars().take(1200).collect();
    assert_eq!(summary, format!("{kept}{}", TaskTool::TRUNCATION_NOTE));

    // 1200 multibyte characters (more than 1200 bytes) pass whole.
    let text: String = (0..1200).map(|i| cycle[i % cycle.len()]).collect();
    let (raw, is_error, _) = summary_run(text.clone());
    assert!(!is_error);
    assert_eq!(report_json(&raw)["summary"], text.as_str());
}

// ---------------------------------------------------------- invalid tasks

fn invalid_inputs() -> Vec<(&'static str, Value)> {
    vec![
        ("empty", json!({"task": ""})),
        ("whitespace", json!({"task": "  \n\t  "})),
        (
            "601 after trimming",
            json!({"task": format!("  {}  ", "x".repeat(601))}),
        ),
        ("missing", json!({})),
        ("number", json!({"task": 42})),
        ("null", json!({"task": null})),
    ]
}

#[test]
fn invalid_tasks_are_refused_under_the_original_id_without_a_child() {
    let ws = workspace();
    for (label, input) in invalid_inputs() {
        let id = format!("toolu_bad_{}", label.replace(' ', "_"));
        let parent = RecordingModel::new(vec![
            Ok(ModelResponse::tool_calls([(
                id.as_str(),
                "task",
                input.clone(),
            )])),
            answer("refused"),
        ]);
        let children = RecordingChildren::new(vec![vec![answer("must not run")]]);
        let report = run(
            ws.path(),
            Arc::new(AllowAll),
            SubagentConfig::new(as_child_models(&children), Hooks::none()),
            &parent,
        );
        let results = tool_results(&report.outcome.messages);
        assert_eq!(results.len(), 1, "{label}");
        let (result_id, content, is_error) = &results[0];
        assert_eq!(result_id, &id, "{label}");
        assert!(is_error, "{label}");
        assert!(content.starts_with("not executed:"), "{label}: {content}");
        assert!(
            children.created().is_empty(),
            "{label}: a child model was created"
        );
        assert!(report.children.is_empty(), "{label}");
        assert_eq!(report.outcome.status, StatusKind::Answered, "{label}");
        assert_eq!(parent.requests().len(), 2, "{label}: the parent continues");
    }
}

#[test]
fn invalid_tasks_in_one_reply_are_refused_each_under_its_id() {
    // Several task calls in one reply take the batch path: the same rules hold.
    let ws = workspace();
    let mut calls: Vec<(String, &str, Value)> = invalid_inputs()
        .into_iter()
        .enumerate()
        .map(|(i, (_, input))| (format!("toolu_bad_{i}"), "task", input))
        .collect();
    calls.push((
        "toolu_good".to_owned(),
        "task",
        json!({"task": "  Read notes.txt. "}),
    ));
    let parent = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls(calls.clone())),
        answer("done"),
    ]);
    let children = RecordingChildren::new(vec![vec![answer("only valid one")]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let results = tool_results(&report.outcome.messages);
    let ids: Vec<&str> = results.iter().map(|(id, ..)| id.as_str()).collect();
    let expected: Vec<&str> = calls.iter().map(|(id, ..)| id.as_str()).collect();
    assert_eq!(ids, expected);
    for (id, content, is_error) in &results[..results.len() - 1] {
        assert!(is_error, "{id}");
        assert!(content.starts_with("not executed:"), "{id}: {content}");
    }
    let (_, content, is_error) = results.last().unwrap();
    assert!(!is_error);
    assert_eq!(
        content,
        r#"{"status":"answered","summary":"only valid one","calls":1}"#
    );
    // Exactly one child, numbered 1, for the one valid task.
    let created = children.created();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].0, 1);
    assert_eq!(report.children.len(), 1);
    assert_eq!(report.children[0].agent.to_string(), "child-1");
    assert_eq!(report.children[0].parent_tool_use_id.as_str(), "toolu_good");
    assert_eq!(
        children.requests(1)[0].messages,
        vec![Message::user_text("Read notes.txt.")]
    );
}

#[test]
fn a_task_of_600_characters_after_trimming_is_accepted() {
    let ws = workspace();
    let task = "y".repeat(600);
    let parent = RecordingModel::new(vec![
        task_call("toolu_t", format!("\n  {task}  \n")),
        answer("ok"),
    ]);
    let children = RecordingChildren::new(vec![vec![answer("fine")]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let (_, is_error) = result_for(&report.outcome.messages, "toolu_t");
    assert!(!is_error);
    assert_eq!(
        children.requests(1)[0].messages,
        vec![Message::user_text(task)]
    );
}

// --------------------------------------------------------- child failures

#[test]
fn a_child_model_error_still_produces_the_report() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![task_call("toolu_t", "Read."), answer("carried on")]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        Err(ModelFailure::new("upstream exploded")),
    ]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.outcome.text, "carried on");
    let (raw, is_error) = result_for(&report.outcome.messages, "toolu_t");
    assert!(is_error);
    let value = report_json(&raw);
    assert_eq!(value["status"], "model_error");
    assert_eq!(value["calls"], 2);
    assert!(
        value["summary"]
            .as_str()
            .unwrap()
            .contains("upstream exploded")
    );
}

#[test]
fn a_child_protocol_error_still_produces_the_report() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![task_call("toolu_t", "Read."), answer("carried on")]);
    let duplicate = ModelResponse {
        content: vec![
            ReplyBlock::Known(Block::tool_use(
                "dup",
                "read_file",
                json!({"path": "main.py"}),
            )),
            ReplyBlock::Known(Block::tool_use(
                "dup",
                "read_file",
                json!({"path": "expected.txt"}),
            )),
        ],
        stop_reason: Some(StopReason::ToolUse),
        usage: None,
    };
    let children = RecordingChildren::new(vec![vec![Ok(duplicate)]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let (raw, is_error) = result_for(&report.outcome.messages, "toolu_t");
    assert!(is_error);
    let value = report_json(&raw);
    assert_eq!(value["status"], "protocol_error");
    assert_eq!(value["calls"], 1);
    let summary = value["summary"].as_str().unwrap();
    assert!(summary.starts_with("protocol error:"), "{summary}");
    assert!(summary.contains("dup"), "{summary}");
    assert!(report.children[0].tools.is_empty(), "no tool ran");
}

#[test]
fn a_child_that_runs_out_of_script_reports_model_error() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![task_call("toolu_t", "Read."), answer("carried on")]);
    let children = RecordingChildren::new(vec![]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let (raw, is_error) = result_for(&report.outcome.messages, "toolu_t");
    assert!(is_error);
    assert_eq!(report_json(&raw)["status"], "model_error");
    assert_eq!(report.outcome.text, "carried on");
}

// ------------------------------------------------------------ setup errors

#[test]
fn whitelist_errors_at_construction() {
    let ws = workspace();
    let children = RecordingChildren::new(vec![]);
    let config = || SubagentConfig::new(as_child_models(&children), Hooks::none());

    let err = builder(ws.path(), Arc::new(AllowAll))
        .subagents(config().whitelist(&["grep"]))
        .unwrap_err();
    assert_eq!(err, SetupError::UnknownTool("grep".to_owned()));

    let err = builder(ws.path(), Arc::new(AllowAll))
        .subagents(config().whitelist(&["read_file", "write_file"]))
        .unwrap_err();
    assert_eq!(err, SetupError::UnknownTool("write_file".to_owned()));

    for name in ["run_main", "todo_write", "task"] {
        let err = builder(ws.path(), Arc::new(AllowAll))
            .subagents(config().whitelist(&["read_file", name]))
            .unwrap_err();
        assert_eq!(err, SetupError::NotReadOnly(name.to_owned()), "{name}");
    }

    // read_file registered as a general tool cannot be whitelisted either.
    let err = AgentBuilder::new(Arc::new(AllowAll))
        .tool(ReadFile::new(ws.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .subagents(config())
        .unwrap_err();
    assert_eq!(err, SetupError::NotReadOnly("read_file".to_owned()));

    // A parent without read_file cannot give it to the child (no fallback).
    let err = AgentBuilder::new(Arc::new(AllowAll))
        .subagents(config())
        .unwrap_err();
    assert_eq!(err, SetupError::UnknownTool("read_file".to_owned()));

    // The default whitelist builds fine on the full parent.
    let agent = builder(ws.path(), Arc::new(AllowAll)).subagents(config());
    assert!(agent.is_ok());
    assert!(children.created().is_empty());
}

// -------------------------------------------------------- hooks and gate

#[test]
fn the_child_runs_the_hooks_given_in_its_config_only() {
    let ws = workspace();
    let (parent_hook, parent_log) = RecordingHook::new("parent-hook");
    let (child_hook, child_log) = RecordingHook::new("child-hook");
    let parent = RecordingModel::new(vec![
        task_call("toolu_task_A", "Read main.py."),
        call("toolu_p2", "read_file", json!({"path": "expected.txt"})),
        answer("done"),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        answer("42"),
    ]]);
    let agent = builder(ws.path(), Arc::new(AllowAll))
        .hooks(Hooks::none().with(parent_hook))
        .subagents(SubagentConfig::new(
            as_child_models(&children),
            Hooks::none().with(child_hook),
        ))
        .unwrap()
        .build();
    let mut model = parent.clone();
    let report = agent
        .run_driven("q", Budget::new(8).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::Answered);

    let seen = |phase, agent: &str, parent_id: Option<&str>, tool: &str, id: &str| Seen {
        phase,
        agent: agent.to_owned(),
        parent_tool_use_id: parent_id.map(str::to_owned),
        tool: tool.to_owned(),
        id: id.to_owned(),
    };
    assert_eq!(
        *parent_log.lock().unwrap(),
        vec![
            seen("before", "parent", None, "task", "toolu_task_A"),
            seen("after", "parent", None, "task", "toolu_task_A"),
            seen("before", "parent", None, "read_file", "toolu_p2"),
            seen("after", "parent", None, "read_file", "toolu_p2"),
        ]
    );
    assert_eq!(
        *child_log.lock().unwrap(),
        vec![
            seen(
                "before",
                "child-1",
                Some("toolu_task_A"),
                "read_file",
                "toolu_c1"
            ),
            seen(
                "after",
                "child-1",
                Some("toolu_task_A"),
                "read_file",
                "toolu_c1"
            ),
        ]
    );

    // The audit log tags the child's entries the same way.
    let child_audit: Vec<_> = report
        .audit
        .iter()
        .filter(|entry| entry.call_id.as_str() == "toolu_c1")
        .collect();
    assert_eq!(child_audit.len(), 2);
    for entry in child_audit {
        assert_eq!(entry.agent.to_string(), "child-1");
        assert_eq!(
            entry.agent.parent_tool_use_id().map(|id| id.as_str()),
            Some("toolu_task_A")
        );
    }
    assert_eq!(report.children[0].agent.to_string(), "child-1");
    assert_eq!(
        report.children[0].parent_tool_use_id.as_str(),
        "toolu_task_A"
    );
}

#[test]
fn a_child_hook_is_not_run_for_the_parent_and_can_block_the_child() {
    struct Blocker;
    impl Hook for Blocker {
        fn name(&self) -> &str {
            "blocker"
        }
        fn before(&self, _: &HookCall<'_>, _: &mut Vec<String>) -> Result<Verdict, HookError> {
            Ok(Verdict::Block("no reading".to_owned()))
        }
    }
    let ws = workspace();
    let parent = RecordingModel::new(vec![
        call("toolu_p1", "read_file", json!({"path": "expected.txt"})),
        task_call("toolu_t", "Read main.py."),
        answer("done"),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        answer("blocked"),
    ]]);
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none().with(Blocker)),
        &parent,
    );
    // The parent's read ran (the child's hook is not the parent's).
    let (content, is_error) = result_for(&report.outcome.messages, "toolu_p1");
    assert_eq!((content.as_str(), is_error), ("42\n", false));
    // The child's read was blocked by its own hook.
    let (content, is_error) = result_for(&report.children[0].outcome.messages, "toolu_c1");
    assert_eq!(content, "not executed: blocked by hook blocker: no reading");
    assert!(is_error);
    assert_eq!(report.children[0].tools[0].decision, CallDecision::Blocked);
}

#[test]
fn child_calls_pass_the_parents_gate() {
    let ws = workspace();
    // The gate denies everything that needs approval.
    let approver = CountingApprover::new(Decision::Deny);
    let parent = RecordingModel::new(vec![
        task_call("toolu_t", "Read and try to run."),
        call("toolu_p2", "run_main", json!({})),
        answer("done"),
    ]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "main.py"})),
        call("toolu_c2", "run_main", json!({})),
        answer("read it"),
    ]]);
    let report = run(
        ws.path(),
        approver.clone(),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let child = &report.children[0];
    // read_file needs no approval: it ran even though the gate denies.
    assert_eq!(child.tools[0].name, "read_file");
    assert_eq!(child.tools[0].decision, CallDecision::NotRequired);
    let (content, is_error) = result_for(&child.outcome.messages, "toolu_c1");
    assert!(content.contains("print(6 * 7)"));
    assert!(!is_error);
    // run_main is not the child's: refused before the gate is asked.
    assert_eq!(child.tools[1].decision, CallDecision::Unregistered);
    // The only question the gate got is the parent's run_main.
    assert_eq!(
        approver.asked(),
        [("parent".to_owned(), "run_main".to_owned())]
    );
    let (content, is_error) = result_for(&report.outcome.messages, "toolu_p2");
    assert_eq!(content, "not executed: permission denied");
    assert!(is_error);
    assert!(!marker(&ws).exists());
}

#[test]
fn a_denying_gate_does_not_stop_child_reads() {
    let ws = workspace();
    let parent = RecordingModel::new(vec![task_call("toolu_t", "Read."), answer("done")]);
    let children = RecordingChildren::new(vec![vec![
        call("toolu_c1", "read_file", json!({"path": "notes.txt"})),
        answer("notes say 42"),
    ]]);
    let report = run(
        ws.path(),
        Arc::new(DenyAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let (content, is_error) = result_for(&report.children[0].outcome.messages, "toolu_c1");
    assert_eq!((content.as_str(), is_error), ("the answer is 42\n", false));
}

// --------------------------------------------------- parallel = sequential

/// Child `n` reads `file_n.txt` and answers with what it read.
fn per_child_scripts() -> Vec<Vec<ScriptedReply>> {
    (1..=3)
        .map(|n| {
            vec![
                call(
                    &format!("toolu_child{n}_read"),
                    "read_file",
                    json!({"path": format!("file_{n}.txt")}),
                ),
                answer(format!("child {n} read: content {n}")),
            ]
        })
        .collect()
}

/// ScriptedChildren, with child 1 slowed down so that it finishes last when
/// the children run at once; the reports must still come back in call order.
struct SlowFirst(ScriptedChildren);

struct Slow(Box<dyn Model + Send>);

impl Model for Slow {
    fn respond(
        &mut self,
        request: &subloop::core::protocol::Request<'_>,
    ) -> Result<ModelResponse, ModelFailure> {
        std::thread::sleep(std::time::Duration::from_millis(30));
        self.0.respond(request)
    }
}

impl ChildModels for SlowFirst {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        let model = self.0.model_for(number);
        if number == 1 {
            Box::new(Slow(model))
        } else {
            model
        }
    }
}

fn tasks() -> [(&'static str, String); 3] {
    [1, 2, 3].map(|n| match n {
        1 => ("toolu_t1", "Read file_1.txt.".to_owned()),
        2 => ("toolu_t2", "Read file_2.txt.".to_owned()),
        _ => ("toolu_t3", "Read file_3.txt.".to_owned()),
    })
}

fn delegation_run(parallel: bool) -> RunReport {
    let ws = workspace();
    for n in 1..=3 {
        ws.write(&format!("file_{n}.txt"), format!("content {n}"));
    }
    let mut replies: Vec<ScriptedReply> = if parallel {
        vec![Ok(ModelResponse::tool_calls(
            tasks().map(|(id, task)| (id, "task", json!({"task": task}))),
        ))]
    } else {
        tasks()
            .into_iter()
            .map(|(id, task)| task_call(id, task))
            .collect()
    };
    replies.push(answer("all three read"));
    let parent = RecordingModel::new(replies);
    let children: Arc<dyn ChildModels> = Arc::new(SlowFirst(ScriptedChildren(per_child_scripts())));
    run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(children, Hooks::none()),
        &parent,
    )
}

#[test]
fn parallel_delegations_give_the_same_transcript_as_sequential_ones() {
    let sequential = delegation_run(false);
    assert_eq!(sequential.outcome.status, StatusKind::Answered);
    assert_eq!(sequential.outcome.calls, 4);
    let expected_results: Vec<(String, String, bool)> = (1..=3)
        .map(|n| {
            (
                format!("toolu_t{n}"),
                format!(
                    r#"{{"status":"answered","summary":"child {n} read: content {n}","calls":2}}"#
                ),
                false,
            )
        })
        .collect();
    assert_eq!(tool_results(&sequential.outcome.messages), expected_results);

    for _ in 0..5 {
        let parallel = delegation_run(true);
        assert_eq!(parallel.outcome.status, StatusKind::Answered);
        assert_eq!(parallel.outcome.calls, 2);
        // One user message holding the three results, in call order.
        assert_eq!(parallel.outcome.messages.len(), 4);
        assert_eq!(tool_results(&parallel.outcome.messages), expected_results);
        assert_eq!(
            tool_results(&parallel.outcome.messages[2..3]),
            expected_results
        );
        assert_eq!(parallel.outcome.text, sequential.outcome.text);

        // Children numbered in call order, each with its own script, same transcripts.
        assert_eq!(parallel.children.len(), 3);
        for (n, (par, seq)) in parallel
            .children
            .iter()
            .zip(&sequential.children)
            .enumerate()
        {
            let n = n + 1;
            assert_eq!(par.agent.to_string(), format!("child-{n}"));
            assert_eq!(seq.agent.to_string(), format!("child-{n}"));
            assert_eq!(par.parent_tool_use_id.as_str(), format!("toolu_t{n}"));
            assert_eq!(seq.parent_tool_use_id, par.parent_tool_use_id);
            assert_eq!(par.task, format!("Read file_{n}.txt."));
            assert_eq!(par.report, seq.report);
            assert_eq!(par.outcome, seq.outcome);
            assert_eq!(par.tools, seq.tools);
        }
        // The parent's tool records, in call order.
        let ids: Vec<&str> = parallel.tools.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["toolu_t1", "toolu_t2", "toolu_t3"]);
        assert_eq!(parallel.tools, sequential.tools);
    }
}

#[test]
fn children_are_numbered_across_the_run() {
    // Delegations in later replies continue the numbering: the script for
    // child-3 is used by the third delegation, whatever reply it is in.
    let ws = workspace();
    for n in 1..=3 {
        ws.write(&format!("file_{n}.txt"), format!("content {n}"));
    }
    let [(id1, task1), (id2, task2), (id3, task3)] = tasks();
    let parent = RecordingModel::new(vec![
        task_call(id1, task1),
        Ok(ModelResponse::tool_calls([
            (id2, "task", json!({"task": task2})),
            (id3, "task", json!({"task": task3})),
        ])),
        answer("done"),
    ]);
    let children = RecordingChildren::new(per_child_scripts());
    let report = run(
        ws.path(),
        Arc::new(AllowAll),
        SubagentConfig::new(as_child_models(&children), Hooks::none()),
        &parent,
    );
    let mut created: Vec<usize> = children.created().iter().map(|(n, _)| *n).collect();
    created.sort_unstable();
    assert_eq!(created, [1, 2, 3]);
    assert_eq!(children.total_requests(), 6);
    for n in 1..=3 {
        let (raw, _) = result_for(&report.outcome.messages, &format!("toolu_t{n}"));
        assert_eq!(
            report_json(&raw)["summary"],
            format!("child {n} read: content {n}")
        );
        assert_eq!(
            children.requests(n)[0].messages,
            vec![Message::user_text(format!("Read file_{n}.txt."))]
        );
    }
}

/// Children that meet at a rendezvous on their first request: each records
/// whether all of its siblings were running at the same time.
struct Rendezvous {
    arrived: Arc<std::sync::atomic::AtomicUsize>,
    met: Arc<Mutex<Vec<bool>>>,
    expected: usize,
}

struct RendezvousModel {
    arrived: Arc<std::sync::atomic::AtomicUsize>,
    met: Arc<Mutex<Vec<bool>>>,
    expected: usize,
}

impl Rendezvous {
    fn model(&self) -> RendezvousModel {
        RendezvousModel {
            arrived: self.arrived.clone(),
            met: self.met.clone(),
            expected: self.expected,
        }
    }
}

/// Blocking runs get models that wait on their thread; async runs, models
/// that wait on the runtime's timer (the children then meet on one task).
impl ChildModels for Rendezvous {
    fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
        Box::new(self.model())
    }

    fn async_model_for(&self, _number: usize) -> Box<dyn AsyncModel + Send> {
        Box::new(self.model())
    }
}

impl AsyncModel for RendezvousModel {
    fn respond_async<'a>(
        &'a mut self,
        _request: &'a subloop::core::protocol::Request<'_>,
    ) -> BoxFuture<'a, Result<Received, ModelFailure>> {
        use std::sync::atomic::Ordering;
        Box::pin(async move {
            self.arrived.fetch_add(1, Ordering::SeqCst);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while self.arrived.load(Ordering::SeqCst) < self.expected
                && std::time::Instant::now() < deadline
            {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            let all_there = self.arrived.load(Ordering::SeqCst) >= self.expected;
            self.met.lock().unwrap().push(all_there);
            Ok(Received::parsed(ModelResponse::answer("met")))
        })
    }
}

impl Model for RendezvousModel {
    fn respond(
        &mut self,
        _request: &subloop::core::protocol::Request<'_>,
    ) -> Result<ModelResponse, ModelFailure> {
        use std::sync::atomic::Ordering;
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.arrived.load(Ordering::SeqCst) < self.expected
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let all_there = self.arrived.load(Ordering::SeqCst) >= self.expected;
        self.met.lock().unwrap().push(all_there);
        Ok(ModelResponse::answer("met"))
    }
}

#[test]
fn several_task_calls_in_one_reply_really_run_at_the_same_time() {
    let ws = TempDir::new("rendezvous");
    let met = Arc::new(Mutex::new(Vec::new()));
    let children = Rendezvous {
        arrived: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        met: met.clone(),
        expected: 3,
    };
    let parent = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls((1..=3).map(|i| {
            (format!("p{i}"), "task", json!({"task": format!("job {i}")}))
        }))),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = run(
        ws.path(),
        Arc::new(DenyAll),
        SubagentConfig::new(Arc::new(children), Hooks::none()),
        &parent,
    );
    assert_eq!(report.children.len(), 3);
    // Run one after another, the first child would wait alone until its 5 s ran out.
    assert_eq!(*met.lock().unwrap(), vec![true, true, true]);
}

crate::async_twins!(
    parent_and_child_histories_are_separate,
    the_builtin_tools_offer_the_same_schemas_byte_for_byte,
    child_tool_definitions_are_exactly_the_default_whitelist,
    child_tool_definitions_follow_a_custom_whitelist,
    child_cannot_run_main_delegate_or_plan_even_with_allow_all,
    control_the_marker_appears_when_the_parent_runs_main,
    budget_one_gives_call_limit_and_an_error_report,
    child_budget_outside_one_to_eight_is_an_error,
    default_child_budget_is_four_calls,
    a_summary_of_1201_characters_is_truncated_and_flagged,
    a_summary_of_1200_characters_passes_whole,
    multibyte_summaries_are_cut_at_character_boundaries,
    invalid_tasks_are_refused_under_the_original_id_without_a_child,
    invalid_tasks_in_one_reply_are_refused_each_under_its_id,
    a_task_of_600_characters_after_trimming_is_accepted,
    a_child_model_error_still_produces_the_report,
    a_child_protocol_error_still_produces_the_report,
    a_child_that_runs_out_of_script_reports_model_error,
    whitelist_errors_at_construction,
    the_child_runs_the_hooks_given_in_its_config_only,
    a_child_hook_is_not_run_for_the_parent_and_can_block_the_child,
    child_calls_pass_the_parents_gate,
    a_denying_gate_does_not_stop_child_reads,
    parallel_delegations_give_the_same_transcript_as_sequential_ones,
    children_are_numbered_across_the_run,
    several_task_calls_in_one_reply_really_run_at_the_same_time,
);

// ---------------------------------------------------------------- spans

/// A host's `tracing` layer that keeps each span's name and its parent's.
#[derive(Clone, Default)]
struct SpanTree(Arc<Mutex<Vec<SeenSpan>>>);

/// A span's id, name and parent's id.
type SeenSpan = (u64, String, Option<u64>);

impl<S> tracing_subscriber::Layer<S> for SpanTree
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        _attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let span = ctx.span(id).expect("a new span is in the registry");
        let parent = span.parent().map(|parent| parent.id().into_u64());
        self.0
            .lock()
            .unwrap()
            .push((id.into_u64(), span.name().to_owned(), parent));
    }
}

impl SpanTree {
    /// The names of the spans whose parent is `parent`, in creation order.
    fn children(&self, parent: Option<u64>) -> Vec<(u64, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, p)| *p == parent)
            .map(|(id, name, _)| (*id, name.clone()))
            .collect()
    }

    fn count(&self, parent: u64, name: &str) -> usize {
        self.children(Some(parent))
            .iter()
            .filter(|(_, n)| n == name)
            .count()
    }
}

/// Two `task` calls in one reply (run side by side), then an answer; each
/// child reads a file and answers.
fn two_children_run(tree: &SpanTree, asynchronous: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    let ws = workspace();
    let parent = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("t1", "task", json!({"task": "read notes.txt"})),
            ("t2", "task", json!({"task": "read expected.txt"})),
        ])),
        answer("done"),
    ]);
    let child = |path: &str| {
        vec![
            call("c1", "read_file", json!({"path": path})),
            answer("read it"),
        ]
    };
    let children = RecordingChildren::new(vec![child("notes.txt"), child("expected.txt")]);
    let subscriber = tracing_subscriber::registry().with(tree.clone());
    tracing::subscriber::with_default(subscriber, || {
        // The callsites' cached interest and the global level filter are
        // computed again with this thread's subscriber among the live ones:
        // another test's subscriber, dropped on another thread at the same
        // moment, may have computed them without it.
        tracing::callsite::rebuild_interest_cache();
        let host = tracing::info_span!("host_request");
        let _entered = host.enter();
        let agent = builder(ws.path(), Arc::new(AllowAll))
            .subagents(SubagentConfig::new(
                as_child_models(&children),
                Hooks::default(),
            ))
            .unwrap()
            .build();
        let mut model = subloop::run::model::Blocking(parent.clone());
        let report = if asynchronous {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime
                .block_on(agent.run_async("Check.", Budget::new(8).unwrap(), &mut model))
                .unwrap()
        } else {
            agent
                .run("Check.", Budget::new(8).unwrap(), &mut model.0)
                .unwrap()
        };
        assert_eq!(report.outcome.status, StatusKind::Answered);
    });
}

/// The run's spans nest under the host's current span: the run's
/// `invoke_agent`, its `chat` and `execute_tool` spans under it, and each
/// child's `invoke_agent` under the `execute_tool` span of its `task` call,
/// whether the children run on threads (blocking) or as futures (async).
#[test]
fn a_runs_spans_nest_under_the_hosts_span_in_both_drivers() {
    for asynchronous in [false, true] {
        let tree = SpanTree::default();
        two_children_run(&tree, asynchronous);
        let roots = tree.children(None);
        assert_eq!(roots.len(), 1, "one root, the host's: {roots:?}");
        let (host, name) = &roots[0];
        assert_eq!(name, "host_request");
        let agents = tree.children(Some(*host));
        assert_eq!(agents.len(), 1, "{agents:?}");
        let (run, name) = &agents[0];
        assert_eq!(name, "invoke_agent");
        assert_eq!(tree.count(*run, "chat"), 2);
        let tools = tree.children(Some(*run));
        let tasks: Vec<u64> = tools
            .iter()
            .filter(|(_, name)| name == "execute_tool")
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(tasks.len(), 2, "async {asynchronous}: {tools:?}");
        for task in tasks {
            let child = tree.children(Some(task));
            assert_eq!(child.len(), 1, "async {asynchronous}: {child:?}");
            assert_eq!(child[0].1, "invoke_agent");
            assert_eq!(tree.count(child[0].0, "chat"), 2);
            assert_eq!(tree.count(child[0].0, "execute_tool"), 1);
        }
    }
}
