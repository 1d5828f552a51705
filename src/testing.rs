//! Property-testing support for embedders (feature `testing`).
//!
//! Strategies for well-formed and hostile model replies, tool calls and
//! scripts, and [`check_conversation`] / [`check_executor`], which drive a
//! host's own [`Executor`] through arbitrary conversations with the real
//! driver and check the loop's invariants:
//!
//! * the run never panics and makes at most `budget` model requests;
//! * `outcome.calls` equals the number of requests the model saw;
//! * every `tool_use` in the history is answered exactly once, in the very
//!   next user message, in call order, and that message holds nothing else;
//! * the executor was asked to run exactly the calls of accepted replies, in order;
//! * `answered` ends on a non-empty text with no call, `call_limit` spends the budget.
//!
//! ```
//! use proptest::prelude::*;
//! use subloop::testing::{check_conversation, scripted_replies};
//! use subloop::core::conversation::{ToolCall, ToolOutput};
//! use subloop::core::protocol::ToolDefinition;
//! use subloop::run::driver::Executor;
//!
//! struct Echo(Vec<ToolDefinition>);
//! impl Executor for Echo {
//!     fn definitions(&self) -> &[ToolDefinition] { &self.0 }
//!     fn execute(&mut self, call: &ToolCall) -> ToolOutput { ToolOutput::ok(call.input().to_string()) }
//! }
//!
//! proptest!(|(script in scripted_replies(&["echo"], 6), budget in 1u32..5)| {
//!     check_conversation(&mut Echo(Vec::new()), script, budget)
//!         .map_err(TestCaseError::fail)?;
//! });
//! ```

use proptest::prelude::*;
use serde_json::{Value, json};

mod histories;
pub use histories::{
    Breach, GeneratedHistory, Mutation, broken_history, every_format, sound_history,
};

use crate::core::conversation::{Budget, Conversation, Outcome, StatusKind, ToolCall, ToolOutput};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{
    Block, Message, ModelResponse, ReplyBlock, Request, Role, StopReason, ToolDefinition, Usage,
};
use crate::providers::scripted::ScriptedReply;
use crate::run::driver::{self, Executor};
use crate::run::model::Model;

/// Arbitrary JSON values, a few levels deep.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Tool names: mostly from `known`, sometimes unknown or empty.
pub fn tool_name(known: &[&str]) -> impl Strategy<Value = String> + use<> {
    let known: Vec<String> = known.iter().map(|name| (*name).to_owned()).collect();
    let pick = if known.is_empty() {
        Just(String::from("tool")).boxed()
    } else {
        prop::sample::select(known).boxed()
    };
    prop_oneof![
        6 => pick,
        1 => "[a-z_]{1,12}",
        1 => Just(String::new()),
    ]
}

/// Tool calls with names from `known` (and a few others) and arbitrary inputs.
pub fn tool_call(known: &[&str]) -> impl Strategy<Value = ToolCall> + use<> {
    ("toolu_[a-z0-9]{1,8}", tool_name(known), json_value())
        .prop_map(|(id, name, input)| ToolCall::new(id, name, input))
}

/// Every stop reason, a missing one, and unknown strings.
pub fn stop_reason() -> impl Strategy<Value = Option<StopReason>> {
    prop_oneof![
        4 => Just(Some(StopReason::ToolUse)),
        4 => Just(Some(StopReason::EndTurn)),
        1 => Just(Some(StopReason::MaxTokens)),
        1 => Just(Some(StopReason::StopSequence)),
        1 => Just(Some(StopReason::PauseTurn)),
        1 => Just(Some(StopReason::Refusal)),
        1 => Just(Some(StopReason::ModelContextWindowExceeded)),
        1 => "[a-z_]{1,10}".prop_map(|s| Some(StopReason::parse(&s))),
        1 => Just(None),
    ]
}

/// A well-formed reply: an answer, or 1–4 calls with unique ids (and maybe some text).
pub fn well_formed_reply(known: &[&str]) -> impl Strategy<Value = ModelResponse> + use<> {
    let calls = prop::collection::vec((tool_name(known), json_value()), 1..=4);
    prop_oneof![
        "[A-Za-z0-9 .]{1,40}".prop_map(ModelResponse::answer),
        (calls, proptest::option::of("[a-z ]{1,20}")).prop_map(|(calls, text)| {
            let mut reply = ModelResponse::tool_calls(
                calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, input))| (format!("toolu_{i}"), name, input)),
            );
            if let Some(text) = text {
                reply.content.insert(0, Block::text(text).into());
            }
            reply
        }),
    ]
}

