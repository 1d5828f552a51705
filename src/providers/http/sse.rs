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

/// Reads events from a byte stream; an event is complete at a blank line.
/// Comment lines (`:`) are skipped; an event cut off by the end of the stream
/// is dropped.
#[derive(Debug)]
pub struct SseReader<R> {
    input: R,
    line: String,
}

impl<R: BufRead> SseReader<R> {
    /// A reader over `input`.
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: String::new(),
        }
    }

    /// The next complete event, `Ok(None)` at the end of the stream.
    pub fn next_event(&mut self) -> std::io::Result<Option<SseEvent>> {
        let mut event = String::new();
        let mut data: Option<String> = None;
        loop {
            self.line.clear();
            if self.input.read_line(&mut self.line)? == 0 {
                return Ok(None);
            }
            let line = self.line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if event.is_empty() && data.is_none() {
                    continue;
                }
                return Ok(Some(SseEvent {
                    event,
                    data: data.unwrap_or_default(),
                }));
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line, ""),
            };
            match field {
                "event" => event = value.to_owned(),
                "data" => match &mut data {
                    Some(existing) => {
                        existing.push('\n');
                        existing.push_str(value);
                    }
                    None => data = Some(value.to_owned()),
                },
                _ => {}
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

    #[test]
    fn the_parser_joins_data_lines_skips_comments_and_drops_a_cut_event() {
        let parsed = events(
            ": hello\r\nevent: a\r\ndata: one\r\ndata: two\r\n\r\n\n\ndata:x\n\nevent: cut\ndata: never",
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
