//! What a hook's exit and output mean, in Claude Code's terms: exit 0 with
//! stdout read as JSON when it is JSON, exit 2 a block with stderr as the
//! reason, anything else a failure — which blocks a tool call (fail
//! closed, unlike Claude Code) unless the hook opted into failing open,
//! and is a warning everywhere else.
//!
//! A hook's JSON counts only when it is whole and unambiguous: a key
//! repeated in one object (at any depth) is a failure, and so is output
//! cut short (by the cap, or a pipe still held open once the hook ended
//! with what was read not a complete JSON value).

use serde_json::{Map, Value};

use crate::core::hook::{HookDecision, HookEvent};
use crate::policy::command_hooks::process::{HOOK_OUTPUT_CAP, Ran};

/// The longest reason or context kept from a hook, in characters.
const MAX_TEXT: usize = 4000;

/// What one hook's run means for the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judged {
    /// What it decided, for the record.
    pub(crate) decision: HookDecision,
    /// Its reason (for a block, a denial, an ask) or what went wrong.
    pub(crate) reason: Option<String>,
    /// Context for the model (`additionalContext`, or plain stdout where
    /// Claude Code reads it so).
    pub(crate) context: Option<String>,
    /// `continue: false`: why the run stops.
    pub(crate) stop: Option<String>,
    /// Warnings for the user (`systemMessage`, a failure that only warns).
    pub(crate) warnings: Vec<String>,
}

impl Judged {
    fn none() -> Self {
        Self {
            decision: HookDecision::None,
            reason: None,
            context: None,
            stop: None,
            warnings: Vec::new(),
        }
    }

    fn decided(decision: HookDecision, reason: impl Into<String>) -> Self {
        Self {
            decision,
            reason: Some(reason.into()),
            ..Self::none()
        }
    }
}

/// `text` trimmed, cut at [`MAX_TEXT`] characters.
fn bounded(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_TEXT) {
        Some((cut, _)) => format!("{}… (cut)", text.get(..cut).unwrap_or_default()),
        None => text.to_owned(),
    }
}

/// Whether a failure of a hook at `event` blocks (a tool call) or warns.
fn failure(event: HookEvent, fail_open: bool, command: &str, what: String) -> Judged {
    if event == HookEvent::PreToolUse && !fail_open {
        return Judged::decided(HookDecision::Failed, what);
    }
    let mut judged = Judged::decided(HookDecision::Warned, what.clone());
    judged
        .warnings
        .push(format!("{event} hook `{command}` failed: {what}"));
    judged
}

/// What `ran` means at `event`.
pub(crate) fn judge(event: HookEvent, command: &str, fail_open: bool, ran: &Ran) -> Judged {
    let stderr = String::from_utf8_lossy(&ran.stderr);
    let fail = |what: String| failure(event, fail_open, command, what);
    if let Some(error) = &ran.error {
        return fail(error.clone());
    }
    if ran.timed_out {
        return fail(format!(
            "timed out after {:.1} s; its process group was killed",
            ran.duration.as_secs_f64()
        ));
    }
    if ran.stdout_dropped > 0 || ran.stderr_dropped > 0 {
        return fail(format!(
            "its output passed the cap of {HOOK_OUTPUT_CAP} bytes ({} more bytes of stdout, {} of stderr dropped)",
            ran.stdout_dropped, ran.stderr_dropped
        ));
    }
    match (ran.exit_code, ran.signal) {
        (Some(0), _) => {}
        (Some(2), _) => return blocked(event, command, &stderr),
        (Some(code), _) => {
            let said = bounded(&stderr);
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            };
            return fail(format!("exit code {code}{said}"));
        }
        (None, Some(signal)) => return fail(format!("killed by signal {signal}")),
        (None, None) => return fail("ended without an exit code".to_owned()),
    }
    let stdout = String::from_utf8_lossy(&ran.stdout);
    let text = stdout.trim();
    if ran.stdout_open && serde_json::from_str::<serde::de::IgnoredAny>(text).is_err() {
        return fail(
            "it ended, but its stdout was still held open (by a process it left behind) and what it had printed is not a complete JSON value"
                .to_owned(),
        );
    }
    if text.is_empty() {
        return Judged::none();
    }
    if let Err(err) = unique_keys(text)
        && err.is_data()
    {
        return fail(format!("its JSON output is ambiguous: {err}"));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => from_json(event, command, fail_open, &fields),
        _ => match event {
            // Claude Code adds plain stdout of these as context.
            HookEvent::UserPromptSubmit | HookEvent::SessionStart | HookEvent::SubagentStart => {
                Judged {
                    context: Some(bounded(text)),
                    ..Judged::none()
                }
            }
            HookEvent::PreToolUse => fail(format!(
                "its output is not a JSON object: {}",
                bounded(text).chars().take(200).collect::<String>()
            )),
            _ => {
                let mut judged = Judged::none();
                judged.warnings.push(format!(
                    "{event} hook `{command}` printed output that is not a JSON object; it was ignored"
                ));
                judged
            }
        },
    }
}

