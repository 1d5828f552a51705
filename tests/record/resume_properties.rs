//! For arbitrary scripted runs (compacted under a small window or not),
//! the trace cut at every line boundary either resumes to a history that
//! keeps the conversation's rules or is refused with an error — never a
//! panic, never a broken history.

use crate::common;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{Value, json};

use crate::host::{self, DecisionMode, Models, Settings};
use common::TempDir;
use subloop::Budget;
use subloop::agent::ResumePoint;
use subloop::core::conversation::OnEmptyReply;
use subloop::core::protocol::Block;
use subloop::core::protocol::Message;
use subloop::core::protocol::Role;
use subloop::record::recorded::RecordedRun;

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

/// The trace of a scripted run of `rounds` (and an answer if `answers`)
/// with `max_calls` and `decision`, compacted (the default policy) under
/// a context `window` of that many tokens when there is one, and the
/// folder that holds it.
fn recorded(
    rounds: &[Vec<Value>],
    answers: bool,
    max_calls: u32,
    decision: DecisionMode,
    window: Option<u64>,
    tag: &str,
) -> (TempDir, String) {
    let dir = TempDir::new(tag);
    dir.write("ws/main.py", "print(6 * 7)\n");
    let mut script = replies(rounds, answers);
    // Under a window the run counts by its own estimate: the script's
    // token counts (far below it) would hide what the history holds.
    if window.is_some() {
        for reply in script["parent"].as_array_mut().into_iter().flatten() {
            if let Some(object) = reply.as_object_mut() {
                object.remove("usage");
            }
        }
    }
    let script = dir.write("script.json", script.to_string());
    let trace = dir.path().join("run.jsonl");
    let mut settings = Settings::new(dir.path().join("ws"));
    settings.question = "Check main.py.".to_owned();
    settings.max_calls = max_calls;
    settings.decision = decision;
    settings.progress = false;
    settings.trace = Some(trace.clone());
    settings.script = Some(script.clone());
    settings.context_window = window;
    let loaded = subloop::providers::scripted::Script::load(&script).expect("script");
    host::execute(&settings, Models::Script(loaded)).expect("run");
    let text = std::fs::read_to_string(&trace).expect("trace");
    (dir, text)
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
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/resume_properties.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_prefix_resumes_to_a_sound_history_or_is_refused(
        (rounds, answers) in script(),
        max_calls in 1u32..6,
        window in proptest::option::of(600u64..1400),
    ) {
        let (_dir, text) =
            recorded(&rounds, answers, max_calls, DecisionMode::Deny, window, "resume-prop");
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
                        .filter(|(_, content, _)| content == subloop::record::resume::ResumeFile::INTERRUPTED)
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

/// One single-line change to a trace.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    Delete,
    Duplicate,
    SwapWithNext,
    /// A field of the line gets a value of another JSON type.
    Retype(usize),
    /// A tool result says something else (in a `tool` line or a request),
    /// or the outcome says `answered`.
    Rewrite,
}

fn mutations() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::Delete),
        Just(Mutation::Duplicate),
        Just(Mutation::SwapWithNext),
        (0usize..8).prop_map(Mutation::Retype),
        Just(Mutation::Rewrite),
    ]
}

/// `lines` with `mutation` applied at `at`; `None` when it changes nothing.
fn mutate(lines: &[String], at: usize, mutation: Mutation) -> Option<String> {
    let mut lines = lines.to_vec();
    let line = lines.get(at)?.clone();
    match mutation {
        Mutation::Delete => {
            lines.remove(at);
        }
        Mutation::Duplicate => lines.insert(at, line),
        Mutation::SwapWithNext => {
            if at + 1 >= lines.len() {
                return None;
            }
            lines.swap(at, at + 1);
        }
        Mutation::Retype(which) => {
            let mut value: Value = serde_json::from_str(&line).ok()?;
            let object = value.as_object_mut()?;
            let key = object
                .keys()
                .filter(|key| key.as_str() != "version")
                .nth(which % object.len().max(1))?
                .clone();
            let field = object.get_mut(&key)?;
            *field = match field {
                Value::String(_) => json!(7),
                Value::Number(_) => json!("7"),
                Value::Bool(_) => json!("yes"),
                Value::Null => json!({}),
                Value::Array(_) => json!("[]"),
                Value::Object(_) => json!([]),
            };
            *lines.get_mut(at)? = value.to_string();
        }
        Mutation::Rewrite => {
            let mut value: Value = serde_json::from_str(&line).ok()?;
            match value["kind"].as_str()? {
                "tool" => value["content"] = json!("EVIL"),
                "outcome" if value["status"] != "answered" => value["status"] = json!("answered"),
                "request" => {
                    let messages = value["messages"].as_array_mut()?;
                    let block = messages
                        .iter_mut()
                        .filter_map(|message| message["content"].as_array_mut())
                        .flatten()
                        .find(|block| block["type"] == "tool_result")?;
                    block["content"] = json!("EVIL");
                }
                _ => return None,
            }
            *lines.get_mut(at)? = value.to_string();
        }
    }
    Some(lines.iter().map(|line| format!("{line}\n")).collect())
}

