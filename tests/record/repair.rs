//! `repair`: each broken case of each format (Messages API, Chat
//! Completions, Claude Code, codex) made to hold, in its own format, with
//! every change listed, every text kept, and (JSON Lines) every line it
//! does not change written back byte for byte; a sound history comes
//! back unchanged; `subloop repair` through the binary never touches its
//! input.

use proptest::strategy::Strategy;
use serde_json::{Value, json};
use subloop::record::history::{ChangeKind, Format, History, INTERRUPTED, Repaired, repair};

use super::history::{anthropic_session, broken_anthropic, claude_code, codex, openai_session};

/// Every string under a `text`, `thinking` or `content` key of `value`
/// that a person or a model wrote (not the repair's own).
fn texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    (
                        "text" | "thinking" | "content" | "output" | "arguments",
                        Value::String(text),
                    ) if text != INTERRUPTED => {
                        out.push(text.clone());
                    }
                    _ => texts(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| texts(item, out)),
        _ => {}
    }
}

fn texts_of_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Ok(value) = serde_json::from_str::<Value>(line) {
            texts(&value, &mut out);
        }
    }
    out.sort();
    out
}

fn holds(text: &str, format: Option<Format>) -> Repaired {
    let repaired = repair(text, format).expect("repaired");
    assert!(
        repaired.remaining.is_empty(),
        "still broken: {:?}\n{}",
        repaired.remaining,
        repaired.text
    );
    let again = History::read(&repaired.text, Some(repaired.format)).expect("readable");
    assert!(again.check().is_empty(), "{:?}", again.check());
    repaired
}

#[test]
fn a_sound_history_of_each_format_comes_back_byte_for_byte() {
    let claude = claude_code::text_of(&claude_code::session());
    let rollout = claude_code::text_of(&codex::rollout());
    let pretty = serde_json::to_string_pretty(&anthropic_session()).unwrap();
    for text in [
        anthropic_session().to_string(),
        pretty,
        openai_session().to_string(),
        claude,
        rollout,
    ] {
        let repaired = holds(&text, None);
        assert!(repaired.changes.is_empty(), "{:?}", repaired.changes);
        assert_eq!(repaired.text, text);
    }
}

