//! The house keeps its shape: the library's layers import only the layers
//! below them, and no module of the library closes an import cycle. Reads
//! every `crate::…` and `super::…` path in `src/` (code, `use` lines and
//! doc links alike) and fails naming file and line.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's layers, lowest first; a layer may name only lower ones
/// (the siblings `policy`, `tools` and `providers` not each other).
const LAYERS: [(&str, u8); 9] = [
    ("core", 0),
    ("run", 1),
    ("policy", 2),
    ("tools", 2),
    ("providers", 2),
    ("agent", 3),
    ("record", 4),
    ("host", 5),
    ("testing", 6),
];

fn rank(top: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == top)
        .map(|(_, rank)| *rank)
}

/// Every `.rs` file of the library (the binary's `main.rs` and `cli/` are
/// not the library), with its module path (`record::resume`).
fn library_files(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut found = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(src).unwrap_or(&path).to_path_buf();
            if relative.starts_with("cli") || relative == Path::new("main.rs") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let mut module: Vec<String> = relative
                    .with_extension("")
                    .iter()
                    .map(|part| part.to_string_lossy().into_owned())
                    .collect();
                if module
                    .last()
                    .is_some_and(|last| last == "mod" || last == "lib")
                {
                    module.pop();
                }
                found.push((path, module));
            }
        }
    }
    found.sort();
    found
}

/// The module paths named on `line` of the file of `module`: `crate::a::b`
/// as is, `super::x` resolved against `module` (whose file is a `mod.rs`
/// when `is_mod`).
fn named(line: &str, module: &[String], is_mod: bool) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (start, _) in line
        .match_indices("crate::")
        .chain(line.match_indices("super::"))
    {
        let before = line.get(..start).and_then(|text| text.chars().last());
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = line.get(start..).unwrap_or_default();
        let text: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let mut parts: Vec<&str> = text.split("::").filter(|p| !p.is_empty()).collect();
        let mut path: Vec<String> = Vec::new();
        if parts.first() == Some(&"crate") {
            parts.remove(0);
        } else {
            // `super` is the parent of the file's module (of the folder's,
            // for a mod.rs, whose module is the folder itself).
            path = module.to_vec();
            if !is_mod {
                path.pop();
            }
            while parts.first() == Some(&"super") {
                parts.remove(0);
                if parts.first() == Some(&"super") {
                    path.pop();
                }
            }
        }
        path.extend(parts.iter().map(|p| (*p).to_owned()));
        paths.push(path);
    }
    paths
}

/// The module (a file of the library) that `path` names: its longest prefix
/// that is one.
fn owner(path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|len| path.get(..len).unwrap_or_default().to_vec())
        .find(|prefix| modules.contains(prefix))
}

/// The modules of every cycle of `edges` (strongly connected components
/// with more than one module).
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    let nodes: Vec<&Vec<String>> = edges.keys().collect();
    let reaches = |from: &Vec<String>| -> BTreeSet<Vec<String>> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        nodes.iter().map(|node| (*node, reaches(node))).collect();
    let mut found: Vec<Vec<Vec<String>>> = Vec::new();
    for node in &nodes {
        if found.iter().any(|cycle| cycle.contains(node)) {
            continue;
        }
        let cycle: Vec<Vec<String>> = nodes
            .iter()
            .filter(|other| {
                *other != node
                    && reach.get(*node).is_some_and(|r| r.contains(**other))
                    && reach.get(*other).is_some_and(|r| r.contains(*node))
            })
            .map(|other| (*other).clone())
            .collect();
        if !cycle.is_empty() {
            let mut cycle = cycle;
            cycle.push((*node).clone());
            cycle.sort();
            found.push(cycle);
        }
    }
    found
}

/// What the library's files import: upward imports and cycles, one line each.
fn breaches(src: &Path) -> Vec<String> {
    let files = library_files(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(_, module)| module.clone()).collect();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (path, module) in &files {
        let is_mod = path
            .file_name()
            .is_some_and(|name| name == "mod.rs" || name == "lib.rs");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let from_rank = module.first().and_then(|top| rank(top));
        let shown = path.strip_prefix(src).unwrap_or(path).display().to_string();
        for (number, line) in text.lines().enumerate() {
            for named in named(line, module, is_mod) {
                let Some(target) = owner(&named, &modules) else {
                    continue;
                };
                let top = target.first().map(String::as_str).unwrap_or_default();
                if let (Some(from), Some(to)) = (from_rank, rank(top)) {
                    let sibling = from == to && module.first().map(String::as_str) != Some(top);
                    if to > from || sibling {
                        problems.push(format!(
                            "src/{shown}:{}: {} imports {} (`{}`), a layer it may not name",
                            number + 1,
                            module.join("::"),
                            top,
                            named.join("::")
                        ));
                    }
                }
                // A folder's mod.rs declaring its files is not an import.
                let declares = is_mod && target.starts_with(module) && target.len() > module.len();
                if target != *module && !declares && !module.is_empty() {
                    edges.entry(module.clone()).or_default().insert(target);
                }
            }
        }
    }
    for cycle in cycles(&edges) {
        let names: Vec<String> = cycle.iter().map(|module| module.join("::")).collect();
        let mut lines = Vec::new();
        for (path, module) in &files {
            if !cycle.contains(module) {
                continue;
            }
            let is_mod = path
                .file_name()
                .is_some_and(|name| name == "mod.rs" || name == "lib.rs");
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let shown = path.strip_prefix(src).unwrap_or(path).display().to_string();
            for (number, line) in text.lines().enumerate() {
                let closes = named(line, module, is_mod).iter().any(|named| {
                    owner(named, &modules)
                        .is_some_and(|target| target != *module && cycle.contains(&target))
                });
                if closes {
                    lines.push(format!("src/{shown}:{}", number + 1));
                }
            }
        }
        problems.push(format!(
            "an import cycle among {}: {}",
            names.join(", "),
            lines.join(", ")
        ));
    }
    problems
}

#[test]
fn layers_import_only_lower_layers_and_no_module_closes_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = breaches(&src);
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The check itself: an upward import and a cycle in a small made-up tree
/// are found, with file and line.
#[test]
fn an_upward_import_and_a_cycle_are_found() {
    let dir = std::env::temp_dir().join(format!("subloop-architecture-{}", std::process::id()));
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("dir");
        }
        std::fs::write(path, text).expect("write");
    };
    write("lib.rs", "pub mod core;\npub mod record;\n");
    write("core/mod.rs", "pub mod a;\npub mod b;\n");
    write("core/a.rs", "use super::b::B;\n");
    write(
        "core/b.rs",
        "use crate::core::a::A;\n/// See [`crate::record::trace`].\n",
    );
    write("record/mod.rs", "pub mod trace;\n");
    write("record/trace.rs", "//! A trace.\n");
    let problems = breaches(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert_eq!(
        problems[0],
        "src/core/b.rs:2: core::b imports record (`record::trace`), a layer it may not name"
    );
    assert_eq!(
        problems[1],
        "an import cycle among core::a, core::b: src/core/a.rs:1, src/core/b.rs:1"
    );
}
