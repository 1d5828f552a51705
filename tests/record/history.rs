//! The pairing rules over histories other programs keep: a Messages API
//! request body and a Chat Completions `messages` array, read by the
//! library and checked by the rules `view --check` holds subloop's traces
//! to. Fixtures are written here, small: parallel calls, a thinking block,
//! an MCP tool, an interrupted call at the end and mid-history, a
//! duplicated result, results out of order, an orphan result. Generated
//! histories are held; one mutation that breaks the pairing is reported at
//! its place; arbitrary text is an error or a history, never a panic.

use proptest::prelude::*;
use serde_json::{Value, json};
use subloop::record::history::{Format, History, Rule};

fn rules(history: &History) -> Vec<(Rule, usize, Option<String>)> {
    history
        .check()
        .into_iter()
        .map(|finding| (finding.rule, finding.message, finding.id))
        .collect()
}

fn read(value: &Value, format: Option<Format>) -> History {
    History::read(&value.to_string(), format).expect("a history")
}

fn tool_use(id: &str, name: &str) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": {"path": "a.txt"}})
}

pub(crate) fn tool_result(id: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": "alpha"})
}

/// A Messages API session: parallel calls (one of them an MCP tool's), a
/// thinking block, text after the results, and an answer.
pub(crate) fn anthropic_session() -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": [
        {"role": "user", "content": "Read a.txt and ask the notes server."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Two reads at once.", "signature": "c2ln"},
            tool_use("toolu_01", "read_file"),
            tool_use("toolu_02", "mcp__notes__search")]},
        {"role": "user", "content": [tool_result("toolu_01"), tool_result("toolu_02"),
            {"type": "text", "text": "Be brief."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Both say alpha."}]},
        {"role": "user", "content": "And b.txt?"}
    ]})
}

#[test]
fn a_sound_messages_api_session_holds() {
    let history = read(&anthropic_session(), None);
    assert_eq!(history.format, Format::Anthropic);
    assert_eq!(history.turns.len(), 5);
    assert_eq!(history.turns[1].calls.len(), 2);
    assert!(rules(&history).is_empty(), "{:?}", history.check());
    // The bare `messages` array reads the same.
    let bare = read(&anthropic_session()["messages"], Some(Format::Anthropic));
    assert_eq!(bare.turns, history.turns);
}

pub(crate) type Expected<'a> = Vec<(Rule, usize, Option<&'a str>)>;

/// Each broken Messages API case: its name, the body, what is found.
pub(crate) fn broken_anthropic() -> Vec<(&'static str, Value, Expected<'static>)> {
    let mut cases: Vec<(&str, Value, Expected)> = Vec::new();
    // Interrupted at the end: the last reply's calls have no result.
    let mut end = anthropic_session();
    end["messages"].as_array_mut().unwrap().truncate(2);
    cases.push((
        "interrupted at the end",
        end,
        vec![
            (Rule::CallWithoutResult, 1, Some("toolu_01")),
            (Rule::CallWithoutResult, 1, Some("toolu_02")),
        ],
    ));
    // Interrupted mid-history: one result lost, the session went on.
    let mut mid = anthropic_session();
    mid["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    cases.push((
        "interrupted mid-history",
        mid,
        vec![(Rule::CallWithoutResult, 1, Some("toolu_02"))],
    ));
    // A result twice.
    let mut twice = anthropic_session();
    twice["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .insert(2, tool_result("toolu_01"));
    cases.push((
        "a duplicated result",
        twice,
        vec![(Rule::DuplicateId, 2, Some("toolu_01"))],
    ));
    // Results in another order than the calls.
    let mut order = anthropic_session();
    order["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .swap(0, 1);
    cases.push((
        "results out of order",
        order,
        vec![(Rule::ResultsOutOfOrder, 2, None)],
    ));
    // A result nobody asked for.
    let mut orphan = anthropic_session();
    orphan["messages"][4] = json!({"role": "user", "content": [tool_result("toolu_99")]});
    cases.push((
        "an orphan result",
        orphan,
        vec![(Rule::ResultWithoutCall, 4, Some("toolu_99"))],
    ));
    // A result a message late: the user spoke in between.
    let mut late = anthropic_session();
    let messages = late["messages"].as_array_mut().unwrap();
    let results = messages.remove(2);
    messages.insert(2, json!({"role": "user", "content": "wait"}));
    messages.insert(3, results);
    cases.push((
        "results a message late",
        late,
        vec![
            (Rule::ResultNotNext, 3, Some("toolu_01")),
            (Rule::ResultNotNext, 3, Some("toolu_02")),
        ],
    ));
    // Two calls of one reply with one id.
    let mut same = anthropic_session();
    same["messages"][1]["content"][2]["id"] = json!("toolu_01");
    same["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    cases.push((
        "one id twice in a reply",
        same,
        vec![(Rule::DuplicateId, 1, Some("toolu_01"))],
    ));
    cases
}

