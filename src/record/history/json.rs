//! Edits of JSON text that keep every byte they do not change: a member's
//! value of an object replaced in place, an array's elements as the text
//! they were written as. A repair writes the fields it does not touch
//! exactly as they were (key order, spacing, escapes, numbers).

use std::collections::BTreeMap;
use std::ops::Range;

use serde_json::value::RawValue;

/// Where `inner` lies in `outer`, when it is a slice of it.
fn span(outer: &str, inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// The text of the value of member `key` of the JSON object `object`,
/// and where it is in it.
pub(super) fn member<'a>(object: &'a str, key: &str) -> Option<(&'a str, Range<usize>)> {
    let members: BTreeMap<String, &RawValue> = serde_json::from_str(object).ok()?;
    let raw = members.get(key)?.get();
    let at = span(object, raw)?;
    Some((raw, at))
}

/// `object` with the value of its member `key` replaced by `value` (JSON
/// text); `None` when `object` is not an object with that member.
pub(super) fn replace(object: &str, key: &str, value: &str) -> Option<String> {
    let (_, at) = member(object, key)?;
    let mut out = String::with_capacity(object.len() + value.len());
    out.push_str(object.get(..at.start)?);
    out.push_str(value);
    out.push_str(object.get(at.end..)?);
    Some(out)
}

/// The elements of the JSON array `array`, each as the text it was
/// written as.
pub(super) fn elements(array: &str) -> Option<Vec<&str>> {
    let raw: Vec<&RawValue> = serde_json::from_str(array).ok()?;
    Some(raw.into_iter().map(RawValue::get).collect())
}

/// The JSON array of `elements` (each JSON text).
pub(super) fn array<S: AsRef<str>>(elements: &[S]) -> String {
    let mut out = String::from("[");
    for (index, element) in elements.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(element.as_ref());
    }
    out.push(']');
    out
}

/// `elements` (each JSON text) as a JSON array laid out as `original` (an
/// array): its opening, its first separator between every two elements,
/// its closing; so a pretty-printed array stays pretty-printed.
pub(super) fn array_like<S: AsRef<str>>(original: &str, elements: &[S]) -> String {
    let parts = self::elements(original).unwrap_or_default();
    let spans: Vec<Range<usize>> = parts
        .iter()
        .filter_map(|part| span(original, part))
        .collect();
    let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
        return array(elements);
    };
    let open = original.get(..first.start).unwrap_or("[");
    let close = original.get(last.end..).unwrap_or("]");
    let between = spans
        .get(1)
        .and_then(|second| original.get(first.end..second.start))
        .unwrap_or(",");
    let mut out = String::from(open);
    for (index, element) in elements.iter().enumerate() {
        if index > 0 {
            out.push_str(between);
        }
        out.push_str(element.as_ref());
    }
    out.push_str(close);
    out
}

/// `text` as a JSON string.
pub(super) fn string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_replaced_and_every_other_byte_kept() {
        let object = r#"{ "b" : 1.50, "a":"\u00e9", "c" :[1, 2] }"#;
        assert_eq!(
            replace(object, "a", "\"x\"").as_deref(),
            Some(r#"{ "b" : 1.50, "a":"x", "c" :[1, 2] }"#)
        );
        assert_eq!(
            replace(object, "c", "[]").as_deref(),
            Some(r#"{ "b" : 1.50, "a":"\u00e9", "c" :[] }"#)
        );
        assert_eq!(replace(object, "d", "1"), None);
        assert_eq!(replace("[1]", "a", "1"), None);
        assert_eq!(replace("{\"a\":1", "a", "2"), None);
    }

    #[test]
    fn elements_keep_their_text() {
        assert_eq!(
            elements(r#"[ {"a" : 1} ,"x", 2.0 ]"#),
            Some(vec![r#"{"a" : 1}"#, r#""x""#, "2.0"])
        );
        assert_eq!(elements("{}"), None);
        assert_eq!(array(&["1", "\"a\""]), "[1,\"a\"]");
    }
}
