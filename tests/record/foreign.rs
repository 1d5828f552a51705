//! `view` of other agents' histories: a Claude Code session (its
//! subagent a lane of its own, started by the `Task` call whose result
//! names it), a codex rollout, a Messages API and a Chat Completions
//! history, each shown as a run — a model call per reply, a tool line per
//! result, the answer as the outcome — with the rules that apply to any
//! history; `--check` and `-o page.html` as for subloop's own traces.
//! Generated histories of each format, sound or broken, read as runs
//! whose calls are their replies and whose verdicts are `check`'s.

use proptest::strategy::Strategy;
use serde_json::{Value, json};
use subloop::record::foreign::Foreign;
use subloop::record::history::{Format, History};
use subloop::record::invariants::Invariant;

use super::history::{anthropic_session, claude_code, codex, openai_session};

/// A session whose `Task` call started a subagent (its result names it),
/// and the subagent's own file: every entry a side chain with its
/// `agentId`.
pub(crate) fn session_with_a_subagent() -> (String, String) {
    use claude_code::*;
    let mut lines = vec![user_text("u1", None, "Find the bug.")];
    lines.push(assistant(
        "a1",
        "u1",
        "msg_1",
        json!({"type": "tool_use", "id": "toolu_T", "name": "Task",
            "input": {"prompt": "Look at a.rs", "subagent_type": "Explore"}}),
    ));
    let mut result = result("r1", "a1", "toolu_T");
    result["message"]["content"][0]["content"] =
        json!([{"type": "text", "text": "a.rs line 3 divides by zero\nagentId: ab12cd"}]);
    result["toolUseResult"] = json!({"status": "completed", "agentId": "ab12cd"});
    lines.push(result);
    lines.push(assistant(
        "a2",
        "r1",
        "msg_2",
        json!({"type": "text", "text": "Line 3 divides by zero."}),
    ));
    let mut agent = vec![
        user_text("c1", None, "Look at a.rs"),
        assistant(
            "c2",
            "c1",
            "msg_x1",
            json!({"type": "tool_use", "id": "toolu_G", "name": "Grep", "input": {"pattern": "/"}}),
        ),
        super::history::claude_code::result("c3", "c2", "toolu_G"),
        assistant(
            "c4",
            "c3",
            "msg_x2",
            json!({"type": "text", "text": "a.rs line 3 divides by zero"}),
        ),
    ];
    for line in &mut agent {
        line["isSidechain"] = json!(true);
        line["agentId"] = json!("ab12cd");
    }
    (text_of(&lines), text_of(&agent))
}

