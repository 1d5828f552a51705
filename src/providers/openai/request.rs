//! A [`Request`] as a Chat Completions request body.
//!
//! * the system prompt is a `system` message, and the attachment (the plan)
//!   a second `system` message right after it: before the history, so it
//!   never follows `tool` messages;
//! * a user message's text is a `user` message; its `tool_result` blocks
//!   are `tool` messages with `tool_call_id`, in call order, before any text
//!   of the same message;
//! * an assistant turn's text and `tool_use` blocks are one `assistant`
//!   message with `tool_calls` (`function.arguments` is the input as a JSON
//!   string; an input kept as text because it was not a JSON object is sent
//!   back exactly as received); thinking blocks have no Chat Completions
//!   form and are left out;
//! * tools are `{"type": "function", "function": {name, description, parameters}}`.
//!
//! The body is the protocol's business: an embedder sees it through the
//! client (`Client::request_body`). Without the `live` feature there is no
//! client, and the builder is not used.
#![cfg_attr(not(feature = "live"), allow(dead_code))]

use serde::Serialize;
use serde_json::{Value, json};

use crate::core::protocol::{Block, Message, Request, Role, ToolResultContent, join_text};
use crate::providers::body::BodyCache;

/// Which field carries the reply's token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_completion_tokens`: OpenAI's current field (its reasoning models
    /// refuse `max_tokens`).
    MaxCompletionTokens,
    /// `max_tokens`: the older field, the one most compatible servers know.
    MaxTokens,
}

impl MaxTokensField {
    /// The field for a server: `max_completion_tokens` for OpenAI's own
    /// endpoint (`api.openai.com`), `max_tokens` for every other server.
    pub fn for_base_url(base_url: &str) -> Self {
        let rest = base_url
            .split_once("://")
            .map_or(base_url, |(_, rest)| rest);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        let host = host.split(':').next().unwrap_or(host);
        if host.eq_ignore_ascii_case("api.openai.com") {
            Self::MaxCompletionTokens
        } else {
            Self::MaxTokens
        }
    }

    /// The other field.
    pub fn other(self) -> Self {
        match self {
            Self::MaxCompletionTokens => Self::MaxTokens,
            Self::MaxTokens => Self::MaxCompletionTokens,
        }
    }

    /// Whether an error body says the server does not take this field:
    /// its `param` names the field (OpenAI), or, without a `param`, its
    /// message calls the quoted field unsupported.
    pub fn refused_by(self, error_body: &str) -> bool {
        let Ok(body) = serde_json::from_str::<Value>(error_body) else {
            return false;
        };
        let error = body.get("error").unwrap_or(&body);
        let name = self.as_str();
        // `param` decides when the server names one; else the message.
        if let Some(param) = error.get("param").and_then(Value::as_str) {
            return param == name;
        }
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_ascii_lowercase();
        let named = message.contains(&format!("'{name}'"))
            || message.contains(&format!("`{name}`"))
            || message.contains(&format!("\"{name}\""));
        named && (message.contains("unsupported") || message.contains("not supported"))
    }

    /// The JSON field name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxCompletionTokens => "max_completion_tokens",
            Self::MaxTokens => "max_tokens",
        }
    }
}

/// What a body needs besides the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodySettings<'a> {
    /// The model name.
    pub model: &'a str,
    /// The reply's token limit.
    pub max_tokens: u32,
    /// The field the limit goes in.
    pub max_tokens_field: MaxTokensField,
    /// Ask for a stream (`stream: true` and usage in its last chunk).
    pub stream: bool,
}

/// `function.arguments` of a stored input: the text kept as received when
/// the input is a string (arguments that were not a JSON object), else the
/// input as JSON text.
pub(crate) fn arguments_text(input: &Value) -> String {
    match input {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A Chat Completions message as it is written, without a value tree.
#[derive(Serialize)]
struct Written<'a> {
    role: &'static str,
    /// `None` is written as `null` (an assistant turn of calls alone).
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WrittenCall<'a>>,
}

#[derive(Serialize)]
struct WrittenCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WrittenFunction<'a>,
}