#[test]
fn each_broken_messages_api_case_is_named_where_it_is() {
    for (name, value, expected) in broken_anthropic() {
        let history = read(&value, None);
        let expected: Vec<(Rule, usize, Option<String>)> = expected
            .into_iter()
            .map(|(rule, message, id)| (rule, message, id.map(str::to_owned)))
            .collect();
        assert_eq!(rules(&history), expected, "{name}: {:?}", history.check());
        for finding in history.check() {
            assert!(!finding.detail.is_empty());
        }
    }
}

/// A Chat Completions session: a system message, parallel `tool_calls`,
/// their `tool` messages, an answer.
pub(crate) fn openai_session() -> Value {
    json!([
        {"role": "system", "content": "You read files."},
        {"role": "user", "content": "Read a.txt and b.txt."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"b.txt\"}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "alpha"},
        {"role": "tool", "tool_call_id": "call_b", "content": "beta"},
        {"role": "assistant", "content": "alpha and beta"}
    ])
}

#[test]
fn a_sound_chat_completions_session_holds_and_its_breaks_are_named() {
    let history = read(&openai_session(), None);
    assert_eq!(history.format, Format::OpenAi);
    // system is no turn; the two tool messages are one.
    assert_eq!(history.turns.len(), 4);
    assert!(rules(&history).is_empty(), "{:?}", history.check());
    let body = json!({"model": "gpt-test", "messages": openai_session()});
    assert_eq!(read(&body, Some(Format::OpenAi)).turns, history.turns);

    // A function_call without output ("No tool output found for function call").
    let mut lost = openai_session();
    lost.as_array_mut().unwrap().remove(4);
    let history = read(&lost, None);
    assert_eq!(
        rules(&history),
        [(Rule::CallWithoutResult, 2, Some("call_b".to_owned()))]
    );
    // A tool message for an unknown call, found at its own index.
    let mut orphan = openai_session();
    orphan.as_array_mut().unwrap()[4]["tool_call_id"] = json!("call_z");
    let history = read(&orphan, None);
    assert_eq!(
        rules(&history),
        [
            (Rule::CallWithoutResult, 2, Some("call_b".to_owned())),
            (Rule::ResultWithoutCall, 4, Some("call_z".to_owned())),
        ]
    );
}

#[test]
fn what_is_not_a_history_is_an_error_that_says_why() {
    for (text, says) in [
        ("{", "not JSON"),
        ("42", "neither a request body nor a `messages` array"),
        ("{\"model\": \"m\"}", "without a `messages` array"),
        ("[{\"content\": \"hi\"}]", "message 0: no `role`"),
        (
            "[{\"role\": \"robot\", \"content\": \"hi\"}]",
            "message 0: role \"robot\"",
        ),
        (
            "[{\"role\": \"user\", \"content\": 7}]",
            "message 0: `content` is neither",
        ),
        (
            "[{\"role\": \"tool\", \"content\": \"x\"}]",
            "without `tool_call_id`",
        ),
    ] {
        let err = History::read(text, None).expect_err(text);
        assert!(err.to_string().contains(says), "{text}: {err}");
    }
}

/// A generated sound Messages API history: rounds of 1–3 calls answered
/// in order, with text between.
fn sound_rounds() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..4, 0..6)
}

fn anthropic_of(rounds: &[usize]) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "go"})];
    let mut next = 0;
    for calls in rounds {
        let ids: Vec<String> = (0..*calls)
            .map(|_| {
                next += 1;
                format!("toolu_{next}")
            })
            .collect();
        messages.push(json!({"role": "assistant", "content":
            ids.iter().map(|id| tool_use(id, "read_file")).collect::<Vec<_>>()}));
        messages.push(json!({"role": "user", "content":
            ids.iter().map(|id| tool_result(id)).collect::<Vec<_>>()}));
    }
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages
}