/// One block of a hostile reply: text (empty, blank, or up to ~100 KB), tool_use
/// with empty or colliding ids, thinking, or a block this crate does not know.
pub fn hostile_block(known: &[&str]) -> impl Strategy<Value = ReplyBlock> + use<> {
    let id = prop_oneof![Just(String::new()), "t[0-2]", "toolu_[a-z]{1,6}"];
    prop_oneof![
        3 => ".{0,30}".prop_map(|t| Block::text(t).into()),
        1 => Just(Block::text("   ").into()),
        1 => (1usize..100_000).prop_map(|n| Block::text("x".repeat(n)).into()),
        4 => (id, tool_name(known), json_value()).prop_map(|(id, name, input)| Block::tool_use(id, name, input).into()),
        1 => (".{0,10}", ".{0,10}").prop_map(|(thinking, signature)| Block::Thinking { thinking, signature }.into()),
        1 => json_value().prop_map(ReplyBlock::from_value),
        1 => "[a-z_]{1,12}".prop_map(|kind| ReplyBlock::from_value(json!({"type": kind}))),
    ]
}

/// A hostile reply: any mix of blocks with any stop reason.
pub fn hostile_reply(known: &[&str]) -> impl Strategy<Value = ModelResponse> + use<> {
    (
        prop::collection::vec(hostile_block(known), 0..5),
        stop_reason(),
    )
        .prop_map(|(content, stop_reason)| ModelResponse {
            content,
            stop_reason,
            usage: Some(Usage {
                input_tokens: 1,
                output_tokens: 1,
                ..Usage::default()
            }),
        })
}

/// One scripted reply: mostly well-formed, some hostile, some failed requests.
pub fn scripted_reply(known: &[&str]) -> impl Strategy<Value = ScriptedReply> + use<> {
    prop_oneof![
        6 => well_formed_reply(known).prop_map(Ok),
        3 => hostile_reply(known).prop_map(Ok),
        1 => ".{0,20}".prop_map(|text| Err(ModelFailure::new(text))),
    ]
}

/// A parent script of up to `max_len` replies.
pub fn scripted_replies(
    known: &[&str],
    max_len: usize,
) -> impl Strategy<Value = Vec<ScriptedReply>> + use<> {
    prop::collection::vec(scripted_reply(known), 0..=max_len)
}

/// Wraps the host's executor and records what it was asked to run.
struct Recorder<'e, E: ?Sized> {
    inner: &'e mut E,
    executed: Vec<ToolCall>,
    skipped: Vec<ToolCall>,
}

impl<E: Executor + Send + ?Sized> Executor for Recorder<'_, E> {
    fn definitions(&self) -> &[ToolDefinition] {
        self.inner.definitions()
    }

    fn attachment(&self) -> Option<String> {
        self.inner.attachment()
    }

    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        self.inner.execute(call)
    }

    fn interrupt(&self) -> Option<crate::core::conversation::Interrupt> {
        self.inner.interrupt()
    }

    /// The host's own round, watched: a call answered `not executed`
    /// because the round was stopped counts as asked, not as run.
    fn execute_round<'a>(
        &'a mut self,
        calls: &'a [ToolCall],
        agent: &'a crate::core::agent_id::AgentId,
        monitor: &'a mut dyn crate::run::monitor::Monitor,
    ) -> crate::run::driver::RoundFuture<'a> {
        Box::pin(async move {
            let round = self.inner.execute_round(calls, agent, monitor).await;
            self.watch(calls, &round);
            round
        })
    }
}

impl<E: ?Sized> Recorder<'_, E> {
    fn watch(&mut self, calls: &[ToolCall], round: &crate::run::driver::Round) {
        let not_run = round
            .stopped
            .as_ref()
            .map(crate::run::driver::stopped_output);
        for (call, output) in calls.iter().zip(&round.outputs) {
            if not_run.as_ref() == Some(output) {
                self.skipped.push(call.clone());
            } else {
                self.executed.push(call.clone());
            }
        }
    }
}

/// A scripted model that counts the requests it saw.
struct Counting {
    replies: std::vec::IntoIter<ScriptedReply>,
    seen: u32,
}

