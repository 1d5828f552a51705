//! `todo_write` and the plan attachment: a valid plan rides on every later
//! parent request but never enters the stored history; a bad plan is refused
//! and the previous plan stays.

use crate::common;
use crate::common::RunDriven;

use common::tool_results;

use std::sync::Arc;

use common::RecordingModel;
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::RunReport;
use subloop::StatusKind;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::policy::permission::DenyAll;

const NO_PLAN: &str = "Current plan: none yet (todo_write sets one).";

fn item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "text": text, "status": status})
}

fn good_plan() -> Value {
    json!({"items": [
        item("read", "Read main.py with read_file", "completed"),
        item("run", "Run the program via run_main", "in_progress"),
        item("report", "Report the printed number", "pending"),
    ]})
}

const GOOD_RENDERED: &str = "Current plan:\n\
    [x] read: Read main.py with read_file\n\
    [>] run: Run the program via run_main\n\
    [ ] report: Report the printed number";

/// Runs a parent that makes one `todo_write` call per entry of `plans`, then answers.
fn run_plans(plans: Vec<Value>) -> (RunReport, RecordingModel) {
    let turns = plans.len();
    let mut replies: Vec<_> = plans
        .into_iter()
        .enumerate()
        .map(|(i, plan)| {
            Ok(ModelResponse::tool_calls([(
                format!("t{i}"),
                "todo_write".to_owned(),
                plan,
            )]))
        })
        .collect();
    replies.push(Ok(ModelResponse::answer("all planned")));
    let model = RecordingModel::new(replies);
    let mut driving = model.clone();
    let report = AgentBuilder::new(Arc::new(DenyAll))
        .plan()
        .unwrap()
        .build()
        .run_driven(
            "Make a plan",
            Budget::new(turns as u32 + 1).unwrap(),
            &mut driving,
        )
        .unwrap();
    (report, model)
}

/// Asserts that no stored message carries the attachment text.
fn assert_history_is_clean(messages: &[Message]) {
    let stored = serde_json::to_string(messages).unwrap();
    assert!(!stored.contains("Current plan"), "{stored}");
    assert!(!stored.contains("[>] run"), "{stored}");
    assert!(!stored.contains("[x] read"), "{stored}");
}

#[test]
fn a_valid_plan_is_attached_to_every_later_request_but_not_stored() {
    let second = json!({"items": [
        item("read", "Read main.py with read_file", "completed"),
        item("run", "Run the program via run_main", "completed"),
    ]});
    let (report, model) = run_plans(vec![good_plan(), second]);

    assert_eq!(report.outcome.status, StatusKind::Answered);
    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|(_, _, e)| !e), "{results:?}");

    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let attachments: Vec<Option<&str>> = requests.iter().map(|r| r.attachment.as_deref()).collect();
    assert_eq!(
        attachments,
        [
            Some(NO_PLAN),
            Some(GOOD_RENDERED),
            Some(
                "Current plan:\n[x] read: Read main.py with read_file\n[x] run: Run the program via run_main"
            ),
        ]
    );

    // The stored history is only what the user, the model and the tools said.
    assert_history_is_clean(&report.outcome.messages);
    for request in &requests {
        assert_history_is_clean(&request.messages);
        // Each request's history is a prefix of the final one: nothing was added, then removed.
        assert_eq!(
            request.messages[..],
            report.outcome.messages[..request.messages.len()]
        );
    }
    assert_eq!(
        report.outcome.messages[0],
        Message::user_text("Make a plan")
    );
    // The last user message of each later request holds exactly the tool result.
    for request in &requests[1..] {
        let last = request.messages.last().unwrap();
        assert_eq!(last.content.len(), 1);
        assert_eq!(last.content[0].kind(), "tool_result");
    }
    // The todo_write tool declares itself to the model.
    assert_eq!(requests[0].tools.len(), 1);
    assert_eq!(requests[0].tools[0].name, "todo_write");
}

#[test]
fn the_wire_form_carries_the_plan_as_a_system_block_after_the_system_prompt() {
    let (report, model) = run_plans(vec![good_plan()]);
    let requests = model.requests();
    let second = &requests[1];
    let request = subloop::core::protocol::Request {
        system: &second.system,
        tools: &second.tools,
        messages: &second.messages,
        attachment: second.attachment.as_deref(),
        output: None,
    };
    // The system prompt first (the cached, stable part), then the plan.
    assert_eq!(
        request.system_blocks(),
        vec![second.system.as_str(), GOOD_RENDERED]
    );
    // Nothing follows the tool result in the last message.
    let last = second.messages.last().unwrap();
    assert_eq!(last.content.last().map(Block::kind), Some("tool_result"));
    assert_history_is_clean(&report.outcome.messages);
    let bare = subloop::core::protocol::Request {
        system: "",
        attachment: None,
        output: None,
        ..request
    };
    assert!(bare.system_blocks().is_empty());
}