proptest! {
    #![proptest_config(crate::common::proptest_config(128, "proptest-regressions/history.txt"))]

    /// A sound history holds; dropping one result is a call without a
    /// result at its call's message; moving a result of one round into the
    /// next is a result not next, at the message it moved to.
    #[test]
    fn one_broken_pairing_is_reported_at_its_place(
        rounds in sound_rounds(),
        pick in any::<prop::sample::Index>(),
    ) {
        let messages = anthropic_of(&rounds);
        let history = read(&json!(messages), None);
        prop_assert!(history.check().is_empty(), "{:?}", history.check());
        let results: Vec<(usize, usize)> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m["role"] == "user" && m["content"].is_array())
            .flat_map(|(index, m)| (0..m["content"].as_array().map_or(0, Vec::len)).map(move |b| (index, b)))
            .collect();
        if results.is_empty() {
            return Ok(());
        }
        let (at, block) = results[pick.index(results.len())];
        let mut dropped = messages.clone();
        let removed = dropped[at]["content"].as_array_mut().unwrap().remove(block);
        let id = removed["tool_use_id"].as_str().unwrap().to_owned();
        let history = read(&json!(dropped), None);
        prop_assert_eq!(rules(&history), vec![(Rule::CallWithoutResult, at - 1, Some(id.clone()))]);
        // Into the next results message, when there is one: not next.
        if let Some(&(later, _)) = results.iter().find(|(index, _)| *index > at) {
            let mut moved = dropped.clone();
            moved[later]["content"].as_array_mut().unwrap().push(removed);
            let history = read(&json!(moved), None);
            prop_assert_eq!(rules(&history), vec![(Rule::ResultNotNext, later, Some(id))]);
        }
    }

    /// Any text: a history or an error, never a panic.
    #[test]
    fn arbitrary_text_is_read_or_refused(text in ".{0,200}", bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = History::read(&text, None).map(|history| history.check());
        let _ = History::read(&String::from_utf8_lossy(&bytes), Some(Format::OpenAi)).map(|history| history.check());
        let _ = History::read(&String::from_utf8_lossy(&bytes), Some(Format::Anthropic)).map(|history| history.check());
    }

    /// Arbitrary JSON shaped like messages: read or refused, never a panic.
    #[test]
    fn arbitrary_message_shapes_are_read_or_refused(value in subloop::testing::json_value()) {
        for wrapped in [json!([value.clone()]), json!({"messages": [value.clone()]}), value.clone()] {
            for format in [None, Some(Format::Anthropic), Some(Format::OpenAi)] {
                let _ = History::read(&wrapped.to_string(), format).map(|history| history.check());
            }
        }
    }
}

