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

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::{Model, Received};
use crate::error::{ModelFailure, ScriptError};
use crate::protocol::{ModelResponse, Request};

/// One scripted reply: a response, or a failed request.
pub type ScriptedReply = Result<ModelResponse, ModelFailure>;

/// A parsed replay script.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Script {
    /// The parent's replies, in order.
    pub parent: Vec<ScriptedReply>,
    /// One list of replies per delegation, in delegation order.
    pub children: Vec<Vec<ScriptedReply>>,
    /// Every reply as the script wrote it, in the shape of `parent` and
    /// `children`: what the trace records as received.
    pub raw: ScriptText,
}

/// The replies of a [`Script`] as written, one JSON text per reply.
///
/// The texts are ranges into one shared copy of the script, so keeping them
/// costs a few bytes per reply, not a string each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScriptText {
    /// The parent's replies.
    pub parent: RawReplies,
    /// Each delegation's replies.
    pub children: Vec<RawReplies>,
}

/// A list of reply texts, each a range of one shared text.
#[derive(Clone, Default)]
pub struct RawReplies {
    source: Arc<str>,
    ranges: Vec<Range<usize>>,
}

impl RawReplies {
    /// The texts `ranges` of `source`; a range that is not a `str` range of
    /// `source` is `None`.
    pub fn new(source: Arc<str>, ranges: Vec<Range<usize>>) -> Option<Self> {
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
            source: source.into(),
            ranges,
        }
    }
}

impl Script {
    /// Reads and parses a script file.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_owned(),
            source,
        })?;
        // The one copy of the text the reply texts are kept in.
        super::script_reader::parse_shared(text.into()).map_err(|message| ScriptError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses a script from JSON text; the error says what is wrong.
    ///
    /// The text is read in one pass straight into typed replies (no JSON
    /// value of the whole script is built), so a large script costs about
    /// its replies' own size on top of the text.
    pub fn parse(text: &str) -> Result<Self, String> {
        super::script_reader::parse_shared(text.into())
    }
}

/// Replays a list of replies, one per request; running out is a model failure.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    replies: std::vec::IntoIter<ScriptedReply>,
    used: usize,
}

impl ScriptedModel {
    /// A model that replays `replies` in order.
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self {
            replies: replies.into_iter(),
            used: 0,
        }
    }
}

/// Wraps a model so that each reply comes with the next entry of `raw`
/// (a script's reply as written) as the reply as received; one entry is
/// used per request, failed or not, so `raw` lines up with a script.
#[derive(Debug, Clone)]
pub struct WithRawReplies<M> {
    inner: M,
    raw: RawReplies,
    next: usize,
}

impl<M> WithRawReplies<M> {
    /// `inner`, whose `n`-th reply is handed back with `raw[n]`.
    pub fn new(inner: M, raw: impl Into<RawReplies>) -> Self {
        Self {
            inner,
            raw: raw.into(),
            next: 0,
        }
    }
}

impl<M: Model> Model for WithRawReplies<M> {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let raw = self.raw.get(self.next);
        self.next += 1;
        let raw = raw.and_then(|text| serde_json::from_str(text).ok());
        let response = self.inner.respond(request)?;
        Ok(Received { response, raw })
    }
}

impl Model for ScriptedModel {
    fn respond(&mut self, _request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        match self.replies.next() {
            Some(reply) => {
                self.used += 1;
                reply
            }
            None => Err(ModelFailure::with_kind(
                "script_exhausted",
                format!(
                    "script exhausted: all {} scripted replies were used",
                    self.used
                ),
            )),
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
        let parent: Vec<&str> = script.raw.parent.iter().collect();
        assert_eq!(
            parent,
            [
                r#"{"content": [], "stop_reason": "end_turn"}"#,
                r#"{"error":"x"}"#
            ]
        );
        assert_eq!(script.raw.children.len(), 1);
        assert_eq!(script.raw.children[0].get(0), Some(r#"{"error": "y" }"#));
        assert_eq!(script.raw.children[0].get(1), None);
        // All of them share the one copy of the text.
        assert!(Arc::ptr_eq(
            &script.raw.parent.source,
            &script.raw.children[0].source
        ));
    }

    #[test]
    fn raw_replies_from_strings_and_bad_ranges() {
        let replies = RawReplies::from(vec!["{}".to_owned(), "[1]".to_owned()]);
        assert_eq!(replies.iter().collect::<Vec<_>>(), ["{}", "[1]"]);
        let same = RawReplies::new(Arc::from("..{}[1]"), vec![2..4, 4..7]).expect("in range");
        assert_eq!(replies, same);
        assert!(RawReplies::new(Arc::from("{}"), vec![0..2, 1..3]).is_none());
        assert!(RawReplies::new(Arc::from("é{}"), vec![2..4, 0..1]).is_none());
    }

    #[test]
    fn each_request_gets_the_next_text_failed_or_not() {
        let replies = vec![
            Err(ModelFailure::with_kind("x", "first fails")),
            Ok(ModelResponse::answer("done")),
        ];
        let raw = vec![
            r#"{"error":"first fails"}"#.to_owned(),
            "{\"n\": 2}".to_owned(),
        ];
        let mut model = WithRawReplies::new(ScriptedModel::new(replies), raw);
        let request = Request {
            system: "",
            tools: &[],
            messages: &[],
            attachment: None,
        };
        assert!(model.respond_received(&request).is_err());
        let received = model.respond_received(&request).expect("second reply");
        assert_eq!(received.raw, Some(serde_json::json!({"n": 2})));
    }
}
