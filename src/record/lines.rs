//! The shape of every trace line, checked once when a trace is read.
//!
//! A trace is input like any other: a hand-edited line of the wrong shape
//! (`null`, a number, a `decision` of `7`, a `content` that is an object)
//! is refused with its line number rather than read as something else. The
//! kinds and their fields are those the trace writer (`record::trace`) writes; a field this
//! reader does not know is ignored, a known field of the wrong type, an
//! unknown `kind` and a line that is not an object are errors.

use serde::Deserialize;
use serde_json::Value;

use crate::core::call::CallDecision;
use crate::core::conversation::StatusKind;
use crate::core::hook::HookDecision;
use crate::core::protocol::{Message, ToolDefinition};
use crate::tools::sandbox::Sandbox;

/// Every line: its `agent`, `kind` and, for a child, the `task` call that
/// started it.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Common {
    agent: String,
    kind: String,
    #[serde(default)]
    parent_tool_use_id: Option<String>,
}

#[derive(Deserialize)]
#[allow(dead_code)] // Read for their types only.
struct Request {
    call: u64,
    messages: Vec<Message>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    attachment: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    tool_definitions: Option<Vec<ToolDefinition>>,
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    sandbox: Option<Sandbox>,
    #[serde(default)]
    output_schema: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Response {
    call: u64,
    response: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct ModelFailed {
    call: u64,
    error: String,
    #[serde(default)]
    error_type: Option<String>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct EmptyReply {
    call: u64,
    #[serde(default)]
    continued_with: Option<String>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct InvalidAnswer {
    call: u64,
    error: String,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Tool {
    name: String,
    id: String,
    decision: CallDecision,
    is_error: bool,
    content: String,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Warning {
    text: String,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Hook {
    event: String,
    command: String,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    call: Option<u64>,
    exit_code: Option<i64>,
    #[serde(default)]
    timed_out: bool,
    decision: HookDecision,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    duration_ms: Option<u64>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Outcome {
    status: StatusKind,
    text: String,
    #[serde(default)]
    calls: Option<u64>,
    #[serde(default)]
    usage: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    output_error: Option<String>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Compaction {
    call: u64,
    trigger: crate::core::compaction::CompactTrigger,
    compactor: String,
    #[serde(default)]
    tokens: Option<u64>,
    messages: Vec<Message>,
    replaced: u64,
    history: Vec<Message>,
    #[serde(default)]
    summary: Option<Summary>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Summary {
    text: String,
    #[serde(default)]
    usage: Option<crate::core::protocol::Usage>,
    requests: u32,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct McpServer {
    server: String,
    event: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Resumed {
    calls: u64,
    #[serde(default)]
    ended: Option<String>,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    delegations: Option<u64>,
    #[serde(default)]
    interrupted: Option<Vec<String>>,
    #[serde(default)]
    follow_up: Option<String>,
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    sandbox: Option<Sandbox>,
}

/// The kinds a trace holds.
pub(crate) const KINDS: [&str; 12] = [
    "request",
    "compaction",
    "response",
    "model_failed",
    "empty_reply",
    "invalid_answer",
    "tool",
    "warning",
    "hook",
    "outcome",
    "mcp_server",
    "resumed",
];

/// What JSON type `value` is, for messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks one line's shape; the error says what is wrong (without the
/// line number, which the caller adds).
pub(crate) fn check(value: &Value) -> Result<(), String> {
    if !value.is_object() {
        return Err(format!(
            "a trace line is a JSON object, not {}",
            type_name(value)
        ));
    }
    let common = Common::deserialize(value).map_err(|err| format!("{err}"))?;
    let kind = common.kind.as_str();
    let checked = match kind {
        "request" => Request::deserialize(value).map(drop),
        "response" => Response::deserialize(value).map(drop),
        "compaction" => Compaction::deserialize(value).map(drop),
        "model_failed" => ModelFailed::deserialize(value).map(drop),
        "empty_reply" => EmptyReply::deserialize(value).map(drop),
        "invalid_answer" => InvalidAnswer::deserialize(value).map(drop),
        "tool" => Tool::deserialize(value).map(drop),
        "warning" => Warning::deserialize(value).map(drop),
        "hook" => Hook::deserialize(value).map(drop),
        "outcome" => Outcome::deserialize(value).map(drop),
        "mcp_server" => McpServer::deserialize(value).map(drop),
        "resumed" => Resumed::deserialize(value).map(drop),
        other => {
            return Err(format!(
                "unknown kind {}: a trace line's kind is one of {}",
                Value::from(other),
                KINDS.join(", ")
            ));
        }
    };
    checked.map_err(|err| format!("a `{kind}` line: {err}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_of_the_wrong_shape_are_refused() {
        let tool = json!({"agent": "parent", "kind": "tool", "name": "read_file", "id": "t1",
                          "decision": "not_required", "is_error": false, "content": "x"});
        assert_eq!(check(&tool), Ok(()));
        for (field, bad) in [
            ("decision", json!(7)),
            ("decision", json!("totally_fine")),
            ("is_error", json!("yes")),
            ("content", json!({})),
            ("kind", json!(["tool"])),
        ] {
            let mut line = tool.clone();
            line[field] = bad;
            assert!(check(&line).is_err(), "{line}");
        }
        let mut no_kind = tool.clone();
        no_kind.as_object_mut().map(|object| object.remove("kind"));
        assert!(check(&no_kind).is_err());
        for line in [json!(null), json!(12), json!([1, 2, 3])] {
            let err = check(&line).expect_err("not an object");
            assert!(err.starts_with("a trace line is a JSON object"), "{err}");
        }
        let request = json!({"agent": "parent", "kind": "request", "call": 1,
                             "messages": [], "system": {}});
        assert!(check(&request).is_err());
        let request = json!({"agent": "parent", "kind": "request", "call": 1,
                             "messages": [], "tools": "read_file"});
        assert!(check(&request).is_err());
        let outcome = json!({"agent": "parent", "kind": "outcome", "status": "fine", "text": ""});
        assert!(check(&outcome).is_err());
        for (sandbox, fine) in [
            (json!("workspace-write"), true),
            (json!("read-only"), true),
            (json!("off"), true),
            (json!("none"), false),
            (json!(true), false),
        ] {
            let request = json!({"agent": "parent", "kind": "request", "call": 1,
                                 "messages": [], "sandbox": sandbox});
            assert_eq!(check(&request).is_ok(), fine, "{request}");
            let resumed = json!({"agent": "parent", "kind": "resumed", "calls": 1,
                                 "sandbox": sandbox});
            assert_eq!(check(&resumed).is_ok(), fine, "{resumed}");
        }
    }
}
