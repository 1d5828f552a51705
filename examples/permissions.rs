//! Layer 3, permissions: `read_file` runs freely; `run_main` runs only after
//! the approver says yes, and a denial goes back to the model as "not executed".
//!
//! Run with `cargo run --example permissions`.

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
use subloop::ModelResponse;
use subloop::core::protocol::Block;
use subloop::policy::permission::{AllowAll, Approver, DenyAll};
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::{RunMain, RunSettings};

fn run_with(approver: Arc<dyn Approver>) -> Result<String, Box<dyn std::error::Error>> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    let agent = AgentBuilder::new(approver)
        .tool(RunMain::new(&workspace, RunSettings::default())?)?
        .build();
    let mut model = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([("t1", "run_main", json!({}))])),
        Ok(ModelResponse::answer("reported")),
    ]);
    let report = agent.run("Run the program", Budget::new(2)?, &mut model)?;
    match report.outcome.messages[2].content.first() {
        Some(Block::ToolResult { content, .. }) => Ok(content.text()),
        _ => Err("no tool result".into()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("deny:  {}", run_with(Arc::new(DenyAll))?);
    println!("allow: {}", run_with(Arc::new(AllowAll))?);
    Ok(())
}
