//! Reads a replay script in one pass, straight into typed replies.
//!
//! There is no `serde_json::Value` of the whole script in between: the
//! document is walked once by serde visitors, each reply is checked as a
//! [`ScriptedReply`] as soon as its closing brace is read (its content
//! blocks only as JSON: a block cannot make a reply invalid), and only the
//! small fields whose shape decides validity (`error`, `stop_reason`,
//! `usage`) are held as values for a moment. The rules and messages are
//! those of the script format (see [`super::Script`]):
//!
//! * any JSON syntax error (or nesting deeper than serde_json's limit)
//!   anywhere makes the text "not JSON", whatever else is wrong with it;
//! * then, in this order: the top level must be an object, its keys only
//!   `parent` and `children` (the first unknown key in sorted order is
//!   named), `parent` must be present, the first bad reply of `parent`,
//!   the first bad entry of `children`;
//! * a repeated key counts once, the last occurrence wins.
//!
//! Each checked reply is dropped: what is kept is each reply's text as
//! written. Once the script is known to be valid, a light second scan
//! borrows each reply's text ([`RawValue`], no tree built) and keeps it as
//! a range of the one shared copy of the script; a reply is typed from its
//! text ([`reply_text`]) when it is replayed, and that text is also the
//! reply as received for the trace's `response` line.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{RawReplies, Script, ScriptedReply};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{ModelResponse, ReplyBlock, StopReason, Usage};

/// Implements a visitor's scalar `visit_*` methods without keeping the
/// scalar: `null` is `$null`, every other scalar `$other`. Each scalar has
/// been read (a string's escapes decoded, a number parsed) by the time it
/// is visited.
macro_rules! scalars_are {
    ($null:expr, $other:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($null)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

/// Parses a script; the error is the message `Script::parse` returns.
#[cfg(test)]
pub(super) fn parse(text: &str) -> Result<Script, String> {
    parse_shared(Arc::new(text.to_owned()))
}

/// One reply's text, as checked in a script: the reply, or why it is none.
pub(super) fn reply_text(text: &str) -> Result<ScriptedReply, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    ReplySeed {
        blocks: Blocks::Typed,
    }
    .deserialize(&mut de)
    .and_then(|reply| de.end().map(|()| reply))
    .map_err(|err| format!("not JSON: {err}"))?
}

/// Parses a script; the reply texts are kept as ranges of `text`.
pub(super) fn parse_shared(text: Arc<String>) -> Result<Script, String> {
    let mut de = serde_json::Deserializer::from_str(&text);
    let top = TopSeed
        .deserialize(&mut de)
        .and_then(|top| de.end().map(|()| top))
        .map_err(|err| format!("not JSON: {err}"))?;
    let Top::Object {
        unknown,
        parent,
        children,
    } = top
    else {
        return Err("the script must be a JSON object".to_owned());
    };
    if let Some(key) = unknown {
        return Err(format!("unknown key `{key}`"));
    }
    let parent = parent.ok_or_else(|| "missing key `parent`".to_owned())??;
    let children = children.unwrap_or(Ok(Vec::new()))?;
    // The text is valid, so the scan finds every reply; were it ever to
    // disagree, the script is refused rather than replayed wrong.
    reply_texts(&text)
        .filter(|script| {
            script.parent.len() == parent
                && script
                    .children
                    .iter()
                    .map(RawReplies::len)
                    .eq(children.iter().copied())
        })
        .ok_or_else(|| "the replies could not be located in the script".to_owned())
}

/// Each reply's text as written, in the shape of the script (a repeated key
/// counts once, the last wins, as in [`parse_shared`]), as ranges of `text`,
/// found in one scan of the text.
fn reply_texts(text: &Arc<String>) -> Option<Script> {
    // Each borrowed text is a slice of `text`: its offset is where it starts.
    let texts = |list: &[&RawValue]| -> Option<RawReplies> {
        let ranges = list
            .iter()
            .map(|raw| {
                let start = (raw.get().as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
                Some(start..start.checked_add(raw.get().len())?)
            })
            .collect::<Option<Vec<_>>>()?;
        let replies = RawReplies::new(Arc::clone(text), ranges)?;
        replies
            .iter()
            .eq(list.iter().map(|raw| raw.get()))
            .then_some(replies)
    };
    let top: RawTop<'_> = serde_json::from_str(text).ok()?;
    Some(Script {
        parent: texts(&top.parent?.0?)?,
        children: match top.children {
            None => Vec::new(),
            Some(lists) => lists
                .0?
                .iter()
                .map(|list| texts(list.0.as_deref()?))
                .collect::<Option<_>>()?,
        },
    })
}

/// A valid script's reply texts, borrowed: `parent`'s and each child's.
struct RawTop<'a> {
    parent: Option<RawList<'a>>,
    children: Option<RawLists<'a>>,
}

/// An array's items, borrowed as written; `None` for any other value.
struct RawList<'a>(Option<Vec<&'a RawValue>>);

