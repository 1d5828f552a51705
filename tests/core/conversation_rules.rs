//! Every rule of the typestate conversation, checked at `receive`, `submit` and in the driver.

use crate::common;

use serde_json::{Value, json};
use subloop::Budget;
use subloop::Conversation;
use subloop::ModelResponse;
use subloop::Outcome;
use subloop::StatusKind;
use subloop::core::agent_id::AgentId;
use subloop::core::conversation::AfterRound;
use subloop::core::conversation::AfterTools;
use subloop::core::conversation::AwaitingModel;
use subloop::core::conversation::AwaitingTools;
use subloop::core::conversation::Finished;
use subloop::core::conversation::Fresh;
use subloop::core::conversation::ModelError;
use subloop::core::conversation::ModelStopped;
use subloop::core::conversation::OnEmptyReply;
use subloop::core::conversation::ProtocolError;
use subloop::core::conversation::Reply;
use subloop::core::conversation::ToolCall;
use subloop::core::conversation::ToolOutput;
use subloop::core::conversation::ToolResult;
use subloop::core::conversation::Violation;
use subloop::core::error::FailureKind;
use subloop::core::error::InputError;
use subloop::core::error::ModelFailure;
use subloop::core::error::SubmitError;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::ReplyBlock;
use subloop::core::protocol::Role;
use subloop::core::protocol::StopReason;
use subloop::core::protocol::ToolDefinition;
use subloop::core::protocol::ToolResultContent;
use subloop::core::protocol::ToolUseId;
use subloop::core::protocol::Usage;
use subloop::providers::scripted::Script;
use subloop::providers::scripted::ScriptedModel;
use subloop::run::BoxFuture;
use subloop::run::driver::Executor;
use subloop::run::driver::Round;
use subloop::run::driver::run;
use subloop::run::monitor::Event;
use subloop::run::monitor::Monitor;

use common::RecordingModel;

const QUESTION: &str = "What does main.py print?";

fn start(max_calls: u32) -> Conversation<AwaitingModel> {
    Conversation::start(QUESTION, Budget::new(max_calls).unwrap()).unwrap()
}

/// A conversation not yet begun, to configure.
fn fresh(max_calls: u32) -> Conversation<Fresh> {
    Conversation::new(QUESTION, Budget::new(max_calls).unwrap()).unwrap()
}

fn reply(content: Vec<ReplyBlock>, stop_reason: Option<StopReason>) -> ModelResponse {
    ModelResponse {
        content,
        stop_reason,
        usage: None,
    }
}

fn text(t: &str) -> ReplyBlock {
    Block::text(t).into()
}

fn tool_use(id: &str, name: &str) -> ReplyBlock {
    Block::tool_use(id, name, json!({"path": format!("{id}.txt")})).into()
}

fn question() -> Message {
    Message::user_text(QUESTION)
}

fn assistant(content: Vec<Block>) -> Message {
    Message {
        role: Role::Assistant,
        content,
    }
}

fn result_block(id: &str, content: &str, is_error: bool) -> Block {
    Block::ToolResult {
        tool_use_id: ToolUseId::new(id),
        content: ToolResultContent::Text(content.into()),
        is_error,
    }
}

fn results_message(ids: &[&str]) -> Message {
    Message {
        role: Role::User,
        content: ids
            .iter()
            .map(|id| result_block(id, &format!("out {id}"), false))
            .collect(),
    }
}

fn expect_tools(reply: Reply) -> Conversation<AwaitingTools> {
    match reply {
        Reply::Tools(pending) => pending,
        other => panic!("expected Reply::Tools, got {other:?}"),
    }
}

fn expect_protocol_error(reply: Reply) -> Conversation<Finished<ProtocolError>> {
    match reply {
        Reply::ProtocolError(done) => done,
        other => panic!("expected Reply::ProtocolError, got {other:?}"),
    }
}

fn expect_stopped(reply: Reply) -> Conversation<Finished<ModelStopped>> {
    match reply {
        Reply::ModelStopped(done) => done,
        other => panic!("expected Reply::ModelStopped, got {other:?}"),
    }
}

fn expect_continue(after: AfterTools) -> Conversation<AwaitingModel> {
    match after {
        AfterTools::Continue(next) => next,
        AfterTools::CallLimit(done) => panic!("expected Continue, got {done:?}"),
    }
}

fn answer_all(pending: Conversation<AwaitingTools>) -> AfterTools {
    pending.answer_with(|call| ToolOutput::ok(format!("out {}", call.id())))
}

fn tool_result(id: &str) -> ToolResult {
    ToolResult {
        tool_use_id: ToolUseId::new(id),
        content: format!("out {id}"),
        is_error: false,
    }
}

/// Asserts the reply was rejected with `violation` and did not reach the history.
fn assert_rejected(reply_value: ModelResponse, violation: Violation) {
    let done = expect_protocol_error(start(3).receive(reply_value.clone()));
    assert_eq!(done.status().violation(), &violation);
    assert_eq!(done.status().reply(), &reply_value);
    assert_eq!(done.status_kind(), StatusKind::ProtocolError);
    assert_eq!(done.text(), format!("protocol error: {violation}"));
    assert_eq!(
        done.history(),
        &[question()],
        "the reply must not be in the history"
    );
    assert_eq!(done.calls_made(), 1);
    let outcome = done.into_outcome();
    assert_eq!(outcome.status, StatusKind::ProtocolError);
    assert_eq!(outcome.messages, vec![question()]);
    assert_eq!(outcome.calls, 1);
}

// ---------------------------------------------------------------- receive

#[test]
fn end_turn_with_text_is_answered() {
    let done = match start(3).receive(ModelResponse::answer("It prints 42.")) {
        Reply::Answered(done) => done,
        other => panic!("expected Answered, got {other:?}"),
    };
    assert_eq!(done.text(), "It prints 42.");
    assert_eq!(done.status_kind(), StatusKind::Answered);
    assert_eq!(done.calls_made(), 1);
    assert_eq!(
        done.history(),
        &[question(), assistant(vec![Block::text("It prints 42.")])]
    );
    let outcome = done.into_outcome();
    assert_eq!(outcome.status, StatusKind::Answered);
    assert_eq!(outcome.text, "It prints 42.");
    assert_eq!(outcome.calls, 1);
    assert_eq!(outcome.messages.len(), 2);
}

