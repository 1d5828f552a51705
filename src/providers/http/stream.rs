//! What a provider's event stream parser is to the shared readers: the
//! blocking transport's and the async one's (feature `async`), in the send
//! loop, both feed it the same [`SseEvent`]s, so a stream means the same
//! reply whichever transport read it.

use crate::core::error::{FailureKind, ModelFailure};
use crate::providers::http::sse::SseEvent;
use crate::run::model::Received;

/// Assembles one reply from a provider's stream events.
pub trait StreamParser {
    /// Takes one event; `on_text` sees each piece of text as it arrives.
    /// `Ok(true)` when the reply is complete and the rest of the stream
    /// need not be read.
    fn event(
        &mut self,
        event: &SseEvent,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<bool, ModelFailure>;

    /// The reply assembled (a stream that ended before it was complete
    /// is a failure).
    fn finish(self) -> Result<Received, ModelFailure>;
}

/// The failure of a stream whose reading failed.
pub fn read_failed(err: &std::io::Error) -> ModelFailure {
    ModelFailure::with_kind(
        FailureKind::Stream,
        format!("reading the stream failed: {err}"),
    )
}

/// Reads a blocking byte stream's events into `parser` until the reply is
/// complete or the stream ends.
pub fn read_events<P: StreamParser>(
    input: impl std::io::BufRead,
    mut parser: P,
    on_text: &mut dyn FnMut(&str),
) -> Result<Received, ModelFailure> {
    let mut reader = crate::providers::http::sse::SseReader::new(input);
    loop {
        match reader.next_event() {
            Ok(Some(event)) => {
                if parser.event(&event, on_text)? {
                    return parser.finish();
                }
            }
            Ok(None) => return parser.finish(),
            Err(err) => return Err(read_failed(&err)),
        }
    }
}
