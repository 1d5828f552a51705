//! Layer 1, the loop: drive a conversation by hand, one typed state at a time.
//!
//! Run with `cargo run --example loop`.

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::json;
use subloop::Budget;
use subloop::Conversation;
use subloop::ModelResponse;
use subloop::core::conversation::AfterTools;
use subloop::core::conversation::Reply;
use subloop::core::conversation::ToolOutput;
use subloop::core::conversation::ToolResult;
use subloop::core::protocol::ToolUseId;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // AwaitingModel: the only thing to do is ask the model.
    let conversation = Conversation::start("What does main.py print?", Budget::new(3)?)?;
    let request = conversation.request(&[], None);
    println!("request 1 carries {} message(s)", request.messages.len());

    // The model asks for two tools: the reply is stored, the state becomes AwaitingTools.
    let reply = ModelResponse::tool_calls([
        ("t1", "read_file", json!({"path": "main.py"})),
        ("t2", "read_file", json!({"path": "expected.txt"})),
    ]);
    let Reply::Tools(pending) = conversation.receive(reply) else {
        return Err("expected a tool round".into());
    };
    println!(
        "pending calls: {:?}",
        pending
            .calls()
            .iter()
            .map(|c| c.id().as_str())
            .collect::<Vec<_>>()
    );

    // The raw form refuses a result for an id nobody asked about, and hands the state back.
    let wrong = vec![ToolResult {
        tool_use_id: ToolUseId::new("t9"),
        content: "?".into(),
        is_error: false,
    }];
    let pending = match pending.submit(wrong) {
        Ok(_) => return Err("a foreign id must be refused".into()),
        Err(rejected) => {
            println!("rejected: {}", rejected.error);
            rejected.conversation
        }
    };

    // The paired form cannot get ids wrong: the machine attaches them.
    let after = pending.answer_with(|call| match call.input()["path"].as_str() {
        Some("main.py") => ToolOutput::ok("print(6 * 7)"),
        _ => ToolOutput::ok("42"),
    });
    let AfterTools::Continue(conversation) = after else {
        return Err("budget left, so the loop continues".into());
    };

    // The model answers: Finished<Answered>, which has no transitions at all.
    let Reply::Answered(done) = conversation.receive(ModelResponse::answer("It prints 42.")) else {
        return Err("expected an answer".into());
    };
    let outcome = done.into_outcome();
    println!(
        "status={} calls={} text={:?}",
        outcome.status, outcome.calls, outcome.text
    );
    println!("{}", serde_json::to_string_pretty(&outcome.messages)?);
    Ok(())
}
