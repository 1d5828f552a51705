//! A script's replies cost little memory beyond its text: a counting global
//! allocator measures the peak of `Script::parse` on a script of many small
//! tool-call replies (issue 10 §7: within about 3× the script's size).
//!
//! This binary holds one test, so no other test allocates meanwhile.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use subloop::Model;
use subloop::providers::scripted::Script;
use subloop::providers::scripted::ScriptedModel;

/// The system allocator, counting the bytes live now and at most.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::SeqCst) + size;
    PEAK.fetch_max(live, Ordering::SeqCst);
}

// SAFETY: every call is passed to `System` unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System::alloc`'s.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            grew(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System::realloc`'s.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
            grew(new_size);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_script_of_many_small_replies_costs_about_its_text() {
    const REPLIES: usize = 20_000;
    let mut text = String::from(r#"{"parent":["#);
    for turn in 1..=REPLIES {
        text.push_str(&format!(
            r#"{{"content":[{{"id":"toolu_{turn}","input":{{"path":"data.txt"}},"name":"read_file","type":"tool_use"}}],"stop_reason":"tool_use"}},"#
        ));
    }
    text.push_str(r#"{"content":[{"text":"done","type":"text"}],"stop_reason":"end_turn"}]}"#);

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let script = Script::parse(&text).expect("a valid script");
    let peak = PEAK.load(Ordering::SeqCst) - before;
    let kept = LIVE.load(Ordering::SeqCst) - before;
    // The text itself is counted apart: `text` is the script's size, and
    // the parse's peak (its own copy of the text included) stays within 3×.
    assert!(
        peak <= 3 * text.len(),
        "parsing a {} byte script peaked at {peak} bytes ({:.1}×)",
        text.len(),
        peak as f64 / text.len() as f64
    );
    assert!(
        kept <= 2 * text.len(),
        "the parsed script keeps {kept} bytes"
    );

    // Every reply is still there, typed when it is replayed.
    assert_eq!(script.parent.len(), REPLIES + 1);
    let mut model = ScriptedModel::from_script(script.parent.clone(), false);
    let request = subloop::core::protocol::Request {
        system: "",
        tools: &[],
        messages: &[],
        attachment: None,
        output: None,
    };
    let first = model.respond(&request).expect("the first reply");
    assert_eq!(
        first,
        subloop::ModelResponse::tool_calls([(
            "toolu_1",
            "read_file",
            serde_json::json!({"path": "data.txt"})
        )])
    );
}
