//! Loop invariants over arbitrary model replies, driven through `subloop::run::driver::run`.
//!
//! Each case builds a script of arbitrary replies (any mix of text, tool_use
//! with empty / duplicate / random ids, thinking, unsupported blocks, every
//! stop reason, failures, occasionally ~100 KB of text), runs it with a budget
//! and checks that the loop finishes within budget, that the history pairs
//! every call with exactly one result, and that the status agrees with the
//! rules of the conversation.

use std::collections::HashSet;

use crate::common::ScriptedReply;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{Value, json};
use subloop::Budget;
use subloop::Conversation;
use subloop::Model;
use subloop::ModelResponse;
use subloop::Outcome;
use subloop::StatusKind;
use subloop::core::conversation::AfterTools;
use subloop::core::conversation::ToolCall;
use subloop::core::conversation::ToolOutput;
use subloop::core::conversation::ToolResult;
use subloop::core::conversation::Violation;
use subloop::core::error::ModelFailure;
use subloop::core::error::SubmitError;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::ReplyBlock;
use subloop::core::protocol::Request;
use subloop::core::protocol::Role;
use subloop::core::protocol::StopReason;
use subloop::core::protocol::ToolDefinition;
use subloop::core::protocol::ToolResultContent;
use subloop::core::protocol::ToolUseId;
use subloop::core::protocol::Usage;
use subloop::providers::scripted::ScriptedModel;
use subloop::run::driver::Executor;

const QUESTION: &str = "What does main.py print?";

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/loop_properties.txt",
        ))),
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------------ strategies

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-z_ ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "[ a-zA-Z0-9\n\t.é]{0,24}",
        2 => Just(String::new()),
        2 => "[ \n\t]{1,5}",
        // Huge text: a short random piece repeated up to ~100 KB.
        1 => ("[a-z ]{1,8}", 1_000usize..12_500).prop_map(|(piece, n)| piece.repeat(n)),
    ]
}

fn arb_id() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        3 => prop::sample::select(vec!["toolu_0", "toolu_1", "toolu_2"]).prop_map(str::to_owned),
        6 => "toolu_[a-zA-Z0-9]{1,10}",
    ]
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        4 => prop::sample::select(vec!["read_file", "run_main", "todo_write", "task"])
            .prop_map(str::to_owned),
        2 => "[a-z_]{1,12}",
    ]
}

fn arb_unsupported() -> impl Strategy<Value = ReplyBlock> {
    let typed = (
        prop_oneof![
            Just("image".to_owned()),
            Just("server_tool_use".to_owned()),
            Just("web_search_tool_result".to_owned()),
            Just("tool_result".to_owned()),
            Just("tool_use".to_owned()),
            Just("text".to_owned()),
            Just("thinking".to_owned()),
            Just("redacted_thinking".to_owned()),
            "[a-z_]{0,10}",
        ],
        prop::collection::btree_map("[a-z_]{1,6}", arb_json(), 0..4),
    )
        .prop_map(|(kind, fields)| {
            let mut object: serde_json::Map<String, Value> = fields.into_iter().collect();
            object.insert("type".to_owned(), Value::String(kind));
            Value::Object(object)
        });
    prop_oneof![arb_json(), typed].prop_map(ReplyBlock::from_value)
}

fn arb_block() -> impl Strategy<Value = ReplyBlock> {
    prop_oneof![
        3 => arb_text().prop_map(|t| Block::text(t).into()),
        4 => (arb_id(), arb_name(), arb_json())
            .prop_map(|(id, name, input)| Block::tool_use(id, name, input).into()),
        1 => ("[a-z ]{0,20}", "[A-Za-z0-9+/=]{0,16}").prop_map(|(thinking, signature)| {
            Block::Thinking { thinking, signature }.into()
        }),
        1 => "[A-Za-z0-9+/=]{0,16}".prop_map(|data| Block::RedactedThinking { data }.into()),
        1 => arb_unsupported(),
    ]
}

