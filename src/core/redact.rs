//! [`Redactor`]: the secrets a host holds (an API key, a password in a
//! base URL), hidden from every text it records or prints.
//!
//! A secret is replaced by [`Redactor::MASK`] wherever it appears whole: in a text,
//! in every string (and object key) of a JSON value, in every block of a
//! model's reply. Secrets shorter than [`Redactor::MIN_SECRET_CHARS`] are not hidden:
//! replacing a one-letter "key" would garble every text, and so short a
//! string is no secret worth hiding. A redactor holds the secrets
//! themselves, so its `Debug` shows only how many it holds.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use crate::core::protocol::{Block, ModelResponse, ReplyBlock, ToolResultContent};

/// Secrets shorter than this many characters are not hidden.
pub(crate) const MIN_SECRET_CHARS: usize = 8;

/// What a secret is replaced by.
pub(crate) const MASK: &str = "***";

/// The secrets to hide; cloning one shares them. The default hides nothing.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Longest first, so a secret holding another is hidden whole.
    secrets: Arc<Vec<String>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secret(s))", self.secrets.len())
    }
}

impl Redactor {
    /// Secrets shorter than this many characters are not hidden.
    pub const MIN_SECRET_CHARS: usize = MIN_SECRET_CHARS;

    /// What a secret is replaced by.
    pub const MASK: &'static str = MASK;

    /// A redactor hiding `secrets` (those shorter than
    /// [`Redactor::MIN_SECRET_CHARS`] are left out).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::default().with(secrets)
    }

    /// This redactor, also hiding `secrets`.
    pub fn with<I, S>(self, secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut all: Vec<String> = self.secrets.as_ref().clone();
        for secret in secrets {
            let secret = secret.into();
            if secret.chars().count() >= MIN_SECRET_CHARS && !all.contains(&secret) {
                all.push(secret);
            }
        }
        all.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        Self {
            secrets: Arc::new(all),
        }
    }

    /// Whether it hides nothing.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret replaced by [`Redactor::MASK`]; borrowed when it
    /// holds none.
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for secret in self.secrets.iter() {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), MASK));
            }
        }
        out
    }

    /// Replaces every secret in `text`, in place; says whether one was found.
    pub fn string(&self, text: &mut String) -> bool {
        match self.text(text) {
            Cow::Borrowed(_) => false,
            Cow::Owned(hidden) => {
                *text = hidden;
                true
            }
        }
    }

    /// Replaces every secret in every string and object key of `value`.
    pub fn value(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(text) => {
                self.string(text);
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.value(item)),
            Value::Object(fields) => {
                let secret_key = fields
                    .keys()
                    .any(|key| matches!(self.text(key), Cow::Owned(_)));
                if secret_key {
                    let old = std::mem::take(fields);
                    for (key, field) in old {
                        fields.insert(self.text(&key).into_owned(), field);
                    }
                }
                fields.values_mut().for_each(|field| self.value(field));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// Replaces every secret in a block: its text, a call's id, name and
    /// input, a result's content, the visible thinking. The opaque
    /// `redacted_thinking` data is left as it is.
    pub fn block(&self, block: &mut Block) {
        match block {
            Block::Text { text } => {
                self.string(text);
            }
            Block::ToolUse { id, name, input } => {
                let mut text = id.as_str().to_owned();
                if self.string(&mut text) {
                    *id = crate::core::protocol::ToolUseId::new(text);
                }
                self.string(name);
                self.value(input);
            }
            Block::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                let mut text = tool_use_id.as_str().to_owned();
                if self.string(&mut text) {
                    *tool_use_id = crate::core::protocol::ToolUseId::new(text);
                }
                match content {
                    ToolResultContent::Text(text) => {
                        if let Cow::Owned(hidden) = self.text(text) {
                            *text = hidden.into();
                        }
                    }
                    ToolResultContent::Blocks(blocks) => {
                        blocks.iter_mut().for_each(|block| self.block(block));
                    }
                }
            }
            Block::Thinking { thinking, .. } => {
                self.string(thinking);
            }
            Block::Compaction { content, .. } => {
                if let Some(content) = content {
                    self.string(content);
                }
            }
            Block::RedactedThinking { .. } => {}
        }
    }

    /// Replaces every secret in every block of a model's reply.
    pub fn response(&self, response: &mut ModelResponse) {
        if self.is_empty() {
            return;
        }
        for block in &mut response.content {
            match block {
                ReplyBlock::Known(block) => self.block(block),
                ReplyBlock::Unsupported { kind, reason, raw } => {
                    self.string(kind);
                    self.string(reason);
                    self.value(raw);
                }
            }
        }
    }

    /// Where the end of `text` may be the start of a secret still coming
    /// (text shown as it streams in): the byte index of the longest suffix
    /// of `text` that begins some secret without being all of it;
    /// `text.len()` when there is none.
    pub fn unfinished(&self, text: &str) -> usize {
        let mut start = text.len();
        for secret in self.secrets.iter() {
            for (cut, _) in secret.char_indices().skip(1) {
                let Some(head) = secret.get(..cut) else {
                    continue;
                };
                if text.ends_with(head) {
                    start = start.min(text.len() - head.len());
                }
            }
        }
        start
    }
}

