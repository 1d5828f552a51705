//! An MCP `tools/call` result as the text of a `tool_result`: `text` content
//! joined; `structuredContent` as JSON text when there is no text; images
//! and audio as a one-line placeholder with type and size; a `resource_link`
//! as its URI; an embedded text resource as its text; `isError` kept; the
//! whole cut to the byte cap with the same note as `read_file`.
//!
//! It works on the result as JSON (the MCP wire shape), so a server's
//! result is read the same whatever the SDK's types look like.

use serde_json::Value;

/// The text the model gets for `result` of `tool` (the registered name),
/// at most `cap` bytes plus the truncation note, and whether it is an error.
pub fn result_text(tool: &str, result: &Value, cap: usize) -> (String, bool) {
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let mut parts: Vec<String> = Vec::new();
    let mut has_text = false;
    for item in result
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        let field = |name: &str| item.get(name).and_then(Value::as_str);
        match kind {
            "text" => {
                has_text = true;
                parts.push(field("text").unwrap_or_default().to_owned());
            }
            "image" | "audio" => parts.push(format!(
                "[{kind}: {}, {} bytes]",
                field("mimeType").unwrap_or("unknown type"),
                base64_len(field("data").unwrap_or_default())
            )),
            "resource_link" => parts.push(format!(
                "[resource link: {}]",
                field("uri").unwrap_or("(no uri)")
            )),
            "resource" => {
                let resource = item.get("resource").unwrap_or(&Value::Null);
                let inner = |name: &str| resource.get(name).and_then(Value::as_str);
                match inner("text") {
                    Some(text) => {
                        has_text = true;
                        parts.push(text.to_owned());
                    }
                    None => parts.push(format!(
                        "[resource: {}, {}, {} bytes]",
                        inner("uri").unwrap_or("(no uri)"),
                        inner("mimeType").unwrap_or("unknown type"),
                        base64_len(inner("blob").unwrap_or_default())
                    )),
                }
            }
            other => parts.push(format!(
                "[{} content]",
                if other.is_empty() { "untyped" } else { other }
            )),
        }
    }
    if !has_text && let Some(structured) = result.get("structuredContent") {
        parts.insert(0, structured.to_string());
    }
    let text = parts.join("\n");
    (cap_text(tool, text, cap), is_error)
}

/// A JSON-RPC error of a call, as the model sees it.
pub fn rpc_error(server: &str, code: i64, message: &str) -> String {
    format!("MCP server {server} answered with an error (code {code}): {message}")
}

/// The decoded size of base64 `data`.
fn base64_len(data: &str) -> usize {
    let padding = data.bytes().rev().take_while(|&b| b == b'=').count();
    (data.len() / 4 * 3
        + match data.len() % 4 {
            2 => 1,
            3 => 2,
            _ => 0,
        })
    .saturating_sub(padding)
}

/// `text` cut at a char boundary at most `cap` bytes in, with a note saying
/// how much was shown (the note `read_file` uses, with the tool's name).
fn cap_text(tool: &str, text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let mut cut = cap;
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let total = text.len();
    let shown = text.get(..cut).unwrap_or_default();
    format!("{shown}\n[{tool}: showing {cut} of {total} bytes; the rest is past the read limit]")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_kind_of_content_becomes_text() {
        let result = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "audio", "data": "aGk=", "mimeType": "audio/wav"},
            {"type": "resource_link", "uri": "file:///a.txt", "name": "a"},
            {"type": "resource", "resource": {"uri": "file:///b", "text": "two"}},
            {"type": "resource", "resource": {"uri": "file:///c", "mimeType": "application/zip", "blob": "AAAA"}},
            {"type": "future_kind"}
        ], "isError": true});
        let (text, error) = result_text("mcp__t__x", &result, 1 << 20);
        assert!(error);
        assert_eq!(
            text,
            "one\n[image: image/png, 5 bytes]\n[audio: audio/wav, 2 bytes]\n[resource link: file:///a.txt]\ntwo\n[resource: file:///c, application/zip, 3 bytes]\n[future_kind content]"
        );
    }

    #[test]
    fn structured_content_stands_in_for_missing_text() {
        let result = json!({"content": [], "structuredContent": {"sum": 3}});
        assert_eq!(
            result_text("t", &result, 100),
            ("{\"sum\":3}".to_owned(), false)
        );
        let both =
            json!({"content": [{"type": "text", "text": "3"}], "structuredContent": {"sum": 3}});
        assert_eq!(result_text("t", &both, 100).0, "3");
        assert_eq!(result_text("t", &json!({}), 100).0, "");
    }

    #[test]
    fn long_results_are_cut_with_the_read_limit_note() {
        let result = json!({"content": [{"type": "text", "text": "é".repeat(10)}]});
        let (text, _) = result_text("mcp__t__x", &result, 5);
        assert_eq!(
            text,
            "éé\n[mcp__t__x: showing 4 of 20 bytes; the rest is past the read limit]"
        );
    }
}