/// An array of [`RawList`]s (`null` is an empty one); `None` for any other value.
struct RawLists<'a>(Option<Vec<RawList<'a>>>);

impl<'de> Deserialize<'de> for RawTop<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TopVisitor;
        impl<'de> Visitor<'de> for TopVisitor {
            type Value = RawTop<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a script object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawTop<'de>, A::Error> {
                let mut top = RawTop {
                    parent: None,
                    children: None,
                };
                // A key with escapes is unescaped into a `String`; the last
                // occurrence of a key wins, as in the checking walk.
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "parent" => top.parent = Some(map.next_value()?),
                        "children" => top.children = Some(map.next_value()?),
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(top)
            }
        }
        deserializer.deserialize_map(TopVisitor)
    }
}

/// Reads a map without checking or keeping it (the text is known valid).
fn ignore_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map
        .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
        .is_some()
    {}
    Ok(())
}

impl<'de> Deserialize<'de> for RawList<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor;
        impl<'de> Visitor<'de> for ListVisitor {
            type Value = RawList<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            scalars_are!(RawList(None), RawList(None));
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawList<'de>, A::Error> {
                ignore_map(map)?;
                Ok(RawList(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawList<'de>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(RawList(Some(items)))
            }
        }
        deserializer.deserialize_any(ListVisitor)
    }
}

impl<'de> Deserialize<'de> for RawLists<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListsVisitor;
        impl<'de> Visitor<'de> for ListsVisitor {
            type Value = RawLists<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of arrays")
            }
            // `null`: no children.
            scalars_are!(RawLists(Some(Vec::new())), RawLists(None));
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawLists<'de>, A::Error> {
                ignore_map(map)?;
                Ok(RawLists(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawLists<'de>, A::Error> {
                let mut lists = Vec::new();
                while let Some(list) = seq.next_element::<RawList<'de>>()? {
                    lists.push(list);
                }
                Ok(RawLists(Some(lists)))
            }
        }
        deserializer.deserialize_any(ListsVisitor)
    }
}

/// Implements a visitor's scalar `visit_*` methods: each hands the scalar,
/// as a [`Value`], to the visitor's own `other` method.
macro_rules! scalars_to_other {
    () => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(self.other(Value::Null))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok(self.other(Value::Bool(v)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(self.other(Value::from(v)))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(self.other(Value::from(v)))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(self.other(Value::from(v)))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(self.other(Value::String(v.to_owned())))
        }
    };
}

/// Consumes any JSON value without keeping it. Unlike `IgnoredAny` it goes
/// through `deserialize_any`, so nesting is counted and strings are checked
/// exactly as when a `Value` is built: the same texts are "not JSON".
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are!(Skip, Skip);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Skip>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<Skip, Skip>()?.is_some() {}
    Ok(())
}

/// The top level as read, before the script's rules are applied.
enum Top {
    NotObject,
    Object {
        /// The smallest unknown key (the one a sorted map would name first).
        unknown: Option<String>,
        /// How many replies `parent` has, once each is checked.
        parent: Option<Result<usize, String>>,
        /// How many replies each child has.
        children: Option<Result<Vec<usize>, String>>,
    },
}

struct TopSeed;

