//! The README's library example, the CLI's agent built by hand: read-only
//! `read_file`, `run_main` behind a terminal prompt, the plan, and `task`.
//! Run with `cargo run --example library` from the repository.

use std::path::Path;
use std::sync::Arc;

use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Hooks;
use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::policy::permission::AskTerminal;
use subloop::providers::demo::DemoChildren;
use subloop::providers::demo::DemoParent;
use subloop::tools::{ReadFile, RunMain, RunSettings};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workspace = Path::new("examples/workspace");
    let agent = AgentBuilder::new(Arc::new(AskTerminal::new())) // one gate for parent and children
        .read_only_tool(ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT)?)?
        .tool(RunMain::new(workspace, RunSettings::default())?)?
        .plan()? // todo_write, and the plan on each request
        .subagents(
            SubagentConfig::new(Arc::new(DemoChildren), Hooks::none()) // child hooks: explicit
                .whitelist(&["read_file"])
                .budget(ChildBudget::new(4)?),
        )?
        .build();
    let mut model = DemoParent; // or a ScriptedModel, or the live client
    let report = agent.run(DemoParent::QUESTION, Budget::new(8)?, &mut model)?;
    println!("{}: {}", report.outcome.status, report.outcome.text);
    Ok(())
}
