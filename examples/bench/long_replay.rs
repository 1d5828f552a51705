//! The long-replay benchmark's input, shared by `benches/loop.rs` and
//! `examples/long_script.rs` (each includes this file with `#[path]`).

use serde_json::{Value, json};

/// A replay script of `turns` tool rounds, each reading `file`, then one
/// answer: the long-replay benchmark's input (`examples/long_script.rs`
/// writes it to disk for `subloop run --script`).
pub fn long_replay_script(turns: usize, file: &str) -> Value {
    let mut parent: Vec<Value> = (1..=turns)
        .map(|turn| {
            json!({
                "content": [{"type": "tool_use", "id": format!("toolu_{turn}"), "name": "read_file", "input": {"path": file}}],
                "stop_reason": "tool_use"
            })
        })
        .collect();
    parent.push(json!({
        "content": [{"type": "text", "text": format!("Read {file} {turns} times.")}],
        "stop_reason": "end_turn"
    }));
    json!({"parent": parent})
}
