//! Server-sent events: a small line parser, shared by every provider's stream.

use std::io::BufRead;

/// One event: its `event:` name (empty if none) and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event name.
    pub event: String,
    /// The data.
    pub data: String,
}

/// The event parser, fed one line at a time (without its line ending):
/// the part of SSE that both the blocking reader and the async client's
/// chunk reader share. An event is complete at a blank line; comment lines
/// (`:`) are skipped.
#[derive(Debug, Default)]
pub struct SseDecoder {
    event: String,
    data: Option<String>,
}

impl SseDecoder {
    /// A decoder with no event begun.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one line; the event it completes, if it is the blank line
    /// ending one.
    pub fn line(&mut self, line: &str) -> Option<SseEvent> {
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            if self.event.is_empty() && self.data.is_none() {
                return None;
            }
            return Some(SseEvent {
                event: std::mem::take(&mut self.event),
                data: self.data.take().unwrap_or_default(),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => match &mut self.data {
                Some(existing) => {
                    existing.push('\n');
                    existing.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

/// Splits byte chunks, as they arrive from an async body, into lines for
/// an [`SseDecoder`]; a line cut between two chunks waits for the rest.
#[cfg(any(feature = "async", test))]
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

#[cfg(any(feature = "async", test))]
impl LineSplitter {
    /// A splitter holding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a chunk and hands each line it completes (invalid UTF-8
    /// replaced) to `line`, in order.
    pub fn push(&mut self, chunk: &[u8], mut line: impl FnMut(&str)) {
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|&byte| byte == b'\n') {
            let (head, tail) = rest.split_at(end + 1);
            if self.partial.is_empty() {
                line(&String::from_utf8_lossy(head));
            } else {
                self.partial.extend_from_slice(head);
                line(&String::from_utf8_lossy(&self.partial));
                self.partial.clear();
            }
            rest = tail;
        }
        self.partial.extend_from_slice(rest);
    }
}

/// Reads events from a byte stream; an event is complete at a blank line.
/// Comment lines (`:`) are skipped; an event cut off by the end of the stream
/// is dropped.
#[derive(Debug)]
pub struct SseReader<R> {
    input: R,
    line: String,
    decoder: SseDecoder,
}

impl<R: BufRead> SseReader<R> {
    /// A reader over `input`.
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: String::new(),
            decoder: SseDecoder::new(),
        }
    }

    /// The next complete event, `Ok(None)` at the end of the stream.
    pub fn next_event(&mut self) -> std::io::Result<Option<SseEvent>> {
        loop {
            self.line.clear();
            if self.input.read_line(&mut self.line)? == 0 {
                return Ok(None);
            }
            if let Some(event) = self.decoder.line(&self.line) {
                return Ok(Some(event));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str) -> Vec<SseEvent> {
        let mut reader = SseReader::new(text.as_bytes());
        let mut out = Vec::new();
        while let Ok(Some(event)) = reader.next_event() {
            out.push(event);
        }
        out
    }

    fn text_of_parsed() -> &'static str {
        ": hello\r\nevent: a\r\ndata: one\r\ndata: two\r\n\r\n\n\ndata:x\n\nevent: cut\ndata: never"
    }

    #[test]
    fn the_parser_joins_data_lines_skips_comments_and_drops_a_cut_event() {
        let parsed = events(text_of_parsed());
        let mut chunked = Vec::new();
        let (mut splitter, mut decoder) = (LineSplitter::new(), SseDecoder::new());
        for chunk in text_of_parsed().as_bytes().chunks(3) {
            splitter.push(chunk, |line| chunked.extend(decoder.line(line)));
        }
        assert_eq!(
            chunked, parsed,
            "the same events, fed three bytes at a time"
        );
        assert_eq!(
            parsed,
            vec![
                SseEvent {
                    event: "a".into(),
                    data: "one\ntwo".into()
                },
                SseEvent {
                    event: String::new(),
                    data: "x".into()
                },
            ]
        );
    }
}