fn arb_stop_reason() -> impl Strategy<Value = Option<StopReason>> {
    prop_oneof![
        3 => Just(Some(StopReason::EndTurn)),
        5 => Just(Some(StopReason::ToolUse)),
        1 => Just(Some(StopReason::MaxTokens)),
        1 => Just(Some(StopReason::StopSequence)),
        1 => Just(Some(StopReason::PauseTurn)),
        1 => Just(Some(StopReason::Refusal)),
        1 => Just(Some(StopReason::ModelContextWindowExceeded)),
        1 => "[a-z_]{0,12}".prop_map(|s| Some(StopReason::parse(&s))),
        1 => Just(None),
    ]
}

fn arb_usage() -> impl Strategy<Value = Option<Usage>> {
    prop::option::of((0u64..10_000, 0u64..10_000, 0u64..100, 0u64..100).prop_map(
        |(input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens)| {
            Usage::new(input_tokens, output_tokens)
                .with_cache(cache_creation_input_tokens, cache_read_input_tokens)
        },
    ))
}

/// Any mix of blocks with any stop reason.
fn arb_wild_reply() -> impl Strategy<Value = ModelResponse> {
    (
        prop::collection::vec(arb_block(), 0..6),
        arb_stop_reason(),
        arb_usage(),
    )
        .prop_map(|(content, stop_reason, usage)| ModelResponse {
            content,
            stop_reason,
            usage,
        })
}

/// A well-formed tool round, so that loops run several rounds deep.
fn arb_clean_tools() -> impl Strategy<Value = ModelResponse> {
    (
        prop::option::of(arb_text()),
        prop::collection::vec((arb_name(), arb_json()), 1..4),
        any::<u16>(),
    )
        .prop_map(|(text, calls, salt)| {
            let mut content: Vec<ReplyBlock> =
                text.map(|t| Block::text(t).into()).into_iter().collect();
            for (index, (name, input)) in calls.into_iter().enumerate() {
                let name = if name.is_empty() {
                    "read_file".to_owned()
                } else {
                    name
                };
                content.push(Block::tool_use(format!("toolu_{salt}_{index}"), name, input).into());
            }
            ModelResponse {
                content,
                stop_reason: Some(StopReason::ToolUse),
                usage: None,
            }
        })
}

fn arb_reply() -> impl Strategy<Value = ScriptedReply> {
    prop_oneof![
        3 => arb_wild_reply().prop_map(Ok),
        8 => arb_clean_tools().prop_map(Ok),
        1 => arb_text().prop_map(|t| Ok(ModelResponse::answer(format!("answer {t}")))),
        1 => "[a-z ]{1,20}".prop_map(|m| Err(ModelFailure::new(format!("failed: {m}")))),
    ]
}

// ------------------------------------------------------------------ harness

/// Answers every call with `result for <id>`; `run_main` calls are errors.
#[derive(Default)]
struct AnswerAll {
    executed: Vec<ToolCall>,
}

fn output_for(id: &ToolUseId, name: &str) -> (String, bool) {
    (format!("result for {id}"), name == "run_main")
}

impl Executor for AnswerAll {
    fn definitions(&self) -> &[ToolDefinition] {
        &[]
    }

    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        self.executed.push(call.clone());
        let (content, is_error) = output_for(call.id(), call.name());
        ToolOutput {
            content: content.into(),
            is_error,
        }
    }
}

/// Wraps the scripted model, counting requests and remembering what each one held.
struct Counting {
    inner: ScriptedModel,
    /// For every request: (number of messages, role of the last one).
    requests: Vec<(usize, Option<Role>)>,
}

impl Model for Counting {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.requests.push((
            request.messages.len(),
            request.messages.last().map(|m| m.role),
        ));
        self.inner.respond(request)
    }
}

// ------------------------------------------------------------------ the rules, restated

