//! Layer 4, hooks: a before hook blocks what policy forbids, an after hook
//! warns, and the audit log records every call before and after.
//!
//! Run with `cargo run --example hooks`.

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
use subloop::core::conversation::ToolOutput;
use subloop::policy::hooks::{HookCall, HookError, Verdict};
use subloop::policy::permission::DenyAll;
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::ReadFile;

/// Blocks reading anything named like a secret.
struct NoSecrets;

impl subloop::policy::hooks::Hook for NoSecrets {
    fn name(&self) -> &str {
        "no-secrets"
    }

    fn before(
        &self,
        call: &HookCall<'_>,
        _warnings: &mut Vec<String>,
    ) -> Result<Verdict, HookError> {
        let path = call.input()["path"].as_str().unwrap_or_default();
        Ok(if path.contains("secret") {
            Verdict::Block(format!("{path} looks like a secret"))
        } else {
            Verdict::Continue
        })
    }
}

/// Warns when a result is large.
struct SizeWatch;

impl subloop::policy::hooks::Hook for SizeWatch {
    fn name(&self) -> &str {
        "size-watch"
    }

    fn after(
        &self,
        call: &HookCall<'_>,
        output: &ToolOutput,
        warnings: &mut Vec<String>,
    ) -> Result<(), HookError> {
        if output.content.len() > 4 {
            warnings.push(format!(
                "{} returned {} bytes",
                call.id(),
                output.content.len()
            ));
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    let agent = AgentBuilder::new(Arc::new(DenyAll))
        .read_only_tool(ReadFile::new(&workspace, ReadFile::DEFAULT_LIMIT)?)?
        .hooks(Hooks::none().with(NoSecrets).with(SizeWatch))
        .build();
    let mut model = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("t1", "read_file", json!({"path": "main.py"})),
            ("t2", "read_file", json!({"path": "secret.env"})),
        ])),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = agent.run("Read files", Budget::new(2)?, &mut model)?;
    for record in &report.tools {
        println!(
            "{} {} {:?} is_error={}",
            record.id, record.name, record.decision, record.is_error
        );
    }
    for warning in &report.warnings {
        println!("warning from {}: {}", warning.agent, warning.text);
    }
    for entry in &report.audit {
        println!("audit: {}", serde_json::to_string(entry)?);
    }
    Ok(())
}