/// Exit 2: a block, with stderr as the reason, where the event can block.
fn blocked(event: HookEvent, command: &str, stderr: &str) -> Judged {
    let reason = bounded(stderr);
    let reason = if reason.is_empty() {
        format!("blocked by hook `{command}` (exit 2, nothing on stderr)")
    } else {
        reason
    };
    match event {
        HookEvent::PreToolUse => Judged::decided(HookDecision::Deny, reason),
        HookEvent::PostToolUse
        | HookEvent::UserPromptSubmit
        | HookEvent::Stop
        | HookEvent::SubagentStop
        | HookEvent::PreCompact => Judged::decided(HookDecision::Block, reason),
        HookEvent::SubagentStart | HookEvent::SessionStart | HookEvent::SessionEnd => {
            let mut judged = Judged::decided(HookDecision::Warned, reason.clone());
            judged.warnings.push(format!(
                "{event} hook `{command}` exited 2, but {event} cannot block: {reason}"
            ));
            judged
        }
    }
}

/// Checks that no object in the JSON `text` has a key twice (serde_json's
/// `Value` would keep the last one). A repeated key is a data error
/// (`is_data`); text that is not JSON gives serde_json's syntax or
/// end-of-input error.
fn unique_keys(text: &str) -> Result<(), serde_json::Error> {
    use serde::Deserializer as _;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    deserializer.deserialize_any(UniqueKeys)?;
    deserializer.end()
}

/// A visitor that walks a JSON value and fails on a key repeated in one object.
struct UniqueKeys;

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(UniqueKeys)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                let shown: String = key.chars().take(100).collect();
                return Err(serde::de::Error::custom(format!(
                    "the key `{shown}` appears twice in one object"
                )));
            }
            map.next_value_seed(UniqueKeys)?;
            seen.insert(key);
        }
        Ok(())
    }
}

fn text<'a>(fields: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    fields.get(name).and_then(Value::as_str)
}

/// Exit 0 with a JSON object.
fn from_json(
    event: HookEvent,
    command: &str,
    fail_open: bool,
    fields: &Map<String, Value>,
) -> Judged {
    let mut judged = Judged::none();
    if let Some(message) = text(fields, "systemMessage") {
        judged
            .warnings
            .push(format!("{event} hook `{command}`: {}", bounded(message)));
    }
    let specific = fields.get("hookSpecificOutput").and_then(Value::as_object);
    if let Some(context) = specific.and_then(|specific| text(specific, "additionalContext"))
        && matches!(
            event,
            HookEvent::PostToolUse
                | HookEvent::UserPromptSubmit
                | HookEvent::SessionStart
                | HookEvent::SubagentStart
        )
        && !context.trim().is_empty()
    {
        judged.context = Some(bounded(context));
    }
    if fields.get("continue") == Some(&Value::Bool(false)) {
        let reason = text(fields, "stopReason")
            .map(bounded)
            .filter(|reason| !reason.is_empty())
            .unwrap_or_else(|| format!("a {event} hook said not to continue"));
        judged.decision = HookDecision::Stop;
        judged.reason = Some(reason.clone());
        judged.stop = Some(reason);
        return judged;
    }
    if event == HookEvent::PreToolUse {
        return permission(command, fail_open, fields, specific, judged);
    }
    let reason = text(fields, "reason").map(bounded);
    if text(fields, "decision") == Some("block") {
        match event {
            HookEvent::PostToolUse
            | HookEvent::UserPromptSubmit
            | HookEvent::Stop
            | HookEvent::SubagentStop
            | HookEvent::PreCompact => {
                judged.decision = HookDecision::Block;
                judged.reason = Some(reason.filter(|reason| !reason.is_empty()).unwrap_or_else(
                    || format!("blocked by {event} hook `{command}` (no reason given)"),
                ));
            }
            _ => judged.warnings.push(format!(
                "{event} hook `{command}` answered `block`, but {event} cannot block"
            )),
        }
    }
    judged
}

