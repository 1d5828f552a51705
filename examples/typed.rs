//! Typed boundaries, both ways: a tool whose arguments are a Rust type (its
//! schema generated, its arguments deserialized before it runs) and an
//! answer that must be a Rust type (checked, sent back once when it is not,
//! and handed to the host as the value). The model is a script, so the run
//! is offline; the first answer is prose and goes back with the reason.
//!
//! Run with `cargo run --example typed`.

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use subloop::core::conversation::ToolOutput;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::{Capability, ToolContext, TypedTool};
use subloop::{AgentBuilder, Budget, ModelResponse};

/// The arguments of `compare`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CompareArgs {
    /// The value the program printed.
    printed: String,
    /// The value it should print.
    expected: String,
}

/// A tool that compares two values, trimmed.
struct Compare;

impl TypedTool for Compare {
    type Args = CompareArgs;

    fn name(&self) -> &str {
        "compare"
    }

    fn description(&self) -> &str {
        "Compare what a program printed with what it should print."
    }

    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }

    fn run(&self, args: CompareArgs, _context: &ToolContext<'_>) -> ToolOutput {
        let same = args.printed.trim() == args.expected.trim();
        ToolOutput::ok(if same { "equal" } else { "different" })
    }
}

/// The answer the host asks for.
#[derive(Deserialize, JsonSchema)]
struct Verdict {
    /// Whether the program prints what it should.
    matches: bool,
    /// What it prints.
    printed: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .tool(Compare)?
        .output::<Verdict>()
        .build();
    let tool = agent_schema();
    println!("compare's input schema: {tool}");
    let mut model = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([(
            "c1",
            "compare",
            json!({"printed": "42\n", "expected": "42"}),
        )])),
        // Prose: not a Verdict. It goes back to the model with the reason.
        Ok(ModelResponse::answer("They are equal, so it matches.")),
        Ok(ModelResponse::answer(
            r#"{"matches": true, "printed": "42"}"#,
        )),
    ]);
    let report = agent.run("Does the program print 42?", Budget::new(6)?, &mut model)?;
    let verdict: Verdict = report.output()?;
    println!(
        "{} after {} model calls: matches = {}, printed = {:?}",
        report.outcome.status, report.outcome.calls, verdict.matches, verdict.printed
    );
    Ok(())
}

/// The schema the model is offered for `compare`, generated from `CompareArgs`.
fn agent_schema() -> String {
    subloop::tools::input_schema_for::<CompareArgs>().to_string()
}
