//! Arbitrary requests, for the properties of the providers' bodies.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::core::protocol::{Block, Message, Role, ToolDefinition, ToolResultContent, ToolUseId};

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