impl Model for Counting {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.seen += 1;
        self.replies.next().unwrap_or_else(|| {
            Err(ModelFailure::with_kind(
                FailureKind::ScriptExhausted,
                "script exhausted",
            ))
        })
    }
}

/// Runs `script` against `executor` with the real driver and checks every
/// invariant listed in the module docs; the error says which one broke.
pub fn check_conversation<E: Executor + Send + ?Sized>(
    executor: &mut E,
    script: Vec<ScriptedReply>,
    budget: u32,
) -> Result<Outcome, String> {
    let budget = Budget::new(budget).map_err(|err| err.to_string())?;
    let conversation =
        Conversation::start("check the invariants", budget).map_err(|err| err.to_string())?;
    let mut model = Counting {
        replies: script.into_iter(),
        seen: 0,
    };
    let mut recorder = Recorder {
        inner: executor,
        executed: Vec::new(),
        skipped: Vec::new(),
    };
    let outcome = driver::run(conversation, &mut model, &mut recorder, &mut ());
    check_outcome(
        &outcome,
        budget.get(),
        model.seen,
        &recorder.executed,
        &recorder.skipped,
    )?;
    Ok(outcome)
}

/// Runs `cases` arbitrary scripts (with tool names from the executor's own
/// definitions) against executors made by `make`, checking the invariants.
pub fn check_executor<E: Executor + Send>(cases: u32, make: impl Fn() -> E) -> Result<(), String> {
    let names: Vec<String> = make()
        .definitions()
        .iter()
        .map(|def| def.name.clone())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (scripted_replies(&names, 8), 1u32..=6);
    runner
        .run(&strategy, |(script, budget)| {
            check_conversation(&mut make(), script, budget)
                .map(|_| ())
                .map_err(TestCaseError::fail)
        })
        .map_err(|err| err.to_string())
}

fn check_outcome(
    outcome: &Outcome,
    budget: u32,
    requests: u32,
    executed: &[ToolCall],
    skipped: &[ToolCall],
) -> Result<(), String> {
    // Calls the driver answered itself (the run was stopped) were never run.
    let asked: Vec<(String, String, Value)> = check_history(outcome, budget, requests)?
        .into_iter()
        .filter(|(id, ..)| !skipped.iter().any(|call| call.id().as_str() == id))
        .collect();
    let ran: Vec<(String, String, Value)> = executed
        .iter()
        .map(|call| {
            (
                call.id().to_string(),
                call.name().to_owned(),
                call.input().clone(),
            )
        })
        .collect();
    if ran != asked {
        return Err(format!(
            "the executor ran {} call(s), the history asked for {} it did not skip",
            ran.len(),
            asked.len()
        ));
    }
    Ok(())
}

/// The calls asked for in the history, as `(id, name, input)`.
type Asked = Vec<(String, String, Value)>;

/// Checks the history and status of an outcome; returns the calls it asked for.
fn check_history(outcome: &Outcome, budget: u32, requests: u32) -> Result<Asked, String> {
    let fail = |what: String| Err(what);
    if outcome.calls > budget {
        return fail(format!(
            "{} model requests with a budget of {budget}",
            outcome.calls
        ));
    }
    if outcome.calls != requests {
        return fail(format!(
            "outcome says {} calls, the model saw {requests}",
            outcome.calls
        ));
    }
    let messages = &outcome.messages;
    if messages.first().map(|m| m.role) != Some(Role::User) {
        return fail("the history does not start with the user's question".to_owned());
    }
    // The pairing of calls and results: the one definition, in `invariants`.
    let asked = crate::record::invariants::answered_once(messages)?;
    for (index, message) in messages.iter().enumerate() {
        if message.role != Role::Assistant {
            continue;
        }
        let calls = message
            .content
            .iter()
            .any(|block| matches!(block, Block::ToolUse { .. }));
        if calls && index + 1 == messages.len() {
            return fail(format!("the calls of message {index} were never answered"));
        }
        if !calls && index + 1 != messages.len() {
            return fail(format!(
                "assistant message {index} without calls is not the last"
            ));
        }
    }
    let last = messages.last().map(Message::text).unwrap_or_default();
    match outcome.status {
        StatusKind::Answered if last.trim().is_empty() || outcome.text != last => {
            fail("answered without the last message's text".to_owned())
        }
        StatusKind::CallLimit if outcome.calls != budget => fail(format!(
            "call_limit after {} of {budget} calls",
            outcome.calls
        )),
        _ => Ok(asked),
    }
}

