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

use std::path::Path;

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
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScriptText {
    /// The parent's replies.
    pub parent: Vec<String>,
    /// Each delegation's replies.
    pub children: Vec<Vec<String>>,
}

impl Script {
    /// Reads and parses a script file.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ScriptError::Invalid {
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
        super::script_reader::parse(text)
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
    raw: std::vec::IntoIter<String>,
}

impl<M> WithRawReplies<M> {
    /// `inner`, whose `n`-th reply is handed back with `raw[n]`.
    pub fn new(inner: M, raw: Vec<String>) -> Self {
        Self {
            inner,
            raw: raw.into_iter(),
        }
    }
}

impl<M: Model> Model for WithRawReplies<M> {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    fn respond_received(&mut self, request: &Request<'_>) -> Result<Received, ModelFailure> {
        let raw = self.raw.next();
        let response = self.inner.respond(request)?;
        Ok(Received {
            response,
            raw: raw.and_then(|text| serde_json::from_str(&text).ok()),
        })
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
