//! The built-in offline models of `subloop demo`.
//!
//! Like the course's fixed stub, they look at the conversation so far and
//! pick the next step of one scenario: check `main.py` against
//! `expected.txt`. The child recognises `print(6 * 7)` and nothing else; it
//! is not a general code reader.
//!
//! * Parent: delegate the reading (`task`), read `expected.txt` itself, ask
//!   for `run_main`, then compare the program's full stdout with the expected
//!   text. A failed delegation or a denied run is reported, not papered over.
//! * Child: read `main.py`, read `expected.txt`, conclude "source derives 42;
//!   not run yet".

use serde_json::{Value, json};

use crate::core::error::ModelFailure;
use crate::core::protocol::{Block, Message, ModelResponse, Request, Role};
use crate::run::model::{ChildModels, Model};

/// The task text the demo parent delegates.
pub(crate) const DEMO_TASK: &str = "Read main.py and expected.txt in the workspace. Say what output the source \
derives and whether it matches the expected text. Do not run anything.";

/// The result `results` holds for the call `id`: its text and whether it is an error.
fn result_of(results: &Message, id: &crate::core::protocol::ToolUseId) -> Option<(String, bool)> {
    results.content.iter().find_map(|block| match block {
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } if tool_use_id == id => Some((content.text(), *is_error)),
        _ => None,
    })
}

/// The calls of `asked` (an assistant message) with their results in
/// `results` (the next message): `(name, text, is_error)`, a call without a
/// result only when `keep_unanswered` (with an empty text).
fn answered<'a>(
    asked: &'a Message,
    results: &Message,
    keep_unanswered: bool,
) -> Vec<(&'a str, String, bool)> {
    asked
        .content
        .iter()
        .filter_map(|block| match block {
            Block::ToolUse { id, name, .. } => match result_of(results, id) {
                Some((text, is_error)) => Some((name.as_str(), text, is_error)),
                None if keep_unanswered => Some((name.as_str(), String::new(), false)),
                None => None,
            },
            _ => None,
        })
        .collect()
}

/// The last tool round: the calls of the last assistant message and their results.
fn last_round(messages: &[Message]) -> Vec<(String, String, bool)> {
    let (Some(results), Some(asked)) = (messages.last(), messages.iter().rev().nth(1)) else {
        return Vec::new();
    };
    if results.role != Role::User || asked.role != Role::Assistant {
        return Vec::new();
    }
    answered(asked, results, true)
        .into_iter()
        .map(|(name, text, is_error)| (name.to_owned(), text, is_error))
        .collect()
}

fn turn(messages: &[Message]) -> usize {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count()
}

fn call(prefix: &str, turn: usize, name: &str, input: Value) -> ModelResponse {
    ModelResponse::tool_calls([(format!("toolu_{prefix}_{}", turn + 1), name, input)])
}

/// Every call of the history with its result, in order: `(name, text, is_error)`.
fn results(messages: &[Message]) -> Vec<(&str, String, bool)> {
    messages
        .iter()
        .zip(messages.iter().skip(1))
        .filter(|(message, _)| message.role == Role::Assistant)
        .flat_map(|(asked, next)| answered(asked, next, false))
        .collect()
}

/// The demo's parent model. It keeps nothing between requests: what it
/// knows (the subagent's finding, the expected text) it reads from the
/// history it is sent, so a resumed run is answered from what is on record.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoParent;

impl DemoParent {
    /// The question the demo parent answers (`subloop demo` asks it).
    pub const QUESTION: &'static str = "Check the program in this workspace: find out what main.py should print, \
run it if allowed, and say whether its output matches expected.txt.";
}