#[test]
fn answered_text_joins_text_blocks_and_keeps_thinking_in_history() {
    let thinking = Block::Thinking {
        thinking: "6 * 7".to_owned(),
        signature: "sig".to_owned(),
    };
    let content = vec![thinking.clone().into(), text("It prints"), text("42.")];
    let done = match start(1).receive(reply(content, Some(StopReason::EndTurn))) {
        Reply::Answered(done) => done,
        other => panic!("expected Answered, got {other:?}"),
    };
    assert_eq!(done.text(), "It prints\n42.");
    assert_eq!(
        done.history()[1],
        assistant(vec![thinking, Block::text("It prints"), Block::text("42.")])
    );
}

#[test]
fn answer_text_joins_non_empty_text_blocks_and_drops_empty_ones() {
    // Empty text blocks say nothing: skipped in the text, dropped from the
    // stored reply (the API refuses empty text blocks when history is resent).
    let content = vec![text(""), text("A"), text(""), text("B")];
    let done = match start(1).receive(reply(content, Some(StopReason::EndTurn))) {
        Reply::Answered(done) => done,
        other => panic!("expected Answered, got {other:?}"),
    };
    assert_eq!(done.text(), "A\nB");
    assert_eq!(
        done.history()[1],
        assistant(vec![Block::text("A"), Block::text("B")])
    );
}

#[test]
fn tool_use_gives_tools_with_calls_in_order() {
    let content = vec![
        text("Let me look."),
        tool_use("toolu_c", "read_file"),
        tool_use("toolu_a", "run_main"),
        tool_use("toolu_b", "read_file"),
    ];
    let pending = expect_tools(start(3).receive(reply(content, Some(StopReason::ToolUse))));
    let ids: Vec<&str> = pending.calls().iter().map(|c| c.id().as_str()).collect();
    assert_eq!(ids, vec!["toolu_c", "toolu_a", "toolu_b"]);
    let names: Vec<&str> = pending.calls().iter().map(ToolCall::name).collect();
    assert_eq!(names, vec!["read_file", "run_main", "read_file"]);
    assert_eq!(pending.calls()[1].input(), &json!({"path": "toolu_a.txt"}));
    assert_eq!(pending.calls_made(), 1);
}

#[test]
fn assistant_reply_is_in_history_before_tools_run_and_results_follow_in_call_order() {
    let content = vec![
        text("Two files."),
        tool_use("toolu_2", "read_file"),
        tool_use("toolu_1", "read_file"),
    ];
    let pending = expect_tools(start(3).receive(reply(content, Some(StopReason::ToolUse))));
    let reply_message = assistant(vec![
        Block::text("Two files."),
        Block::tool_use("toolu_2", "read_file", json!({"path": "toolu_2.txt"})),
        Block::tool_use("toolu_1", "read_file", json!({"path": "toolu_1.txt"})),
    ]);
    // Before any tool runs, the reply is already stored.
    assert_eq!(pending.history(), &[question(), reply_message.clone()]);

    let mut order = Vec::new();
    let next = expect_continue(pending.answer_with(|call| {
        order.push(call.id().as_str().to_owned());
        if call.id().as_str() == "toolu_1" {
            ToolOutput::error("not executed: denied")
        } else {
            ToolOutput::ok("file two")
        }
    }));
    assert_eq!(order, vec!["toolu_2", "toolu_1"]);
    assert_eq!(
        next.history(),
        &[
            question(),
            reply_message,
            Message {
                role: Role::User,
                content: vec![
                    result_block("toolu_2", "file two", false),
                    result_block("toolu_1", "not executed: denied", true),
                ],
            },
        ]
    );
}

#[test]
fn empty_tool_use_id_is_a_protocol_error() {
    assert_rejected(
        reply(
            vec![
                text("hm"),
                tool_use("toolu_ok", "read_file"),
                tool_use("", "read_file"),
            ],
            Some(StopReason::ToolUse),
        ),
        Violation::EmptyId { index: 2 },
    );
}

#[test]
fn duplicate_tool_use_id_is_a_protocol_error() {
    assert_rejected(
        reply(
            vec![
                tool_use("toolu_1", "read_file"),
                tool_use("toolu_2", "read_file"),
                tool_use("toolu_1", "run_main"),
            ],
            Some(StopReason::ToolUse),
        ),
        Violation::DuplicateId {
            id: ToolUseId::new("toolu_1"),
        },
    );
}

#[test]
fn duplicate_ids_are_found_in_long_replies_too() {
    // Past 16 calls the check switches from a scan to a set; both must agree.
    let ids: Vec<String> = (0..40).map(|i| format!("toolu_{i}")).collect();
    let unique: Vec<ReplyBlock> = ids.iter().map(|id| tool_use(id, "read_file")).collect();
    let pending = expect_tools(start(2).receive(reply(unique.clone(), Some(StopReason::ToolUse))));
    assert_eq!(pending.calls().len(), 40);
    for repeat_at in [3usize, 16, 17, 39] {
        let mut blocks = unique.clone();
        blocks.insert(repeat_at, tool_use("toolu_2", "read_file"));
        assert_rejected(
            reply(blocks, Some(StopReason::ToolUse)),
            Violation::DuplicateId {
                id: ToolUseId::new("toolu_2"),
            },
        );
    }
    let mut late = unique;
    late.push(tool_use("toolu_39", "read_file"));
    assert_rejected(
        reply(late, Some(StopReason::ToolUse)),
        Violation::DuplicateId {
            id: ToolUseId::new("toolu_39"),
        },
    );
}

#[test]
fn empty_tool_name_is_a_protocol_error() {
    assert_rejected(
        reply(
            vec![tool_use("toolu_1", "read_file"), tool_use("toolu_2", "")],
            Some(StopReason::ToolUse),
        ),
        Violation::EmptyName {
            id: ToolUseId::new("toolu_2"),
        },
    );
}

#[test]
fn unsupported_block_is_a_protocol_error_naming_it() {
    let unknown = ReplyBlock::from_value(json!({
        "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}
    }));
    assert_rejected(
        reply(vec![text("answer"), unknown], Some(StopReason::EndTurn)),
        Violation::UnsupportedBlock {
            kind: "server_tool_use".to_owned(),
            reason: "block type not supported".to_owned(),
        },
    );
}