/// `subloop check`: a verdict per file, the rule and place of each breach,
/// a subloop trace by every rule of `view --check`, `--json` lines, and
/// the exit status (0 held, 1 broken, 2 unreadable).
#[test]
fn subloop_check_gives_a_verdict_per_file_and_the_exit_status() {
    let dir = crate::common::TempDir::new("check-cli");
    let sound = dir.write("sound.json", anthropic_session().to_string());
    let mut broken = openai_session();
    broken.as_array_mut().unwrap().remove(4);
    let broken = dir.write("broken.json", broken.to_string());
    let unreadable = dir.write("unreadable.json", "{\"model\": \"m\"}");
    let check = |args: &[&std::path::Path], extra: &[&str]| {
        let out = std::process::Command::new(crate::common::bin())
            .arg("check")
            .args(args)
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = check(&[&sound], &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.ends_with("sound.json: held (anthropic)\n"), "{text}");
    let (code, text) = check(&[&sound, &broken], &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("broken.json: broken (openai): 1 place(s)\n    message 2: the call call_b (read_file) has no result: the next message must hold one [call_without_result]"),
        "{text}"
    );
    let (code, text) = check(&[&broken, &unreadable], &["--json"]);
    assert_eq!(code, Some(2), "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines[0]["held"], false);
    assert_eq!(lines[0]["findings"][0]["rule"], "call_without_result");
    assert_eq!(lines[0]["findings"][0]["message"], 2);
    assert_eq!(lines[0]["findings"][0]["id"], "call_b");
    assert!(
        lines[1]["error"]
            .as_str()
            .unwrap()
            .contains("without a `messages` array")
    );
    // The format forced: a Chat Completions history read as the Messages
    // API's is refused message by message.
    let (code, text) = check(&[&broken], &["--format", "anthropic"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("message 0: role \"system\""), "{text}");
    // A Claude Code session whose second result went off the chain.
    let mut branch = claude_code::session();
    branch[6]["parentUuid"] = json!("a3");
    branch[7]["parentUuid"] = json!("r1");
    let session = dir.write("session.jsonl", claude_code::text_of(&branch));
    let (code, text) = check(&[&session], &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("session.jsonl: broken (claude-code): 2 place(s)"),
        "{text}"
    );
    assert!(
        text.contains(
            "line 5, message 1: the call toolu_B (mcp__tracker__get_issue) has no result"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "line 7, message 1: the result for toolu_B is on line 7, an entry off the chain"
        ),
        "{text}"
    );
    // Its subagent, a file of its own beside it, interrupted at the end.
    let agent: Vec<Value> = claude_code::session().into_iter().take(5).collect();
    dir.write(
        "session/subagents/agent-a1b2.jsonl",
        claude_code::text_of(&agent),
    );
    dir.write("session/subagents/notes.txt", "not a session");
    let (code, text) = check(&[&session], &["--json"]);
    assert_eq!(code, Some(1), "{text}");
    let verdicts: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(verdicts.len(), 2, "{text}");
    assert!(
        verdicts[1]["file"]
            .as_str()
            .unwrap()
            .ends_with("session/subagents/agent-a1b2.jsonl")
    );
    // Its two calls without results, and no call of the session started it.
    let rules: Vec<&str> = verdicts[1]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|finding| finding["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        [
            "call_without_result",
            "call_without_result",
            "child_without_call"
        ],
        "{text}"
    );
    // A codex rollout with a function_call without output.
    let mut lost = codex::rollout();
    lost.remove(7);
    let rollout = dir.write("rollout-x.jsonl", claude_code::text_of(&lost));
    let (code, text) = check(&[&rollout], &["--json"]);
    assert_eq!(code, Some(1), "{text}");
    let verdict: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(verdict["format"], "codex");
    assert_eq!(verdict["findings"][0]["line"], 6);
    assert_eq!(verdict["findings"][0]["id"], "call_1");
    // A subloop trace: every rule of `view --check`.
    let trace = dir.path().join("demo.jsonl");
    let demo = std::process::Command::new(crate::common::bin())
        .args(["demo", "--quiet", "--decision", "deny", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(demo.status.code(), Some(0));
    let (code, text) = check(&[&trace], &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("demo.jsonl: held (subloop)"), "{text}");
    let mut lines: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // A request that lost the result of the parent's first call.
    let second = lines
        .iter_mut()
        .find(|line| line["kind"] == "request" && line["agent"] == "parent" && line["call"] == 2)
        .unwrap();
    second["messages"][1]["content"]
        .as_array_mut()
        .unwrap()
        .clear();
    second["messages"][1]["content"] = json!([{"type": "text", "text": "lost"}]);
    let edited: String = lines.iter().map(|line| format!("{line}\n")).collect();
    let edited = dir.write("edited.jsonl", edited);
    let (code, text) = check(&[&edited], &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("[call_without_result]") || text.contains("has no result"),
        "{text}"
    );
}

/// Claude Code session lines, written here: each entry threaded by
/// `uuid`/`parentUuid`, one API message split over lines sharing
/// `message.id`, each parallel result a line of its own.
pub(crate) mod claude_code {
    use super::*;

    pub fn entry(kind: &str, uuid: &str, parent: Option<&str>, message: Value) -> Value {
        json!({"parentUuid": parent, "isSidechain": false, "userType": "external",
               "cwd": "/home/user/project", "sessionId": "0000-session", "version": "2.1.0",
               "type": kind, "message": message, "uuid": uuid,
               "timestamp": "2026-12-01T10:00:00.000Z"})
    }

    pub fn user_text(uuid: &str, parent: Option<&str>, text: &str) -> Value {
        entry(
            "user",
            uuid,
            parent,
            json!({"role": "user", "content": text}),
        )
    }

    pub fn assistant(uuid: &str, parent: &str, id: &str, block: Value) -> Value {
        entry(
            "assistant",
            uuid,
            Some(parent),
            json!({"id": id, "type": "message",
            "role": "assistant", "model": "claude-sonnet-4-5", "content": [block],
            "stop_reason": null, "usage": {"input_tokens": 10, "output_tokens": 2}}),
        )
    }

    pub fn result(uuid: &str, parent: &str, call: &str) -> Value {
        let mut line = entry(
            "user",
            uuid,
            Some(parent),
            json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call, "content": "ok"}]}),
        );
        line["toolUseResult"] = json!({"stdout": "ok", "stderr": "", "interrupted": false});
        line
    }

    /// A sound session: a prompt, a reply split over three lines
    /// (thinking, two parallel calls, one an MCP tool's), the two results
    /// each on a line, an answer; and lines that are no entries.
    pub fn session() -> Vec<Value> {
        vec![
            json!({"type": "file-history-snapshot", "messageId": "u1", "snapshot": {}, "isSnapshotUpdate": false}),
            user_text("u1", None, "Look at the issue and the file."),
            assistant(
                "a1",
                "u1",
                "msg_1",
                json!({"type": "thinking", "thinking": "Two at once.", "signature": "c2ln"}),
            ),
            assistant(
                "a2",
                "a1",
                "msg_1",
                json!({"type": "tool_use", "id": "toolu_A", "name": "Read", "input": {"file_path": "/home/user/project/a.rs"}}),
            ),
            assistant(
                "a3",
                "a2",
                "msg_1",
                json!({"type": "tool_use", "id": "toolu_B", "name": "mcp__tracker__get_issue", "input": {"id": 7}}),
            ),
            result("r1", "a3", "toolu_A"),
            result("r2", "r1", "toolu_B"),
            assistant(
                "a4",
                "r2",
                "msg_2",
                json!({"type": "text", "text": "The file fixes the issue."}),
            ),
            json!({"type": "summary", "summary": "Issue and file", "leafUuid": "a4"}),
        ]
    }

    pub fn text_of(lines: &[Value]) -> String {
        lines.iter().map(|line| format!("{line}\n")).collect()
    }
}

