//! Layer 6, the subagent: `task` runs the same loop with a fresh history,
//! `read_file` only, its own budget, and returns a bounded report under the
//! original tool_use id. The host keeps the child's full outcome.
//!
//! Run with `cargo run --example subagent`.

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Hooks;
use subloop::ModelResponse;
use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedChildren;
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::{ReadFile, RunMain, RunSettings};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    let child_script = vec![
        Ok(ModelResponse::tool_calls([(
            "c1",
            "read_file",
            json!({"path": "main.py"}),
        )])),
        // Even if the child asks for run_main, its registry does not have it.
        Ok(ModelResponse::tool_calls([("c2", "run_main", json!({}))])),
        Ok(ModelResponse::answer("source derives 42; not run yet")),
    ];
    let config = SubagentConfig::new(
        Arc::new(ScriptedChildren(vec![child_script])),
        Hooks::none(),
    )
    .budget(ChildBudget::new(3)?);
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(&workspace, ReadFile::DEFAULT_LIMIT)?)?
        .tool(RunMain::new(&workspace, RunSettings::default())?)?
        .subagents(config)?
        .build();
    let mut parent = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([(
            "p1",
            "task",
            json!({"task": "What does main.py derive?"}),
        )])),
        Ok(ModelResponse::answer("The subagent says 42.")),
    ]);
    let report = agent.run("Check main.py", Budget::new(4)?, &mut parent)?;
    println!("parent history: {} messages", report.outcome.messages.len());
    println!(
        "parent got: {}",
        serde_json::to_string(&report.outcome.messages[2])?
    );
    for child in &report.children {
        println!(
            "{} answered {} with {} messages kept by the host",
            child.agent,
            child.parent_tool_use_id,
            child.outcome.messages.len()
        );
        for record in &child.tools {
            println!("  {} {} {:?}", record.id, record.name, record.decision);
        }
    }
    Ok(())
}
