//! What a model keeps between its requests so as not to write again what
//! did not change: the tool lists a client's requests offered (shared by
//! its models) and the history messages a model wrote. Plain data over the
//! core's types, with no HTTP crate: the providers' body writers use it
//! with or without the `live` feature.
#![cfg_attr(not(feature = "live"), allow(dead_code))]

use serde::Serialize;

use crate::core::protocol::{Block, Message, Role, ToolDefinition, ToolResultContent};

/// Writes one field of a JSON object a body writer writes piece by piece:
/// `,"name":value`, or `{"name":value` for the first.
pub(crate) fn write_field(
    out: &mut Vec<u8>,
    first: bool,
    name: &str,
    value: &impl Serialize,
) -> Result<(), serde_json::Error> {
    out.push(if first { b'{' } else { b',' });
    serde_json::to_writer(&mut *out, name)?;
    out.push(b':');
    serde_json::to_writer(&mut *out, value)
}

/// Tools written once: the definitions and the bytes the protocol wrote for them.
type Written = std::sync::Arc<(Vec<ToolDefinition>, Vec<u8>)>;

/// The tool lists a client's requests offered lately, each written once
/// and shared by every model of the client (runs with the same tools share
/// one copy); at most [`ToolShelf::KEPT`] lists, the oldest dropped first.
#[derive(Debug, Default)]
pub(crate) struct ToolShelf(std::sync::Mutex<Vec<Written>>);

impl ToolShelf {
    /// How many tool lists a client keeps written.
    const KEPT: usize = 16;

    fn find(&self, tools: &[ToolDefinition]) -> Option<Written> {
        let shelf = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        shelf
            .iter()
            .find(|written| written.0.as_slice() == tools)
            .map(std::sync::Arc::clone)
    }

    fn keep(&self, written: &Written) {
        let mut shelf = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        if shelf.len() >= Self::KEPT {
            shelf.remove(0);
        }
        shelf.push(std::sync::Arc::clone(written));
    }
}

/// What one model keeps between its requests so as not to serialize again
/// what did not change: the tools it offered last, written once (as the
/// protocol writes them, found on its client's shelf or put there) and
/// reused while a request offers the same ones; and the history messages
/// it wrote (see [`BodyCache::history`]).
#[derive(Debug, Default)]
pub struct BodyCache {
    shelf: std::sync::Arc<ToolShelf>,
    last: Option<Written>,
    /// The length of the last body, the next one's first capacity.
    last_len: usize,
    /// The history's messages as written before, for the next request.
    history: History,
}

/// Messages written once: their bytes, comma-separated, and for each a
/// fingerprint (a keyed 64-bit hash of everything it holds) with where
/// its bytes end. A request whose first messages have the same
/// fingerprints takes their bytes instead of writing them again.
#[derive(Debug, Default)]
struct History {
    keys: std::collections::hash_map::RandomState,
    bytes: Vec<u8>,
    written: Vec<(u64, usize)>,
}

impl History {
    fn fingerprint(&self, message: &Message) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut hasher = self.keys.build_hasher();
        matches!(message.role, Role::User).hash(&mut hasher);
        message.content.len().hash(&mut hasher);
        for block in &message.content {
            hash_block(block, &mut hasher);
        }
        hasher.finish()
    }
}

/// Feeds everything `block` holds to `hasher`, tagged by kind.
fn hash_block(block: &Block, hasher: &mut impl std::hash::Hasher) {
    use std::hash::Hash;
    match block {
        Block::Text { text } => (0u8, text).hash(hasher),
        Block::ToolUse { id, name, input } => {
            (1u8, id.as_str(), name).hash(hasher);
            hash_value(input, hasher);
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            (2u8, tool_use_id.as_str(), is_error).hash(hasher);
            match content {
                ToolResultContent::Text(text) => (0u8, text.as_str()).hash(hasher),
                ToolResultContent::Blocks(blocks) => {
                    (1u8, blocks.len()).hash(hasher);
                    for block in blocks {
                        hash_block(block, hasher);
                    }
                }
            }
        }
        Block::Thinking {
            thinking,
            signature,
        } => (3u8, thinking, signature).hash(hasher),
        Block::RedactedThinking { data } => (4u8, data).hash(hasher),
        Block::Compaction { content, rest } => {
            (5u8, content, rest.len()).hash(hasher);
            for (key, value) in rest {
                key.hash(hasher);
                hash_value(value, hasher);
            }
        }
    }
}