#[test]
fn malformed_tool_use_is_a_protocol_error_naming_tool_use() {
    let broken =
        ReplyBlock::from_value(json!({"type": "tool_use", "name": "read_file", "input": {}}));
    let done =
        expect_protocol_error(start(3).receive(reply(vec![broken], Some(StopReason::ToolUse))));
    match done.status().violation() {
        Violation::UnsupportedBlock { kind, reason } => {
            assert_eq!(kind, "tool_use");
            assert!(reason.contains("malformed"), "{reason}");
        }
        other => panic!("expected UnsupportedBlock, got {other:?}"),
    }
    assert!(done.text().contains("`tool_use`"), "{}", done.text());
    assert_eq!(done.history(), &[question()]);
}

#[test]
fn tool_use_without_calls_is_a_protocol_error() {
    assert_rejected(
        reply(vec![text("I will call a tool")], Some(StopReason::ToolUse)),
        Violation::ToolUseWithoutCalls,
    );
    assert_rejected(
        reply(vec![], Some(StopReason::ToolUse)),
        Violation::ToolUseWithoutCalls,
    );
}

#[test]
fn end_turn_with_calls_is_a_protocol_error() {
    assert_rejected(
        reply(
            vec![
                text("done"),
                tool_use("toolu_1", "read_file"),
                tool_use("toolu_2", "read_file"),
            ],
            Some(StopReason::EndTurn),
        ),
        Violation::EndTurnWithCalls { count: 2 },
    );
}

#[test]
fn end_turn_without_text_is_a_protocol_error() {
    assert_rejected(
        reply(vec![], Some(StopReason::EndTurn)),
        Violation::EndTurnWithoutText,
    );
    let thinking_only = Block::Thinking {
        thinking: "nothing to say".to_owned(),
        signature: "sig".to_owned(),
    };
    assert_rejected(
        reply(vec![thinking_only.into()], Some(StopReason::EndTurn)),
        Violation::EndTurnWithoutText,
    );
}

#[test]
fn end_turn_with_whitespace_only_text_is_a_protocol_error() {
    assert_rejected(
        reply(vec![text("  \n\t "), text("")], Some(StopReason::EndTurn)),
        Violation::EndTurnWithoutText,
    );
}

#[test]
fn every_other_stop_reason_is_model_stopped_with_the_reason_in_the_text() {
    let reasons = [
        StopReason::MaxTokens,
        StopReason::StopSequence,
        StopReason::Refusal,
        StopReason::PauseTurn,
        StopReason::ModelContextWindowExceeded,
        StopReason::Other("something_new".to_owned()),
    ];
    for reason in reasons {
        let sent = reply(vec![text("partial answer")], Some(reason.clone()));
        let done = expect_stopped(start(3).receive(sent.clone()));
        assert_eq!(done.status().reason(), Some(&reason));
        assert_eq!(done.status().reply(), &sent);
        assert_eq!(done.status_kind(), StatusKind::ModelStopped);
        assert_eq!(
            done.text(),
            format!("model stopped: {}\npartial answer", reason.as_str())
        );
        assert_eq!(done.history(), &[question()]);
        assert_eq!(done.calls_made(), 1);
        let outcome = done.into_outcome();
        assert_eq!(outcome.status, StatusKind::ModelStopped);
        assert!(outcome.text.contains(reason.as_str()), "{}", outcome.text);
    }
}

#[test]
fn stop_reason_with_tool_calls_is_still_model_stopped() {
    // max_tokens in the middle of a tool_use block: nothing runs.
    let done = expect_stopped(start(3).receive(reply(
        vec![tool_use("toolu_1", "read_file")],
        Some(StopReason::MaxTokens),
    )));
    assert_eq!(done.status().reason(), Some(&StopReason::MaxTokens));
    // The outcome says that the call it held was dropped.
    assert_eq!(
        done.text(),
        "model stopped: max_tokens\n[1 tool call(s) in this reply did not run, since it stopped before it was finished: read_file (toolu_1)]"
    );
    assert_eq!(done.history(), &[question()]);
}

#[test]
fn missing_stop_reason_is_model_stopped() {
    let done = expect_stopped(start(3).receive(reply(vec![text("half")], None)));
    assert_eq!(done.status().reason(), None);
    assert_eq!(done.text(), "model stopped without a stop reason\nhalf");
    assert_eq!(done.history(), &[question()]);
    assert_eq!(done.into_outcome().status, StatusKind::ModelStopped);
}

// ---------------------------------------------------------------- budget and input

#[test]
fn budget_one_still_runs_tools_and_finishes_call_limit() {
    let pending = expect_tools(start(1).receive(ModelResponse::tool_calls([
        ("toolu_1", "read_file", json!({"path": "main.py"})),
        ("toolu_2", "read_file", json!({"path": "expected.txt"})),
    ])));
    let mut ran = Vec::new();
    let after = pending.answer_with(|call| {
        ran.push(call.id().clone());
        ToolOutput::ok(format!("out {}", call.id()))
    });
    assert_eq!(
        ran,
        vec![ToolUseId::new("toolu_1"), ToolUseId::new("toolu_2")]
    );
    let done = match after {
        AfterTools::CallLimit(done) => done,
        AfterTools::Continue(next) => panic!("expected CallLimit, got {next:?}"),
    };
    assert_eq!(done.status_kind(), StatusKind::CallLimit);
    assert_eq!(done.calls_made(), 1);
    assert!(
        done.text().starts_with("call limit reached"),
        "{}",
        done.text()
    );
    assert_eq!(done.history().len(), 3);
    assert_eq!(done.history()[2], results_message(&["toolu_1", "toolu_2"]));
    let outcome = done.into_outcome();
    assert_eq!(outcome.status, StatusKind::CallLimit);
    assert_eq!(outcome.calls, 1);
}

