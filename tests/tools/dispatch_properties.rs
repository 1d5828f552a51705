//! Property: for arbitrary scripted call sequences, no tool outside the
//! registry ever runs, only arguments that match the schema reach a tool,
//! and every call gets exactly one result carrying its id, in call order.

use crate::common::RunDriven;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::StatusKind;
use subloop::core::conversation::ToolOutput;
use subloop::core::protocol::Block;
use subloop::core::protocol::Role;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::schema::{Schema, SchemaError};

/// `value` checked against `schema`.
fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    Schema::new(schema).validate(value)
}
use subloop::tools::{Capability, Tool, ToolContext};

type Runs = Arc<Mutex<HashMap<String, usize>>>;

/// A tool that records each run under its name in a log shared by all of them.
struct Counting {
    name: &'static str,
    schema: Value,
    runs: Runs,
}

impl Tool for Counting {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        "counts its runs"
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }

    fn run(&self, _input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(self.name.to_owned())
            .or_default() += 1;
        ToolOutput::ok(format!("{} ran", self.name))
    }
}

fn loose_schema() -> Value {
    json!({"type": "object"})
}

fn strict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": false
    })
}

const REGISTERED: [&str; 2] = ["alpha", "beta"];
/// Names the model may use; only `alpha` and `beta` are registered.
const NAMES: [&str; 10] = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "read_file",
    "run_main",
    "todo_write",
    "Alpha",
    "beta ",
    "alpha\u{0}",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-z]{0,5}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("n|[a-z]{1,3}", inner, 0..4)
                .prop_map(|map: BTreeMap<String, Value>| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn input() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => any::<i64>().prop_map(|n| json!({ "n": n })),
        1 => Just(json!({})),
        3 => json_value(),
    ]
}

/// One reply's calls: (name, input).
fn batch() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    prop::collection::vec((prop::sample::select(&NAMES[..]), input()), 1..5)
}

/// The batches, and a budget from 1 to one more than the batches.
fn script() -> impl Strategy<Value = (Vec<Vec<(&'static str, Value)>>, u32)> {
    prop::collection::vec(batch(), 1..6).prop_flat_map(|batches| {
        let max = batches.len() as u32 + 1;
        (Just(batches), 1..=max)
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        // 1024 by default; PROPTEST_CASES raises it for a long run.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1024),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/dispatch_properties.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn only_registered_tools_run_and_every_call_gets_one_result(
        (batches, budget) in script()
    ) {
        let runs: Runs = Arc::default();
        // Tools that exist but are not registered: they must never run.
        let _outside = [
            Counting { name: "gamma", schema: loose_schema(), runs: Arc::clone(&runs) },
            Counting { name: "delta", schema: loose_schema(), runs: Arc::clone(&runs) },
        ];
        let agent = AgentBuilder::new(Arc::new(AllowAll))
            .tool(Counting { name: "alpha", schema: loose_schema(), runs: Arc::clone(&runs) })
            .unwrap()
            .tool(Counting { name: "beta", schema: strict_schema(), runs: Arc::clone(&runs) })
            .unwrap()
            .build();

        let mut replies: Vec<_> = batches
            .iter()
            .enumerate()
            .map(|(turn, calls)| {
                Ok(ModelResponse::tool_calls(calls.iter().enumerate().map(
                    |(i, (name, input))| (format!("c{turn}_{i}"), *name, input.clone()),
                )))
            })
            .collect();
        replies.push(Ok(ModelResponse::answer("done")));
        let mut model = ScriptedModel::new(replies);
        let report = agent
            .run_driven("go", Budget::new(budget).unwrap(), &mut model)
            .unwrap();

        // Answered when the budget covers every batch and the answer, else call_limit.
        let executed = batches.len().min(budget as usize);
        let expected_status = if budget as usize > batches.len() {
            StatusKind::Answered
        } else {
            StatusKind::CallLimit
        };
        prop_assert_eq!(report.outcome.status, expected_status);
        let calls: Vec<(String, &str, &Value)> = batches[..executed]
            .iter()
            .enumerate()
            .flat_map(|(turn, batch)| {
                batch
                    .iter()
                    .enumerate()
                    .map(move |(i, (name, input))| (format!("c{turn}_{i}"), *name, input))
            })
            .collect();

        // No tool outside the registry ran; registered tools ran once per valid call.
        let runs = runs.lock().unwrap().clone();
        for name in runs.keys() {
            prop_assert!(REGISTERED.contains(&name.as_str()), "{} ran", name);
        }
        for (name, schema) in [("alpha", loose_schema()), ("beta", strict_schema())] {
            let valid = calls
                .iter()
                .filter(|(_, n, input)| *n == name && validate(&schema, input).is_ok())
                .count();
            prop_assert_eq!(runs.get(name).copied().unwrap_or(0), valid, "{}", name);
        }

        // Every tool reply is followed by one user message answering each call, in order.
        let messages = &report.outcome.messages;
        let mut results = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let ids: Vec<String> = message
                .content
                .iter()
                .filter_map(|block| match block {
                    Block::ToolUse { id, .. } => Some(id.to_string()),
                    _ => None,
                })
                .collect();
            if ids.is_empty() {
                continue;
            }
            prop_assert_eq!(message.role, Role::Assistant);
            let next = messages.get(index + 1);
            prop_assert!(next.is_some(), "no results after message {}", index);
            let next = next.unwrap();
            prop_assert_eq!(next.role, Role::User);
            let answered: Vec<(String, String, bool)> = next
                .content
                .iter()
                .map(|block| match block {
                    Block::ToolResult { tool_use_id, content, is_error } => {
                        (tool_use_id.to_string(), content.text(), *is_error)
                    }
                    other => (String::new(), format!("unexpected {} block", other.kind()), true),
                })
                .collect();
            let answered_ids: Vec<&String> = answered.iter().map(|(id, ..)| id).collect();
            prop_assert_eq!(answered_ids, ids.iter().collect::<Vec<_>>());
            results.extend(answered);
        }
        prop_assert_eq!(results.len(), calls.len());

        for ((id, name, input), (result_id, text, is_error)) in calls.iter().zip(&results) {
            prop_assert_eq!(id, result_id);
            if !REGISTERED.contains(name) {
                prop_assert_eq!(text, &format!("not executed: unregistered tool {name}"));
                prop_assert!(*is_error);
            } else if text.starts_with("not executed: ") && input.is_string() {
                // A string input is arguments that were not a JSON object.
                prop_assert!(
                    text.starts_with("not executed: arguments are not valid JSON (")
                        || text.starts_with("not executed: arguments are JSON but not an object: ")
                        || text == "not executed: arguments are a string holding a JSON object, not an object",
                    "{}",
                    text
                );
                prop_assert!(*is_error);
            } else if text.starts_with("not executed: ") {
                prop_assert!(text.starts_with(&format!("not executed: invalid input for {name}: input")), "{}", text);
                prop_assert!(*is_error);
            } else {
                prop_assert_eq!(text, &format!("{name} ran"));
                prop_assert!(!*is_error, "{} with {}", name, input);
            }
        }

        // The host's records and the audit log agree: one record, two audit entries per call.
        prop_assert_eq!(report.tools.len(), calls.len());
        for (record, (id, name, _)) in report.tools.iter().zip(&calls) {
            prop_assert_eq!(record.id.as_str(), id.as_str());
            prop_assert_eq!(record.name.as_str(), *name);
        }
        prop_assert_eq!(report.audit.len(), 2 * calls.len());
    }
}

crate::async_twins!();