/// Every rule a reply breaks (empty when it is acceptable).
fn violations(reply: &ModelResponse) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut calls = 0;
    let mut text = String::new();
    // A reply that stops for another reason (max_tokens, refusal, …) is
    // model_stopped whatever blocks it holds.
    let stops_otherwise = !matches!(
        reply.stop_reason,
        None | Some(StopReason::EndTurn | StopReason::ToolUse)
    );
    for (index, block) in reply.content.iter().enumerate() {
        match block {
            ReplyBlock::Unsupported { .. } if stops_otherwise => {}
            ReplyBlock::Unsupported { kind, reason, .. } => {
                found.push(Violation::UnsupportedBlock {
                    kind: kind.clone(),
                    reason: reason.clone(),
                })
            }
            ReplyBlock::Known(Block::ToolUse { id, name, .. }) => {
                calls += 1;
                if id.as_str().is_empty() {
                    found.push(Violation::EmptyId { index });
                } else if !seen.insert(id.clone()) {
                    found.push(Violation::DuplicateId { id: id.clone() });
                }
                if name.is_empty() {
                    found.push(Violation::EmptyName { id: id.clone() });
                }
            }
            ReplyBlock::Known(Block::Text { text: t }) => text.push_str(t),
            ReplyBlock::Known(_) => {}
        }
    }
    match reply.stop_reason {
        Some(StopReason::EndTurn) if calls > 0 => {
            found.push(Violation::EndTurnWithCalls { count: calls })
        }
        Some(StopReason::EndTurn) if text.trim().is_empty() => {
            found.push(Violation::EndTurnWithoutText)
        }
        Some(StopReason::ToolUse) if calls == 0 => found.push(Violation::ToolUseWithoutCalls),
        _ => {}
    }
    found
}

/// Violations about the blocks themselves, which the rules check before the stop reason.
fn structural(violation: &Violation) -> bool {
    matches!(
        violation,
        Violation::UnsupportedBlock { .. }
            | Violation::EmptyId { .. }
            | Violation::DuplicateId { .. }
            | Violation::EmptyName { .. }
    )
}

fn known(reply: &ModelResponse) -> Vec<Block> {
    reply
        .content
        .iter()
        .map(|block| match block {
            ReplyBlock::Known(block) => block.clone(),
            ReplyBlock::Unsupported { .. } => unreachable!("checked by violations()"),
        })
        // The stored reply drops empty text blocks.
        .filter(|block| !matches!(block, Block::Text { text } if text.is_empty()))
        .collect()
}

fn tool_uses(blocks: &[Block]) -> Vec<(ToolUseId, String)> {
    blocks
        .iter()
        .filter_map(|block| match block {
            Block::ToolUse { id, name, .. } => Some((id.clone(), name.clone())),
            _ => None,
        })
        .collect()
}