impl<'de> DeserializeSeed<'de> for TopSeed {
    type Value = Top;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Top, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl TopSeed {
    fn other(self, _value: Value) -> Top {
        Top::NotObject
    }
}

impl<'de> Visitor<'de> for TopSeed {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a script object")
    }

    scalars_to_other!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top, A::Error> {
        skip_seq(seq)?;
        Ok(Top::NotObject)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut unknown: Option<String> = None;
        let mut parent = None;
        let mut children = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "parent" => parent = Some(map.next_value_seed(RepliesSeed(Place::Parent))?),
                "children" => children = Some(map.next_value_seed(ChildrenSeed)?),
                _ => {
                    map.next_value::<Skip>()?;
                    if unknown.as_ref().is_none_or(|known| key < *known) {
                        unknown = Some(key);
                    }
                }
            }
        }
        Ok(Top::Object {
            unknown,
            parent,
            children,
        })
    }
}

/// Where a list of replies sits, for messages.
#[derive(Clone, Copy)]
enum Place {
    Parent,
    Child(usize),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parent => f.write_str("parent"),
            Self::Child(index) => write!(f, "children[{index}]"),
        }
    }
}

/// A list of replies: how many, each checked and dropped, or the message of
/// the first bad one.
struct RepliesSeed(Place);

impl<'de> DeserializeSeed<'de> for RepliesSeed {
    type Value = Result<usize, String>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl RepliesSeed {
    fn other(self, _value: Value) -> Result<usize, String> {
        Err(format!("`{}` must be an array of replies", self.0))
    }
}

impl<'de> Visitor<'de> for RepliesSeed {
    type Value = Result<usize, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of replies")
    }

    scalars_to_other!();

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(self.other(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut index = 0usize;
        let seed = ReplySeed {
            blocks: Blocks::Checked,
        };
        while let Some(reply) = seq.next_element_seed(seed)? {
            match reply {
                // Checked; kept as its text, not as this typed copy.
                Ok(_) => {}
                Err(message) => {
                    // The rest only has to be JSON: it is read, not kept.
                    skip_seq(seq)?;
                    return Ok(Err(format!("{}[{index}]: {message}", self.0)));
                }
            }
            index += 1;
        }
        Ok(Ok(index))
    }
}

/// `children`: null (none), or an array of reply lists.
struct ChildrenSeed;

impl<'de> DeserializeSeed<'de> for ChildrenSeed {
    type Value = Result<Vec<usize>, String>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl ChildrenSeed {
    fn other(self, value: Value) -> Result<Vec<usize>, String> {
        match value {
            Value::Null => Ok(Vec::new()),
            _ => Err("`children` must be an array of arrays".to_owned()),
        }
    }
}

impl<'de> Visitor<'de> for ChildrenSeed {
    type Value = Result<Vec<usize>, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of reply lists")
    }

