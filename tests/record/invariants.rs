//! The loop's invariants over recorded runs (`subloop::record::invariants`): every
//! rule holds on the demo's traces, and each hand-broken trace breaks the
//! rule it should, at the place it should.

use crate::common;

use std::process::{Command, Stdio};

use serde_json::{Value, json};

use common::TempDir;
use subloop::record::invariants::{Invariant, Policy, Verdict};
use subloop::record::recorded::RecordedRun;

/// The trace of `subloop demo ARGS`, as JSON lines.
fn demo_trace(dir: &TempDir, name: &str, args: &[&str]) -> Vec<Value> {
    let trace = dir.path().join(name);
    let out = Command::new(common::bin())
        .arg("demo")
        .args(args)
        .arg("--quiet")
        .arg("--trace")
        .arg(&trace)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("demo");
    assert!(
        out.status.code().is_some(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&trace)
        .expect("trace")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

fn verdicts_of(lines: &[Value], policy: &Policy) -> Vec<Verdict> {
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    policy.check(&RecordedRun::parse(&text).expect("parse"))
}

fn broken(verdicts: &[Verdict]) -> Vec<Invariant> {
    verdicts
        .iter()
        .filter(|verdict| !verdict.held())
        .map(|verdict| verdict.invariant)
        .collect()
}

#[test]
fn every_rule_holds_on_the_demo_runs() {
    let dir = TempDir::new("invariants-good");
    let policy = Policy {
        parent_calls: Some(8),
        child_calls: Some(4),
        ..Policy::default()
    };
    for (name, args) in [
        ("allow.jsonl", &["--decision", "allow"][..]),
        ("deny.jsonl", &["--decision", "deny"][..]),
        (
            "child.jsonl",
            &["--decision", "deny", "--child-calls", "1"][..],
        ),
    ] {
        let lines = demo_trace(&dir, name, args);
        let verdicts = verdicts_of(&lines, &policy);
        assert_eq!(verdicts.len(), Invariant::ALL.len());
        assert!(broken(&verdicts).is_empty(), "{name}: {verdicts:?}");
    }
}

#[test]
fn each_hand_broken_trace_breaks_its_rule() {
    let dir = TempDir::new("invariants-broken");
    let deny = demo_trace(&dir, "deny.jsonl", &["--decision", "deny"]);
    let policy = Policy::default();

    // A result given twice in a request's history.
    let mut twice = deny.clone();
    let line = twice
        .iter_mut()
        .find(|line| {
            line["kind"] == "request"
                && line["agent"] == "parent"
                && line["messages"].as_array().is_some_and(|messages| {
                    messages
                        .iter()
                        .any(|m| m["content"][0]["type"] == "tool_result")
                })
        })
        .expect("a request carrying results");
    let messages = line["messages"].as_array_mut().expect("messages");
    let results = messages
        .iter_mut()
        .find(|m| m["content"][0]["type"] == "tool_result")
        .expect("results");
    let first = results["content"][0].clone();
    results["content"]
        .as_array_mut()
        .expect("blocks")
        .push(first);
    let verdicts = verdicts_of(&twice, &policy);
    // The history no longer rebuilds either: the trace contradicts itself.
    assert_eq!(
        broken(&verdicts),
        [Invariant::AnsweredOnce, Invariant::Consistent]
    );
    let breach = &verdicts[0].breaches[0];
    assert_eq!(breach.agent, "parent");
    assert!(
        breach.detail.contains("a second result for"),
        "{}",
        breach.detail
    );

    // A child whose first request holds more than the task.
    let mut crowded = deny.clone();
    let line = crowded
        .iter_mut()
        .find(|line| line["kind"] == "request" && line["agent"] == "child-1" && line["call"] == 1)
        .expect("child-1's first request");
    let messages = line["messages"].as_array_mut().expect("messages");
    messages.insert(
        0,
        json!({"role": "user", "content": [{"type": "text", "text": "the parent's secrets"}]}),
    );
    messages.insert(
        1,
        json!({"role": "assistant", "content": [{"type": "text", "text": "noted"}]}),
    );
    let verdicts = verdicts_of(&crowded, &policy);
    // Two messages no transition made: the child's history does not rebuild.
    assert_eq!(
        broken(&verdicts),
        [Invariant::ChildStartsFresh, Invariant::Consistent]
    );
    let breach = &verdicts[3].breaches[0];
    assert_eq!((breach.agent.as_str(), breach.call), ("child-1", Some(1)));

    // A child asked something other than its task.
    let mut other = deny.clone();
    let line = other
        .iter_mut()
        .find(|line| line["kind"] == "request" && line["agent"] == "child-1" && line["call"] == 1)
        .expect("child-1's first request");
    line["messages"][0]["content"][0]["text"] = json!("not the task");
    let verdicts = verdicts_of(&other, &policy);
    assert_eq!(broken(&verdicts), [Invariant::ChildStartsFresh]);

    // A child offered a tool that is not whitelisted.
    let verdicts = verdicts_of(
        &deny,
        &Policy {
            child_tools: vec!["todo_write".into()],
            ..Policy::default()
        },
    );
    assert_eq!(broken(&verdicts), [Invariant::ChildStartsFresh]);

    // A denied call whose result shows it ran.
    let mut ran = deny.clone();
    let line = ran
        .iter_mut()
        .find(|line| line["kind"] == "tool" && line["decision"] == "denied")
        .expect("a denied call");
    line["content"] = json!("{\"exit_code\":0,\"stdout\":\"42\\n\"}");
    line["is_error"] = json!(false);
    let verdicts = verdicts_of(&ran, &policy);
    // The next request sent the model the denial: the line contradicts it.
    assert_eq!(
        broken(&verdicts),
        [Invariant::DeniedNeverRan, Invariant::Consistent]
    );
    assert_eq!(verdicts[5].breaches[0].agent, "parent");
    assert!(verdicts[5].breaches[0].id.is_some());

    // More calls than the budget.
    let verdicts = verdicts_of(
        &deny,
        &Policy {
            parent_calls: Some(2),
            ..Policy::default()
        },
    );
    assert_eq!(broken(&verdicts), [Invariant::WithinBudget]);
    assert_eq!(verdicts[1].breaches[0].call, Some(3));

    // A tool that ran without being offered.
    let mut unoffered = deny.clone();
    let line = unoffered
        .iter_mut()
        .find(|line| {
            line["kind"] == "tool" && line["agent"] == "parent" && line["name"] == "read_file"
        })
        .expect("a read_file call");
    line["name"] = json!("write_file");
    let verdicts = verdicts_of(&unoffered, &policy);
    assert_eq!(broken(&verdicts), [Invariant::OfferedIsDispatched]);

    // A tool_use reply whose stop reason says end_turn, accepted and followed by more calls.
    let mut disagree = deny.clone();
    let line = disagree
        .iter_mut()
        .find(|line| line["kind"] == "response" && line["agent"] == "parent" && line["call"] == 1)
        .expect("the first reply");
    line["response"]["stop_reason"] = json!("end_turn");
    let verdicts = verdicts_of(&disagree, &policy);
    assert!(
        broken(&verdicts).contains(&Invariant::StopReasons),
        "{verdicts:?}"
    );
}
