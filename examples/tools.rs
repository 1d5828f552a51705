//! Layer 2, tools: one registry serves both the definitions the model sees
//! and the dispatch; bad arguments and unknown names never reach a tool.
//!
//! Run with `cargo run --example tools`.

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
use subloop::core::protocol::Message;
use subloop::policy::permission::DenyAll;
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::ReadFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    let agent = AgentBuilder::new(Arc::new(DenyAll))
        .read_only_tool(ReadFile::new(&workspace, ReadFile::DEFAULT_LIMIT)?)?
        .build();
    let mut model = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("t1", "read_file", json!({"path": "main.py"})),
            ("t2", "read_file", json!({"path": 7})),
            ("t3", "read_file", json!({"path": "../../etc/passwd"})),
            ("t4", "delete_everything", json!({})),
        ])),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = agent.run("Read some files", Budget::new(2)?, &mut model)?;
    let results: &Message = &report.outcome.messages[2];
    for block in &results.content {
        println!("{}", serde_json::to_string(block)?);
    }
    for record in &report.tools {
        println!("{} {} -> {:?}", record.id, record.name, record.decision);
    }
    Ok(())
}