#[test]
fn a_sound_claude_code_session_holds() {
    let text = claude_code::text_of(&claude_code::session());
    let history = History::read(&text, None).expect("a session");
    assert_eq!(history.format, Format::ClaudeCode);
    // The prompt, one reply of three lines, one turn of two results, the answer.
    assert_eq!(history.turns.len(), 4);
    assert_eq!(history.turns[1].calls.len(), 2);
    assert_eq!(history.turns[1].calls[1].line, Some(5));
    assert_eq!(history.turns[2].results.len(), 2);
    assert!(history.check().is_empty(), "{:?}", history.check());
    // Read line by line from a reader, the same.
    let streamed = History::read_claude_code(std::io::Cursor::new(text.as_bytes())).unwrap();
    assert_eq!(streamed, history);
}

#[test]
fn broken_claude_code_sessions_are_named_by_line() {
    use claude_code::*;
    let findings = |lines: &[Value]| -> Vec<(Rule, Option<usize>, Option<String>)> {
        History::read(&text_of(lines), Some(Format::ClaudeCode))
            .unwrap()
            .check()
            .into_iter()
            .map(|finding| (finding.rule, finding.line, finding.id))
            .collect()
    };
    // Interrupted at the end: the session stopped after the calls.
    let end: Vec<Value> = session().into_iter().take(5).collect();
    assert_eq!(
        findings(&end),
        [
            (Rule::CallWithoutResult, Some(4), Some("toolu_A".to_owned())),
            (Rule::CallWithoutResult, Some(5), Some("toolu_B".to_owned())),
        ]
    );
    // Interrupted mid-history: one result never written, the user went on.
    let mut mid = session();
    mid.remove(6);
    mid[6]["parentUuid"] = json!("r1");
    assert_eq!(
        findings(&mid),
        [(Rule::CallWithoutResult, Some(5), Some("toolu_B".to_owned()))]
    );
    // Results on a side branch: the second result's parent is the reply,
    // not the first result, and the chain goes on from the first.
    let mut branch = session();
    branch[6]["parentUuid"] = json!("a3");
    branch[7]["parentUuid"] = json!("r1");
    assert_eq!(
        findings(&branch),
        [
            (Rule::CallWithoutResult, Some(5), Some("toolu_B".to_owned())),
            (Rule::ResultOffChain, Some(7), Some("toolu_B".to_owned())),
        ]
    );
    // A duplicated result line.
    let mut twice = session();
    let mut again = result("r1b", "r2", "toolu_B");
    again["uuid"] = json!("r3");
    twice.insert(7, again);
    twice[8]["parentUuid"] = json!("r3");
    assert_eq!(
        findings(&twice),
        [(Rule::DuplicateId, Some(8), Some("toolu_B".to_owned()))]
    );
}