#[test]
fn budget_two_allows_a_second_request_then_call_limit() {
    let next = expect_continue(answer_all(expect_tools(
        start(2).receive(ModelResponse::tool_calls([("t1", "read_file", json!({}))])),
    )));
    assert_eq!(next.calls_made(), 1);
    let pending =
        expect_tools(next.receive(ModelResponse::tool_calls([("t2", "read_file", json!({}))])));
    match answer_all(pending) {
        AfterTools::CallLimit(done) => {
            assert_eq!(done.calls_made(), 2);
            assert_eq!(done.history().len(), 5);
            assert_eq!(done.history()[4], results_message(&["t2"]));
        }
        AfterTools::Continue(next) => panic!("expected CallLimit, got {next:?}"),
    }
}

#[test]
fn zero_budget_is_an_input_error() {
    assert_eq!(Budget::new(0), Err(InputError::ZeroBudget));
    assert_eq!(Budget::new(1).unwrap().get(), 1);
    assert_eq!(Budget::new(8).unwrap().get(), 8);
}

#[test]
fn empty_question_is_an_input_error() {
    let budget = Budget::new(1).unwrap();
    assert_eq!(
        Conversation::start("", budget).unwrap_err(),
        InputError::EmptyQuestion
    );
    assert_eq!(
        Conversation::start(" \n\t", budget).unwrap_err(),
        InputError::EmptyQuestion
    );
    let ok = Conversation::start("hi", budget).unwrap();
    assert_eq!(ok.history(), &[Message::user_text("hi")]);
    assert_eq!(ok.calls_made(), 0);
}

// ---------------------------------------------------------------- model failure

#[test]
fn model_failed_is_model_error_and_counts_the_call() {
    let failure = ModelFailure::with_kind(FailureKind::Overloaded, "Overloaded");
    let done: Conversation<Finished<ModelError>> = start(3).model_failed(failure.clone());
    assert_eq!(done.status().failure(), &failure);
    assert_eq!(done.calls_made(), 1);
    assert_eq!(done.text(), "model request failed: Overloaded");
    assert_eq!(done.history(), &[question()]);
    let outcome = done.into_outcome();
    assert_eq!(outcome.status, StatusKind::ModelError);
    assert_eq!(outcome.calls, 1);
}

#[test]
fn model_failed_after_a_tool_round_counts_both_calls() {
    let next = expect_continue(answer_all(expect_tools(
        start(3).receive(ModelResponse::tool_calls([("t1", "read_file", json!({}))])),
    )));
    let done = next.model_failed(ModelFailure::new("connection reset"));
    assert_eq!(done.calls_made(), 2);
    assert_eq!(done.history().len(), 3);
}

// ---------------------------------------------------------------- submit

fn three_pending() -> Conversation<AwaitingTools> {
    expect_tools(start(3).receive(ModelResponse::tool_calls([
        ("toolu_a", "read_file", json!({"path": "a"})),
        ("toolu_b", "read_file", json!({"path": "b"})),
        ("toolu_c", "run_main", json!({})),
    ])))
}

/// Submits `results`, expects `error`, and checks the conversation came back unchanged.
fn assert_submit_rejected(
    pending: Conversation<AwaitingTools>,
    results: Vec<ToolResult>,
    error: SubmitError,
) -> Conversation<AwaitingTools> {
    let calls = pending.calls().to_vec();
    let history = pending.history().to_vec();
    let made = pending.calls_made();
    let rejected = match pending.submit(results) {
        Err(rejected) => rejected,
        Ok(after) => panic!("expected a rejection, got {after:?}"),
    };
    assert_eq!(rejected.error, error);
    let back = rejected.conversation;
    assert_eq!(back.calls(), calls.as_slice());
    assert_eq!(back.history(), history.as_slice());
    assert_eq!(back.calls_made(), made);
    back
}

#[test]
fn submit_rejects_a_missing_result_and_hands_back_the_state() {
    let pending = three_pending();
    let back = assert_submit_rejected(
        pending,
        vec![tool_result("toolu_c"), tool_result("toolu_a")],
        SubmitError::Missing(ToolUseId::new("toolu_b")),
    );
    let back = assert_submit_rejected(
        back,
        vec![],
        SubmitError::Missing(ToolUseId::new("toolu_a")),
    );
    submit_reverse_succeeds(back);
}

#[test]
fn submit_rejects_a_foreign_id_and_hands_back_the_state() {
    let back = assert_submit_rejected(
        three_pending(),
        vec![
            tool_result("toolu_a"),
            tool_result("toolu_b"),
            tool_result("toolu_c"),
            tool_result("toolu_zzz"),
        ],
        SubmitError::Foreign(ToolUseId::new("toolu_zzz")),
    );
    submit_reverse_succeeds(back);
}

#[test]
fn submit_rejects_a_duplicate_id_and_hands_back_the_state() {
    let back = assert_submit_rejected(
        three_pending(),
        vec![
            tool_result("toolu_b"),
            tool_result("toolu_a"),
            tool_result("toolu_b"),
            tool_result("toolu_c"),
        ],
        SubmitError::Duplicate(ToolUseId::new("toolu_b")),
    );
    submit_reverse_succeeds(back);
}

#[test]
fn submit_in_reverse_order_stores_results_in_call_order() {
    submit_reverse_succeeds(three_pending());
}

fn submit_reverse_succeeds(pending: Conversation<AwaitingTools>) {
    let results = vec![
        ToolResult {
            tool_use_id: ToolUseId::new("toolu_c"),
            content: "exit 1".to_owned(),
            is_error: true,
        },
        tool_result("toolu_b"),
        tool_result("toolu_a"),
    ];
    let next = match pending.submit(results) {
        Ok(after) => expect_continue(after),
        Err(rejected) => panic!("a correct submit was refused: {}", rejected.error),
    };
    assert_eq!(next.history().len(), 3);
    assert_eq!(
        next.history()[2],
        Message {
            role: Role::User,
            content: vec![
                result_block("toolu_a", "out toolu_a", false),
                result_block("toolu_b", "out toolu_b", false),
                result_block("toolu_c", "exit 1", true),
            ],
        }
    );
}

// ---------------------------------------------------------------- answer_round

