//! The README and the manual in `docs/` tell the truth: the README's demo
//! transcript is what `subloop demo --decision allow` prints, its library
//! example is `examples/library.rs` (built by `cargo test`), the toolchain it
//! asks for is the `rust-version` of `Cargo.toml`; `docs/testing.md` lists
//! every test binary and, under it, its modules; every flag in a table of
//! the docs is a flag of the command it is listed under (by that command's
//! `--help`); and every link between the pages reaches a page and a heading
//! that exist.

use crate::common;

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

/// The README and every page of `docs/`, as (name, text).
fn pages() -> Vec<(String, String)> {
    let mut pages = vec![("README.md".to_owned(), read("README.md"))];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("docs/")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .collect();
    names.sort();
    for name in names {
        let text = read(&format!("docs/{name}"));
        pages.push((format!("docs/{name}"), text));
    }
    pages
}

/// Lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The commands whose help a flag table can be checked against.
const COMMANDS: [&str; 5] = ["demo", "run", "replay", "chat", "view"];

fn help_of(command: &str) -> String {
    let output = Command::new(common::bin())
        .args([command, "--help"])
        .stdin(Stdio::null())
        .output()
        .expect("run subloop");
    assert_eq!(output.status.code(), Some(0), "subloop {command} --help");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The command a heading names as `` `subloop COMMAND`… ``, if any.
fn command_named(heading: &str) -> Option<&'static str> {
    COMMANDS.into_iter().find(|command| {
        let named = format!("`subloop {command}");
        heading.match_indices(&named).any(|(at, _)| {
            heading
                .get(at + named.len()..)
                .is_some_and(|rest| rest.starts_with('`') || rest.starts_with(' '))
        })
    })
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

/// The test binaries in `tests/`, each with its modules: a directory with a
/// `main.rs` is a binary whose modules are its other files (each declared
/// in `main.rs`), a file of `tests/` is a binary of its own with no modules.
/// Directories without a `main.rs` hold shared helpers: their names come
/// back in the second list.
fn test_binaries() -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let (mut binaries, mut helpers) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir).expect("tests/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            binaries.push((stem, Vec::new()));
        } else if path.join("main.rs").is_file() {
            let main = std::fs::read_to_string(path.join("main.rs")).expect("main.rs");
            let mut modules = Vec::new();
            for file in std::fs::read_dir(&path).expect("a test directory") {
                let file = file.expect("entry").path();
                let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
                if file.extension().is_some_and(|ext| ext == "rs") && stem != "main" {
                    assert!(
                        main.lines().any(|line| line == format!("mod {stem};")),
                        "tests/{name}/main.rs does not declare `mod {stem};`: the file is not compiled"
                    );
                    modules.push(stem);
                }
            }
            modules.sort();
            binaries.push((name, modules));
        } else if path.is_dir() {
            helpers.push(name);
        }
    }
    binaries.sort();
    helpers.sort();
    (binaries, helpers)
}

/// The names in backquotes in `text`.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_test_file_is_listed() {
    let testing = read("docs/testing.md");
    let tests = section(&testing, "## The tests");
    // (binary named in a `### ` heading, modules listed as `- ` items under it)
    let mut listed: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in tests.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            let binary = quoted(heading)
                .first()
                .copied()
                .unwrap_or_else(|| panic!("the heading `{line}` names no test binary"));
            listed.push((binary, Vec::new()));
        } else if let Some(item) = line.strip_prefix("- ") {
            let (_, modules) = listed
                .last_mut()
                .unwrap_or_else(|| panic!("`{line}` is listed under no test binary"));
            let names = item.split_once(": ").map_or(item, |(names, _)| names);
            modules.extend(quoted(names));
        }
    }
    let (binaries, helpers) = test_binaries();
    let mut count = 0;
    for (binary, modules) in &binaries {
        let Some((_, shown)) = listed.iter().find(|(name, _)| name == binary) else {
            panic!(
                "the Tests section of docs/testing.md has no heading for the test binary `{binary}`"
            );
        };
        let mut shown = shown.clone();
        shown.sort();
        assert_eq!(
            shown, *modules,
            "the Tests section of docs/testing.md lists other modules under `{binary}` than tests/{binary}/ holds"
        );
        count += modules.len().max(1);
    }
    for helper in &helpers {
        assert!(
            tests.contains(&format!("`tests/{helper}/`")),
            "the Tests section of docs/testing.md does not name the helpers in `tests/{helper}/`"
        );
    }
    assert!(count > 10, "{count}");
}