fn subloop(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(crate::common::bin())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_claude_code_session_is_shown_with_its_subagent_as_a_child() {
    let (session, agent) = session_with_a_subagent();
    let foreign = Foreign::read(
        &session,
        None,
        &[("agent-ab12cd.jsonl".to_owned(), agent.clone())],
    )
    .unwrap();
    assert_eq!(foreign.format, Format::ClaudeCode);
    assert_eq!(foreign.run.calls("parent"), 2);
    assert_eq!(foreign.run.calls("child-1"), 2);
    assert_eq!(foreign.run.started_by("child-1"), Some("toolu_T"));
    assert!(foreign.run.delegates("Task"));
    assert_eq!(
        foreign.run.outcome().map(|(_, text)| text),
        Some("Line 3 divides by zero.")
    );
    assert!(
        foreign.verdicts.iter().all(|verdict| verdict.held()),
        "{:?}",
        foreign.verdicts
    );
    // The trace it was read from reads back the same.
    let again = subloop::record::recorded::RecordedRun::parse(&foreign.trace).unwrap();
    assert_eq!(again.calls("child-1"), 2);

    // Through the binary: the subagent's file beside the session.
    let dir = crate::common::TempDir::new("foreign-view");
    let file = dir.write("s1.jsonl", &session);
    dir.write("s1/subagents/agent-ab12cd.jsonl", &agent);
    let (code, stdout, stderr) = subloop(&["view".as_ref(), "--check".as_ref(), file.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let child_at = stdout.find("    child-1 call 1").expect(&stdout);
    let task_at = stdout.find("tool Task toolu_T").expect(&stdout);
    assert!(
        task_at < child_at,
        "the child under its Task call:\n{stdout}"
    );
    assert!(
        stdout.contains("outcome: answered — Line 3 divides by zero."),
        "{stdout}"
    );
    let page = dir.path().join("page.html");
    let (code, _, stderr) = subloop(&[
        "view".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("\"delegating\":[\"task\",\"Task\"]"),
        "the page knows Task starts a child"
    );
    assert!(html.contains("child-1"));

    // A subagent no call started, a call without its result: both broken.
    dir.write(
        "s1/subagents/agent-zz99.jsonl",
        agent.replace("ab12cd", "zz99"),
    );
    let mut cut: Vec<&str> = session.lines().collect();
    cut.truncate(2);
    let cut = dir.write("s1.jsonl", format!("{}\n", cut.join("\n")));
    let (code, stdout, _) = subloop(&["view".as_ref(), "--check".as_ref(), cut.as_os_str()]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("[call_without_result]"), "{stdout}");
    assert!(
        stdout.contains("agent-zz99.jsonl was started by no call"),
        "{stdout}"
    );
}

#[test]
fn request_histories_and_rollouts_are_shown_as_runs() {
    let dir = crate::common::TempDir::new("foreign-formats");
    let pretty = serde_json::to_string_pretty(&anthropic_session()).unwrap();
    let cases: Vec<(&str, String, &str, u32)> = vec![
        (
            "anthropic.json",
            pretty,
            "tool mcp__notes__search toolu_02",
            3,
        ),
        (
            "openai.json",
            openai_session().to_string(),
            "tool read_file call_b",
            2,
        ),
        (
            "rollout.jsonl",
            claude_code::text_of(&codex::rollout()),
            "tool apply_patch call_2",
            2,
        ),
    ];
    for (name, text, tool, calls) in cases {
        let foreign = Foreign::read(&text, None, &[]).unwrap();
        assert_eq!(foreign.run.calls("parent"), calls, "{name}");
        let file = dir.write(name, &text);
        let (code, stdout, stderr) =
            subloop(&["view".as_ref(), "--check".as_ref(), file.as_os_str()]);
        assert_eq!(code, Some(0), "{name}: {stdout}{stderr}");
        assert!(stdout.contains(tool), "{name}: {stdout}");
        assert!(
            stdout.contains("held every tool_use is answered"),
            "{name}: {stdout}"
        );
    }
    // The Messages API session ends on the user's question: a request not
    // answered yet.
    let foreign = Foreign::read(&anthropic_session().to_string(), None, &[]).unwrap();
    assert!(foreign.run.request("parent", 3).is_some());
    assert!(foreign.run.reply("parent", 3).is_none());
    // Not a history: the error says why, exit 2.
    let bad = dir.write("bad.json", "{\"messages\": 3}");
    let (code, _, stderr) = subloop(&["view".as_ref(), bad.as_os_str()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("messages"), "{stderr}");
}

proptest::proptest! {
    #![proptest_config(crate::common::proptest_config(96, "proptest-regressions/foreign.txt"))]

    /// A generated history of any format, sound or broken, reads as a run
    /// whose model calls are its replies, and whose pairing verdict is
    /// what `check` finds.
    #[test]
    fn any_generated_history_reads_as_a_run_with_checks_verdict(
        sound in subloop::testing::every_format().prop_flat_map(subloop::testing::sound_history),
        broken in subloop::testing::every_format().prop_flat_map(subloop::testing::broken_history),
    ) {
        use proptest::{prop_assert, prop_assert_eq};
        for generated in [sound, broken] {
            let history = History::read(&generated.text, Some(generated.format)).unwrap();
            let foreign = Foreign::read(&generated.text, Some(generated.format), &[]).unwrap();
            let replies = history
                .turns
                .iter()
                .filter(|turn| turn.speaker == subloop::record::history::Speaker::Assistant)
                .count();
            prop_assert_eq!(foreign.run.calls("parent") as usize, replies);
            let pairing = foreign
                .verdicts
                .iter()
                .find(|verdict| verdict.invariant == Invariant::AnsweredOnce)
                .unwrap();
            prop_assert_eq!(pairing.breaches.len(), history.check().len());
            prop_assert_eq!(generated.breach.is_none(), pairing.held());
            prop_assert!(foreign.trace.lines().all(|line| serde_json::from_str::<Value>(line).is_ok()));
        }
    }
}

/// A session that kept its subagent's run in its own file, as side chain
/// entries: the side chain is a child of the `Task` call whose prompt it
/// starts with; a side chain no call started is named.
#[test]
fn a_side_chain_in_the_session_s_own_file_is_a_child() {
    let (session, agent) = session_with_a_subagent();
    let mut lines: Vec<Value> = session
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // The subagent's entries, after the Task call, in the same file.
    let side: Vec<Value> = agent
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let tail = lines.split_off(2);
    lines.extend(side.iter().cloned());
    lines.extend(tail);
    let text = claude_code::text_of(&lines);
    let history = History::read(&text, None).unwrap();
    assert!(history.check().is_empty(), "{:?}", history.check());
    let foreign = Foreign::read(&text, None, &[]).unwrap();
    assert_eq!(foreign.run.calls("child-1"), 2);
    assert_eq!(foreign.run.started_by("child-1"), Some("toolu_T"));
    assert!(
        foreign.verdicts.iter().all(|verdict| verdict.held()),
        "{:?}",
        foreign.verdicts
    );
    // Its first message no call's prompt: named, not shown.
    let stray = text.replace(
        "\"content\":\"Look at a.rs\"",
        "\"content\":\"Something else\"",
    );
    let foreign = Foreign::read(&stray, None, &[]).unwrap();
    assert_eq!(foreign.run.calls("child-1"), 0);
    let broken: Vec<&str> = foreign
        .verdicts
        .iter()
        .flat_map(|verdict| &verdict.breaches)
        .map(|breach| breach.detail.as_str())
        .collect();
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(
        broken[0].contains("side chain that starts on line 3"),
        "{broken:?}"
    );
}