/// The fuzz entry point (`fuzz/fuzz_targets/reply_loop.rs`), also used by the
/// in-tree regression tests: arbitrary bytes go through parse → `receive` →
/// tools → `submit`, and every invariant is asserted. It panics only when an
/// invariant breaks.
///
/// The bytes before the first `0xFF` are the replies (a JSON reply or an
/// array of them, also tried as a whole script file); the bytes after it are
/// tool arguments and raw tool results.
///
/// Tools work in one [`FuzzWorkspace`] per process, made on first use and
/// shared by every call (the fuzz target runs millions of inputs); it is
/// left in the temporary directory when the process exits. Tests, which
/// must leave nothing behind, use [`FuzzWorkspace::fuzz_bytes`] with their own.
pub fn fuzz_bytes(data: &[u8]) {
    static SHARED: std::sync::OnceLock<Option<FuzzWorkspace>> = std::sync::OnceLock::new();
    if let Some(workspace) = SHARED.get_or_init(|| FuzzWorkspace::new().ok()) {
        fuzz_bytes_in(workspace, data);
    }
}

/// A workspace for [`FuzzWorkspace::fuzz_bytes`]: a fresh temporary directory
/// (`subloop-fuzz-<pid>-<n>`) holding a `main.py` and a file with a
/// non-ASCII name, removed when the value is dropped — also when a check
/// panics, as the stack unwinds.
#[derive(Debug)]
pub struct FuzzWorkspace {
    dir: std::path::PathBuf,
}

impl FuzzWorkspace {
    /// [`fuzz_bytes`] with the tools working in this workspace.
    pub fn fuzz_bytes(&self, data: &[u8]) {
        fuzz_bytes_in(self, data);
    }

    /// Creates the directory and its files.
    pub fn new() -> std::io::Result<Self> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("subloop-fuzz-{}-{n}", std::process::id()));
        // Owned from here on, so a failure below removes what was made.
        let workspace = Self { dir };
        std::fs::create_dir_all(workspace.dir.join("sub"))?;
        std::fs::write(workspace.dir.join("main.py"), "print(6 * 7)\n")?;
        std::fs::write(workspace.dir.join("sub/é.txt"), "é".repeat(40))?;
        Ok(workspace)
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for FuzzWorkspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// [`fuzz_bytes`] with the tools working in `workspace`.
fn fuzz_bytes_in(workspace: &FuzzWorkspace, data: &[u8]) {
    let workspace = workspace.path();
    let (replies_part, args_part) = match data.iter().position(|&b| b == 0xFF) {
        Some(cut) => (
            data.get(..cut).unwrap_or_default(),
            data.get(cut + 1..).unwrap_or_default(),
        ),
        None => (data, &[][..]),
    };
    let replies_text = String::from_utf8_lossy(replies_part);
    let _ = crate::providers::scripted::Script::parse(&replies_text);
    let replies: Vec<ScriptedReply> = match serde_json::from_str::<Value>(&replies_text) {
        Ok(Value::Array(items)) => items.into_iter().take(16).map(reply_from_value).collect(),
        Ok(value) => vec![reply_from_value(value)],
        Err(_) => return,
    };
    let args: Value = serde_json::from_slice(args_part).unwrap_or(Value::Null);
    fuzz_tools(workspace, &args);
    fuzz_submit(replies.first(), &args);
    fuzz_agent(workspace, replies, &args);
}

/// Arbitrary bytes as a trace: read, checked against every invariant, and
/// drawn as the terminal timeline and the HTML page — none of which may
/// panic, whatever the bytes (the `trace_view` fuzz target).
pub fn fuzz_trace(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(run) = crate::record::recorded::RecordedRun::parse(&text) else {
        return;
    };
    let verdicts =
        crate::record::invariants::check(&run, &crate::record::invariants::Policy::default());
    let _ = run.timeline(&verdicts, true);
    let page = crate::record::view_html::page(
        &run,
        &verdicts,
        &crate::record::invariants::Policy::default(),
        "fuzz",
    );
    // The data cannot end the script element early.
    assert_eq!(
        page.matches("</script>").count(),
        2,
        "trace text closed a script element"
    );
}

