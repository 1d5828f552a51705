//! Structured answers: an answer checked against a schema (or a Rust type)
//! is accepted with its value, sent back with the reason while retries and
//! calls are left, and otherwise finishes `invalid_output`; a child with an
//! output type reports its value as the summary, or an error with the
//! reason. Agent-level tests run under both drivers.

use crate::common;
use crate::common::{RecordingModel, RunDriven};

use std::sync::Arc;

use crate::common::ScriptedReply;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use subloop::agent::output::{SchemaOutput, TypedOutput};
use subloop::agent::subagent::SubagentConfig;
use subloop::core::conversation::{Finished, InvalidOutput, Reply};
use subloop::policy::hooks::Hooks;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedChildren;
use subloop::{AgentBuilder, Budget, Conversation, ModelResponse, StatusKind};

/// The answer the tests ask for.
#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Verdict {
    /// Whether the program's output matches.
    matches: bool,
    /// What it prints.
    printed: String,
}

fn answer(text: &str) -> ScriptedReply {
    Ok(ModelResponse::answer(text))
}

const GOOD: &str = r#"{"matches": true, "printed": "42"}"#;
const WRONG_TYPE: &str = r#"{"matches": "yes", "printed": "42"}"#;

fn budget(n: u32) -> Budget {
    Budget::new(n).expect("budget")
}

// ------------------------------------------------------------ conversation

#[test]
fn a_matching_answer_finishes_answered_with_its_value() {
    let conversation = Conversation::new("q", budget(3))
        .unwrap()
        .expect_output(TypedOutput::<Verdict>::shared(), 1)
        .begin();
    let request = conversation.request(&[], None);
    let schema = request.output.expect("the schema goes with the request");
    assert_eq!(schema["properties"]["matches"]["type"], "boolean");
    match conversation.receive(ModelResponse::answer(format!("```json\n{GOOD}\n```"))) {
        Reply::Answered(done) => {
            assert_eq!(
                done.output(),
                Some(&json!({"matches": true, "printed": "42"}))
            );
            let outcome = done.into_outcome();
            assert_eq!(
                outcome.output,
                Some(json!({"matches": true, "printed": "42"}))
            );
            assert_eq!(outcome.output_error, None);
        }
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[test]
fn a_mismatch_is_sent_back_then_finishes_invalid_output() {
    let conversation = Conversation::new("q", budget(5))
        .unwrap()
        .expect_output(TypedOutput::<Verdict>::shared(), 1)
        .begin();
    let Reply::InvalidAnswer { next, error } =
        conversation.receive(ModelResponse::answer(WRONG_TYPE))
    else {
        panic!("the first mismatch is sent back");
    };
    assert_eq!(error, "answer.matches: expected boolean, got string");
    let last = next.history().last().expect("a message");
    assert_eq!(
        last.text(),
        format!(
            "Your answer does not match the required output schema: {error}. Reply again with only the JSON value, matching the schema."
        )
    );
    // The second mismatch, with no retry left, finishes with a status of its own.
    let done: Conversation<Finished<InvalidOutput>> =
        match next.receive(ModelResponse::answer("forty-two")) {
            Reply::InvalidOutput(done) => done,
            other => panic!("expected invalid_output, got {other:?}"),
        };
    assert_eq!(done.status_kind(), StatusKind::InvalidOutput);
    assert!(done.status().error().starts_with("the answer is not JSON"));
    assert_eq!(done.text(), "forty-two");
    let outcome = done.into_outcome();
    assert_eq!(outcome.status, StatusKind::InvalidOutput);
    assert_eq!(outcome.output, None);
    assert!(outcome.output_error.is_some());
}

#[test]
fn no_retry_is_given_without_a_call_left_and_a_follow_up_gets_its_own() {
    // A budget of one call: the mismatch cannot be sent back.
    let conversation = Conversation::new("q", budget(1))
        .unwrap()
        .expect_output(SchemaOutput::shared(json!({"type": "integer"})), 3)
        .begin();
    assert!(matches!(
        conversation.receive(ModelResponse::answer("\"seven\"")),
        Reply::InvalidOutput(_)
    ));
    // Retries are per question: a follow-up starts with all of them.
    let conversation = Conversation::new("q", budget(4))
        .unwrap()
        .expect_output(SchemaOutput::shared(json!({"type": "integer"})), 1)
        .begin();
    let Reply::InvalidAnswer { next, .. } = conversation.receive(ModelResponse::answer("x")) else {
        panic!("sent back");
    };
    let Reply::Answered(done) = next.receive(ModelResponse::answer("7")) else {
        panic!("answered");
    };
    let next = done.follow_up("and again?", budget(4)).expect("follow-up");
    assert!(matches!(
        next.receive(ModelResponse::answer("x")),
        Reply::InvalidAnswer { .. }
    ));
}

// ------------------------------------------------------------ agent level

#[test]
fn a_typed_answer_is_in_the_report_after_one_retry() {
    let mut model = RecordingModel::new(vec![answer("It prints 42."), answer(GOOD)]);
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .output::<Verdict>()
        .build();
    let report = agent
        .run_driven("Does it print 42?", budget(4), &mut model)
        .expect("run");
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(
        report.output::<Verdict>().expect("a verdict"),
        Verdict {
            matches: true,
            printed: "42".into()
        }
    );
    let seen = model.requests();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|request| request.output.is_some()));
    // The model saw its answer and then the reason it was sent back.
    let last = seen[1].messages.last().expect("a message").text();
    assert!(
        last.starts_with(
            "Your answer does not match the required output schema: the answer is not JSON"
        ),
        "{last}"
    );
}

