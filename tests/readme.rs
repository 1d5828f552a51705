//! The README and the manual in `docs/` tell the truth: the README's demo
//! transcript is what `subloop demo --decision allow` prints, its library
//! example is `examples/library.rs` (built by `cargo test`), the toolchain it
//! asks for is the `rust-version` of `Cargo.toml`, and `docs/testing.md`
//! lists every test file.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The fenced block that follows the line `after` (the fence opens on the next line).
fn block_after(text: &str, after: &str) -> String {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|line| *line == after)
        .unwrap_or_else(|| panic!("the README has no line `{after}`"));
    let mut block = String::new();
    for line in lines {
        if line.starts_with("```") {
            return block;
        }
        block.push_str(line);
        block.push('\n');
    }
    panic!("the block after `{after}` is not closed")
}

/// The fenced block whose opening fence follows the line `after`.
fn fenced_after(text: &str, after: &str, fence: &str) -> String {
    let start = text
        .find(after)
        .unwrap_or_else(|| panic!("the README has no `{after}`"));
    let rest = text.get(start..).unwrap_or_default();
    let open = rest
        .find(&format!("\n{fence}\n"))
        .unwrap_or_else(|| panic!("no {fence} block after `{after}`"));
    let body = rest.get(open + fence.len() + 2..).unwrap_or_default();
    let close = body.find("\n```\n").expect("the block is closed");
    format!("{}\n", body.get(..close).unwrap_or_default())
}

/// The text of the section that starts with the line `heading`, up to the
/// next heading of the same or a higher level.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section `{heading}`"))
        + heading.len()
        + 2;
    let rest = text.get(start..).unwrap_or_default();
    let end = rest
        .match_indices("\n#")
        .find(|(at, _)| {
            let line = rest.get(at + 1..).unwrap_or_default();
            let hashes = line.chars().take_while(|c| *c == '#').count();
            hashes <= level
                && line
                    .get(hashes..)
                    .is_some_and(|after| after.starts_with(' '))
        })
        .map_or(rest.len(), |(at, _)| at);
    rest.get(..end).unwrap_or_default()
}

#[test]
fn the_demo_transcript_is_what_the_demo_prints() {
    let readme = read("README.md");
    let transcript = block_after(&readme, "$ cargo run --release -- demo --decision allow");
    let output = Command::new(common::bin())
        .args(["demo", "--decision", "allow"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run subloop");
    assert_eq!(output.status.code(), Some(0));
    // Progress on stderr, then the answer on stdout.
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(
        printed, transcript,
        "the README's demo transcript differs from the demo's output"
    );
}

#[test]
fn the_library_example_is_the_compiled_example_file() {
    let readme = read("README.md");
    let shown = fenced_after(&readme, "## The library", "```rust");
    assert_eq!(shown, read("examples/library.rs"));
}

#[test]
fn every_test_file_is_listed() {
    let testing = read("docs/testing.md");
    let tests = section(&testing, "## The tests");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).expect("tests/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            assert!(
                tests.contains(&format!("`{stem}`")),
                "the Tests section of docs/testing.md does not list `{stem}`"
            );
            count += 1;
        }
    }
    assert!(count > 10, "{count}");
}

#[test]
fn the_toolchain_asked_for_is_the_rust_version() {
    let manifest = read("Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|line| line.strip_prefix("rust-version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("Cargo.toml sets rust-version");
    let readme = read("README.md");
    assert!(
        readme.contains(&format!(
            "a Rust toolchain of at least {version} (the `rust-version`"
        )),
        "the README's prerequisites do not name rust-version {version}"
    );
    assert!(readme.contains("`python3`"), "python3 is a prerequisite");
}