#[test]
fn answer_round_refuses_more_outputs_than_calls_and_hands_back_the_state() {
    let pending = three_pending();
    let calls = pending.calls().to_vec();
    let history = pending.history().to_vec();
    let made = pending.calls_made();
    let outputs = (0..4).map(|n| ToolOutput::ok(format!("out {n}"))).collect();
    let rejected = match pending.answer_round(outputs, None) {
        Err(rejected) => rejected,
        Ok(after) => panic!("expected a rejection, got {after:?}"),
    };
    assert_eq!(
        rejected.error,
        SubmitError::TooMany {
            calls: 3,
            outputs: 4
        }
    );
    assert_eq!(
        rejected.error.to_string(),
        "4 outputs for 3 pending call(s)"
    );
    let back = rejected.conversation;
    assert_eq!(back.calls(), calls.as_slice());
    assert_eq!(back.history(), history.as_slice());
    assert_eq!(back.calls_made(), made);
    // One output per call is accepted, stored in call order.
    let outputs = calls
        .iter()
        .map(|call| ToolOutput::ok(format!("out {}", call.id())))
        .collect();
    let next = match back.answer_round(outputs, None) {
        Ok(AfterRound::Continue(next)) => next,
        other => panic!("expected Continue, got {other:?}"),
    };
    assert_eq!(
        next.history()[2],
        Message {
            role: Role::User,
            content: vec![
                result_block("toolu_a", "out toolu_a", false),
                result_block("toolu_b", "out toolu_b", false),
                result_block("toolu_c", "out toolu_c", false),
            ],
        }
    );
}

#[test]
fn answer_round_answers_a_call_without_an_output_as_failed() {
    let outputs = vec![ToolOutput::ok("out toolu_a")];
    let next = match three_pending().answer_round(outputs, None) {
        Ok(AfterRound::Continue(next)) => next,
        other => panic!("expected Continue, got {other:?}"),
    };
    assert_eq!(
        next.history()[2].content,
        vec![
            result_block("toolu_a", "out toolu_a", false),
            result_block(
                "toolu_b",
                "read_file failed: the round gave no result for this call",
                true
            ),
            result_block(
                "toolu_c",
                "run_main failed: the round gave no result for this call",
                true
            ),
        ]
    );
}

/// An executor whose round gives one output too many.
struct OneTooMany;

impl Executor for OneTooMany {
    fn definitions(&self) -> &[ToolDefinition] {
        &[]
    }

    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        ToolOutput::ok(format!("out {}", call.id()))
    }

    fn execute_round<'a>(
        &'a mut self,
        calls: &'a [ToolCall],
        _agent: &'a AgentId,
        _monitor: &'a mut dyn Monitor,
    ) -> BoxFuture<'a, Round> {
        let mut outputs: Vec<ToolOutput> = calls.iter().map(|call| self.execute(call)).collect();
        outputs.push(ToolOutput::ok("for no call"));
        Box::pin(std::future::ready(Round {
            outputs,
            stopped: None,
        }))
    }
}

#[derive(Default)]
struct Warnings(Vec<String>);

impl Monitor for Warnings {
    fn event(&mut self, _agent: &AgentId, _event: &Event<'_>) {}

    fn warning(&mut self, _agent: &AgentId, warning: &str) {
        self.0.push(warning.to_owned());
    }
}

#[test]
fn driver_answers_every_call_as_failed_when_a_round_gives_too_many_outputs() {
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("toolu_a", "read_file", json!({"path": "a"})),
            ("toolu_b", "read_file", json!({"path": "b"})),
        ])),
        Ok(ModelResponse::answer("done")),
    ]);
    let mut warnings = Warnings::default();
    let outcome = run(start(3), &mut model, &mut OneTooMany, &mut warnings);
    assert_eq!(outcome.status, StatusKind::Answered);
    let failed = "read_file failed: the round's results could not be matched to its calls";
    assert_eq!(
        outcome.messages[2].content,
        vec![
            result_block("toolu_a", failed, true),
            result_block("toolu_b", failed, true),
        ]
    );
    assert_eq!(
        warnings.0,
        vec![
            "the executor's round does not match its calls (3 outputs for 2 pending call(s)); every call of the round is answered as failed"
                .to_owned()
        ]
    );
}

// ---------------------------------------------------------------- usage and Outcome

fn with_usage(mut reply: ModelResponse, input: u64, output: u64, cache_read: u64) -> ModelResponse {
    reply.usage = Some(Usage::new(input, output).with_cache(1, cache_read));
    reply
}

#[test]
fn usage_is_summed_across_replies() {
    let first = with_usage(
        ModelResponse::tool_calls([("t1", "read_file", json!({}))]),
        100,
        20,
        0,
    );
    let next = expect_continue(answer_all(expect_tools(start(3).receive(first))));
    assert_eq!(next.usage().input_tokens, 100);
    // A reply without usage adds nothing.
    let pending =
        expect_tools(next.receive(ModelResponse::tool_calls([("t2", "read_file", json!({}))])));
    let next = expect_continue(answer_all(pending));
    let last = with_usage(ModelResponse::answer("42"), 150, 5, 90);
    let done = match next.receive(last) {
        Reply::Answered(done) => done,
        other => panic!("expected Answered, got {other:?}"),
    };
    let expected = Usage::new(250, 25).with_cache(2, 90);
    assert_eq!(done.usage(), expected);
    let outcome = done.into_outcome();
    assert_eq!(outcome.usage, expected);
    assert_eq!(outcome.calls, 3);
}

#[test]
fn usage_of_a_rejected_reply_is_counted() {
    let bad = with_usage(reply(vec![], Some(StopReason::EndTurn)), 7, 3, 0);
    let done = expect_protocol_error(start(2).receive(bad));
    assert_eq!(done.usage().input_tokens, 7);
    assert_eq!(done.usage().output_tokens, 3);
}

fn outcome_json(outcome: Outcome) -> Value {
    serde_json::to_value(outcome).unwrap()
}