/// Arbitrary bytes as a history of every format (the `history` fuzz
/// target): by content, then as each format ([`fuzz_history_as`]).
pub fn fuzz_history(data: &[u8]) {
    use crate::record::history::{Format, History};
    let text = String::from_utf8_lossy(data);
    if let Ok(history) = History::read(&text, None) {
        check_findings(&history, &text);
    }
    for format in [
        Format::Anthropic,
        Format::OpenAi,
        Format::ClaudeCode,
        Format::Codex,
    ] {
        fuzz_history_as(data, format);
    }
}

/// Arbitrary bytes as a history of `format` (the `history_FORMAT` fuzz
/// targets, one per reader): read whole (and line by line, for a Claude
/// Code session and a codex rollout), checked by the pairing rules,
/// repaired, and shown as a run — none of which may panic; every place a
/// finding names is in the file, every change says what it did, a repair
/// with no change gives the text back, and a history shown as a run reads
/// back as a trace.
pub fn fuzz_history_as(data: &[u8], format: crate::record::history::Format) {
    use crate::record::history::{Format, History};
    let text = String::from_utf8_lossy(data);
    let mut read = vec![History::read(&text, Some(format))];
    match format {
        Format::ClaudeCode => read.push(History::read_claude_code(std::io::Cursor::new(data))),
        Format::Codex => read.push(History::read_codex(std::io::Cursor::new(data))),
        _ => {}
    }
    for history in read.into_iter().flatten() {
        check_findings(&history, &text);
    }
    if let Ok(repaired) = crate::record::history::repair(&text, Some(format)) {
        for change in &repaired.changes {
            assert!(!change.detail.is_empty(), "a change says what it did");
        }
        if repaired.changes.is_empty() {
            assert_eq!(repaired.text, text, "no change, the same text");
        }
    }
    if let Ok(foreign) = crate::record::foreign::Foreign::read(&text, Some(format), &[]) {
        assert!(
            crate::record::recorded::RecordedRun::parse(&foreign.trace).is_ok(),
            "the run's trace reads back"
        );
    }
}

/// Every finding over `history` says what is wrong, at a line of `text`.
fn check_findings(history: &crate::record::history::History, text: &str) {
    let lines = text.lines().count();
    for finding in history.check() {
        assert!(!finding.detail.is_empty(), "a finding says what is wrong");
        if let Some(line) = finding.line {
            assert!(line >= 1 && line <= lines.max(1), "line {line} of {lines}");
        }
    }
}

fn reply_from_value(value: Value) -> ScriptedReply {
    ModelResponse::from_value(value).map_err(|err| ModelFailure::new(err.to_string()))
}

/// Tool arguments straight into the schema check and the tools.
fn fuzz_tools(workspace: &std::path::Path, args: &Value) {
    use crate::tools::{ReadFile, Tool, ToolContext, schema};
    let Ok(reader) = ReadFile::new(workspace, 16) else {
        return;
    };
    let call = ToolCall::new("fuzz", "read_file", args.clone());
    let agent = crate::core::agent_id::AgentId::Parent;
    if schema::Schema::new(&reader.input_schema())
        .validate(args)
        .is_ok()
    {
        let output = reader.run(
            args,
            &ToolContext {
                agent: &agent,
                call: &call,
                span: &tracing::Span::none(),
            },
        );
        assert!(
            output.content.len() <= 16 + 200 || output.is_error,
            "read_file exceeded its limit"
        );
    }
    if let Some(path) = args.as_str() {
        let _ = reader.read(path);
    }
    let plan = crate::core::plan::SharedPlan::new();
    let todo = crate::tools::TodoWrite::new(plan.clone());
    if schema::Schema::new(&todo.input_schema())
        .validate(args)
        .is_ok()
    {
        let before = plan.current();
        let output = todo.run(
            args,
            &ToolContext {
                agent: &agent,
                call: &call,
                span: &tracing::Span::none(),
            },
        );
        if output.is_error {
            assert_eq!(plan.current(), before, "a refused plan changed the plan");
        }
    }
}

