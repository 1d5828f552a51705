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

use super::Model;
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