#[derive(Serialize)]
struct WrittenFunction<'a> {
    name: &'a str,
    arguments: String,
}

/// A tool as Chat Completions takes it.
#[derive(Serialize)]
struct WrittenTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WrittenToolFunction<'a>,
}

#[derive(Serialize)]
struct WrittenToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// One message of the history as Chat Completions messages (the rules of
/// the module docs), written into `out` as array items, comma-separated:
/// at least one.
fn write_message(message: &Message, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    let mut first = true;
    let mut item = |out: &mut Vec<u8>, written: &Written<'_>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, written)
    };
    match message.role {
        Role::User => {
            for block in &message.content {
                if let Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } = block
                {
                    let text = match content {
                        ToolResultContent::Text(text) => std::borrow::Cow::Borrowed(text.as_str()),
                        blocks => std::borrow::Cow::Owned(blocks.text()),
                    };
                    item(
                        out,
                        &Written {
                            role: "tool",
                            content: Some(text),
                            tool_call_id: Some(tool_use_id.as_str()),
                            tool_calls: Vec::new(),
                        },
                    )?;
                }
            }
            let text = join_text(message.content.iter());
            let has_results = message
                .content
                .iter()
                .any(|block| matches!(block, Block::ToolResult { .. }));
            // A message of results alone is the tool messages; any other
            // user message is kept, even without text, so no turn disappears.
            if !text.is_empty() || !has_results {
                item(
                    out,
                    &Written {
                        role: "user",
                        content: Some(std::borrow::Cow::Owned(text)),
                        tool_call_id: None,
                        tool_calls: Vec::new(),
                    },
                )?;
            }
        }
        Role::Assistant => {
            let text = join_text(message.content.iter());
            let tool_calls: Vec<WrittenCall<'_>> = message
                .content
                .iter()
                .filter_map(|block| match block {
                    Block::ToolUse { id, name, input } => Some(WrittenCall {
                        id: id.as_str(),
                        kind: "function",
                        function: WrittenFunction {
                            name,
                            arguments: arguments_text(input),
                        },
                    }),
                    _ => None,
                })
                .collect();
            // Text is null when there are calls and no text (as the API sends it).
            let content = if text.is_empty() && !tool_calls.is_empty() {
                None
            } else {
                Some(std::borrow::Cow::Owned(text))
            };
            item(
                out,
                &Written {
                    role: "assistant",
                    content,
                    tool_call_id: None,
                    tool_calls,
                },
            )?;
        }
    }
    Ok(())
}

/// The exact JSON body of a Chat Completions request, written into `out`
/// without a value tree; the tools and the history's messages come from
/// `cache` when it wrote them before.
pub(crate) fn write_body(
    request: &Request<'_>,
    settings: BodySettings<'_>,
    cache: &mut BodyCache,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    use crate::providers::body::write_field as field;
    field(out, true, "model", &settings.model)?;
    field(
        out,
        false,
        settings.max_tokens_field.as_str(),
        &settings.max_tokens,
    )?;
    // The system texts, then the history: its messages written once per
    // model and kept for the next request.
    out.extend_from_slice(b",\"messages\":[");
    let mut wrote = false;
    for text in [Some(request.system), request.attachment]
        .into_iter()
        .flatten()
        .filter(|text| !text.is_empty())
    {
        if std::mem::replace(&mut wrote, true) {
            out.push(b',');
        }
        let system = Written {
            role: "system",
            content: Some(std::borrow::Cow::Borrowed(text)),
            tool_call_id: None,
            tool_calls: Vec::new(),
        };
        serde_json::to_writer(&mut *out, &system)?;
    }
    if wrote && !request.messages.is_empty() {
        out.push(b',');
    }
    cache.history(request.messages, out, write_message)?;
    out.push(b']');
    if !request.tools.is_empty() {
        let tools = cache.tools(request.tools, |bytes| {
            let tools: Vec<WrittenTool<'_>> = request
                .tools
                .iter()
                .map(|tool| WrittenTool {
                    kind: "function",
                    function: WrittenToolFunction {
                        name: &tool.name,
                        description: &tool.description,
                        parameters: &tool.input_schema,
                    },
                })
                .collect();
            serde_json::to_writer(bytes, &tools)
        })?;
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(tools);
    }
    if settings.stream {
        field(out, false, "stream", &true)?;
        field(
            out,
            false,
            "stream_options",
            &json!({"include_usage": true}),
        )?;
    }
    if let Some(schema) = request.output {
        let format = json!({"type": "json_schema", "json_schema": {
            "name": "answer",
            "schema": schema,
            "strict": is_strict(schema),
        }});
        field(out, false, "response_format", &format)?;
    }
    out.push(b'}');
    Ok(())
}