/// The raw `submit` form: whatever results the bytes name, a mismatch hands
/// back the unchanged state, and an accepted set is stored in call order.
fn fuzz_submit(first: Option<&ScriptedReply>, args: &Value) {
    let Some(Ok(reply)) = first else { return };
    let Ok(budget) = Budget::new(2) else { return };
    let Ok(conversation) = Conversation::start("fuzz", budget) else {
        return;
    };
    let crate::core::conversation::Reply::Tools(pending) = conversation.receive(reply.clone())
    else {
        return;
    };
    let calls = pending.calls().to_vec();
    let history = pending.history().to_vec();
    let results: Vec<crate::core::conversation::ToolResult> = match args {
        Value::Array(items) => items
            .iter()
            .take(8)
            .map(|item| crate::core::conversation::ToolResult {
                tool_use_id: crate::core::protocol::ToolUseId::new(
                    item.get("id").and_then(Value::as_str).unwrap_or_default(),
                ),
                content: item.to_string(),
                is_error: item
                    .get("is_error")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            })
            .collect(),
        _ => calls
            .iter()
            .rev()
            .map(|call| crate::core::conversation::ToolResult {
                tool_use_id: call.id().clone(),
                content: String::new(),
                is_error: false,
            })
            .collect(),
    };
    match pending.submit(results) {
        Ok(after) => {
            let history = match &after {
                crate::core::conversation::AfterTools::Continue(next) => next.history(),
                crate::core::conversation::AfterTools::CallLimit(done) => done.history(),
            };
            let stored: Vec<&str> = history
                .last()
                .map(|m| &m.content)
                .into_iter()
                .flatten()
                .filter_map(|block| match block {
                    Block::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
                    _ => None,
                })
                .collect();
            let wanted: Vec<&str> = calls.iter().map(|call| call.id().as_str()).collect();
            assert_eq!(stored, wanted, "accepted results not in call order");
        }
        Err(rejected) => {
            assert_eq!(
                rejected.conversation.calls(),
                calls.as_slice(),
                "rejected state changed its calls"
            );
            assert_eq!(
                rejected.conversation.history(),
                history.as_slice(),
                "rejected state changed its history"
            );
        }
    }
}

