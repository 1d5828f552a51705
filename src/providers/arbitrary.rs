//! Arbitrary requests, for the properties of the providers' bodies.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::core::protocol::{
    Block, Message, Request, Role, ToolDefinition, ToolResultContent, ToolUseId,
};
use crate::providers::body::BodyCache;

pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z\"\\\\]{1,6}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

pub(crate) fn block() -> impl Strategy<Value = Block> {
    let text = "\\PC{0,40}";
    prop_oneof![
        text.prop_map(|text| Block::Text { text }),
        ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", json_value()).prop_map(|(id, name, input)| {
            Block::ToolUse {
                id: ToolUseId::new(id),
                name,
                input,
            }
        }),
        ("[a-z0-9_]{1,8}", text, any::<bool>()).prop_map(|(id, text, is_error)| {
            Block::ToolResult {
                tool_use_id: ToolUseId::new(id),
                content: ToolResultContent::Text(text.into()),
                is_error,
            }
        }),
        ("[a-z0-9_]{1,8}", text).prop_map(|(id, text)| Block::ToolResult {
            tool_use_id: ToolUseId::new(id),
            content: ToolResultContent::Blocks(vec![Block::Text { text }]),
            is_error: false,
        }),
        (text, text).prop_map(|(thinking, signature)| Block::Thinking {
            thinking,
            signature
        }),
        (
            prop::option::of(text),
            prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3)
        )
            .prop_map(|(content, rest)| {
                let rest: Map<String, Value> = rest
                    .into_iter()
                    .filter(|(key, _)| key != "content" && key != "type")
                    .collect();
                Block::Compaction { content, rest }
            }),
    ]
}

pub(crate) fn message() -> impl Strategy<Value = Message> {
    (any::<bool>(), prop::collection::vec(block(), 0..4)).prop_map(|(user, content)| Message {
        role: if user { Role::User } else { Role::Assistant },
        content,
    })
}

pub(crate) fn tool() -> impl Strategy<Value = ToolDefinition> {
    ("[a-z_]{1,8}", "\\PC{0,30}", json_value()).prop_map(|(name, description, schema)| {
        ToolDefinition {
            name,
            description,
            input_schema: schema,
        }
    })
}

/// The histories a model's requests carry, one request after another: one
/// that grows a message at a time, then one whose first message changed
/// (as after a compaction), the whole again, the messages reversed, and
/// the whole once more.
pub(crate) fn rounds(messages: &[Message]) -> Vec<Vec<Message>> {
    let mut changed = messages.to_vec();
    if let Some(first) = changed.first_mut() {
        first.content.push(Block::Text {
            text: "changed".to_owned(),
        });
    }
    let reversed: Vec<Message> = messages.iter().rev().cloned().collect();
    let mut rounds: Vec<Vec<Message>> = (0..=messages.len())
        .map(|n| messages.get(..n).unwrap_or_default().to_vec())
        .collect();
    rounds.extend([changed, messages.to_vec(), reversed, messages.to_vec()]);
    rounds
}

/// What the body properties vary of a request.
#[derive(Debug, Clone)]
pub(crate) struct Parts {
    pub(crate) system: String,
    pub(crate) attachment: Option<String>,
    pub(crate) tools: Vec<ToolDefinition>,
    pub(crate) messages: Vec<Message>,
    pub(crate) output: Option<Value>,
}

pub(crate) fn parts() -> impl Strategy<Value = Parts> {
    (
        "\\PC{0,30}",
        prop::option::of("\\PC{0,20}"),
        prop::collection::vec(tool(), 0..4),
        prop::collection::vec(message(), 0..5),
        prop::option::of(json_value()),
    )
        .prop_map(|(system, attachment, tools, messages, output)| Parts {
            system,
            attachment,
            tools,
            messages,
            output,
        })
}

/// A body writer: a request, a model's cache, the bytes out.
type WriteBody<'a> =
    &'a dyn Fn(&Request<'_>, &mut BodyCache, &mut Vec<u8>) -> Result<(), serde_json::Error>;

/// Writes the requests of a model one after another ([`rounds`] of the
/// history; the same tools twice, fewer, then the first again) with one
/// cache kept across them, and each afresh: the bytes are the same, and
/// they are JSON.
pub(crate) fn cached_is_afresh(parts: &Parts, write: WriteBody<'_>) -> Result<(), TestCaseError> {
    let mut cache = BodyCache::default();
    let fewer = parts.tools.get(1..).unwrap_or_default().to_vec();
    let toolsets = [&parts.tools, &parts.tools, &fewer, &parts.tools];
    for (history, tools) in rounds(&parts.messages).iter().zip(toolsets.iter().cycle()) {
        let request = Request {
            system: &parts.system,
            tools,
            messages: history,
            attachment: parts.attachment.as_deref(),
            output: parts.output.as_ref(),
        };
        let mut out = Vec::new();
        write(&request, &mut cache, &mut out).expect("written");
        let mut afresh = Vec::new();
        write(&request, &mut BodyCache::default(), &mut afresh).expect("written");
        prop_assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&afresh)
        );
        prop_assert!(serde_json::from_slice::<Value>(&out).is_ok());
    }
    Ok(())
}
