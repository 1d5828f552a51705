//! A model that replays replies from a script.
//!
//! Script format (JSON):
//!
//! ```json
//! {"parent": [REPLY, ...], "children": [[REPLY, ...], ...]}
//! ```
//!
//! `REPLY` is a Messages API response object (`stop_reason`, `content`; other
//! fields such as `id`, `model`, `usage` are accepted) or `{"error": "text"}`
//! for a failed request (an API error body `{"type": "error", "error":
//! {"type", "message"}}` also counts). A reply that is neither makes the
//! whole script invalid, before anything runs. `children[i]` is
//! the script of the i-th delegation of the run.

mod reader;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::core::error::{FailureKind, ModelFailure, ScriptError};
use crate::core::protocol::{ModelResponse, Request};
use crate::run::model::{ChildModels, Model, Received};

/// One scripted reply: a response, or a failed request.
pub(crate) type ScriptedReply = Result<ModelResponse, ModelFailure>;

/// A parsed replay script: every reply checked, each kept as written.
///
/// The replies are kept as ranges of one shared copy of the script's text
/// (a few bytes per reply on top of the text) and turned into typed replies
/// one at a time, when they are replayed ([`ScriptedModel::from_script`]),
/// so a script of a million replies costs little more than its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Script {
    /// The parent's replies, in order.
    pub parent: RawReplies,
    /// One list of replies per delegation, in delegation order.
    pub children: Vec<RawReplies>,
}

/// A list of reply texts, each a range of one shared text.
#[derive(Clone, Default)]
pub struct RawReplies {
    source: Arc<String>,
    ranges: Vec<Range<usize>>,
}

impl RawReplies {
    /// The texts `ranges` of `source`; a range that is not a `str` range of
    /// `source` is `None`.
    pub fn new(source: Arc<String>, ranges: Vec<Range<usize>>) -> Option<Self> {
        ranges
            .iter()
            .all(|range| source.get(range.clone()).is_some())
            .then_some(Self { source, ranges })
    }

    /// How many texts there are.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The `index`-th text.
    pub fn get(&self, index: usize) -> Option<&str> {
        self.ranges
            .get(index)
            .and_then(|range| self.source.get(range.clone()))
    }

    /// The texts in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|index| self.get(index))
    }

    /// The `index`-th reply, typed. A text that is not a reply (only
    /// possible for texts not read by [`Script::parse`]) is a failed
    /// request of kind `invalid_script` saying why.
    pub fn reply(&self, index: usize) -> Option<Result<ModelResponse, ModelFailure>> {
        self.get(index).map(|text| {
            reader::reply_text(text).unwrap_or_else(|message| {
                Err(ModelFailure::with_kind(
                    FailureKind::InvalidScript,
                    format!("scripted reply {index} is not a reply: {message}"),
                ))
            })
        })
    }

    /// Every reply, typed, in order.
    pub fn replies(&self) -> Vec<Result<ModelResponse, ModelFailure>> {
        (0..self.len())
            .filter_map(|index| self.reply(index))
            .collect()
    }
}

impl RawReplies {
    /// The replies after the first `count`.
    pub fn skip(&self, count: usize) -> Self {
        Self {
            source: Arc::clone(&self.source),
            ranges: self.ranges.get(count..).unwrap_or_default().to_vec(),
        }
    }
}

impl std::fmt::Debug for RawReplies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Equal when the texts are (wherever they are kept).
impl PartialEq for RawReplies {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

/// One text per string, in order.
impl From<Vec<String>> for RawReplies {
    fn from(texts: Vec<String>) -> Self {
        let mut ranges = Vec::with_capacity(texts.len());
        let mut source = String::with_capacity(texts.iter().map(String::len).sum());
        for text in &texts {
            ranges.push(source.len()..source.len() + text.len());
            source.push_str(text);
        }
        Self {
            source: Arc::new(source),
            ranges,
        }
    }
}

impl Script {
    /// The rest of the script after a run that made `calls` parent requests
    /// and `delegations` delegations: what a continuation of that run replays.
    pub fn after(&self, calls: usize, delegations: usize) -> Self {
        Self {
            parent: self.parent.skip(calls),
            children: self
                .children
                .get(delegations..)
                .unwrap_or_default()
                .to_vec(),
        }
    }

