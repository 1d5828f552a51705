//! Layer 5, the plan: `todo_write` replaces the plan, and the current plan
//! rides on every parent request without entering the history.
//!
//! Run with `cargo run --example plan`.

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;

use serde_json::json;
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::Model;
use subloop::ModelResponse;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Request;
use subloop::policy::permission::DenyAll;

/// Writes a plan on its first turn, then answers; prints what each request carries.
struct Planner;

impl Model for Planner {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        println!(
            "request with {} message(s); attached: {:?}",
            request.messages.len(),
            request.attachment.unwrap_or("-")
        );
        Ok(if request.messages.len() == 1 {
            ModelResponse::tool_calls([(
                "t1",
                "todo_write",
                json!({"items": [
                    {"id": "1", "text": "read main.py", "status": "completed"},
                    {"id": "2", "text": "run it", "status": "in_progress"}
                ]}),
            )])
        } else {
            ModelResponse::answer("planned")
        })
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let agent = AgentBuilder::new(Arc::new(DenyAll)).plan()?.build();
    let report = agent.run("Make a plan", Budget::new(3)?, &mut Planner)?;
    let stored = serde_json::to_string(&report.outcome.messages)?;
    println!(
        "plan text in the stored history: {}",
        stored.contains("Current plan")
    );
    Ok(())
}