/// The whole agent: parent replies from the bytes, one child per delegation
/// replaying the same replies, every tool behind a denying gate.
#[allow(
    clippy::panic,
    reason = "the fuzz oracle: a broken invariant must panic, as `fuzz_bytes` documents"
)]
fn fuzz_agent(workspace: &std::path::Path, replies: Vec<ScriptedReply>, args: &Value) {
    use std::sync::Arc;
    let children = crate::providers::scripted::ScriptedChildren(vec![replies.clone(); 3]);
    let built = crate::AgentBuilder::new(Arc::new(crate::policy::permission::DenyAll))
        .read_only_tool(match crate::tools::ReadFile::new(workspace, 64) {
            Ok(tool) => tool,
            Err(_) => return,
        })
        .and_then(|b| {
            b.tool(crate::tools::RunMain::new(
                workspace,
                crate::tools::RunSettings::default(),
            )?)
        })
        .and_then(|b| b.plan())
        .and_then(|b| {
            let budget = crate::agent::subagent::ChildBudget::new(2)?;
            b.subagents(
                crate::agent::subagent::SubagentConfig::new(
                    Arc::new(children),
                    crate::Hooks::none(),
                )
                .budget(budget),
            )
        });
    let Ok(builder) = built else { return };
    let budget = args
        .get("budget")
        .and_then(Value::as_u64)
        .map_or(4, |n| (n % 6 + 1) as u32);
    let Ok(budget_checked) = Budget::new(budget) else {
        return;
    };
    // The run's trace, checked afterwards with the same invariants a host
    // checks recorded runs with (`subloop view --check`).
    static TRACES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let trace_path = workspace.join(format!(
        "trace-{}.jsonl",
        TRACES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let Ok(trace_file) = std::fs::File::create(&trace_path) else {
        return;
    };
    let builder = builder.monitor(crate::record::trace::TraceWriter::from_file(trace_file));
    let mut model = crate::providers::scripted::ScriptedModel::new(replies);
    let agent = builder.build();
    let Ok(report) = agent.run("fuzz", budget_checked, &mut model) else {
        let _ = std::fs::remove_file(&trace_path);
        return;
    };
    let trace = std::fs::read_to_string(&trace_path);
    let _ = std::fs::remove_file(&trace_path);
    if let Ok(trace) = trace {
        let run = crate::record::recorded::RecordedRun::parse(&trace)
            .unwrap_or_else(|err| panic!("the run's own trace does not parse: {err}"));
        let policy = crate::record::invariants::Policy {
            parent_calls: Some(budget),
            child_calls: Some(2),
            ..crate::record::invariants::Policy::default()
        };
        for verdict in crate::record::invariants::check(&run, &policy) {
            assert!(
                verdict.held(),
                "invariant broken on the run's trace: {}: {:?}",
                verdict.invariant.rule(),
                verdict.breaches
            );
        }
    }
    let asked = check_history(&report.outcome, budget, report.outcome.calls)
        .unwrap_or_else(|err| panic!("parent invariant broken: {err}"));
    assert_eq!(
        asked.len(),
        report.tools.len(),
        "a call without a record, or a record without a call"
    );
    // Each record holds exactly the result the model got, in call order.
    let results = report
        .outcome
        .messages
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => Some((tool_use_id, content.text(), *is_error)),
            _ => None,
        });
    for (record, (id, content, is_error)) in report.tools.iter().zip(results) {
        assert!(
            &record.id == id && record.content == content && record.is_error == is_error,
            "the record of {id} differs from the result the model got"
        );
    }
    for child in &report.children {
        assert!(child.outcome.calls <= 2, "child exceeded its budget");
        assert!(
            child.report.summary.chars().count() <= 1200 + 60,
            "summary not bounded"
        );
        for record in &child.tools {
            assert!(
                record.name == "read_file" || record.is_error,
                "a child ran {}",
                record.name
            );
        }
    }
    for record in &report.tools {
        if record.name == "run_main" {
            assert!(record.is_error, "run_main ran behind a denying gate");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::protocol::ToolResultContent;

    fn check(
        outcome: &Outcome,
        budget: u32,
        requests: u32,
        executed: &[ToolCall],
    ) -> Result<(), String> {
        check_outcome(outcome, budget, requests, executed, &[])
    }

    fn outcome(messages: Vec<Message>, status: StatusKind, calls: u32, text: &str) -> Outcome {
        Outcome {
            status,
            text: text.to_owned(),
            calls,
            messages,
            usage: Usage::default(),
            output: None,
            output_error: None,
        }
    }

    fn result(id: &str) -> Block {
        Block::ToolResult {
            tool_use_id: crate::core::protocol::ToolUseId::new(id),
            content: ToolResultContent::Text("ok".into()),
            is_error: false,
        }
    }

    fn message(role: Role, content: Vec<Block>) -> Message {
        Message { role, content }
    }

    #[test]
    fn the_checker_catches_broken_histories() {
        let question = Message::user_text("q");
        let ask = message(
            Role::Assistant,
            vec![
                Block::tool_use("a", "t", json!({})),
                Block::tool_use("b", "t", json!({})),
            ],
        );
        let call = |id: &str| ToolCall::new(id, "t", json!({}));
        let good = vec![
            question.clone(),
            ask.clone(),
            message(Role::User, vec![result("a"), result("b")]),
        ];
        assert!(
            check(
                &outcome(good, StatusKind::CallLimit, 1, ""),
                1,
                1,
                &[call("a"), call("b")]
            )
            .is_ok()
        );

        let swapped = vec![
            question.clone(),
            ask.clone(),
            message(Role::User, vec![result("b"), result("a")]),
        ];
        assert!(
            check(
                &outcome(swapped, StatusKind::CallLimit, 1, ""),
                1,
                1,
                &[call("a"), call("b")]
            )
            .is_err()
        );
        let unanswered = vec![question.clone(), ask.clone()];
        assert!(
            check(
                &outcome(unanswered, StatusKind::ModelError, 1, ""),
                1,
                1,
                &[]
            )
            .is_err()
        );
        let good = vec![
            question.clone(),
            ask,
            message(Role::User, vec![result("a"), result("b")]),
        ];
        assert!(
            check(
                &outcome(good.clone(), StatusKind::CallLimit, 1, ""),
                1,
                1,
                &[call("a")]
            )
            .is_err()
        );
        assert!(
            check(
                &outcome(good.clone(), StatusKind::CallLimit, 2, ""),
                1,
                2,
                &[call("a"), call("b")]
            )
            .is_err()
        );
        assert!(
            check(
                &outcome(good, StatusKind::CallLimit, 1, ""),
                3,
                1,
                &[call("a"), call("b")]
            )
            .is_err()
        );
        let answered = vec![question, message(Role::Assistant, vec![Block::text("hi")])];
        assert!(
            check(
                &outcome(answered.clone(), StatusKind::Answered, 1, "hi"),
                2,
                1,
                &[]
            )
            .is_ok()
        );
        assert!(
            check(
                &outcome(answered, StatusKind::Answered, 1, "other"),
                2,
                1,
                &[]
            )
            .is_err()
        );
    }
}
