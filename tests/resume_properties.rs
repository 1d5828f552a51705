//! For arbitrary scripted runs, the trace cut at every line boundary either
//! resumes to a history that keeps the conversation's rules or is refused
//! with an error — never a panic, never a broken history.

mod common;

use proptest::prelude::*;
use serde_json::{Value, json};

use common::TempDir;
use subloop::app::{self, DecisionMode, Models, Settings};
use subloop::model::replay::RecordedRun;
use subloop::resume::{INTERRUPTED, ResumePoint};
use subloop::{Block, Budget, Message, OnEmptyReply, Role};

/// One tool call of a generated reply.
fn call() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"name": "read_file", "input": {"path": "main.py"}})),
        Just(json!({"name": "read_file", "input": {"path": "missing.txt"}})),
        Just(json!({"name": "run_main", "input": {}})),
        Just(
            json!({"name": "todo_write", "input": {"items": [{"id": "a", "text": "check", "status": "in_progress"}]}})
        ),
        Just(json!({"name": "no_such_tool", "input": {}})),
    ]
}

/// A parent script: rounds of 1–3 calls, then an answer or not.
fn script() -> impl Strategy<Value = (Vec<Vec<Value>>, bool)> {
    (
        prop::collection::vec(prop::collection::vec(call(), 1..4), 0..5),
        any::<bool>(),
    )
}

fn replies(rounds: &[Vec<Value>], answers: bool) -> Value {
    let mut parent: Vec<Value> = Vec::new();
    let mut next = 0;
    for round in rounds {
        let content: Vec<Value> = round
            .iter()
            .map(|call| {
                next += 1;
                json!({"type": "tool_use", "id": format!("toolu_{next:02}"),
                       "name": call["name"], "input": call["input"]})
            })
            .collect();
        parent.push(json!({"content": content, "stop_reason": "tool_use",
                           "usage": {"input_tokens": 10, "output_tokens": 1}}));
    }
    if answers {
        parent.push(
            json!({"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}),
        );
    }
    json!({ "parent": parent })
}

/// Every tool_use of the history is answered exactly once, in order, by the
/// next message, and no result answers an id that was not asked.
fn keeps_the_rules(history: &[Message]) -> Result<(), String> {
    let mut expect: Option<Vec<String>> = None;
    for message in history {
        let ids = |want_uses: bool| -> Vec<String> {
            message
                .content
                .iter()
                .filter_map(|block| match (block, want_uses) {
                    (Block::ToolUse { id, .. }, true) => Some(id.to_string()),
                    (Block::ToolResult { tool_use_id, .. }, false) => Some(tool_use_id.to_string()),
                    _ => None,
                })
                .collect()
        };
        match (message.role, expect.take()) {
            (Role::User, Some(asked)) if ids(false) != asked => {
                return Err(format!("asked {asked:?}, answered {:?}", ids(false)));
            }
            (Role::User, Some(_)) => {}
            (Role::User, None) if !ids(false).is_empty() => {
                return Err("results nobody asked for".into());
            }
            (Role::Assistant, None) => {
                let uses = ids(true);
                if !uses.is_empty() {
                    expect = Some(uses);
                }
            }
            (_, Some(asked)) => return Err(format!("{asked:?} left unanswered")),
            _ => {}
        }
    }
    match expect {
        Some(asked) => Err(format!("{asked:?} left unanswered at the end")),
        None => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_prefix_resumes_to_a_sound_history_or_is_refused(
        (rounds, answers) in script(),
        max_calls in 1u32..6,
    ) {
        let dir = TempDir::new("resume-prop");
        dir.write("ws/main.py", "print(6 * 7)\n");
        let script = dir.write("script.json", replies(&rounds, answers).to_string());
        let trace = dir.path().join("run.jsonl");
        let mut settings = Settings::new(dir.path().join("ws"));
        settings.question = "Check main.py.".to_owned();
        settings.max_calls = max_calls;
        settings.decision = DecisionMode::Deny;
        settings.progress = false;
        settings.trace = Some(trace.clone());
        settings.script = Some(script.clone());
        let loaded = subloop::Script::load(&script).expect("script");
        app::execute(&settings, Models::Script(loaded)).expect("run");
        let text = std::fs::read_to_string(&trace).expect("trace");
        let mut cut = 0;
        let mut prefixes = vec![String::new()];
        for line in text.split_inclusive('\n') {
            cut += line.len();
            prefixes.push(text[..cut].to_owned());
        }
        let mut resumed = 0;
        for prefix in prefixes {
            let Ok(run) = RecordedRun::parse(&prefix) else { continue };
            let budget = Budget::new(64).expect("budget");
            match ResumePoint::rebuild(&run, budget, OnEmptyReply::Stop) {
                Ok(point) => {
                    resumed += 1;
                    let history = point.conversation.history();
                    prop_assert!(keeps_the_rules(history).is_ok(), "{:?}", keeps_the_rules(history));
                    prop_assert!(point.conversation.calls_made() <= run.calls("parent"));
                    prop_assert!(point.sent <= history.len());
                    let interrupted = common::tool_results(history)
                        .into_iter()
                        .filter(|(_, content, _)| content == INTERRUPTED)
                        .count();
                    prop_assert_eq!(interrupted, point.interrupted.len());
                }
                Err(err) => prop_assert!(!err.to_string().is_empty()),
            }
        }
        // At least the prefix that ends after the first request resumes.
        prop_assert!(resumed > 0);
    }
}