#[test]
fn two_mismatches_finish_invalid_output_and_retries_are_configurable() {
    let mut model = RecordingModel::new(vec![answer(WRONG_TYPE), answer(WRONG_TYPE)]);
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .output::<Verdict>()
        .build();
    let report = agent.run_driven("q", budget(8), &mut model).expect("run");
    assert_eq!(report.outcome.status, StatusKind::InvalidOutput);
    assert_eq!(report.outcome.text, WRONG_TYPE);
    assert_eq!(
        report.outcome.output_error.as_deref(),
        Some("answer.matches: expected boolean, got string")
    );
    assert!(report.output::<Verdict>().is_err());
    // No retry at all: the first mismatch ends the run.
    let mut model = RecordingModel::new(vec![answer(WRONG_TYPE), answer(GOOD)]);
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .output::<Verdict>()
        .output_retries(0)
        .build();
    let report = agent.run_driven("q", budget(8), &mut model).expect("run");
    assert_eq!(report.outcome.status, StatusKind::InvalidOutput);
    assert_eq!(report.outcome.calls, 1);
}

fn delegate(task: &str) -> ScriptedReply {
    Ok(ModelResponse::tool_calls([(
        "p1",
        "task",
        json!({"task": task}),
    )]))
}

/// The parent delegates once and answers; the child's script is `child`.
fn child_run(child: Vec<ScriptedReply>) -> (subloop::RunReport, Value) {
    let children = ScriptedChildren(vec![child]);
    let config = SubagentConfig::new(Arc::new(children), Hooks::none())
        .whitelist(&[])
        .output::<Verdict>();
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .subagents(config)
        .expect("subagents")
        .build();
    let task_description = agent_task_description();
    let mut parent = RecordingModel::new(vec![delegate("Check it."), answer("done")]);
    let report = agent.run_driven("q", budget(4), &mut parent).expect("run");
    let result =
        serde_json::from_str::<Value>(&common::tool_results(&report.outcome.messages)[0].1)
            .expect("a JSON report");
    assert!(
        task_description.contains("\"matches\""),
        "{task_description}"
    );
    (report, result)
}

/// The `task` tool's description under an output type names its shape.
fn agent_task_description() -> String {
    let config = SubagentConfig::new(Arc::new(ScriptedChildren(Vec::new())), Hooks::none())
        .whitelist(&[])
        .output::<Verdict>();
    let builder = AgentBuilder::new(Arc::new(AllowAll))
        .subagents(config)
        .expect("subagents");
    builder
        .registry()
        .definitions()
        .iter()
        .find(|tool| tool.name == "task")
        .map(|tool| tool.description.clone())
        .unwrap_or_default()
}

#[test]
fn a_typed_child_reports_its_value_as_the_summary() {
    let (report, result) = child_run(vec![answer(GOOD)]);
    assert_eq!(result["status"], "answered");
    let summary: Value = serde_json::from_str(result["summary"].as_str().unwrap()).unwrap();
    assert_eq!(summary, json!({"matches": true, "printed": "42"}));
    assert_eq!(report.children[0].outcome.output, Some(summary));
    assert!(!report.children[0].report.is_error);
}

#[test]
fn a_typed_child_that_mismatches_once_is_sent_back_and_then_reports() {
    let (report, result) = child_run(vec![answer("42, I think"), answer(GOOD)]);
    assert_eq!(result["status"], "answered");
    assert_eq!(report.children[0].outcome.calls, 2);
    assert!(!report.children[0].report.is_error);
}

#[test]
fn a_typed_child_that_mismatches_twice_reports_an_error_with_the_reason() {
    let (report, result) = child_run(vec![answer(WRONG_TYPE), answer(WRONG_TYPE)]);
    assert_eq!(result["status"], "invalid_output");
    assert_eq!(
        result["summary"],
        "the answer does not match the output schema: answer.matches: expected boolean, got string"
    );
    assert!(report.children[0].report.is_error);
    // The parent's own answer is not checked (it asked for no output type).
    assert_eq!(report.outcome.status, StatusKind::Answered);
}

crate::async_twins!(
    a_typed_answer_is_in_the_report_after_one_retry,
    two_mismatches_finish_invalid_output_and_retries_are_configurable,
    a_typed_child_reports_its_value_as_the_summary,
    a_typed_child_that_mismatches_once_is_sent_back_and_then_reports,
    a_typed_child_that_mismatches_twice_reports_an_error_with_the_reason,
);