/// A PreToolUse hook's JSON: `hookSpecificOutput.permissionDecision`
/// (`allow`, `deny`, `ask`) with `permissionDecisionReason`, or the older
/// top-level `decision` (`approve`, `block`) with `reason`. Anything a
/// tool call cannot be run by (an unknown decision, `updatedInput`) fails
/// closed.
fn permission(
    command: &str,
    fail_open: bool,
    fields: &Map<String, Value>,
    specific: Option<&Map<String, Value>>,
    mut judged: Judged,
) -> Judged {
    let fail = |what: String| {
        let mut failed = failure(HookEvent::PreToolUse, fail_open, command, what);
        failed.warnings.extend(judged.warnings.iter().cloned());
        failed
    };
    if specific.is_some_and(|specific| specific.contains_key("updatedInput")) {
        return fail(
            "it asked to change the call's input (`updatedInput`), which subloop does not do"
                .to_owned(),
        );
    }
    let (decision, reason) = match specific.and_then(|specific| specific.get("permissionDecision"))
    {
        Some(Value::String(decision)) => (
            Some(decision.as_str()),
            specific.and_then(|specific| text(specific, "permissionDecisionReason")),
        ),
        Some(other) => {
            return fail(format!(
                "permissionDecision is a string (allow, deny or ask), not {other}"
            ));
        }
        None => match text(fields, "decision") {
            Some("approve") => (Some("allow"), text(fields, "reason")),
            Some("block") => (Some("deny"), text(fields, "reason")),
            Some(other) => {
                return fail(format!("decision `{other}` is not approve or block"));
            }
            None => (None, None),
        },
    };
    let reason = reason.map(bounded).filter(|reason| !reason.is_empty());
    match decision {
        None => {}
        Some("allow") => {
            judged.decision = HookDecision::Allow;
            judged.reason = reason;
        }
        Some("ask") => {
            judged.decision = HookDecision::Ask;
            judged.reason = reason;
        }
        Some("deny") => {
            judged.decision = HookDecision::Deny;
            judged.reason = Some(
                reason.unwrap_or_else(|| format!("denied by hook `{command}` (no reason given)")),
            );
        }
        Some(other) => {
            return fail(format!(
                "permissionDecision `{other}` is not allow, deny or ask"
            ));
        }
    }
    judged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(code: i32, stdout: &str, stderr: &str) -> Ran {
        Ran {
            exit_code: Some(code),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            ..Ran::default()
        }
    }

    #[test]
    fn exits_and_outputs_mean_what_claude_code_says() {
        let pre = HookEvent::PreToolUse;
        let deny = r#"{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "no"}}"#;
        let judged = judge(pre, "g", false, &ran(0, deny, ""));
        assert_eq!(judged.decision, HookDecision::Deny);
        assert_eq!(judged.reason.as_deref(), Some("no"));
        assert_eq!(
            judge(pre, "g", false, &ran(2, "", "nope\n"))
                .reason
                .as_deref(),
            Some("nope")
        );
        assert_eq!(
            judge(pre, "g", false, &ran(1, "", "")).decision,
            HookDecision::Failed
        );
        assert_eq!(
            judge(pre, "g", true, &ran(1, "", "")).decision,
            HookDecision::Warned
        );
        assert_eq!(
            judge(pre, "g", false, &ran(0, "garbage", "")).decision,
            HookDecision::Failed
        );
        assert_eq!(
            judge(pre, "g", false, &ran(0, "", "")).decision,
            HookDecision::None
        );
        let ask = r#"{"hookSpecificOutput": {"permissionDecision": "ask"}}"#;
        assert_eq!(
            judge(pre, "g", false, &ran(0, ask, "")).decision,
            HookDecision::Ask
        );
        let odd = r#"{"hookSpecificOutput": {"permissionDecision": "maybe"}}"#;
        assert_eq!(
            judge(pre, "g", false, &ran(0, odd, "")).decision,
            HookDecision::Failed
        );
        let stop = HookEvent::Stop;
        let block = r#"{"decision": "block", "reason": "tests fail"}"#;
        let judged = judge(stop, "s", false, &ran(0, block, ""));
        assert_eq!(
            (judged.decision, judged.reason.as_deref()),
            (HookDecision::Block, Some("tests fail"))
        );
        assert_eq!(
            judge(stop, "s", false, &ran(1, "", "")).decision,
            HookDecision::Warned
        );
        assert_eq!(
            judge(stop, "s", false, &ran(0, "garbage", "")).decision,
            HookDecision::None
        );
        let halt = r#"{"continue": false, "stopReason": "enough"}"#;
        assert_eq!(
            judge(stop, "s", false, &ran(0, halt, "")).stop.as_deref(),
            Some("enough")
        );
        let prompt = judge(
            HookEvent::UserPromptSubmit,
            "p",
            false,
            &ran(0, "be brief", ""),
        );
        assert_eq!(prompt.context.as_deref(), Some("be brief"));
        let timed_out = Ran {
            timed_out: true,
            ..Ran::default()
        };
        assert_eq!(
            judge(pre, "g", false, &timed_out).decision,
            HookDecision::Failed
        );
    }

    #[test]
    fn a_repeated_key_anywhere_is_a_failure() {
        let pre = HookEvent::PreToolUse;
        for twice in [
            r#"{"hookSpecificOutput": {"permissionDecision": "deny", "permissionDecision": "allow"}}"#,
            r#"{"hookSpecificOutput": {"permissionDecision": "allow"}, "hookSpecificOutput": {"permissionDecision": "allow"}}"#,
            r#"{"decision": "approve", "x": [{"a": 1, "a": 2}]}"#,
            // The same key, written with an escape.
            r#"{"decision": "approve", "decisio\u006e": "approve"}"#,
        ] {
            let judged = judge(pre, "g", false, &ran(0, twice, ""));
            assert_eq!(judged.decision, HookDecision::Failed, "{twice}");
            assert!(
                judged
                    .reason
                    .as_deref()
                    .is_some_and(|reason| reason.contains("appears twice")),
                "{judged:?}"
            );
            // Elsewhere a warning, not the last value.
            let stop = judge(HookEvent::Stop, "s", false, &ran(0, twice, ""));
            assert_eq!(stop.decision, HookDecision::Warned, "{twice}");
        }
        let once = r#"{"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]}"#;
        assert_eq!(
            judge(pre, "g", false, &ran(0, once, "")).decision,
            HookDecision::None
        );
        // Plain text still is context where Claude Code reads it so.
        let prompt = judge(
            HookEvent::UserPromptSubmit,
            "p",
            false,
            &ran(0, "{not json", ""),
        );
        assert_eq!(prompt.context.as_deref(), Some("{not json"));
    }

    #[test]
    fn output_read_from_a_pipe_still_held_open_counts_only_when_whole() {
        let pre = HookEvent::PreToolUse;
        let open = |stdout: &str| Ran {
            stdout_open: true,
            ..ran(0, stdout, "")
        };
        let deny = r#"{"hookSpecificOutput": {"permissionDecision": "deny"}}"#;
        assert_eq!(
            judge(pre, "g", false, &open(deny)).decision,
            HookDecision::Deny
        );
        for cut in [
            "",
            "{\"hookSpecificOutput\": {\"permissionDecision\"",
            "plain",
        ] {
            assert_eq!(
                judge(pre, "g", false, &open(cut)).decision,
                HookDecision::Failed,
                "{cut}"
            );
            assert_eq!(
                judge(HookEvent::UserPromptSubmit, "p", false, &open(cut)).decision,
                HookDecision::Warned,
                "{cut}"
            );
        }
    }
}
