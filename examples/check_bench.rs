//! What `check` costs on a large Claude Code session: writes a session of
//! realistic entries (prompts, replies split over lines with thinking and
//! text, parallel tool calls, results of a few KB each) of about the size
//! asked for, then reads it three ways, each timed: a bare pass that splits
//! lines and parses each as JSON (the floor), `History::read_claude_code`
//! with the pairing rules, and the same through the binary's
//! `subloop check`. Prints one JSON line: MB/s of each, the ratio to the
//! floor, and the reader's peak heap.
//!
//! ```text
//! cargo run --release --example check_bench -- 500
//! ```

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufWriter, Write};
use std::time::Instant;

use serde_json::{Value, json};
use subloop::record::history::History;

#[path = "bench/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

fn entry(kind: &str, uuid: &str, parent: &str, message: Value) -> Value {
    json!({"parentUuid": parent, "isSidechain": false, "userType": "external",
           "cwd": "/home/user/project", "sessionId": "0000-bench", "version": "2.1.0",
           "gitBranch": "main", "type": kind, "message": message, "uuid": uuid,
           "timestamp": "2026-12-01T10:00:00.000Z"})
}

/// Writes rounds until the file holds about `bytes`.
fn write_session(path: &std::path::Path, bytes: u64) -> u64 {
    let mut out = BufWriter::new(std::fs::File::create(path).unwrap());
    let result_text: String = "fn main() { println!(\"hello\"); } // a line of source\n".repeat(60);
    let mut written = 0u64;
    let mut parent = String::new();
    let mut n = 0u64;
    let line = |value: Value, out: &mut BufWriter<std::fs::File>| {
        let text = value.to_string();
        out.write_all(text.as_bytes()).unwrap();
        out.write_all(b"\n").unwrap();
        text.len() as u64 + 1
    };
    while written < bytes {
        n += 1;
        let prompt = format!("u{n}");
        written += line(
            entry(
                "user",
                &prompt,
                &parent,
                json!({"role": "user", "content": "Read the two files and fix the bug."}),
            ),
            &mut out,
        );
        let message = format!("msg_{n}");
        let think = format!("t{n}");
        written += line(
            entry(
                "assistant",
                &think,
                &prompt,
                json!({"id": message, "role": "assistant", "type": "message", "model": "claude-sonnet-4-5",
            "content": [{"type": "thinking", "thinking": "Read both, then compare them.", "signature": "c2lnbmF0dXJl"}],
            "stop_reason": null, "usage": {"input_tokens": 1200, "output_tokens": 40}}),
            ),
            &mut out,
        );
        let mut last = think;
        let mut calls = Vec::new();
        for k in 0..2 {
            let uuid = format!("c{n}_{k}");
            let id = format!("toolu_{n}_{k}");
            written += line(
                entry(
                    "assistant",
                    &uuid,
                    &last,
                    json!({"id": message, "role": "assistant", "type": "message",
                "content": [{"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("/home/user/project/src/file{k}.rs")}}],
                "stop_reason": null}),
                ),
                &mut out,
            );
            last = uuid;
            calls.push(id);
        }
        for id in calls {
            let uuid = format!("r_{id}");
            let mut value = entry(
                "user",
                &uuid,
                &last,
                json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": result_text}]}),
            );
            value["toolUseResult"] = json!({"type": "text", "file": {"filePath": "/home/user/project/src/file.rs", "numLines": 60}});
            written += line(value, &mut out);
            last = uuid;
        }
        let answer = format!("a{n}");
        written += line(
            entry(
                "assistant",
                &answer,
                &last,
                json!({"id": format!("msg_{n}_b"), "role": "assistant", "type": "message",
            "content": [{"type": "text", "text": "Both files read; the bug is in file1.rs, fixed."}], "stop_reason": "end_turn"}),
            ),
            &mut out,
        );
        parent = answer;
    }
    out.flush().unwrap();
    written
}

fn main() {
    let megabytes: u64 = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("a size in MB"))
        .unwrap_or(500);
    let dir = std::env::temp_dir().join(format!("subloop-check-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("session.jsonl");
    let bytes = write_session(&path, megabytes * 1_000_000);
    let mb = bytes as f64 / 1e6;

    // The floor: split lines, parse each as JSON, nothing kept.
    let started = Instant::now();
    let reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let mut lines = 0u64;
    for line in reader.lines() {
        let value: Value = serde_json::from_str(&line.unwrap()).unwrap();
        lines += u64::from(value.is_object());
    }
    let floor = started.elapsed().as_secs_f64();

    // The library: the chain, the turns, the rules.
    let before = counting::reset();
    let started = Instant::now();
    let reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let history = History::read_claude_code(reader).unwrap();
    let findings = history.check();
    let library = started.elapsed().as_secs_f64();
    let peak = counting::peak_above(before);
    assert!(findings.is_empty(), "{:?}", findings.first());

    // The binary, when it is built next to this example.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("subloop")))
        .filter(|path| path.is_file());
    let cli = binary.map(|binary| {
        let started = Instant::now();
        let out = std::process::Command::new(binary)
            .arg("check")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        started.elapsed().as_secs_f64()
    });
    std::fs::remove_dir_all(&dir).ok();
    let rate = |seconds: f64| (mb / seconds).round();
    println!(
        "{}",
        json!({
            "file_mb": mb.round(),
            "lines": lines,
            "turns": history.turns.len(),
            "floor_mb_s": rate(floor),
            "library_mb_s": rate(library),
            "cli_mb_s": cli.map(rate),
            "library_over_floor": ((library / floor) * 100.0).round() / 100.0,
            "library_peak_heap_mib": (peak as f64 / 1_048_576.0 * 10.0).round() / 10.0,
        })
    );
}