/// (what, plan, a piece of the expected error text).
fn refused_plans() -> Vec<(&'static str, Value, &'static str)> {
    let many: Vec<Value> = (0..21)
        .map(|i| item(&format!("i{i}"), "step", "pending"))
        .collect();
    vec![
        (
            "21 items",
            json!({ "items": many }),
            "input.items: must have at most 20 items (got 21)",
        ),
        (
            "empty text",
            json!({"items": [item("a", "", "pending")]}),
            "input.items[0].text: must have at least 1 character (got 0)",
        ),
        (
            "201-char text",
            json!({"items": [item("a", &"x".repeat(201), "pending")]}),
            "input.items[0].text: must have at most 200 characters (got 201)",
        ),
        (
            "duplicate ids",
            json!({"items": [item("a", "one", "pending"), item("a", "two", "pending")]}),
            "item id `a` is used twice",
        ),
        (
            "two in progress",
            json!({"items": [item("a", "one", "in_progress"), item("b", "two", "in_progress")]}),
            "at most one item may be in_progress (got 2)",
        ),
        (
            "bad status",
            json!({"items": [item("a", "one", "blocked")]}),
            "input.items[0].status: must be one of",
        ),
        (
            "extra field",
            json!({"items": [{"id": "a", "text": "one", "status": "pending", "owner": "me"}]}),
            "input.items[0].owner: unexpected field",
        ),
        (
            "missing items",
            json!({}),
            "input.items: required field is missing",
        ),
        (
            "items not an array",
            json!({"items": "a, b"}),
            "input.items: expected array, got string",
        ),
        (
            "blank text",
            json!({"items": [item("a", "   ", "pending")]}),
            "item `a`: text must be 1 to 200 characters",
        ),
        (
            "empty id",
            json!({"items": [item("", "one", "pending")]}),
            "input.items[0].id: must have at least 1 character (got 0)",
        ),
        (
            "65-char id",
            json!({"items": [item(&"i".repeat(65), "one", "pending")]}),
            "input.items[0].id: must have at most 64 characters (got 65)",
        ),
        (
            "a line break in a text (a forged plan line)",
            json!({"items": [item("a", "one\n[x] fake: done", "pending")]}),
            "item 0: ids and texts may not hold control characters or line breaks",
        ),
        (
            "an escape sequence in an id",
            json!({"items": [item("a\u{1b}[31m", "one", "pending")]}),
            "item 0: ids and texts may not hold control characters or line breaks",
        ),
    ]
}

#[test]
fn plans_over_the_limits_are_refused_and_the_old_plan_stays() {
    let bad = refused_plans();
    let mut plans = vec![good_plan()];
    plans.extend(bad.iter().map(|(_, plan, _)| plan.clone()));
    let (report, model) = run_plans(plans);

    assert_eq!(report.outcome.status, StatusKind::Answered);
    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), bad.len() + 1);
    assert!(!results[0].2, "the good plan was refused: {:?}", results[0]);
    for (index, ((what, _, expected), (id, text, is_error))) in
        bad.iter().zip(&results[1..]).enumerate()
    {
        assert_eq!(id, &format!("t{}", index + 1));
        assert!(is_error, "{what} was accepted: {text}");
        assert!(
            text.starts_with("not executed: invalid input for todo_write: ")
                || (text.starts_with("todo_write: ") && text.ends_with("; the plan is unchanged")),
            "{what}: {text}"
        );
        assert!(text.contains(expected), "{what}: {text}");
    }

    // Every request after the good plan still carries it, unchanged.
    let requests = model.requests();
    assert_eq!(requests.len(), bad.len() + 2);
    assert_eq!(requests[0].attachment.as_deref(), Some(NO_PLAN));
    for (index, request) in requests.iter().enumerate().skip(1) {
        assert_eq!(
            request.attachment.as_deref(),
            Some(GOOD_RENDERED),
            "request {index}"
        );
    }
    assert_history_is_clean(&report.outcome.messages);
}

#[test]
fn plans_at_the_limits_are_accepted() {
    let twenty: Vec<Value> = (0..20)
        .map(|i| item(&format!("i{i}"), "step", "pending"))
        .collect();
    let plans = vec![
        json!({ "items": twenty }),
        json!({"items": [item("a", &"\u{e9}".repeat(200), "in_progress"), item("b", "x", "completed")]}),
        json!({"items": []}),
    ];
    let (report, model) = run_plans(plans);
    let results = tool_results(&report.outcome.messages);
    assert!(results.iter().all(|(_, _, e)| !e), "{results:?}");
    let requests = model.requests();
    let second = requests[1].attachment.clone().unwrap();
    assert_eq!(second.lines().count(), 21);
    assert!(second.ends_with("[ ] i19: step"), "{second}");
    let third = requests[2].attachment.clone().unwrap();
    assert!(
        third.contains(&format!("[>] a: {}", "\u{e9}".repeat(200))),
        "{third}"
    );
    // An empty plan is a valid plan: it replaces the old one.
    assert_eq!(requests[3].attachment.as_deref(), Some(NO_PLAN));
}

#[test]
fn without_a_plan_no_attachment_is_sent() {
    let mut model = RecordingModel::new(vec![Ok(ModelResponse::answer("hi"))]);
    let report = AgentBuilder::new(Arc::new(DenyAll))
        .build()
        .run_driven("Hello", Budget::new(1).unwrap(), &mut model)
        .unwrap();
    assert_eq!(report.outcome.status, StatusKind::Answered);
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].attachment, None);
    assert!(requests[0].tools.is_empty());
}

crate::async_twins!(
    a_valid_plan_is_attached_to_every_later_request_but_not_stored,
    the_wire_form_carries_the_plan_as_a_system_block_after_the_system_prompt,
    plans_over_the_limits_are_refused_and_the_old_plan_stays,
    plans_at_the_limits_are_accepted,
    without_a_plan_no_attachment_is_sent,
);