#[test]
fn outcome_serializes_with_the_status_strings() {
    let answered = match start(1).receive(ModelResponse::answer("42")) {
        Reply::Answered(done) => done.into_outcome(),
        other => panic!("{other:?}"),
    };
    let call_limit = match answer_all(expect_tools(
        start(1).receive(ModelResponse::tool_calls([("t", "x", json!({}))])),
    )) {
        AfterTools::CallLimit(done) => done.into_outcome(),
        other => panic!("{other:?}"),
    };
    let model_error = start(1)
        .model_failed(ModelFailure::new("boom"))
        .into_outcome();
    let protocol_error =
        expect_protocol_error(start(1).receive(reply(vec![], Some(StopReason::ToolUse))))
            .into_outcome();
    let model_stopped =
        expect_stopped(start(1).receive(reply(vec![text("x")], Some(StopReason::Refusal))))
            .into_outcome();

    let cases = [
        (answered, "answered", StatusKind::Answered),
        (call_limit, "call_limit", StatusKind::CallLimit),
        (model_error, "model_error", StatusKind::ModelError),
        (protocol_error, "protocol_error", StatusKind::ProtocolError),
        (model_stopped, "model_stopped", StatusKind::ModelStopped),
    ];
    for (outcome, name, kind) in cases {
        assert_eq!(outcome.status, kind);
        assert_eq!(kind.as_str(), name);
        assert_eq!(kind.to_string(), name);
        let value = outcome_json(outcome.clone());
        assert_eq!(value["status"], json!(name));
        assert_eq!(value["text"], json!(outcome.text));
        assert_eq!(value["calls"], json!(1));
        assert!(value["messages"].is_array(), "{value}");
        assert_eq!(value["messages"][0]["role"], "user");
        // And it reads back to the same outcome.
        let back: Outcome = serde_json::from_value(value).unwrap();
        assert_eq!(back, outcome);
    }
}

// ---------------------------------------------------------------- driver

/// Answers every call with "out <id>".
#[derive(Default)]
struct Echo {
    seen: Vec<String>,
}

impl Executor for Echo {
    fn definitions(&self) -> &[ToolDefinition] {
        &[]
    }

    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        self.seen.push(call.id().to_string());
        ToolOutput::ok(format!("out {}", call.id()))
    }
}

/// An owned copy of an event.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Request {
        call: u32,
        history_len: usize,
        new_messages: Vec<Message>,
    },
    Response {
        call: u32,
        stop_reason: Option<StopReason>,
    },
    ModelFailed {
        call: u32,
        message: String,
    },
    Continued {
        call: u32,
        prompt: String,
    },
    ToolRequested(String),
    ToolFinished(String, String),
    Finished(StatusKind),
}

#[derive(Default)]
struct Log(Vec<Seen>);

impl Monitor for Log {
    fn event(&mut self, _agent: &AgentId, event: &Event<'_>) {
        self.0.push(match event {
            Event::Request {
                call,
                request,
                new_messages,
            } => Seen::Request {
                call: *call,
                history_len: request.messages.len(),
                new_messages: new_messages.to_vec(),
            },
            Event::Response { call, response, .. } => Seen::Response {
                call: *call,
                stop_reason: response.stop_reason.clone(),
            },
            Event::EmptyReplyContinued { call, prompt } => Seen::Continued {
                call: *call,
                prompt: (*prompt).to_owned(),
            },
            Event::ModelFailed { call, failure } => Seen::ModelFailed {
                call: *call,
                message: failure.message().to_owned(),
            },
            Event::ToolRequested { call } => Seen::ToolRequested(call.id().to_string()),
            Event::ToolFinished { call, output } => {
                Seen::ToolFinished(call.id().to_string(), output.content.to_string())
            }
            Event::Finished { outcome } => Seen::Finished(outcome.status),
            _ => return,
        });
    }
}

#[test]
fn driver_script_exhausted_is_model_error() {
    let script = Script::parse(
        r#"{"parent": [
            {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
             "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "main.py"}}],
             "stop_reason": "tool_use", "stop_sequence": null,
             "usage": {"input_tokens": 10, "output_tokens": 5}}
        ]}"#,
    )
    .unwrap();
    let mut model = ScriptedModel::from_script(script.parent, false);
    let mut executor = Echo::default();
    let mut log = Log::default();
    let outcome = run(start(5), &mut model, &mut executor, &mut log);
    assert_eq!(outcome.status, StatusKind::ModelError);
    assert!(
        outcome.text.contains("script exhausted"),
        "{}",
        outcome.text
    );
    assert_eq!(outcome.calls, 2);
    assert_eq!(outcome.messages.len(), 3);
    assert_eq!(outcome.usage.input_tokens, 10);
    assert_eq!(executor.seen, vec!["toolu_1"]);
    assert_eq!(log.0.last(), Some(&Seen::Finished(StatusKind::ModelError)));
    match &log.0[log.0.len() - 2] {
        Seen::ModelFailed { call, message } => {
            assert_eq!(*call, 2);
            assert!(message.contains("script exhausted"), "{message}");
        }
        other => panic!("expected ModelFailed, got {other:?}"),
    }
}

#[test]
fn driver_empty_script_is_model_error_after_one_request() {
    let mut model = ScriptedModel::new(Vec::new());
    let outcome = run(
        start(3),
        &mut model,
        &mut Echo::default(),
        &mut Log::default(),
    );
    assert_eq!(outcome.status, StatusKind::ModelError);
    assert!(
        outcome.text.contains("script exhausted"),
        "{}",
        outcome.text
    );
    assert_eq!(outcome.calls, 1);
    assert_eq!(outcome.messages, vec![question()]);
}