/// Where a trace contradicts itself, by a rule stated apart from the
/// checker's: a `tool` line and a result the model was sent for the same
/// call disagree, or the outcome says `answered` after a reply that asks
/// for tools.
fn contradiction(run: &RecordedRun) -> Option<String> {
    for (agent, _) in run.agents() {
        let sent = common::tool_results(run.messages(agent));
        for line in run.tools(agent) {
            let id = line["id"].as_str().unwrap_or_default();
            let content = line["content"].as_str().unwrap_or_default();
            let is_error = line["is_error"].as_bool().unwrap_or_default();
            for (sent_id, sent_content, sent_error) in &sent {
                if sent_id == id && (sent_content != content || *sent_error != is_error) {
                    return Some(format!("{agent} {id}: {content:?} vs {sent_content:?}"));
                }
            }
        }
    }
    let (status, _) = run.outcome()?;
    let last = run.reply("parent", run.calls("parent"));
    let answered = matches!(last, Some(Ok(reply))
        if reply.stop_reason == Some(subloop::core::protocol::StopReason::EndTurn));
    (status == subloop::StatusKind::Answered && !answered)
        .then(|| "an answered outcome after a reply that is no answer".to_owned())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/resume_properties.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// For arbitrary recorded runs and arbitrary single-line changes, the
    /// invariant check never says "held" for a trace that resume refuses as
    /// broken or that contradicts itself.
    #[test]
    fn check_never_holds_what_resume_refuses_or_what_contradicts_itself(
        (rounds, answers) in script(),
        max_calls in 1u32..6,
        changes in prop::collection::vec((any::<prop::sample::Index>(), mutations()), 1..12),
    ) {
        let (_dir, text) =
            recorded(&rounds, answers, max_calls, DecisionMode::Allow, None, "check-prop");
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        // The run as recorded holds every rule.
        let run = RecordedRun::parse(&text).expect("the trace reads");
        let policy = subloop::record::invariants::Policy::default();
        let verdicts = policy.check(&run);
        prop_assert!(verdicts.iter().all(|v| v.held()), "{:?}", verdicts);
        for (index, mutation) in changes {
            let at = index.index(lines.len());
            let Some(mutated) = mutate(&lines, at, mutation) else { continue };
            // A trace that does not read is refused by view, --check and resume alike.
            let Ok(run) = RecordedRun::parse(&mutated) else { continue };
            let verdicts = policy.check(&run);
            let held = verdicts.iter().all(|v| v.held());
            let budget = Budget::new(64).expect("budget");
            let refused = match ResumePoint::rebuild(&run, budget, OnEmptyReply::Stop) {
                Err(err @ (subloop::record::resume::ResumeError::Broken { .. }
                    | subloop::record::resume::ResumeError::Inconsistent(_))) => Some(err.to_string()),
                _ => None,
            };
            prop_assert!(
                !(held && refused.is_some()),
                "line {} {:?}: resume refuses ({:?}) but every invariant held\n{}",
                at + 1, mutation, refused, mutated
            );
            let contradicts = contradiction(&run);
            prop_assert!(
                !(held && contradicts.is_some()),
                "line {} {:?}: the trace contradicts itself ({:?}) but every invariant held\n{}",
                at + 1, mutation, contradicts, mutated
            );
        }
    }
}