#[test]
fn a_claude_code_compaction_starts_the_chain_again_and_side_chains_are_left_out() {
    use claude_code::*;
    let mut lines: Vec<Value> = session().into_iter().take(5).collect();
    // Compacted after the unanswered calls: the boundary has no parent,
    // and the summary follows it.
    lines.push(json!({"parentUuid": null, "logicalParentUuid": "a3", "isSidechain": false,
        "type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
        "uuid": "c1", "sessionId": "0000-session", "compactMetadata": {"trigger": "auto", "preTokens": 150000}}));
    let mut summary = user_text(
        "s1",
        Some("c1"),
        "This session is being continued from a previous conversation.",
    );
    summary["isCompactSummary"] = json!(true);
    lines.push(summary);
    lines.push(assistant(
        "a5",
        "s1",
        "msg_3",
        json!({"type": "text", "text": "Going on."}),
    ));
    // A side chain (a subagent's, in the same file) with a call of its own.
    let mut side = assistant(
        "x1",
        "a3",
        "msg_x",
        json!({"type": "tool_use", "id": "toolu_X", "name": "Grep", "input": {}}),
    );
    side["isSidechain"] = json!(true);
    lines.push(side);
    let history = History::read(&text_of(&lines), None).unwrap();
    assert_eq!(history.compactions, 1);
    assert_eq!(history.turns.len(), 2, "{:?}", history.turns);
    assert!(history.check().is_empty(), "{:?}", history.check());
}

/// A generated Claude Code session: rounds of 1–3 parallel calls, each
/// call a line of the reply and each result a line of its own, chained.
fn claude_session(rounds: &[usize]) -> Vec<Value> {
    use claude_code::*;
    let mut lines = vec![user_text("u0", None, "go")];
    let mut parent = "u0".to_owned();
    let mut n = 0;
    for (round, calls) in rounds.iter().enumerate() {
        let mut ids = Vec::new();
        for _ in 0..*calls {
            n += 1;
            let uuid = format!("a{n}");
            let id = format!("toolu_{n}");
            lines.push(assistant(
                &uuid,
                &parent,
                &format!("msg_{round}"),
                json!({"type": "tool_use", "id": id, "name": "Read", "input": {}}),
            ));
            parent = uuid;
            ids.push(id);
        }
        for id in ids {
            let uuid = format!("r_{id}");
            lines.push(result(&uuid, &parent, &id));
            parent = uuid;
        }
    }
    lines.push(assistant(
        "end",
        &parent,
        "msg_end",
        json!({"type": "text", "text": "done"}),
    ));
    lines
}

