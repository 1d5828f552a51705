//! [`SharedText`]: an immutable string shared by reference count.
//!
//! A tool result is held in three places at once: the history (sent with
//! every later request), the call's `ToolRecord` (`core::call`), and the
//! events observers see. Holding it as one shared allocation instead of
//! copies keeps a long run's memory at one copy of what its tools said.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An immutable string; cloning it shares the text instead of copying it.
/// It reads as a `str` (`Deref`), compares with `str` and `String`, and is
/// a JSON string on the wire.
///
/// ```
/// use subloop::core::shared_text::SharedText;
///
/// let text = SharedText::from("result");
/// let record = text.clone(); // the same allocation, not a copy
/// assert_eq!(record, "result");
/// assert!(record.starts_with("res"));
/// assert_eq!(serde_json::to_string(&text).unwrap(), "\"result\"");
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedText(Arc<String>);

impl SharedText {
    /// The text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// Whether `self` and `other` share one allocation (a clone of the
    /// other), rather than only being equal.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for SharedText {
    type Target = str;

    fn deref(&self) -> &str {
        self.0.as_str()
    }
}

impl AsRef<str> for SharedText {
    fn as_ref(&self) -> &str {
        self.0.as_str()
    }
}

impl Borrow<str> for SharedText {
    fn borrow(&self) -> &str {
        self.0.as_str()
    }
}

impl From<String> for SharedText {
    /// Takes the string's buffer as it is: no copy of the text.
    fn from(text: String) -> Self {
        Self(Arc::new(text))
    }
}

impl From<&str> for SharedText {
    fn from(text: &str) -> Self {
        Self(Arc::new(text.to_owned()))
    }
}

impl From<&String> for SharedText {
    fn from(text: &String) -> Self {
        Self(Arc::new(text.clone()))
    }
}

impl From<SharedText> for String {
    /// The buffer itself when nothing else shares it, else a copy.
    fn from(text: SharedText) -> Self {
        Arc::try_unwrap(text.0).unwrap_or_else(|shared| shared.as_str().to_owned())
    }
}

impl fmt::Debug for SharedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0.as_str(), f)
    }
}

impl fmt::Display for SharedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.0.as_str(), f)
    }
}

impl PartialEq<str> for SharedText {
    fn eq(&self, other: &str) -> bool {
        self.0.as_str() == other
    }
}

impl PartialEq<&str> for SharedText {
    fn eq(&self, other: &&str) -> bool {
        self.0.as_str() == *other
    }
}

impl PartialEq<String> for SharedText {
    fn eq(&self, other: &String) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<SharedText> for str {
    fn eq(&self, other: &SharedText) -> bool {
        self == other.0.as_str()
    }
}

impl PartialEq<SharedText> for &str {
    fn eq(&self, other: &SharedText) -> bool {
        *self == other.0.as_str()
    }
}

impl PartialEq<SharedText> for String {
    fn eq(&self, other: &SharedText) -> bool {
        *self == other.0.as_str()
    }
}

impl Serialize for SharedText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for SharedText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_and_equal_texts_compare_equal() {
        let text = SharedText::from(String::from("abc"));
        let shared = text.clone();
        assert!(text.ptr_eq(&shared));
        let copy = SharedText::from("abc");
        assert_eq!(text, copy);
        assert!(!text.ptr_eq(&copy));
        assert_eq!(format!("{text:?} {text}"), "\"abc\" abc");
    }

    #[test]
    fn a_string_is_taken_not_copied() {
        let text = String::from("what a tool said");
        let at = text.as_ptr();
        let shared = SharedText::from(text);
        assert_eq!(
            shared.as_ptr(),
            at,
            "the text was copied into the shared text"
        );
        let back = String::from(shared);
        assert_eq!(back.as_ptr(), at, "an unshared text was copied back");
    }

    #[test]
    fn it_is_a_json_string_both_ways() {
        let text: SharedText = serde_json::from_str("\"a\\nb\"").unwrap();
        assert_eq!(text, "a\nb");
        assert_eq!(serde_json::to_string(&text).unwrap(), "\"a\\nb\"");
        assert!(serde_json::from_str::<SharedText>("1").is_err());
    }
}
