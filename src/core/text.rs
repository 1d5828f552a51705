//! Text made safe for a terminal: what a model, a tool or a trace says is
//! shown with its control characters, line separators and invisible format
//! characters escaped, so it cannot forge a line or send escape sequences.

/// Text from a model or a tool, made safe for a terminal: control
/// characters (escape sequences, line breaks), the Unicode line and
/// paragraph separators, bidi controls and zero-width characters are shown
/// escaped.
pub fn printable(text: &str) -> String {
    escape_controls(text, false)
}

/// Like the progress lines' escaping, but line breaks are kept: for model
/// text streamed to the terminal as it arrives.
pub fn printable_lines(text: &str) -> String {
    escape_controls(text, true)
}

/// A character that is no control character (`char::is_control`) yet is
/// shown escaped: the bidi controls and zero-width characters, invisible
/// yet changing how the text around them reads, and the Unicode line and
/// paragraph separators (U+2028, U+2029), at which text viewers and some
/// terminals break lines.
pub(crate) fn needs_escape(c: char) -> bool {
    is_hidden_format(c) || is_unicode_line_break(c)
}

/// Bidi controls (U+202A–U+202E, U+2066–U+2069) and zero-width characters
/// (U+200B–U+200F, U+2060, U+FEFF): invisible, yet they change how text
/// around them reads, so a terminal is shown them escaped.
fn is_hidden_format(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}'..='\u{200f}' | '\u{2060}' | '\u{feff}')
}

/// The Unicode line and paragraph separators (U+2028, U+2029): not control
/// characters, yet text viewers and some terminals break lines at them, so
/// text holding one could pass for a line of its own. Shown escaped like
/// `\n`, even where line breaks are kept (only `\n` is). NEL (U+0085) is a
/// control character and escaped as one.
fn is_unicode_line_break(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

fn escape_controls(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && !(keep_newlines && c == '\n') {
            out.extend(c.escape_default());
        } else if needs_escape(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_text_cannot_forge_lines_or_send_escape_sequences() {
        let hostile = "ok\u{1b}[31m\r[parent] forged\nnext";
        assert_eq!(printable(hostile), "ok\\u{1b}[31m\\r[parent] forged\\nnext");
        assert_eq!(
            printable_lines(hostile),
            "ok\\u{1b}[31m\\r[parent] forged\nnext"
        );
    }

    #[test]
    fn bidi_controls_and_zero_width_characters_are_shown_escaped() {
        let hostile = "a\u{202e}b\u{2066}c\u{200b}d\u{2060}e\u{feff}f\u{200f}g";
        assert_eq!(
            printable(hostile),
            "a\\u{202e}b\\u{2066}c\\u{200b}d\\u{2060}e\\u{feff}f\\u{200f}g"
        );
        assert_eq!(printable("plain é ü 日本"), "plain é ü 日本");
    }

    #[test]
    fn unicode_line_breaks_are_shown_escaped_even_where_newlines_are_kept() {
        let hostile = "a\u{2028}[parent] forged\u{2029}b\u{85}c\nd";
        assert_eq!(
            printable(hostile),
            "a\\u{2028}[parent] forged\\u{2029}b\\u{85}c\\nd"
        );
        assert_eq!(
            printable_lines(hostile),
            "a\\u{2028}[parent] forged\\u{2029}b\\u{85}c\nd"
        );
    }
}