/// Feeds a JSON value to `hasher`, tagged by kind (a number by its text).
fn hash_value(value: &serde_json::Value, hasher: &mut impl std::hash::Hasher) {
    use serde_json::Value;
    use std::hash::Hash;
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(flag) => (1u8, flag).hash(hasher),
        Value::Number(number) => {
            2u8.hash(hasher);
            match (number.as_i64(), number.as_u64(), number.as_f64()) {
                (Some(n), _, _) => (0u8, n).hash(hasher),
                (_, Some(n), _) => (1u8, n).hash(hasher),
                (_, _, Some(n)) => (2u8, n.to_bits()).hash(hasher),
                _ => (3u8, number.to_string()).hash(hasher),
            }
        }
        Value::String(text) => (3u8, text).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            for item in items {
                hash_value(item, hasher);
            }
        }
        Value::Object(fields) => {
            (5u8, fields.len()).hash(hasher);
            for (key, field) in fields {
                key.hash(hasher);
                hash_value(field, hasher);
            }
        }
    }
}

impl BodyCache {
    /// A cache that shares its client's shelf.
    pub(crate) fn new(shelf: std::sync::Arc<ToolShelf>) -> Self {
        Self {
            shelf,
            last: None,
            last_len: 0,
            history: History::default(),
        }
    }

    /// Writes `messages` into `out` as the items of a JSON array
    /// (comma-separated, no brackets), each message as `write` writes it
    /// (one item or more; none is not allowed). The longest first run of
    /// messages this cache wrote before, found by fingerprint, is copied
    /// rather than written again; the rest is written and kept for the
    /// next request. Gives whether anything was written.
    pub(crate) fn history(
        &mut self,
        messages: &[Message],
        out: &mut Vec<u8>,
        mut write: impl FnMut(&Message, &mut Vec<u8>) -> Result<(), serde_json::Error>,
    ) -> Result<bool, serde_json::Error> {
        let history = &mut self.history;
        let mut kept: usize = 0;
        for (message, (fingerprint, _)) in messages.iter().zip(&history.written) {
            if history.fingerprint(message) != *fingerprint {
                break;
            }
            kept += 1;
        }
        let end = kept
            .checked_sub(1)
            .and_then(|last| history.written.get(last))
            .map_or(0, |(_, end)| *end);
        history.written.truncate(kept);
        history.bytes.truncate(end);
        for message in messages.get(kept..).unwrap_or_default() {
            let fingerprint = history.fingerprint(message);
            if !history.bytes.is_empty() {
                history.bytes.push(b',');
            }
            let start = history.bytes.len();
            if let Err(err) = write(message, &mut history.bytes) {
                // Nothing half-written is kept.
                history.bytes.truncate(start.saturating_sub(1));
                return Err(err);
            }
            history.written.push((fingerprint, history.bytes.len()));
        }
        out.extend_from_slice(&history.bytes);
        Ok(!history.bytes.is_empty())
    }

    pub(crate) fn last_len(&self) -> usize {
        self.last_len
    }

    pub(crate) fn wrote(&mut self, len: usize) {
        self.last_len = len;
    }

    /// `tools` as `write` writes them: the bytes of this model's last
    /// request or of its client's shelf when they offered the same tools,
    /// else written now and kept on both.
    pub(crate) fn tools(
        &mut self,
        tools: &[ToolDefinition],
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>,
    ) -> Result<&[u8], serde_json::Error> {
        let written = match self.last.take() {
            Some(last) if last.0.as_slice() == tools => last,
            _ => match self.shelf.find(tools) {
                Some(found) => found,
                None => {
                    let mut bytes = Vec::new();
                    write(&mut bytes)?;
                    let written = std::sync::Arc::new((tools.to_vec(), bytes));
                    self.shelf.keep(&written);
                    written
                }
            },
        };
        Ok(&self.last.insert(written).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A growing history is written a message at a time: each request
    /// writes only the messages the last one did not have; a changed
    /// message is written again with everything after it.
    #[test]
    fn each_message_is_written_once_while_the_history_grows() {
        let messages: Vec<Message> = (0..50)
            .map(|n| Message::user_text(format!("message {n}")))
            .collect();
        let mut cache = BodyCache::default();
        let mut written = 0;
        for n in 0..=messages.len() {
            let mut out = Vec::new();
            cache
                .history(&messages[..n], &mut out, |message, bytes| {
                    written += 1;
                    serde_json::to_writer(bytes, message)
                })
                .expect("written");
            let items: Vec<Message> = messages[..n].to_vec();
            let expected = serde_json::to_vec(&items).expect("json");
            assert_eq!(
                format!("[{}]", String::from_utf8_lossy(&out)).as_bytes(),
                expected
            );
        }
        assert_eq!(written, messages.len());
        let mut changed = messages.clone();
        changed[40] = Message::user_text("changed");
        let mut out = Vec::new();
        cache
            .history(&changed, &mut out, |message, bytes| {
                written += 1;
                serde_json::to_writer(bytes, message)
            })
            .expect("written");
        assert_eq!(written, messages.len() + 10);
    }
}