/// Whether `schema` meets what OpenAI's strict structured outputs demand
/// of every object in it: `additionalProperties: false` and every property
/// required. A schema that does not is sent with `strict: false` (the
/// server then only guides the reply; the answer is checked locally either
/// way).
pub(crate) fn is_strict(schema: &Value) -> bool {
    match schema {
        Value::Object(keywords) => {
            let object_ok = match keywords.get("properties").and_then(Value::as_object) {
                Some(properties) => {
                    let required: Vec<&str> = keywords
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|names| names.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    keywords.get("additionalProperties") == Some(&Value::Bool(false))
                        && properties
                            .keys()
                            .all(|name| required.contains(&name.as_str()))
                }
                None => {
                    keywords.get("type") != Some(&json!("object"))
                        || keywords.get("additionalProperties") == Some(&Value::Bool(false))
                }
            };
            object_ok && keywords.values().all(is_strict_nested)
        }
        _ => true,
    }
}

/// [`is_strict`] of the schemas nested in a keyword's value.
fn is_strict_nested(value: &Value) -> bool {
    match value {
        Value::Object(map)
            if map.contains_key("type")
                || map.contains_key("properties")
                || map.contains_key("$ref")
                || map.contains_key("anyOf") =>
        {
            is_strict(value)
        }
        Value::Object(map) => map.values().all(is_strict_nested),
        Value::Array(items) => items.iter().all(is_strict_nested),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::protocol::{ToolDefinition, ToolUseId};

    /// The body `request` is sent with, read back.
    fn request_body(request: &Request<'_>, settings: BodySettings<'_>) -> Value {
        let mut out = Vec::new();
        write_body(request, settings, &mut BodyCache::default(), &mut out).expect("written");
        serde_json::from_slice(&out).expect("JSON")
    }

    fn settings(stream: bool) -> BodySettings<'static> {
        BodySettings {
            model: "m",
            max_tokens: 100,
            max_tokens_field: MaxTokensField::MaxTokens,
            stream,
        }
    }

    /// Strict mode needs every property required and no other property.
    #[test]
    fn a_schema_with_an_optional_property_is_sent_without_strict_mode() {
        let mut schema = serde_json::json!({
            "type": "object",
            "properties": {"verdict": {"type": "string"}},
            "required": ["verdict"],
            "additionalProperties": false
        });
        assert!(is_strict(&schema));
        schema["required"] = serde_json::json!([]);
        assert!(!is_strict(&schema));
    }

    #[test]
    fn a_tool_round_maps_to_system_user_assistant_and_tool_messages() {
        let tools = [ToolDefinition {
            name: "read_file".into(),
            description: "reads".into(),
            input_schema: json!({"type": "object"}),
        }];
        let messages = [
            Message::user_text("question"),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::text("looking"),
                    Block::Thinking {
                        thinking: "hm".into(),
                        signature: "s".into(),
                    },
                    Block::tool_use("call_1", "read_file", json!({"path": "a"})),
                    Block::tool_use("call_2", "read_file", json!("{\"path\": ")),
                ],
            },
            Message {
                role: Role::User,
                content: vec![
                    Block::ToolResult {
                        tool_use_id: ToolUseId::new("call_1"),
                        content: ToolResultContent::Text("alpha".into()),
                        is_error: false,
                    },
                    Block::ToolResult {
                        tool_use_id: ToolUseId::new("call_2"),
                        content: ToolResultContent::Text("not executed: x".into()),
                        is_error: true,
                    },
                ],
            },
        ];
        let request = Request {
            system: "sys",
            tools: &tools,
            messages: &messages,
            attachment: Some("plan"),
            output: None,
        };
        let body = request_body(&request, settings(false));
        assert_eq!(
            body,
            json!({
                "model": "m",
                "max_tokens": 100,
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "system", "content": "plan"},
                    {"role": "user", "content": "question"},
                    {"role": "assistant", "content": "looking", "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}},
                        {"id": "call_2", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\": "}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "alpha"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "not executed: x"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "read_file", "description": "reads",
                    "parameters": {"type": "object"}}}],
            })
        );
    }

    #[test]
    fn calls_without_text_have_null_content_and_streams_ask_for_usage() {
        let messages = [
            Message::user_text("q"),
            Message {
                role: Role::Assistant,
                content: vec![Block::tool_use("c", "t", json!({}))],
            },
        ];
        let request = Request {
            system: "",
            tools: &[],
            messages: &messages,
            attachment: None,
            output: None,
        };
        let body = request_body(&request, settings(true));
        assert_eq!(body["messages"][0], json!({"role": "user", "content": "q"}));
        assert_eq!(body["messages"][1]["content"], Value::Null);
        assert_eq!(
            body["messages"][1]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn a_refused_token_field_is_recognised() {
        let openai = r#"{"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}"#;
        assert!(MaxTokensField::MaxTokens.refused_by(openai));
        assert!(!MaxTokensField::MaxCompletionTokens.refused_by(openai));
        let worded = r#"{"error": {"message": "Unsupported parameter: 'max_completion_tokens'"}}"#;
        assert!(MaxTokensField::MaxCompletionTokens.refused_by(worded));
        let other = r#"{"error": {"message": "max_tokens is too large", "param": "messages"}}"#;
        assert!(!MaxTokensField::MaxTokens.refused_by(other));
        assert!(!MaxTokensField::MaxTokens.refused_by("not json"));
        assert_eq!(
            MaxTokensField::MaxTokens.other(),
            MaxTokensField::MaxCompletionTokens
        );
    }

    #[test]
    fn the_token_field_follows_the_server() {
        use MaxTokensField::*;
        assert_eq!(
            MaxTokensField::for_base_url("https://api.openai.com/v1"),
            MaxCompletionTokens
        );
        assert_eq!(
            MaxTokensField::for_base_url("https://u:p@API.openai.com:443/v1"),
            MaxCompletionTokens
        );
        for other in [
            "http://localhost:11434/v1",
            "http://localhost:8080/v1",
            "https://openrouter.ai/api/v1",
            "https://api.openai.com.evil.example/v1",
        ] {
            assert_eq!(MaxTokensField::for_base_url(other), MaxTokens, "{other}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// A model's next body, written with what its cache kept from the
        /// bodies before (tools, history messages), is byte for byte the
        /// body written afresh, whatever the history did in between.
        #[test]
        fn a_cached_body_is_the_body_written_afresh(
            parts in crate::providers::arbitrary::parts(),
            stream in proptest::prelude::any::<bool>(),
            completion in proptest::prelude::any::<bool>(),
        ) {
            let mut body_settings = settings(stream);
            if completion {
                body_settings.max_tokens_field = MaxTokensField::MaxCompletionTokens;
            }
            crate::providers::arbitrary::cached_is_afresh(&parts, &|request, cache, out| {
                write_body(request, body_settings, cache, out)
            })?;
        }
    }
}