    scalars_to_other!();

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(Err("`children` must be an array of arrays".to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut children = Vec::new();
        let mut index = 0usize;
        while let Some(child) = seq.next_element_seed(RepliesSeed(Place::Child(index)))? {
            match child {
                Ok(child) => children.push(child),
                Err(message) => {
                    skip_seq(seq)?;
                    return Ok(Err(message));
                }
            }
            index += 1;
        }
        Ok(Ok(children))
    }
}

/// What reading a reply does with its content blocks.
#[derive(Clone, Copy)]
enum Blocks {
    /// Each block is typed and kept: the reply is replayed.
    Typed,
    /// Each block is only checked to be JSON (as a `Value` would be) and
    /// dropped: a block never fails to type (what cannot be used is
    /// `ReplyBlock::Unsupported`), so a script being checked at load needs
    /// no more, and typing it then would be thrown away.
    Checked,
}

/// One reply: a response or a failure, or why it is neither.
#[derive(Clone, Copy)]
struct ReplySeed {
    blocks: Blocks,
}

impl<'de> DeserializeSeed<'de> for ReplySeed {
    type Value = Result<ScriptedReply, String>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl ReplySeed {
    fn other(self, _value: Value) -> Result<ScriptedReply, String> {
        Err("a reply must be a JSON object".to_owned())
    }
}

/// The keys of a reply that matter; the rest are accepted and ignored.
enum ReplyKey {
    Error,
    Content,
    StopReason,
    Usage,
    Other,
}

impl<'de> Deserialize<'de> for ReplyKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = ReplyKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<ReplyKey, E> {
                Ok(match key {
                    "error" => ReplyKey::Error,
                    "content" => ReplyKey::Content,
                    "stop_reason" => ReplyKey::StopReason,
                    "usage" => ReplyKey::Usage,
                    _ => ReplyKey::Other,
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A reply's `content`: its blocks when it is an array, else the value as sent.
enum Content {
    Blocks(Vec<ReplyBlock>),
    NotArray(Value),
}

struct ContentSeed(Blocks);

impl<'de> DeserializeSeed<'de> for ContentSeed {
    type Value = Content;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Content, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl ContentSeed {
    fn other(self, value: Value) -> Content {
        Content::NotArray(value)
    }
}

impl<'de> Visitor<'de> for ContentSeed {
    type Value = Content;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a reply's content")
    }

    scalars_to_other!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
        if let Blocks::Checked = self.0 {
            skip_seq(seq)?;
            return Ok(Content::Blocks(Vec::new()));
        }
        // A block never fails to read: what cannot be used is `Unsupported`.
        // Most replies hold one block: room for one, so it needs no regrowth.
        let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(1));
        while let Some(block) = seq.next_element::<ReplyBlock>()? {
            blocks.push(block);
        }
        blocks.shrink_to_fit();
        Ok(Content::Blocks(blocks))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content, A::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(Content::NotArray)
    }
}

impl<'de> Visitor<'de> for ReplySeed {
    type Value = Result<ScriptedReply, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a reply")
    }