    /// Reads and parses a script file.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_owned(),
            source,
        })?;
        // The text read is the one copy the replies are kept in.
        reader::parse_shared(Arc::new(text)).map_err(|message| ScriptError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses a script from JSON text; the error says what is wrong.
    ///
    /// The text is read in one pass straight into typed replies (no JSON
    /// value of the whole script is built), each checked and dropped; a
    /// second light scan finds where each reply's text is.
    pub fn parse(text: &str) -> Result<Self, String> {
        reader::parse_shared(Arc::new(text.to_owned()))
    }
}

/// Replays a list of replies, one per request; running out is a model failure.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    replies: Replies,
    used: usize,
}

/// Where a [`ScriptedModel`]'s replies come from.
#[derive(Debug, Clone)]
enum Replies {
    /// Built in code.
    Typed(std::vec::IntoIter<ScriptedReply>),
    /// A script's texts, each parsed when it is replayed; `raw`: each reply
    /// also comes with its text as a JSON value (for the trace).
    Texts { texts: RawReplies, raw: bool },
}

impl ScriptedModel {
    /// A model that replays `replies` in order.
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self {
            replies: Replies::Typed(replies.into_iter()),
            used: 0,
        }
    }

    /// A model that replays a script's `replies` in order, each parsed when
    /// its request comes. With `raw`, each reply is handed back with its
    /// text as written (the reply as received, which the trace records);
    /// without, no reply is parsed twice.
    pub fn from_script(replies: RawReplies, raw: bool) -> Self {
        Self {
            replies: Replies::Texts {
                texts: replies,
                raw,
            },
            used: 0,
        }
    }

    /// The next reply, with its text as a value when it is kept.
    fn next_reply(&mut self) -> Option<(ScriptedReply, Option<Value>)> {
        let next = match &mut self.replies {
            Replies::Typed(replies) => replies.next().map(|reply| (reply, None)),
            Replies::Texts { texts, raw } => texts.reply(self.used).map(|reply| {
                let text = raw
                    .then(|| texts.get(self.used))
                    .flatten()
                    .and_then(|text| serde_json::from_str(text).ok());
                (reply, text)
            }),
        };
        if next.is_some() {
            self.used += 1;
        }
        next
    }

    fn exhausted(&self) -> ModelFailure {
        ModelFailure::with_kind(
            FailureKind::ScriptExhausted,
            format!(
                "script exhausted: all {} scripted replies were used",
                self.used
            ),
        )
    }
}

impl Model for ScriptedModel {
    fn identity(&self) -> Option<crate::run::model::ModelIdentity> {
        Some(crate::run::model::ModelIdentity::new(
            "subloop.scripted",
            None,
        ))
    }

    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    fn respond_received(&mut self, _request: &Request<'_>) -> Result<Received, ModelFailure> {
        match self.next_reply() {
            Some((reply, raw)) => reply.map(|response| Received { response, raw }),
            None => Err(self.exhausted()),
        }
    }
}

/// A model that fails every request with the same failure.
#[derive(Debug, Clone)]
pub(crate) struct FailingModel(pub ModelFailure);

impl Model for FailingModel {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        Err(self.0.clone())
    }
}

/// Child models from a script's `children`: `children[i]` for delegation `i + 1`.
#[derive(Debug, Clone, Default)]
pub struct ScriptedChildren(pub Vec<Vec<ScriptedReply>>);