/// Text shown as it streams in with every secret hidden: a piece that
/// could be the start of a secret waits for the text after it.
#[cfg(feature = "live")]
#[derive(Debug, Default)]
pub(crate) struct StreamRedactor {
    redactor: Redactor,
    /// Text not shown yet: it may be the start of a secret.
    held: String,
}

#[cfg(feature = "live")]
impl StreamRedactor {
    /// Hides `redactor`'s secrets from a stream.
    pub fn new(redactor: Redactor) -> Self {
        Self {
            redactor,
            held: String::new(),
        }
    }

    /// Takes the next piece of the stream; gives what may be shown now.
    pub fn push(&mut self, text: &str) -> String {
        if self.redactor.is_empty() {
            return text.to_owned();
        }
        self.held.push_str(text);
        // Whole secrets first, so one cannot hide behind a held start.
        self.redactor.string(&mut self.held);
        let cut = self.redactor.unfinished(&self.held);
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// The stream is over: what was held (the start of no whole secret).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "sk-test-0123456789";

    #[test]
    fn secrets_are_hidden_from_texts_values_and_replies() {
        let redactor = Redactor::new([KEY, "short"]);
        assert_eq!(redactor.text(&format!("a {KEY} b short")), "a *** b short");
        assert!(matches!(redactor.text("plain"), Cow::Borrowed(_)));
        let mut value = json!({"k": [KEY, 1, {KEY: format!("x{KEY}")}]});
        redactor.value(&mut value);
        assert_eq!(value, json!({"k": ["***", 1, {"***": "x***"}]}));
        let mut reply = ModelResponse::tool_calls([("toolu_1", "run", json!({"key": KEY}))]);
        reply
            .content
            .push(Block::text(format!("the key is {KEY}")).into());
        redactor.response(&mut reply);
        assert!(!serde_json::to_string(&reply).expect("json").contains(KEY));
        assert!(Redactor::default().is_empty());
        assert_eq!(format!("{redactor:?}"), "Redactor(1 secret(s))");
    }

    #[test]
    #[cfg(feature = "live")]
    fn a_secret_split_across_streamed_pieces_is_hidden() {
        for split in 0..=KEY.len() {
            let (head, tail) = KEY.split_at(split);
            let mut stream = StreamRedactor::new(Redactor::new([KEY]));
            let mut shown = stream.push(&format!("key: {head}"));
            shown.push_str(&stream.push(&format!("{tail} end")));
            shown.push_str(&stream.finish());
            assert_eq!(shown, "key: *** end", "split at {split}");
        }
        // A repeating secret whose start recurs inside it.
        let secret = "ABABABAB";
        let mut stream = StreamRedactor::new(Redactor::new([secret]));
        let mut shown = stream.push("xABABAB");
        shown.push_str(&stream.push("ABAB"));
        shown.push_str(&stream.finish());
        assert_eq!(shown, "x***AB");
        // A start never finished is shown at the end.
        let mut stream = StreamRedactor::new(Redactor::new([KEY]));
        let mut shown = stream.push("sk-te");
        assert_eq!(shown, "");
        shown.push_str(&stream.finish());
        assert_eq!(shown, "sk-te");
    }
}