proptest! {
    #![proptest_config(crate::common::proptest_config(96, "proptest-regressions/history.txt"))]

    /// A sound generated session holds; one result line dropped (the next
    /// line re-parented past it, as an interrupted write leaves it) is a
    /// call without a result on the call's own line.
    #[test]
    fn one_lost_claude_code_result_is_reported_on_its_calls_line(
        rounds in prop::collection::vec(1usize..4, 1..5),
        pick in any::<prop::sample::Index>(),
    ) {
        let lines = claude_session(&rounds);
        let text = claude_code::text_of(&lines);
        let history = History::read(&text, None).unwrap();
        prop_assert!(history.check().is_empty(), "{:?}", history.check());
        let results: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, line)| line["toolUseResult"].is_object())
            .map(|(index, _)| index)
            .collect();
        let at = results[pick.index(results.len())];
        let mut cut = lines.clone();
        let removed = cut.remove(at);
        if let Some(next) = cut.get_mut(at) {
            next["parentUuid"] = removed["parentUuid"].clone();
        }
        let id = removed["message"]["content"][0]["tool_use_id"].as_str().unwrap().to_owned();
        let call_line = lines
            .iter()
            .position(|line| line["message"]["content"][0]["id"] == json!(id))
            .unwrap() + 1;
        let history = History::read(&claude_code::text_of(&cut), None).unwrap();
        let found: Vec<(Rule, Option<usize>, Option<String>)> = history
            .check()
            .into_iter()
            .map(|finding| (finding.rule, finding.line, finding.id))
            .collect();
        prop_assert_eq!(found, vec![(Rule::CallWithoutResult, Some(call_line), Some(id))]);
    }

    /// Arbitrary lines: a session or an error, never a panic.
    #[test]
    fn arbitrary_claude_code_lines_are_read_or_refused(values in prop::collection::vec(subloop::testing::json_value(), 0..8)) {
        let text: String = values.iter().map(|value| format!("{value}\n")).collect();
        let _ = History::read(&text, Some(Format::ClaudeCode)).map(|history| history.check());
    }
}

/// codex rollout lines, written here.
pub(crate) mod codex {
    use super::*;

    pub fn item(payload: Value) -> Value {
        json!({"timestamp": "2026-12-01T10:00:00.000Z", "type": "response_item", "payload": payload})
    }

    pub fn call(id: &str, name: &str) -> Value {
        item(
            json!({"type": "function_call", "name": name, "arguments": "{\"cmd\":\"ls\"}", "call_id": id}),
        )
    }

    pub fn output(id: &str) -> Value {
        item(json!({"type": "function_call_output", "call_id": id, "output": "a.rs\n"}))
    }

    /// A sound rollout: meta, a user message, reasoning and two parallel
    /// calls (one custom), their outputs, an answer, and event lines.
    pub fn rollout() -> Vec<Value> {
        vec![
            json!({"timestamp": "t", "type": "session_meta", "payload": {"id": "0000", "cwd": "/home/user/project"}}),
            json!({"timestamp": "t", "type": "turn_context", "payload": {"cwd": "/home/user/project", "model": "gpt-5"}}),
            item(
                json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]}),
            ),
            item(
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List and patch."}]}),
            ),
            item(json!({"type": "reasoning", "summary": [], "encrypted_content": "b3A="})),
            call("call_1", "shell"),
            item(
                json!({"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch", "call_id": "call_2"}),
            ),
            output("call_1"),
            item(json!({"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"})),
            json!({"timestamp": "t", "type": "event_msg", "payload": {"type": "token_count", "info": null}}),
            item(
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Patched."}]}),
            ),
        ]
    }
}

#[test]
fn codex_rollouts_hold_or_name_the_call_without_output() {
    use codex::*;
    let text = claude_code::text_of(&rollout());
    let history = History::read(&text, None).expect("a rollout");
    assert_eq!(history.format, Format::Codex);
    // user; reasoning and two calls; two outputs; the answer.
    assert_eq!(history.turns.len(), 4, "{:?}", history.turns);
    assert!(history.check().is_empty(), "{:?}", history.check());
    // A function_call without output, then the session went on.
    let mut lost = rollout();
    lost.remove(7);
    let found: Vec<(Rule, Option<usize>, Option<String>)> =
        History::read(&claude_code::text_of(&lost), None)
            .unwrap()
            .check()
            .into_iter()
            .map(|finding| (finding.rule, finding.line, finding.id))
            .collect();
    assert_eq!(
        found,
        [(Rule::CallWithoutResult, Some(6), Some("call_1".to_owned()))]
    );
    // Interrupted at the end: the last call has no output.
    let end: Vec<Value> = rollout().into_iter().take(6).collect();
    let found = History::read(&claude_code::text_of(&end), None)
        .unwrap()
        .check();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].rule, Rule::CallWithoutResult);
    // A compaction replaces what came before: a lost output before it is
    // no longer sent.
    let mut compacted = lost.clone();
    compacted.push(json!({"timestamp": "t", "type": "compacted", "payload": {"message": "summary",
        "replacement_history": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "summary"}]}]}}));
    compacted.push(call("call_9", "shell"));
    compacted.push(output("call_9"));
    let history = History::read(&claude_code::text_of(&compacted), None).unwrap();
    assert_eq!(history.compactions, 1);
    assert_eq!(history.turns.len(), 3);
    assert!(history.check().is_empty(), "{:?}", history.check());
    // Read line by line, the same.
    let streamed = History::read_codex(std::io::Cursor::new(text.as_bytes())).unwrap();
    assert_eq!(streamed.turns, History::read(&text, None).unwrap().turns);
}