fn text_of(blocks: &[Block]) -> String {
    blocks
        .iter()
        .filter_map(|block| match block {
            Block::Text { text } if !text.is_empty() => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the rules say a run of `script` with `max_calls` ends as.
struct Expected {
    status: StatusKind,
    calls: u32,
    messages: Vec<Message>,
    /// The reply the run ended on, if it ended on a reply.
    last_reply: Option<ModelResponse>,
}

fn expected(script: &[ScriptedReply], max_calls: u32) -> Expected {
    let mut messages = vec![Message::user_text(QUESTION)];
    let mut calls = 0u32;
    loop {
        calls += 1;
        let reply = match script.get(calls as usize - 1) {
            None | Some(Err(_)) => {
                return Expected {
                    status: StatusKind::ModelError,
                    calls,
                    messages,
                    last_reply: None,
                };
            }
            Some(Ok(reply)) => reply.clone(),
        };
        let broken = violations(&reply);
        let done = |status, messages| Expected {
            status,
            calls,
            messages,
            last_reply: Some(reply.clone()),
        };
        if broken.iter().any(structural) {
            return done(StatusKind::ProtocolError, messages);
        }
        match reply.stop_reason {
            Some(StopReason::EndTurn) | Some(StopReason::ToolUse) if !broken.is_empty() => {
                return done(StatusKind::ProtocolError, messages);
            }
            Some(StopReason::EndTurn) => {
                messages.push(Message {
                    role: Role::Assistant,
                    content: known(&reply),
                });
                return done(StatusKind::Answered, messages);
            }
            Some(StopReason::ToolUse) => {
                let blocks = known(&reply);
                let results = tool_uses(&blocks)
                    .into_iter()
                    .map(|(id, name)| {
                        let (content, is_error) = output_for(&id, &name);
                        Block::ToolResult {
                            tool_use_id: id,
                            content: ToolResultContent::Text(content.into()),
                            is_error,
                        }
                    })
                    .collect();
                messages.push(Message {
                    role: Role::Assistant,
                    content: blocks,
                });
                messages.push(Message {
                    role: Role::User,
                    content: results,
                });
                if calls >= max_calls {
                    return done(StatusKind::CallLimit, messages);
                }
            }
            _ => return done(StatusKind::ModelStopped, messages),
        }
    }
}

// ------------------------------------------------------------------ invariants

/// Checks the history alone: roles alternate, every tool_use is answered exactly
/// once in the very next message, in call order, and nothing else is there.
fn check_history(messages: &[Message]) -> Result<(), TestCaseError> {
    prop_assert!(!messages.is_empty());
    prop_assert_eq!(&messages[0], &Message::user_text(QUESTION));
    for (index, message) in messages.iter().enumerate() {
        let role = if index % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        prop_assert_eq!(message.role, role, "message {} has the wrong role", index);
        if role == Role::User && index > 0 {
            prop_assert!(
                message
                    .content
                    .iter()
                    .all(|b| matches!(b, Block::ToolResult { .. })),
                "user message {} holds something other than tool results",
                index
            );
        }
        if role == Role::Assistant {
            prop_assert!(
                message
                    .content
                    .iter()
                    .all(|b| !matches!(b, Block::ToolResult { .. })),
                "assistant message {} holds a tool result",
                index
            );
            let calls = tool_uses(&message.content);
            if calls.is_empty() {
                prop_assert_eq!(index, messages.len() - 1, "an answer must end the history");
                continue;
            }
            let next = messages.get(index + 1);
            prop_assert!(
                next.is_some(),
                "tool_use in message {} is never answered",
                index
            );
            let answered: Vec<Option<&ToolUseId>> = next
                .unwrap()
                .content
                .iter()
                .map(|b| match b {
                    Block::ToolResult { tool_use_id, .. } => Some(tool_use_id),
                    _ => None,
                })
                .collect();
            let asked: Vec<Option<&ToolUseId>> = calls.iter().map(|(id, _)| Some(id)).collect();
            prop_assert_eq!(
                answered,
                asked,
                "results of message {} do not match its calls",
                index
            );
            let unique: HashSet<&ToolUseId> = calls.iter().map(|(id, _)| id).collect();
            prop_assert_eq!(unique.len(), calls.len(), "ids repeat in message {}", index);
            prop_assert!(calls.iter().all(|(id, _)| !id.as_str().is_empty()));
        }
    }
    Ok(())
}

fn check_run(script: Vec<ScriptedReply>, max_calls: u32) -> Result<(), TestCaseError> {
    let conversation = Conversation::start(QUESTION, Budget::new(max_calls).unwrap()).unwrap();
    let mut model = Counting {
        inner: ScriptedModel::new(script.clone()),
        requests: Vec::new(),
    };
    let mut executor = AnswerAll::default();
    let outcome: Outcome =
        subloop::run::driver::run(conversation, &mut model, &mut executor, &mut ());

    // Within budget, and `calls` is the number of requests made.
    prop_assert!(outcome.calls >= 1);
    prop_assert!(outcome.calls <= max_calls);
    prop_assert_eq!(outcome.calls as usize, model.requests.len());
    // Every request ended with a user message and grew the history by one round.
    for (n, (len, last)) in model.requests.iter().enumerate() {
        prop_assert_eq!(*len, 1 + 2 * n);
        prop_assert_eq!(*last, Some(Role::User));
    }

    check_history(&outcome.messages)?;

    // The executor ran exactly the calls in the history, in order.
    let in_history: Vec<(ToolUseId, String)> = outcome
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| tool_uses(&m.content))
        .collect();
    let executed: Vec<(ToolUseId, String)> = executor
        .executed
        .iter()
        .map(|c| (c.id().clone(), c.name().to_owned()))
        .collect();
    prop_assert_eq!(executed, in_history);

    // The status agrees with the rules.
    let want = expected(&script, max_calls);
    prop_assert_eq!(outcome.status, want.status, "text: {}", outcome.text);
    prop_assert_eq!(outcome.calls, want.calls);
    prop_assert_eq!(&outcome.messages, &want.messages);

    let last = want.last_reply.as_ref();
    match outcome.status {
        StatusKind::Answered => {
            let last = last.unwrap();
            prop_assert_eq!(&last.stop_reason, &Some(StopReason::EndTurn));
            let blocks = known(last);
            prop_assert!(tool_uses(&blocks).is_empty());
            let text = text_of(&blocks);
            prop_assert!(!text.trim().is_empty());
            prop_assert_eq!(&outcome.text, &text);
            prop_assert_eq!(
                outcome.messages.last().map(|m| m.role),
                Some(Role::Assistant)
            );
        }
        StatusKind::CallLimit => {
            prop_assert_eq!(outcome.calls, max_calls);
            let end = outcome.messages.last().unwrap();
            prop_assert_eq!(end.role, Role::User);
            prop_assert!(!end.content.is_empty());
            prop_assert!(
                end.content
                    .iter()
                    .all(|b| matches!(b, Block::ToolResult { .. })),
                "call_limit history must end with tool results"
            );
        }
        StatusKind::ProtocolError => {
            let broken = violations(last.unwrap());
            prop_assert!(
                !broken.is_empty(),
                "accepted reply reported as protocol_error"
            );
            prop_assert!(
                broken
                    .iter()
                    .any(|v| outcome.text == format!("protocol error: {v}")),
                "text {:?} names none of {:?}",
                outcome.text,
                broken
            );
        }
        StatusKind::ModelStopped => {
            let last = last.unwrap();
            prop_assert!(violations(last).iter().all(|v| !structural(v)));
            match &last.stop_reason {
                None => prop_assert!(
                    outcome
                        .text
                        .starts_with("model stopped without a stop reason")
                ),
                Some(reason) => {
                    prop_assert!(
                        !matches!(reason, StopReason::EndTurn | StopReason::ToolUse),
                        "stopped on {}",
                        reason
                    );
                    let head = format!("model stopped: {reason}");
                    prop_assert!(outcome.text.starts_with(&head), "{}", outcome.text);
                }
            }
        }
        StatusKind::ModelError => {
            let index = outcome.calls as usize - 1;
            match script.get(index) {
                Some(Err(failure)) => prop_assert!(outcome.text.contains(failure.message())),
                Some(Ok(_)) => prop_assert!(false, "model_error on a scripted reply"),
                None => prop_assert!(outcome.text.contains("script exhausted")),
            }
        }
        // No executor here interrupts and no `task` runs, so no run-limit status can appear.
        other => prop_assert!(false, "unexpected status {}", other),
    }

    // The outcome serializes with its status string and reads back unchanged.
    let value = serde_json::to_value(&outcome).unwrap();
    prop_assert_eq!(&value["status"], &json!(outcome.status.as_str()));
    let back: Outcome = serde_json::from_value(value).unwrap();
    prop_assert_eq!(back, outcome);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn loop_invariants_hold_for_arbitrary_replies(
        rounds in prop::collection::vec(arb_clean_tools().prop_map(Ok), 0..6),
        tail in prop::collection::vec(arb_reply(), 0..5),
        max_calls in 1u32..10,
    ) {
        // Some well-formed tool rounds first, so that deep loops are common,
        // then anything at all.
        let script: Vec<ScriptedReply> = rounds.into_iter().chain(tail).collect();
        check_run(script, max_calls)?;
    }

    #[test]
    fn a_single_arbitrary_reply_is_classified_by_the_rules(
        reply in arb_wild_reply(),
        max_calls in 1u32..3,
    ) {
        check_run(vec![Ok(reply)], max_calls)?;
    }

    #[test]
    fn submit_accepts_exactly_the_permutations(
        n in 1usize..6,
        picks in prop_oneof![
            // A permutation of the pending calls (foreign indices are filtered below).
            Just(()).prop_flat_map(|()| Just((0..6).collect::<Vec<usize>>()).prop_shuffle()),
            // Any subset or superset, with repeats and foreign ids.
            prop::collection::vec(0usize..8, 0..10),
        ],
        permutation_only in any::<bool>(),
    ) {
        // Indices < n name pending calls; indices >= n are foreign ids.
        let picks: Vec<usize> = if permutation_only {
            picks.into_iter().filter(|&i| i < n).collect()
        } else {
            picks
        };
        let calls: Vec<(String, String, Value)> = (0..n)
            .map(|i| (format!("toolu_{i}"), "read_file".to_owned(), json!({"i": i})))
            .collect();
        let conversation = Conversation::start(QUESTION, Budget::new(3).unwrap()).unwrap();
        let pending = match conversation.receive(ModelResponse::tool_calls(calls)) {
            subloop::core::conversation::Reply::Tools(pending) => pending,
            other => return Err(TestCaseError::fail(format!("expected tools, got {other:?}"))),
        };
        let before_calls = pending.calls().to_vec();
        let before_history = pending.history().to_vec();

        let id = |i: usize| ToolUseId::new(format!("toolu_{i}"));
        let results: Vec<ToolResult> = picks
            .iter()
            .enumerate()
            .map(|(k, &i)| ToolResult {
                tool_use_id: id(i),
                content: format!("result {k} for {i}"),
                is_error: k % 2 == 1,
            })
            .collect();
        let mut sorted = picks.clone();
        sorted.sort_unstable();
        let is_permutation = sorted == (0..n).collect::<Vec<_>>();

        match pending.submit(results.clone()) {
            Ok(after) => {
                prop_assert!(is_permutation, "accepted {:?} for {} calls", picks, n);
                let next = match after {
                    AfterTools::Continue(next) => next,
                    AfterTools::CallLimit(_) => return Err(TestCaseError::fail("budget 3 spent after 1 call")),
                };
                let history = next.history();
                prop_assert_eq!(history.len(), 3);
                prop_assert_eq!(&history[..2], before_history.as_slice());
                // Results are stored in call order, each with its own content.
                let expected: Vec<Block> = (0..n)
                    .map(|i| {
                        let result = results.iter().find(|r| r.tool_use_id == id(i)).unwrap();
                        Block::ToolResult {
                            tool_use_id: id(i),
                            content: ToolResultContent::Text(result.content.clone().into()),
                            is_error: result.is_error,
                        }
                    })
                    .collect();
                prop_assert_eq!(&history[2], &Message { role: Role::User, content: expected });
            }
            Err(rejected) => {
                prop_assert!(!is_permutation, "refused the permutation {:?}: {}", picks, rejected.error);
                let back = rejected.conversation;
                prop_assert_eq!(back.calls(), before_calls.as_slice());
                prop_assert_eq!(back.history(), before_history.as_slice());
                prop_assert_eq!(back.calls_made(), 1);
                // The error names a real fault of the submission.
                let count = |i: usize| picks.iter().filter(|&&p| p == i).count();
                match rejected.error {
                    SubmitError::Foreign(bad) => {
                        prop_assert!((n..8).any(|i| id(i) == bad), "{} is not foreign", bad);
                    }
                    SubmitError::Duplicate(bad) => {
                        let i = (0..n).find(|&i| id(i) == bad);
                        prop_assert!(i.is_some_and(|i| count(i) >= 2), "{} is not duplicated", bad);
                    }
                    SubmitError::Missing(bad) => {
                        let i = (0..n).find(|&i| id(i) == bad);
                        prop_assert!(i.is_some_and(|i| count(i) == 0), "{} is not missing", bad);
                    }
                    other => prop_assert!(false, "an error of a kind this test does not know: {}", other),
                }
                // And the handed-back state still accepts a correct answer.
                let fixed: Vec<ToolResult> = (0..n)
                    .rev()
                    .map(|i| ToolResult { tool_use_id: id(i), content: format!("ok {i}"), is_error: false })
                    .collect();
                prop_assert!(back.submit(fixed).is_ok());
            }
        }
    }
}