    scalars_to_other!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)?;
        Ok(self.other(Value::Null))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut error = None;
        let mut content = None;
        let mut stop_reason = None;
        let mut usage = None;
        while let Some(key) = map.next_key::<ReplyKey>()? {
            match key {
                ReplyKey::Error => error = Some(map.next_value::<Value>()?),
                ReplyKey::Content => content = Some(map.next_value_seed(ContentSeed(self.blocks))?),
                ReplyKey::StopReason => stop_reason = Some(map.next_value::<Value>()?),
                ReplyKey::Usage => usage = Some(map.next_value::<Value>()?),
                ReplyKey::Other => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(reply(error, content, stop_reason, usage))
    }
}

/// Applies the reply rules to the fields read.
fn reply(
    error: Option<Value>,
    content: Option<Content>,
    stop_reason: Option<Value>,
    usage: Option<Value>,
) -> Result<ScriptedReply, String> {
    // `"error": null` says "no error": such a reply is judged as a message.
    if let Some(error) = error.filter(|error| !error.is_null()) {
        return Ok(Err(failure(error)));
    }
    // A missing field is its default; null is `None` for both.
    let typed_stop = match &stop_reason {
        None => Ok(None),
        Some(value) => Option::<StopReason>::deserialize(value),
    };
    let typed_usage = match &usage {
        None => Ok(None),
        Some(value) => Option::<Usage>::deserialize(value),
    };
    let content = match (content, typed_stop, typed_usage) {
        (Some(Content::Blocks(content)), Ok(stop_reason), Ok(usage)) => {
            return Ok(Ok(ModelResponse {
                content,
                stop_reason,
                usage,
            }));
        }
        (content, _, _) => content,
    };
    // Not a message: the reason is the one deserializing the reply as a
    // `ModelResponse` gives (fields in sorted order, then a missing
    // `content`). Blocks cannot fail, so an empty array stands in for them.
    let mut fields = Map::new();
    match content {
        Some(Content::Blocks(_)) => {
            fields.insert("content".to_owned(), Value::Array(Vec::new()));
        }
        Some(Content::NotArray(value)) => {
            fields.insert("content".to_owned(), value);
        }
        None => {}
    }
    if let Some(value) = stop_reason {
        fields.insert("stop_reason".to_owned(), value);
    }
    if let Some(value) = usage {
        fields.insert("usage".to_owned(), value);
    }
    match ModelResponse::from_value(Value::Object(fields)) {
        Err(err) => Err(format!("not a message: {err}")),
        // Unreachable by the checks above; kept total rather than panicking.
        Ok(_) => Err("not a message".to_owned()),
    }
}

/// A scripted failure: `{"error": "text"}` or an API error body.
fn failure(error: Value) -> ModelFailure {
    match error {
        Value::String(text) => ModelFailure::new(text),
        Value::Object(body) => {
            let message = body
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("model request failed")
                .to_owned();
            match body.get("type").and_then(Value::as_str) {
                Some(kind) => ModelFailure::with_kind(FailureKind::from_name(kind), message),
                None => ModelFailure::new(message),
            }
        }
        other => ModelFailure::new(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The parser this module replaces (a `Value` of the whole script, then
    /// replies), kept as the oracle: the one-pass reader must agree with it
    /// on every text, valid or not, message for message.
    fn through_a_value(text: &str) -> Result<Typed, String> {
        fn replies(value: Value, place: &str) -> Result<Vec<ScriptedReply>, String> {
            let Value::Array(items) = value else {
                return Err(format!("`{place}` must be an array of replies"));
            };
            items
                .into_iter()
                .enumerate()
                .map(|(index, item)| reply(item).map_err(|err| format!("{place}[{index}]: {err}")))
                .collect()
        }
        fn reply(value: Value) -> Result<ScriptedReply, String> {
            if !value.is_object() {
                return Err("a reply must be a JSON object".to_owned());
            }
            if let Some(error) = value.get("error").filter(|error| !error.is_null()) {
                return Ok(Err(failure(error.clone())));
            }
            ModelResponse::from_value(value)
                .map(Ok)
                .map_err(|err| format!("not a message: {err}"))
        }
        let value: Value = serde_json::from_str(text).map_err(|err| format!("not JSON: {err}"))?;
        let Value::Object(mut top) = value else {
            return Err("the script must be a JSON object".to_owned());
        };
        if let Some(key) = top
            .keys()
            .find(|key| *key != "parent" && *key != "children")
        {
            return Err(format!("unknown key `{key}`"));
        }
        let parent = match top.remove("parent") {
            Some(value) => replies(value, "parent")?,
            None => return Err("missing key `parent`".to_owned()),
        };
        let children = match top.remove("children") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(index, item)| replies(item, &format!("children[{index}]")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`children` must be an array of arrays".to_owned()),
        };
        Ok((parent, children))
    }

    /// A script's replies, typed: the parent's, then each child's.
    type Typed = (Vec<ScriptedReply>, Vec<Vec<ScriptedReply>>);

    /// The script's replies as replayed: each read again from its text.
    fn typed(parsed: Result<Script, String>) -> Result<Typed, String> {
        parsed.map(|script| {
            (
                script.parent.replies(),
                script.children.iter().map(RawReplies::replies).collect(),
            )
        })
    }

    /// Both parsers give the same replies, each read back from its text.
    fn agree(text: &str) {
        assert_eq!(typed(parse(text)), through_a_value(text), "script: {text}");
    }

    const TOOL: &str = r#"{"content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}], "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": null}, "id": "msg", "model": "m"}"#;
    const ANSWER: &str =
        r#"{"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}"#;

    #[test]
    fn valid_scripts_read_the_same() {
        for text in [
            format!(r#"{{"parent": [{TOOL}, {ANSWER}]}}"#),
            format!(r#"{{"parent": [], "children": [[{ANSWER}], [], [{TOOL}]]}}"#),
            format!(r#"{{"children": null, "parent": [{ANSWER}]}}"#),
            // Errors in every accepted shape, and an error next to a broken message.
            r#"{"parent": [{"error": "rate limited"}, {"error": {"type": "overloaded_error", "message": "busy"}}, {"error": {"message": 5}}, {"error": null, "stop_reason": "end_turn", "content": [{"type": "text", "text": "ok"}]}, {"error": [1], "content": 7}]}"#.to_owned(),
            // Hostile but well-shaped blocks stay, for the conversation to judge.
            r#"{"parent": [{"content": [{"type": "tool_result"}, {"type": "image"}, 5, {"type": "text"}, {"type": "tool_use", "id": "", "name": "x", "input": 1}], "stop_reason": "weird"}]}"#.to_owned(),
            // A repeated key: the last one counts.
            format!(r#"{{"parent": 5, "parent": [{ANSWER}]}}"#),
            r#"{"parent": [{"content": 5, "content": [], "stop_reason": 1, "stop_reason": null}]}"#.to_owned(),
            r#"{"parent": [{"cont\u0065nt": [], "usage": null}]}"#.to_owned(),
        ] {
            assert!(parse(&text).is_ok(), "{text}: {:?}", parse(&text));
            agree(&text);
        }
    }

    #[test]
    fn invalid_scripts_give_the_same_message() {
        let deep = format!(
            r#"{{"parent": [{{"content": [], "id": {}1{}}}]}}"#,
            "[".repeat(140),
            "]".repeat(140)
        );
        let deep_ignored = format!(r#"{{"other": {}1{}}}"#, "[".repeat(140), "]".repeat(140));
        for text in [
            "",
            "{\"parent\": [",
            "[1, 2]",
            "\"script\"",
            "{} x",
            "{\"zeta\": 1, \"alpha\": [}",
            r#"{"zeta": 1, "alpha": 2, "parent": []}"#,
            r#"{"children": []}"#,
            r#"{"parent": {"stop_reason": "end_turn"}}"#,
            r#"{"parent": null}"#,
            r#"{"parent": [5]}"#,
            r#"{"parent": [{"stop_reason": "end_turn"}]}"#,
            r#"{"parent": [{"content": "oops", "stop_reason": "end_turn"}]}"#,
            r#"{"parent": [{"content": {"a": 1}, "stop_reason": 3}]}"#,
            r#"{"parent": [{"stop_reason": 3}]}"#,
            r#"{"parent": [{"content": [], "stop_reason": 3, "usage": "x"}]}"#,
            r#"{"parent": [{"content": [], "usage": {"input_tokens": -1}}]}"#,
            r#"{"parent": [{"content": [], "usage": 1.5}]}"#,
            r#"{"parent": [{"content": []}, {"foo": 1}, {"bar": 2}]}"#,
            r#"{"parent": [{"foo": 1}, "not even checked", {"bad": "json}]}"#,
            r#"{"parent": [{"foo": 1}], "children": [[{"bar": 2}]]}"#,
            r#"{"parent": [], "children": [[{"content": []}], 5]}"#,
            r#"{"parent": [], "children": {"a": 1}}"#,
            r#"{"parent": [], "children": 3}"#,
            r#"{"parent": [{"content": [], "text": "\ud800"}]}"#,
            r#"{"parent": [{"content": [], "n": 1e400}]}"#,
            &deep,
            &deep_ignored,
        ] {
            assert!(parse(text).is_err(), "{text}");
            agree(text);
        }
    }

    /// Pieces that scripts, broken or not, are made of.
    fn fragment() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("1".to_owned()),
            Just("\"end_turn\"".to_owned()),
            Just("\"tool_use\"".to_owned()),
            Just(TOOL.to_owned()),
            Just(ANSWER.to_owned()),
            Just(r#"{"error": "x"}"#.to_owned()),
            Just(r#"{"type": "text", "text": "hi"}"#.to_owned()),
            Just(r#"{"input_tokens": 2}"#.to_owned()),
            Just("[".to_owned()),
            Just("}".to_owned()),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            let key = prop_oneof![
                Just("parent"),
                Just("children"),
                Just("content"),
                Just("stop_reason"),
                Just("usage"),
                Just("error"),
                Just("other"),
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key, inner), 0..4).prop_map(|entries| {
                    let body: Vec<String> = entries
                        .into_iter()
                        .map(|(key, value)| format!("\"{key}\": {value}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn any_text_reads_as_through_a_value(text in fragment()) {
            prop_assert_eq!(typed(parse(&text)), through_a_value(&text));
        }
    }
}