impl ChildModels for ScriptedChildren {
    fn model_for(&self, number: usize) -> Box<dyn Model + Send> {
        match number.checked_sub(1).and_then(|index| self.0.get(index)) {
            Some(replies) => Box::new(ScriptedModel::new(replies.clone())),
            None => Box::new(FailingModel(ModelFailure::with_kind(
                FailureKind::ScriptExhausted,
                format!(
                    "the script has no children[{}] for delegation {number}",
                    number.saturating_sub(1)
                ),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_texts_are_ranges_of_the_one_script_text() {
        let text = r#"{"parent": [ {"content": [], "stop_reason": "end_turn"} ,{"error":"x"}],
            "children": [[{"error": "y" }]]}"#;
        let script = Script::parse(text).expect("valid");
        let parent: Vec<&str> = script.parent.iter().collect();
        assert_eq!(
            parent,
            [
                r#"{"content": [], "stop_reason": "end_turn"}"#,
                r#"{"error":"x"}"#
            ]
        );
        assert_eq!(script.children.len(), 1);
        assert_eq!(script.children[0].get(0), Some(r#"{"error": "y" }"#));
        assert_eq!(script.children[0].get(1), None);
        // All of them share the one copy of the text.
        assert!(Arc::ptr_eq(
            &script.parent.source,
            &script.children[0].source
        ));
        // And each is typed when asked for.
        assert_eq!(
            script.parent.replies(),
            vec![
                Ok(ModelResponse {
                    content: Vec::new(),
                    stop_reason: Some(crate::core::protocol::StopReason::EndTurn),
                    usage: None,
                }),
                Err(ModelFailure::new("x")),
            ]
        );
    }

    #[test]
    fn raw_replies_from_strings_and_bad_ranges() {
        let replies = RawReplies::from(vec!["{}".to_owned(), "[1]".to_owned()]);
        assert_eq!(replies.iter().collect::<Vec<_>>(), ["{}", "[1]"]);
        let same =
            RawReplies::new(Arc::new("..{}[1]".to_owned()), vec![2..4, 4..7]).expect("in range");
        assert_eq!(replies, same);
        assert!(RawReplies::new(Arc::new("{}".to_owned()), vec![0..2, 1..3]).is_none());
        assert!(RawReplies::new(Arc::new("é{}".to_owned()), vec![2..4, 0..1]).is_none());
        // A text that is not a reply fails its request, saying why.
        let Some(Err(failure)) = replies.reply(1) else {
            panic!("not a reply: {:?}", replies.reply(1));
        };
        assert_eq!(failure.kind(), Some(&FailureKind::InvalidScript));
        assert!(
            failure.message().contains("a reply must be a JSON object"),
            "{failure}"
        );
    }

    #[test]
    fn each_request_gets_the_next_text_failed_or_not() {
        let raw = RawReplies::from(vec![
            r#"{"error":"first fails"}"#.to_owned(),
            r#"{"content": [{"type": "text", "text": "done"}], "n": 2}"#.to_owned(),
        ]);
        let request = Request {
            system: "",
            tools: &[],
            messages: &[],
            attachment: None,
            output: None,
        };
        let mut model = ScriptedModel::from_script(raw.clone(), true);
        assert!(model.respond_received(&request).is_err());
        let received = model.respond_received(&request).expect("second reply");
        assert_eq!(
            received.response,
            ModelResponse {
                content: vec![crate::core::protocol::Block::text("done").into()],
                stop_reason: None,
                usage: None,
            }
        );
        assert_eq!(
            received.raw,
            Some(serde_json::json!({"content": [{"type": "text", "text": "done"}], "n": 2}))
        );
        let exhausted = model.respond_received(&request).expect_err("no third");
        assert_eq!(exhausted.kind(), Some(&FailureKind::ScriptExhausted));
        assert!(
            exhausted.message().contains("all 2 scripted replies"),
            "{exhausted}"
        );
        // Without `raw`, the same replies come with no text.
        let mut model = ScriptedModel::from_script(raw, false);
        assert!(model.respond_received(&request).is_err());
        assert_eq!(model.respond_received(&request).expect("second").raw, None);
    }
}