#[test]
fn driver_scripted_error_reply_is_model_error_with_its_text() {
    let script = Script::parse(r#"{"parent": [{"error": "rate limited, try later"}]}"#).unwrap();
    let mut model = ScriptedModel::from_script(script.parent, false);
    let outcome = run(
        start(3),
        &mut model,
        &mut Echo::default(),
        &mut Log::default(),
    );
    assert_eq!(outcome.status, StatusKind::ModelError);
    assert!(
        outcome.text.contains("rate limited, try later"),
        "{}",
        outcome.text
    );
    assert_eq!(outcome.calls, 1);
}

#[test]
fn driver_emits_events_in_order_with_new_messages_since_previous_request() {
    let tool_reply = ModelResponse {
        content: vec![
            text("Reading both."),
            tool_use("toolu_1", "read_file"),
            tool_use("toolu_2", "read_file"),
        ],
        stop_reason: Some(StopReason::ToolUse),
        usage: None,
    };
    let second = ModelResponse::tool_calls([("toolu_3", "run_main", json!({}))]);
    let answer = ModelResponse::answer("It prints 42.");
    let mut model = ScriptedModel::new(vec![Ok(tool_reply), Ok(second), Ok(answer)]);
    let mut executor = Echo::default();
    let mut log = Log::default();
    let outcome = run(start(5), &mut model, &mut executor, &mut log);
    assert_eq!(outcome.status, StatusKind::Answered);
    assert_eq!(outcome.text, "It prints 42.");
    assert_eq!(outcome.calls, 3);
    assert_eq!(outcome.messages.len(), 6);

    let m = &outcome.messages;
    let expected = vec![
        Seen::Request {
            call: 1,
            history_len: 1,
            new_messages: vec![question()],
        },
        Seen::Response {
            call: 1,
            stop_reason: Some(StopReason::ToolUse),
        },
        Seen::ToolRequested("toolu_1".into()),
        Seen::ToolFinished("toolu_1".into(), "out toolu_1".into()),
        Seen::ToolRequested("toolu_2".into()),
        Seen::ToolFinished("toolu_2".into(), "out toolu_2".into()),
        Seen::Request {
            call: 2,
            history_len: 3,
            new_messages: vec![m[1].clone(), m[2].clone()],
        },
        Seen::Response {
            call: 2,
            stop_reason: Some(StopReason::ToolUse),
        },
        Seen::ToolRequested("toolu_3".into()),
        Seen::ToolFinished("toolu_3".into(), "out toolu_3".into()),
        Seen::Request {
            call: 3,
            history_len: 5,
            new_messages: vec![m[3].clone(), m[4].clone()],
        },
        Seen::Response {
            call: 3,
            stop_reason: Some(StopReason::EndTurn),
        },
        Seen::Finished(StatusKind::Answered),
    ];
    assert_eq!(log.0, expected);
    assert_eq!(m[2], results_message(&["toolu_1", "toolu_2"]));
    assert_eq!(m[4], results_message(&["toolu_3"]));
    assert_eq!(m[5], assistant(vec![Block::text("It prints 42.")]));
}

#[test]
fn driver_model_sees_the_history_with_results_of_the_previous_round() {
    let model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([(
            "toolu_9",
            "read_file",
            json!({"path": "x"}),
        )])),
        Ok(ModelResponse::answer("done")),
    ]);
    let mut driven = model.clone();
    let outcome = run(
        fresh(4).with_system("be brief").begin(),
        &mut driven,
        &mut Echo::default(),
        &mut Log::default(),
    );
    assert_eq!(outcome.status, StatusKind::Answered);
    let seen = model.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].system, "be brief");
    assert_eq!(seen[0].messages, vec![question()]);
    assert_eq!(seen[1].messages.len(), 3);
    assert_eq!(seen[1].messages[2], results_message(&["toolu_9"]));
}

#[test]
fn driver_stops_at_call_limit_without_another_request() {
    let model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([("t1", "read_file", json!({}))])),
        Ok(ModelResponse::tool_calls([("t2", "read_file", json!({}))])),
        Ok(ModelResponse::answer("never asked")),
    ]);
    let mut driven = model.clone();
    let mut executor = Echo::default();
    let outcome = run(start(2), &mut driven, &mut executor, &mut Log::default());
    assert_eq!(outcome.status, StatusKind::CallLimit);
    assert_eq!(outcome.calls, 2);
    assert_eq!(model.requests().len(), 2);
    assert_eq!(executor.seen, vec!["t1", "t2"]);
    assert_eq!(outcome.messages.last(), Some(&results_message(&["t2"])));
}

#[test]
fn a_scripted_message_with_a_null_error_is_a_message_not_a_failure() {
    let script = Script::parse(
        r#"{"parent": [
            {"id": "msg_1", "type": "message", "role": "assistant", "error": null,
             "content": [{"type": "text", "text": "It prints 42."}],
             "stop_reason": "end_turn", "stop_sequence": null}
        ]}"#,
    )
    .expect("a valid script");
    assert!(
        matches!(&script.parent.replies()[..], [Ok(reply)] if reply.stop_reason == Some(StopReason::EndTurn)),
        "{:?}",
        script.parent
    );
    let mut model = ScriptedModel::from_script(script.parent, false);
    let outcome = run(
        start(3),
        &mut model,
        &mut Echo::default(),
        &mut Log::default(),
    );
    assert_eq!(outcome.status, StatusKind::Answered);
    assert_eq!(outcome.text, "It prints 42.");
    // A null error on something that is not a message is no failure either:
    // the script is invalid; a non-null error is still a failed request.
    assert!(Script::parse(r#"{"parent": [{"error": null}]}"#).is_err());
    let failed = Script::parse(
        r#"{"parent": [{"error": "boom", "content": [], "stop_reason": "end_turn"}]}"#,
    )
    .expect("valid");
    assert!(matches!(&failed.parent.replies()[..], [Err(failure)] if failure.message() == "boom"));
}

#[test]
fn other_stop_reasons_finish_model_stopped_even_with_unknown_blocks() {
    let server_tool = || {
        ReplyBlock::from_value(json!({
            "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rust"}
        }))
    };
    let upload =
        || ReplyBlock::from_value(json!({"type": "container_upload", "file_id": "file_1"}));
    for (reason, wire) in [
        (StopReason::PauseTurn, "pause_turn"),
        (StopReason::Refusal, "refusal"),
        (StopReason::MaxTokens, "max_tokens"),
        (StopReason::StopSequence, "stop_sequence"),
        (StopReason::Other("something_new".into()), "something_new"),
    ] {
        let sent = reply(
            vec![text("Searching."), server_tool(), upload()],
            Some(reason.clone()),
        );
        let done = expect_stopped(start(3).receive(sent.clone()));
        assert_eq!(done.status().reason(), Some(&reason));
        assert_eq!(done.status().reply(), &sent, "the reply is kept whole");
        let text = done.text();
        assert!(
            text.starts_with(&format!("model stopped: {wire}\nSearching.")),
            "{text}"
        );
        assert!(
            text.contains("[unsupported `server_tool_use` block: {")
                && text.contains("\"query\":\"rust\""),
            "{text}"
        );
        assert!(
            text.contains("[unsupported `container_upload` block: {"),
            "{text}"
        );
        assert_eq!(done.history(), &[question()]);
    }
    // tool_use and end_turn replies with an unknown block stay protocol errors.
    for reason in [StopReason::ToolUse, StopReason::EndTurn] {
        let sent = reply(
            vec![text("x"), tool_use("toolu_1", "read_file"), server_tool()],
            Some(reason),
        );
        let done = expect_protocol_error(start(3).receive(sent));
        assert!(matches!(
            done.status().violation(),
            Violation::UnsupportedBlock { kind, .. } if kind == "server_tool_use"
        ));
    }
}