proptest! {
    #![proptest_config(crate::common::proptest_config(256, "proptest-regressions/history.txt"))]

    /// The `history` fuzz target's check, on arbitrary bytes and on the
    /// fixtures with one byte changed.
    #[test]
    fn the_history_fuzz_target_holds(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        which in 0usize..3,
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        subloop::testing::fuzz_history(&bytes);
        let fixture = match which {
            0 => anthropic_session().to_string(),
            1 => claude_code::text_of(&claude_code::session()),
            _ => claude_code::text_of(&codex::rollout()),
        };
        let mut changed = fixture.into_bytes();
        let index = at.index(changed.len());
        changed[index] = byte;
        subloop::testing::fuzz_history(&changed);
    }
}

/// A Claude Code reply whose stop reason disagrees with its content: the
/// last entry's `stop_reason` is the reply's.
#[test]
fn a_stop_reason_that_disagrees_with_the_reply_is_named() {
    use claude_code::*;
    let mut lines = session();
    // The reply of two calls ends with `end_turn`: its calls may not run.
    lines[4]["message"]["stop_reason"] = json!("end_turn");
    // The answer says `tool_use` and asks for nothing.
    lines[7]["message"]["stop_reason"] = json!("tool_use");
    let history = History::read(&claude_code::text_of(&lines), None).unwrap();
    assert_eq!(history.turns[1].stop_reason.as_deref(), Some("end_turn"));
    let found = rules_at(&history);
    assert_eq!(
        found,
        [(Rule::StopReason, Some(3)), (Rule::StopReason, Some(8))]
    );
    // What it should be holds.
    lines[4]["message"]["stop_reason"] = json!("tool_use");
    lines[7]["message"]["stop_reason"] = json!("end_turn");
    let history = History::read(&claude_code::text_of(&lines), None).unwrap();
    assert!(history.check().is_empty(), "{:?}", history.check());
}

/// The `history` fuzz targets' seeds (a file of each format) pass their
/// checks, as a fuzzing run starts from them.
#[test]
fn the_history_fuzz_seeds_pass_their_checks() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds_history");
    let mut count = 0;
    for entry in std::fs::read_dir(&seeds).expect("fuzz/seeds_history") {
        let data = std::fs::read(entry.expect("entry").path()).expect("seed");
        subloop::testing::fuzz_history(&data);
        count += 1;
    }
    assert!(count >= 4, "expected a seed of each format, found {count}");
}

/// What `history` breaks: each finding's rule and line.
fn rules_at(history: &History) -> Vec<(Rule, Option<usize>)> {
    history
        .check()
        .into_iter()
        .map(|finding| (finding.rule, finding.line))
        .collect()
}

/// A lost line cuts the chain a resume follows: what came before it is
/// left out, and `check` says where.
#[test]
fn a_lost_line_that_cuts_the_chain_is_named() {
    use claude_code::*;
    let mut lost = session();
    lost.remove(3); // the first call's entry: the next one's parent
    let history = History::read(&claude_code::text_of(&lost), None).unwrap();
    let found = rules_at(&history);
    // The chain starts at the second call (line 4), so the first call's
    // result (line 5) answers nothing on it.
    assert_eq!(
        found,
        [
            (Rule::LostParent, Some(4)),
            (Rule::ResultWithoutCall, Some(5))
        ],
        "{:?}",
        history.check()
    );
    // A session whose first entry names a parent in another file (a
    // continued session) loses nothing: no finding.
    let mut continued = session();
    continued[1]["parentUuid"] = json!("in-another-file");
    let history = History::read(&claude_code::text_of(&continued), None).unwrap();
    assert!(history.check().is_empty(), "{:?}", history.check());
}