#[test]
fn each_broken_messages_api_case_is_repaired_and_keeps_every_text() {
    for (name, value, expected) in broken_anthropic() {
        let text = value.to_string();
        let repaired = holds(&text, None);
        assert_eq!(repaired.format, Format::Anthropic);
        assert!(!repaired.changes.is_empty(), "{name}: no change listed");
        let mut before = Vec::new();
        texts(&value, &mut before);
        let after: Value = serde_json::from_str(&repaired.text).unwrap();
        let mut kept = Vec::new();
        texts(&after, &mut kept);
        for text in &before {
            assert!(kept.contains(text), "{name}: lost {text:?}");
        }
        // Every other field of the body is as it was.
        assert_eq!(after["model"], value["model"], "{name}");
        let kinds: Vec<ChangeKind> = repaired.changes.iter().map(|change| change.kind).collect();
        match name {
            "interrupted at the end" | "interrupted mid-history" => {
                assert!(
                    kinds.iter().all(|kind| *kind == ChangeKind::AddedResult),
                    "{name}: {kinds:?}"
                );
                assert_eq!(kinds.len(), expected.len(), "{name}");
                assert!(repaired.text.contains(INTERRUPTED));
                assert!(repaired.text.contains(r#""is_error":true"#));
            }
            "a duplicated result" => assert_eq!(kinds, [ChangeKind::DroppedDuplicate]),
            "results out of order" => assert_eq!(kinds, [ChangeKind::MovedResult]),
            "an orphan result" => {
                assert_eq!(kinds, [ChangeKind::DroppedOrphan]);
                // The message held only the orphan: it is gone.
                assert_eq!(after["messages"].as_array().unwrap().len(), 4);
            }
            "results a message late" => {
                assert_eq!(kinds, [ChangeKind::MovedResult, ChangeKind::MovedResult]);
                // The results come first, the user's words stay after them.
                assert_eq!(after["messages"][2]["content"][2]["text"], "wait");
                assert_eq!(after["messages"][3]["content"][0]["text"], "Be brief.");
            }
            "one id twice in a reply" => {
                assert!(kinds.contains(&ChangeKind::DroppedDuplicate), "{kinds:?}");
            }
            other => panic!("a case this test does not know: {other}"),
        }
        // Each change names where it was.
        for change in &repaired.changes {
            assert!(!change.detail.is_empty());
            assert!(change.to_string().starts_with("message "), "{change}");
        }
    }
}

#[test]
fn broken_chat_completions_histories_are_repaired() {
    // The call without output gets one, right after the reply.
    let mut lost = openai_session();
    lost.as_array_mut().unwrap().remove(4);
    let repaired = holds(&lost.to_string(), None);
    let after: Value = serde_json::from_str(&repaired.text).unwrap();
    assert_eq!(after[4]["role"], "tool");
    assert_eq!(after[4]["tool_call_id"], "call_b");
    assert_eq!(after[4]["content"], INTERRUPTED);
    assert_eq!(after[5]["content"], "alpha and beta");
    // Outputs out of order and an orphan: ordered, dropped.
    let mut both = openai_session();
    let messages = both.as_array_mut().unwrap();
    messages.swap(3, 4);
    messages.insert(
        6,
        json!({"role": "tool", "tool_call_id": "call_z", "content": "?"}),
    );
    let repaired = holds(&both.to_string(), Some(Format::OpenAi));
    let kinds: Vec<ChangeKind> = repaired.changes.iter().map(|change| change.kind).collect();
    assert_eq!(kinds, [ChangeKind::MovedResult, ChangeKind::DroppedOrphan]);
    assert_eq!(repaired.text, openai_session().to_string());
}

/// Every line of `before` whose entry is in `after` is there byte for
/// byte, or differs only in `parentUuid` and its `message.content`.
fn lines_kept(before: &str, after: &str) {
    let by_uuid: std::collections::HashMap<String, &str> = after
        .lines()
        .filter_map(|line| {
            let value: Value = serde_json::from_str(line).ok()?;
            Some((value["uuid"].as_str()?.to_owned(), line))
        })
        .collect();
    for line in before.lines() {
        if after.lines().any(|kept| kept == line) {
            continue;
        }
        let old: Value = serde_json::from_str(line).unwrap();
        let Some(new) = old["uuid"].as_str().and_then(|uuid| by_uuid.get(uuid)) else {
            continue; // dropped
        };
        let mut new: Value = serde_json::from_str(new).unwrap();
        let mut old = old;
        for value in [&mut old, &mut new] {
            value["parentUuid"] = Value::Null;
            value["message"]["content"] = Value::Null;
        }
        assert_eq!(old, new, "a line changed beyond its parent and content");
    }
}

#[test]
fn each_broken_claude_code_session_is_repaired_in_place_of_its_chain() {
    use claude_code::*;
    let mut cases: Vec<(&str, Vec<Value>, Vec<ChangeKind>)> = Vec::new();
    cases.push((
        "interrupted at the end",
        session().into_iter().take(5).collect(),
        vec![ChangeKind::AddedResult, ChangeKind::AddedResult],
    ));
    let mut mid = session();
    mid.remove(6);
    mid[6]["parentUuid"] = json!("r1");
    cases.push((
        "interrupted mid-history",
        mid,
        vec![ChangeKind::AddedResult],
    ));
    // The parallel results re-parented off the chain: the second's parent
    // is the reply, and the chain goes on from the first.
    let mut branch = session();
    branch[6]["parentUuid"] = json!("a3");
    branch[7]["parentUuid"] = json!("r1");
    cases.push((
        "results on a side branch",
        branch,
        vec![ChangeKind::BroughtBack],
    ));
    let mut twice = session();
    let mut again = result("r1b", "r2", "toolu_B");
    again["uuid"] = json!("r3");
    twice.insert(7, again);
    twice[8]["parentUuid"] = json!("r3");
    cases.push((
        "a duplicated result",
        twice,
        vec![ChangeKind::DroppedDuplicate],
    ));
    let mut order = session();
    order.swap(5, 6);
    order[5]["parentUuid"] = json!("a3");
    order[6]["parentUuid"] = json!("r2");
    order[7]["parentUuid"] = json!("r1");
    cases.push(("results out of order", order, vec![ChangeKind::MovedResult]));
    // A lost line: the second call's entry. The chain a resume follows
    // starts after it; relinked, the conversation before is back, and the
    // result of the lost call answers nothing.
    let mut lost = session();
    lost.remove(3);
    cases.push((
        "a lost line",
        lost,
        vec![ChangeKind::Relinked, ChangeKind::DroppedOrphan],
    ));
    for (name, lines, kinds) in cases {
        let text = text_of(&lines);
        assert!(
            !History::read(&text, None).unwrap().check().is_empty(),
            "{name}: not broken"
        );
        let repaired = holds(&text, None);
        assert_eq!(repaired.format, Format::ClaudeCode);
        let found: Vec<ChangeKind> = repaired.changes.iter().map(|change| change.kind).collect();
        assert_eq!(found, kinds, "{name}: {:?}", repaired.changes);
        assert!(repaired.changes.iter().all(|change| change.line.is_some()));
        lines_kept(&text, &repaired.text);
        // Nothing said is lost (the dropped duplicate said what the first did).
        let before = texts_of_lines(&text);
        let after = texts_of_lines(&repaired.text);
        for text in &before {
            assert!(after.contains(text), "{name}: lost {text:?}");
        }
        // An added result is an entry like the session's own.
        for line in repaired.text.lines() {
            let value: Value = serde_json::from_str(line).unwrap();
            if line.contains(INTERRUPTED) {
                assert_eq!(value["type"], "user");
                assert_eq!(value["sessionId"], "0000-session");
                assert_eq!(value["message"]["content"][0]["is_error"], true);
                assert!(value["uuid"].as_str().is_some_and(|uuid| uuid.len() == 36));
            }
        }
        // The repair of the repair changes nothing.
        let again = holds(&repaired.text, None);
        assert!(again.changes.is_empty(), "{name}: {:?}", again.changes);
        assert_eq!(again.text, repaired.text);
    }
}

#[test]
fn broken_codex_rollouts_are_repaired() {
    use codex::*;
    let mut cases: Vec<(&str, Vec<Value>, Vec<ChangeKind>)> = Vec::new();
    let mut lost = rollout();
    lost.remove(7);
    cases.push((
        "a function_call without output",
        lost,
        vec![ChangeKind::AddedResult],
    ));
    cases.push((
        "interrupted at the end",
        rollout().into_iter().take(7).collect(),
        vec![ChangeKind::AddedResult, ChangeKind::AddedResult],
    ));
    let mut twice = rollout();
    twice.insert(9, output("call_1"));
    cases.push((
        "a duplicated output",
        twice,
        vec![ChangeKind::DroppedDuplicate],
    ));
    let mut swapped = rollout();
    swapped.swap(7, 8);
    cases.push((
        "outputs out of order",
        swapped,
        vec![ChangeKind::MovedResult],
    ));
    for (name, lines, kinds) in cases {
        let text = claude_code::text_of(&lines);
        let repaired = holds(&text, None);
        assert_eq!(repaired.format, Format::Codex);
        let found: Vec<ChangeKind> = repaired.changes.iter().map(|change| change.kind).collect();
        assert_eq!(found, kinds, "{name}: {:?}", repaired.changes);
        // Every line kept is kept byte for byte.
        for line in text.lines() {
            let value: Value = serde_json::from_str(line).unwrap();
            let dropped = name == "a duplicated output" && value == output("call_1");
            assert!(
                dropped || repaired.text.lines().any(|kept| kept == line),
                "{name}: {line}"
            );
        }
        if name == "interrupted at the end" {
            // The custom tool's call gets a custom output.
            assert!(
                repaired
                    .text
                    .contains(r#""type":"custom_tool_call_output""#)
            );
        }
    }
}

#[test]
fn what_is_not_a_history_is_not_repaired() {
    assert!(repair("", None).is_err());
    assert!(repair("{\"messages\": 3}", None).is_err());
    assert!(repair("not json", Some(Format::Anthropic)).is_err());
    assert!(repair("{}\n", Some(Format::ClaudeCode)).is_err());
}

/// `subloop repair FILE -o OUT`: the changes on stderr, OUT passes
/// `subloop check`, FILE is untouched; `-o FILE` and a subloop trace are
/// refused (exit 2); `--json` and `-o -`.
#[test]
fn subloop_repair_writes_a_new_file_that_checks_and_never_touches_the_original() {
    use claude_code::*;
    let dir = crate::common::TempDir::new("repair-cli");
    let mut branch = session();
    branch[6]["parentUuid"] = json!("a3");
    branch[7]["parentUuid"] = json!("r1");
    let text = text_of(&branch);
    let file = dir.write("session.jsonl", &text);
    let out_file = dir.path().join("repaired.jsonl");
    let subloop = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(crate::common::bin())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, stderr) = subloop(&[
        "repair".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        out_file.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("[brought_back]"), "{stderr}");
    assert!(
        stderr.contains("1 change(s); it holds (claude-code)"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    let (code, stdout, _) = subloop(&["check".as_ref(), out_file.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}");
    let (code, stdout, _) = subloop(&["check".as_ref(), file.as_os_str()]);
    assert_eq!(code, Some(1), "{stdout}");
    // Over the original: refused, untouched.
    let (code, _, stderr) = subloop(&[
        "repair".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        file.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("never over the original"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // --json, and the repair on stdout.
    let (code, stdout, stderr) = subloop(&[
        "repair".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        "-".as_ref(),
        "--json".as_ref(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, std::fs::read_to_string(&out_file).unwrap());
    let report: Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(report["held"], true);
    assert_eq!(report["format"], "claude-code");
    assert_eq!(report["changes"][0]["kind"], "brought_back");
    assert_eq!(report["changes"][0]["line"], 7);
    // A sound history: nothing to repair, the same bytes.
    let sound = dir.write("sound.json", anthropic_session().to_string());
    let same = dir.path().join("same.json");
    let (code, _, stderr) = subloop(&[
        "repair".as_ref(),
        sound.as_os_str(),
        "-o".as_ref(),
        same.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("nothing to repair"), "{stderr}");
    assert_eq!(
        std::fs::read(&same).unwrap(),
        std::fs::read(&sound).unwrap()
    );
    // A subloop trace, a missing file, bad flags: exit 2.
    let trace = dir.write(
        "trace.jsonl",
        "{\"agent\":\"parent\",\"kind\":\"outcome\",\"status\":\"answered\",\"text\":\"x\"}\n",
    );
    for args in [
        vec![trace.as_os_str(), "-o".as_ref(), same.as_os_str()],
        vec!["missing.json".as_ref(), "-o".as_ref(), same.as_os_str()],
        vec![file.as_os_str()],
        vec![
            file.as_os_str(),
            "-o".as_ref(),
            same.as_os_str(),
            "--format".as_ref(),
            "yaml".as_ref(),
        ],
        vec![
            file.as_os_str(),
            file.as_os_str(),
            "-o".as_ref(),
            same.as_os_str(),
        ],
    ] {
        let mut all: Vec<&std::ffi::OsStr> = vec!["repair".as_ref()];
        all.extend(args);
        let (code, _, stderr) = subloop(&all);
        assert_eq!(code, Some(2), "{all:?}: {stderr}");
        assert!(stderr.contains("repair"), "{stderr}");
    }
    assert!(!dir.path().join(".same.json.subloop-repair").exists());
}

proptest::proptest! {
    #![proptest_config(crate::common::proptest_config(256, "proptest-regressions/repair.txt"))]

    /// For each format: a sound generated history holds and repairs to
    /// itself; one mutation is reported at its place; its repair holds,
    /// keeps every text, and repairing it again changes nothing.
    #[test]
    fn every_broken_history_is_found_where_it_breaks_and_repaired(
        sound in subloop::testing::every_format().prop_flat_map(subloop::testing::sound_history),
        broken in subloop::testing::every_format().prop_flat_map(subloop::testing::broken_history),
    ) {
        use proptest::{prop_assert, prop_assert_eq};
        let history = History::read(&sound.text, None).unwrap();
        prop_assert_eq!(history.format, sound.format);
        prop_assert!(history.check().is_empty(), "{:?}", history.check());
        let same = repair(&sound.text, None).unwrap();
        prop_assert_eq!(&same.text, &sound.text);

        let breach = broken.breach.clone().unwrap();
        let found = History::read(&broken.text, Some(broken.format)).unwrap().check();
        prop_assert!(found.iter().any(|finding| breach.is(finding)), "{:?} not in {:?}\n{}", breach, found, broken.text);
        let repaired = repair(&broken.text, Some(broken.format)).unwrap();
        prop_assert!(repaired.remaining.is_empty(), "{:?}\n{}", repaired.remaining, repaired.text);
        prop_assert!(!repaired.changes.is_empty());
        for text in &broken.texts {
            prop_assert!(repaired.text.contains(text.as_str()), "lost {:?}", text);
        }
        let again = repair(&repaired.text, Some(broken.format)).unwrap();
        prop_assert!(again.changes.is_empty(), "{:?}", again.changes);
    }
}

/// A session written with `\r\n` line ends keeps them, on the lines the
/// repair edits too.
#[test]
fn a_session_with_crlf_line_ends_keeps_them() {
    use claude_code::*;
    let mut branch = session();
    branch[6]["parentUuid"] = json!("a3");
    branch[7]["parentUuid"] = json!("r1");
    let text = text_of(&branch).replace('\n', "\r\n");
    let repaired = holds(&text, None);
    assert_eq!(repaired.changes.len(), 1, "{:?}", repaired.changes);
    assert!(repaired.text.ends_with("\r\n"));
    assert_eq!(
        repaired.text.matches("\r\n").count(),
        repaired.text.matches('\n').count(),
        "every line ends in \\r\\n:\n{}",
        repaired.text
    );
}

/// JSON nested deeper than any reader follows, in a line of a session, a
/// block of a request history and a rollout's payload: read, checked,
/// repaired and shown without a stack overflow (serde_json stops at its
/// depth limit; the line or the file is then not a history).
#[test]
fn deeply_nested_json_is_refused_or_skipped_not_a_crash() {
    let deep = format!("{}1{}", "[".repeat(200_000), "]".repeat(200_000));
    let mut session = claude_code::text_of(&claude_code::session());
    session.push_str(&format!(
        "{{\"type\":\"user\",\"uuid\":\"z\",\"parentUuid\":\"a4\",\"message\":{{\"role\":\"user\",\"content\":{deep}}}}}\n"
    ));
    let body = format!(
        "{{\"messages\":[{{\"role\":\"user\",\"content\":[{{\"type\":\"text\",\"text\":{deep}}}]}}]}}"
    );
    let rollout = format!(
        "{}{{\"type\":\"response_item\",\"payload\":{deep}}}\n",
        claude_code::text_of(&codex::rollout())
    );
    for text in [&session, &body, &rollout, &deep] {
        for format in [
            None,
            Some(Format::Anthropic),
            Some(Format::OpenAi),
            Some(Format::ClaudeCode),
            Some(Format::Codex),
        ] {
            if let Ok(history) = History::read(text, format) {
                let _ = history.check();
            }
            let _ = repair(text, format);
            let _ = subloop::record::foreign::Foreign::read(text, format, &[]);
        }
    }
    // The session's deep line is no entry: the rest holds.
    let history = History::read(&session, None).unwrap();
    assert!(history.check().is_empty(), "{:?}", history.check());
}

/// Damage of any kind at once, as a crash or a careless edit leaves it:
/// lines (or messages) dropped, written twice, swapped, and (Claude Code)
/// re-parented anywhere.
#[derive(Debug, Clone)]
enum Damage {
    Drop(proptest::sample::Index),
    Twice(proptest::sample::Index),
    Swap(proptest::sample::Index),
    Reparent(proptest::sample::Index, proptest::sample::Index),
}

fn damage() -> impl Strategy<Value = Damage> {
    use proptest::prelude::*;
    prop_oneof![
        any::<proptest::sample::Index>().prop_map(Damage::Drop),
        any::<proptest::sample::Index>().prop_map(Damage::Twice),
        any::<proptest::sample::Index>().prop_map(Damage::Swap),
        (
            any::<proptest::sample::Index>(),
            any::<proptest::sample::Index>()
        )
            .prop_map(|(at, to)| Damage::Reparent(at, to)),
    ]
}

/// `items` (lines, or messages) damaged.
fn damaged(mut items: Vec<Value>, damages: &[Damage]) -> Vec<Value> {
    for damage in damages {
        if items.len() < 2 {
            break;
        }
        match damage {
            Damage::Drop(at) => {
                items.remove(at.index(items.len()));
            }
            Damage::Twice(at) => {
                let at = at.index(items.len());
                items.insert(at, items[at].clone());
            }
            Damage::Swap(at) => {
                let at = at.index(items.len() - 1);
                items.swap(at, at + 1);
            }
            Damage::Reparent(at, to) => {
                let to = items[to.index(items.len())]["uuid"].clone();
                let at = at.index(items.len());
                if items[at].get("parentUuid").is_some() {
                    items[at]["parentUuid"] = to;
                }
            }
        }
    }
    items
}

proptest::proptest! {
    #![proptest_config(crate::common::proptest_config(256, "proptest-regressions/repair.txt"))]

    /// A history of any format damaged in several ways at once still reads,
    /// and its repair holds and is a fixed point.
    #[test]
    fn any_damage_at_once_is_repaired_to_a_history_that_holds(
        sound in subloop::testing::every_format().prop_flat_map(subloop::testing::sound_history),
        damages in proptest::collection::vec(damage(), 1..6),
    ) {
        use proptest::prop_assert;
        let text = match sound.format {
            Format::ClaudeCode | Format::Codex => {
                let lines: Vec<Value> = sound.text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
                claude_code::text_of(&damaged(lines, &damages))
            }
            _ => {
                let mut value: Value = serde_json::from_str(&sound.text).unwrap();
                let messages = value.get_mut("messages").cloned().unwrap_or(value.clone());
                let broken = Value::Array(damaged(messages.as_array().unwrap().clone(), &damages));
                if value.get("messages").is_some() {
                    value["messages"] = broken;
                    value.to_string()
                } else {
                    broken.to_string()
                }
            }
        };
        let repaired = match repair(&text, Some(sound.format)) {
            Ok(repaired) => repaired,
            Err(err) => {
                // Nothing of a history left (every entry dropped): refused.
                prop_assert!(History::read(&text, Some(sound.format)).is_err(), "{}\n{}", err, text);
                return Ok(());
            }
        };
        prop_assert!(repaired.remaining.is_empty(), "{:?}\n{}\nfrom\n{}", repaired.remaining, repaired.text, text);
        match repair(&repaired.text, Some(sound.format)) {
            Ok(again) => prop_assert!(again.changes.is_empty(), "{:?}\n{}", again.changes, repaired.text),
            // Every entry dropped (each held only results for no call):
            // nothing is left to read.
            Err(_) => prop_assert!(History::read(&repaired.text, Some(sound.format)).is_err()),
        }
    }
}