fn expect_continued(reply: Reply) -> Conversation<AwaitingModel> {
    match reply {
        Reply::Continued(next) => next,
        other => panic!("expected Reply::Continued, got {other:?}"),
    }
}

fn empty_end_turn() -> ModelResponse {
    reply(Vec::new(), Some(StopReason::EndTurn))
}

#[test]
fn an_empty_end_turn_is_a_protocol_error_by_default() {
    let pending = expect_tools(start(5).receive(reply(
        vec![tool_use("toolu_1", "read_file")],
        Some(StopReason::ToolUse),
    )));
    let next = expect_continue(answer_all(pending));
    let done = expect_protocol_error(next.receive(empty_end_turn()));
    assert_eq!(done.status().violation(), &Violation::EndTurnWithoutText);
    assert_eq!(done.history().len(), 3, "nothing was added");
    let stop = fresh(5).on_empty_reply(OnEmptyReply::Stop).begin();
    expect_protocol_error(stop.receive(empty_end_turn()));
}

#[test]
fn continue_answers_an_empty_reply_once_with_a_new_user_message() {
    let conversation = fresh(5).on_empty_reply(OnEmptyReply::Continue).begin();
    let pending = expect_tools(conversation.receive(reply(
        vec![tool_use("toolu_1", "read_file")],
        Some(StopReason::ToolUse),
    )));
    let next = expect_continue(answer_all(pending));
    // Whitespace is no text either; the empty reply is not stored.
    let next = expect_continued(next.receive(reply(vec![text(" \n")], Some(StopReason::EndTurn))));
    assert_eq!(
        next.calls_made(),
        2,
        "the empty reply counts against the budget"
    );
    assert_eq!(
        next.history(),
        &[
            question(),
            assistant(vec![Block::tool_use(
                "toolu_1",
                "read_file",
                json!({"path": "toolu_1.txt"})
            )]),
            results_message(&["toolu_1"]),
            Message::user_text(OnEmptyReply::CONTINUE_PROMPT),
        ]
    );
    assert_eq!(OnEmptyReply::CONTINUE_PROMPT, "Please continue.");
    let done = match next.receive(ModelResponse::answer("It prints 42.")) {
        Reply::Answered(done) => done,
        other => panic!("expected an answer, got {other:?}"),
    };
    assert_eq!(done.text(), "It prints 42.");
    assert_eq!(done.calls_made(), 3);
    assert_eq!(done.history().len(), 5);
}

#[test]
fn a_second_empty_reply_in_a_row_is_a_protocol_error_but_a_later_turn_may_continue_again() {
    let conversation = fresh(8).on_empty_reply(OnEmptyReply::Continue).begin();
    let next = expect_continued(conversation.receive(empty_end_turn()));
    let done = expect_protocol_error(next.receive(empty_end_turn()));
    assert_eq!(done.status().violation(), &Violation::EndTurnWithoutText);
    assert!(
        done.text().contains("a second empty reply in a row"),
        "{}",
        done.text()
    );
    assert_eq!(done.calls_made(), 2);

    // Once per turn: a reply with tools in between allows another continue.
    let conversation = fresh(8).on_empty_reply(OnEmptyReply::Continue).begin();
    let next = expect_continued(conversation.receive(empty_end_turn()));
    let pending = expect_tools(next.receive(reply(
        vec![tool_use("toolu_1", "read_file")],
        Some(StopReason::ToolUse),
    )));
    let next = expect_continue(answer_all(pending));
    let next = expect_continued(next.receive(empty_end_turn()));
    assert_eq!(next.calls_made(), 3);
    let prompts = next
        .history()
        .iter()
        .filter(|message| **message == Message::user_text(OnEmptyReply::CONTINUE_PROMPT))
        .count();
    assert_eq!(prompts, 2);
}

#[test]
fn continue_with_no_call_left_is_a_protocol_error() {
    let conversation = fresh(1).on_empty_reply(OnEmptyReply::Continue).begin();
    let done = expect_protocol_error(conversation.receive(empty_end_turn()));
    assert!(
        done.text().contains("no model call left"),
        "{}",
        done.text()
    );
    assert_eq!(done.history(), &[question()]);
}

#[test]
fn the_driver_reports_a_continued_empty_reply_and_sends_the_prompt_next() {
    let mut model = ScriptedModel::new(vec![
        Ok(empty_end_turn()),
        Ok(ModelResponse::answer("done")),
    ]);
    let mut log = Log::default();
    let conversation = fresh(3).on_empty_reply(OnEmptyReply::Continue).begin();
    let outcome = run(conversation, &mut model, &mut Echo::default(), &mut log);
    assert_eq!(outcome.status, StatusKind::Answered);
    assert_eq!(outcome.calls, 2);
    assert_eq!(
        log.0[..3],
        [
            Seen::Request {
                call: 1,
                history_len: 1,
                new_messages: vec![question()],
            },
            Seen::Response {
                call: 1,
                stop_reason: Some(StopReason::EndTurn),
            },
            Seen::Continued {
                call: 1,
                prompt: OnEmptyReply::CONTINUE_PROMPT.to_owned(),
            },
        ]
    );
    assert_eq!(
        log.0[3],
        Seen::Request {
            call: 2,
            history_len: 2,
            new_messages: vec![Message::user_text(OnEmptyReply::CONTINUE_PROMPT)],
        }
    );
    assert_eq!(
        OnEmptyReply::parse("continue"),
        Some(OnEmptyReply::Continue)
    );
    assert_eq!(OnEmptyReply::parse("stop"), Some(OnEmptyReply::Stop));
    assert_eq!(OnEmptyReply::parse("retry"), None);
}
