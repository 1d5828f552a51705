//! How an embedder uses `subloop::testing`: drive your own executor through
//! arbitrary (well-formed and hostile) conversations and let the checker
//! verify the loop's invariants.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};
use subloop::StatusKind;
use subloop::core::conversation::Interrupt;
use subloop::core::conversation::InterruptKind;
use subloop::core::conversation::ToolCall;
use subloop::core::conversation::ToolOutput;
use subloop::core::protocol::ToolDefinition;
use subloop::run::driver::Executor;
use subloop::testing::{
    check_conversation, check_executor, hostile_reply, scripted_replies, tool_call,
};

/// A host's own executor: a key-value store with `get` and `put` tools and
/// its own refusal for anything else.
struct KvStore {
    definitions: Vec<ToolDefinition>,
    data: BTreeMap<String, Value>,
    ran: usize,
}

impl KvStore {
    fn new() -> Self {
        let def = |name: &str| ToolDefinition {
            name: name.to_owned(),
            description: format!("{name} a key"),
            input_schema: json!({"type": "object"}),
        };
        Self {
            definitions: vec![def("get"), def("put")],
            data: BTreeMap::new(),
            ran: 0,
        }
    }
}

impl Executor for KvStore {
    fn definitions(&self) -> &[ToolDefinition] {
        &self.definitions
    }

    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        self.ran += 1;
        let key = call
            .input()
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match call.name() {
            "get" => ToolOutput::ok(
                self.data
                    .get(&key)
                    .map(Value::to_string)
                    .unwrap_or_default(),
            ),
            "put" => {
                self.data.insert(
                    key,
                    call.input().get("value").cloned().unwrap_or(Value::Null),
                );
                ToolOutput::ok("stored")
            }
            other => ToolOutput::error(format!("not executed: unregistered tool {other}")),
        }
    }
}

#[test]
fn the_host_executor_keeps_the_loop_invariants() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    check_executor(cases, KvStore::new).expect("invariants hold");
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "proptest-regressions/embedder_testing.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_scripts_against_the_host(script in scripted_replies(&["get", "put"], 8), budget in 1u32..6) {
        let mut store = KvStore::new();
        let outcome = check_conversation(&mut store, script, budget).map_err(TestCaseError::fail)?;
        // Every call the store ran is answered in the history.
        let answered = outcome.messages.iter().flat_map(|m| &m.content)
            .filter(|b| matches!(b, subloop::core::protocol::Block::ToolResult { .. })).count();
        prop_assert_eq!(answered, store.ran);
    }

    #[test]
    fn a_hostile_first_reply_never_runs_a_tool_without_a_well_formed_call(reply in hostile_reply(&["get", "put"])) {
        let mut store = KvStore::new();
        let outcome = check_conversation(&mut store, vec![Ok(reply)], 1).map_err(TestCaseError::fail)?;
        if outcome.status != StatusKind::CallLimit {
            prop_assert_eq!(store.ran, 0);
        }
    }

    #[test]
    fn a_host_that_stops_the_run_keeps_the_invariants(script in scripted_replies(&["get", "put"], 8), budget in 1u32..6) {
        let mut host = Stopping { store: KvStore::new(), after: 2 };
        let outcome = check_conversation(&mut host, script, budget).map_err(TestCaseError::fail)?;
        prop_assert!(host.store.ran <= 2, "ran {} calls after asking to stop", host.store.ran);
        if host.store.ran == 2 {
            // Its second call ended a tool round: the next boundary is the stop,
            // unless that round also spent the budget.
            prop_assert!(
                matches!(outcome.status, StatusKind::Cancelled | StatusKind::CallLimit),
                "status {} after the host asked to stop",
                outcome.status
            );
        }
    }

    #[test]
    fn generated_calls_never_panic_the_host(call in tool_call(&["get", "put"])) {
        let mut store = KvStore::new();
        let output = store.execute(&call);
        prop_assert_eq!(output.is_error, !matches!(call.name(), "get" | "put"));
    }
}

/// The key-value host with a limit of its own: it stops the run after `after` calls.
struct Stopping {
    store: KvStore,
    after: usize,
}

impl Executor for Stopping {
    fn definitions(&self) -> &[ToolDefinition] {
        self.store.definitions()
    }

    fn execute(&mut self, call: &ToolCall) -> ToolOutput {
        self.store.execute(call)
    }

    fn interrupt(&self) -> Option<Interrupt> {
        (self.store.ran >= self.after)
            .then(|| Interrupt::new(InterruptKind::Cancelled, "the host's own limit"))
    }
}