#[test]
fn the_toolchain_asked_for_is_the_rust_version() {
    let version_of = |manifest: &str| {
        read(manifest)
            .lines()
            .find_map(|line| line.strip_prefix("rust-version = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("{manifest} sets rust-version"))
    };
    // `cargo test` builds both crates of the workspace: the newer version wins.
    let (library, durable) = (version_of("Cargo.toml"), version_of("restate/Cargo.toml"));
    let readme = read("README.md").replace('\n', " ");
    assert!(
        readme.contains(&format!(
            "a Rust toolchain of at least {durable} (the library's `rust-version` is {library}"
        )),
        "the README's prerequisites do not name rust-version {durable} (restate/) and {library}"
    );
    assert!(readme.contains("`python3`"), "python3 is a prerequisite");
}

#[test]
fn every_flag_in_a_table_is_in_the_help_of_its_command() {
    let helps: Vec<(&str, String)> = COMMANDS.iter().map(|c| (*c, help_of(c))).collect();
    let mut checked = 0;
    for (page, text) in pages() {
        // The command of the nearest heading that names one: a `##` heading
        // sets it (or clears it), a deeper one only overrides it.
        let mut command: Option<&str> = None;
        for line in prose(&text) {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            if hashes > 0 && line.get(hashes..).is_some_and(|rest| rest.starts_with(' ')) {
                let named = command_named(line);
                if hashes <= 2 || named.is_some() {
                    command = named;
                }
                continue;
            }
            let Some(cell) = line.strip_prefix("| `--") else {
                continue;
            };
            let cell = cell
                .split('`')
                .next()
                .unwrap_or_default()
                .replace("\\|", "|");
            let flag = format!("--{cell}");
            let in_help = |help: &str| {
                help.match_indices(&flag).any(|(at, _)| {
                    !help
                        .get(at + flag.len()..)
                        .and_then(|rest| rest.chars().next())
                        .is_some_and(|next| next.is_ascii_alphanumeric() || next == '-')
                })
            };
            match command {
                Some(command) => {
                    let help = &helps.iter().find(|(c, _)| *c == command).expect("help").1;
                    assert!(
                        in_help(help),
                        "{page}: `{flag}` is in a table under `subloop {command}` but not in `subloop {command} --help`"
                    );
                }
                None => assert!(
                    helps.iter().any(|(_, help)| in_help(help)),
                    "{page}: `{flag}` is in a table but in no command's help"
                ),
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked} flags checked");
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_link_between_the_pages_reaches_a_heading() {
    let pages = pages();
    let anchors = |name: &str| -> Vec<String> {
        let text = &pages.iter().find(|(page, _)| page == name).expect("page").1;
        prose(text)
            .into_iter()
            .filter(|line| line.starts_with('#'))
            .map(anchor)
            .collect()
    };
    let mut checked = 0;
    for (page, text) in &pages {
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        for line in prose(text) {
            for (at, _) in line.match_indices("](") {
                let target = line.get(at + 2..).unwrap_or_default();
                let target = target.split(')').next().unwrap_or_default();
                if target.contains("://") {
                    continue;
                }
                let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
                let name = if file.is_empty() {
                    page.clone()
                } else {
                    // `docs/x.md` from the README, `x.md` or `../README.md` from docs/.
                    let joined = dir.join(file);
                    let mut parts: Vec<String> = Vec::new();
                    for part in joined.components() {
                        match part {
                            std::path::Component::ParentDir => {
                                parts.pop();
                            }
                            other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
                        }
                    }
                    parts.join("/")
                };
                let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(&name);
                assert!(path.exists(), "{page}: the link `{target}` reaches no file");
                if !fragment.is_empty() {
                    assert!(
                        anchors(&name).iter().any(|a| a == fragment),
                        "{page}: the link `{target}` reaches no heading of {name}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "{checked} links checked");
}