impl Model for DemoParent {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new("subloop.demo", None))
    }

    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        let turn = turn(request.messages);
        let round = last_round(request.messages);
        let Some((tool, text, is_error)) = round.into_iter().next() else {
            return Ok(call("parent", turn, "task", json!({"task": DEMO_TASK})));
        };
        let reply = match tool.as_str() {
            "task" => {
                let report: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let status = report
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown");
                let summary = report
                    .get("summary")
                    .and_then(Value::as_str)
                    .unwrap_or(text.as_str());
                if is_error {
                    ModelResponse::answer(format!(
                        "I could not conclude: the subagent stopped with status `{status}` before finishing \
                         ({summary}). I did not ask to run the program."
                    ))
                } else {
                    call("parent", turn, "read_file", json!({"path": "expected.txt"}))
                }
            }
            "read_file" if is_error => ModelResponse::answer(format!(
                "I could not read expected.txt ({text}), so there is nothing to compare against."
            )),
            "read_file" => call("parent", turn, "run_main", json!({})),
            "run_main" => ModelResponse::answer(verdict(request.messages, &text, is_error)),
            other => {
                ModelResponse::answer(format!("The demo model did not expect a `{other}` result."))
            }
        };
        Ok(reply)
    }
}

/// The answer after `run_main` gave `result`, from what the history holds:
/// the last successful `read_file` (expected.txt) and `task` (the finding).
fn verdict(messages: &[Message], result: &str, is_error: bool) -> String {
    let results = results(messages);
    let last_ok = |tool: &str| {
        results
            .iter()
            .rev()
            .find(|(name, _, error)| *name == tool && !error)
            .map(|(_, text, _)| text.as_str())
    };
    let Some(expected) = last_ok("read_file").map(|text| text.trim_end_matches('\n')) else {
        return "I have not read expected.txt in this conversation, so there is nothing to compare against."
            .to_owned();
    };
    let derived = last_ok("task")
        .and_then(|text| {
            let report: Value = serde_json::from_str(text).ok()?;
            report
                .get("summary")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "no finding".to_owned());
    if result.starts_with("not executed:") {
        return format!(
            "The subagent reports: {derived}. expected.txt holds {expected}. The program was not run \
             ({result}), so whether its output matches is unverified."
        );
    }
    let report: Value = serde_json::from_str(result).unwrap_or(Value::Null);
    let Some(stdout) = report.get("stdout").and_then(Value::as_str) else {
        return format!("Running the program failed: {result}");
    };
    let output = stdout.trim_end_matches('\n');
    if !is_error && output == expected {
        format!(
            "The program printed {output}, which matches expected.txt ({expected}). The subagent's reading ({derived}) is confirmed."
        )
    } else if is_error {
        format!(
            "The program failed (exit code {}), printing {output:?}; expected {expected:?}.",
            report.get("exit_code").unwrap_or(&Value::Null)
        )
    } else {
        format!("The program printed {output:?}, which does not match expected.txt ({expected:?}).")
    }
}

/// The demo's child model.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoChild;

impl Model for DemoChild {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new("subloop.demo", None))
    }

    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        let turn = turn(request.messages);
        let round = last_round(request.messages);
        let Some((_, text, is_error)) = round.into_iter().next() else {
            return Ok(call("child", turn, "read_file", json!({"path": "main.py"})));
        };
        let reply = if is_error {
            ModelResponse::answer(format!("I could not read the file: {text}"))
        } else if turn == 1 {
            if text.contains("print(6 * 7)") {
                call("child", turn, "read_file", json!({"path": "expected.txt"}))
            } else {
                ModelResponse::answer(
                    "main.py does not contain print(6 * 7); this demo model only understands that program.",
                )
            }
        } else if text.trim() == "42" {
            ModelResponse::answer("source derives 42; not run yet")
        } else {
            ModelResponse::answer(format!(
                "source derives 42; not run yet; expected.txt holds {:?}, which differs",
                text.trim()
            ))
        };
        Ok(reply)
    }
}

/// Every delegation gets the demo's child model.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoChildren;

impl ChildModels for DemoChildren {
    fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
        Box::new(DemoChild)
    }
}
