//! The house keeps its shape: the library's layers import only the layers
//! below them, no module of the library closes an import cycle, and every
//! top-level module has a layer. The library's source is parsed with `syn`:
//! every `use` tree (groups and renames expanded), every path in code
//! (expressions, types, patterns, trait bounds, macro paths, the tokens of
//! macro calls and `macro_rules!` bodies), paths in attribute strings (`serialize_with = "…"`) and
//! the intra-doc links of doc comments. `crate::`, `super::` and `self::`
//! are resolved against the module the path is written in, and a name the
//! crate root re-exports (`crate::Agent`) against the module it comes from.
//! Failures name file and line.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::Visit;

/// The library's layers, lowest first; a layer may name only lower ones
/// (the siblings `policy`, `tools` and `providers` not each other).
const LAYERS: [(&str, u8); 8] = [
    ("core", 0),
    ("run", 1),
    ("policy", 2),
    ("tools", 2),
    ("providers", 2),
    ("agent", 3),
    ("record", 4),
    ("testing", 5),
];

/// What a failure tells the reader to do next.
const NEXT: &str = "\
A layer may name only the layers below it:
    core ← run ← {policy, tools, providers} ← agent ← record ← testing
(the siblings policy, tools and providers not each other). To fix an import
across layers, move the item down to a layer both sides may name, or pass it
in from above (a trait, a parameter, a callback defined in the lower layer);
a doc link may point at a path its layer may name, or be plain text. A name
re-exported at the crate root (`crate::Agent`) counts as the module it comes
from. To break a cycle, move what both modules need into one of them or into
a third module they both import. A new top-level module needs a row in LAYERS
(tests/architecture.rs) and in docs/architecture.md.";

fn rank(top: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == top)
        .map(|(_, rank)| *rank)
}

/// One file of the library: its module path (`record::resume`; empty for
/// `lib.rs`), the name failures show, and its text.
struct Source {
    module: Vec<String>,
    file: String,
    text: String,
}

impl Source {
    /// A made-up file of module `module` (`"core::a"`, `""` for the root).
    fn new(module: &str, text: &str) -> Self {
        let module: Vec<String> = module
            .split("::")
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect();
        let file = if module.is_empty() {
            "src/lib.rs".to_owned()
        } else {
            format!("src/{}.rs", module.join("/"))
        };
        Source {
            module,
            file,
            text: text.to_owned(),
        }
    }
}

/// The binary's own folders under `src`: not the library (which cannot
/// name them: the compiler sees to that).
const BINARY_FOLDERS: [&str; 2] = ["cli", "host"];

/// Every `.rs` file of the library under `src` (the binary's `main.rs`,
/// `cli/` and `host/` are not the library), with its module path.
fn library_files(src: &Path) -> Vec<Source> {
    let mut found = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(src).unwrap_or(&path).to_path_buf();
            if BINARY_FOLDERS
                .iter()
                .any(|folder| relative.starts_with(folder))
                || relative == Path::new("main.rs")
            {
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
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let file = format!("src/{}", relative.display());
                found.push(Source { module, file, text });
            }
        }
    }
    found.sort_by(|a, b| a.file.cmp(&b.file));
    found
}

/// The top-level entries of `src` that are modules of the library: each
/// folder and `.rs` file but `lib.rs`, `main.rs` and the binary's folders.
fn top_level_entries(src: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(src).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !BINARY_FOLDERS.contains(&name.as_str()) {
                names.push(name);
            }
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "lib"
            && stem != "main"
        {
            names.push(stem.to_owned());
        }
    }
    names.sort();
    names
}

/// A path named somewhere in a file: where, and what it names, from the
/// crate root (`crate::`, `super::` and `self::` already resolved).
#[derive(Debug)]
struct Named {
    line: usize,
    path: Vec<String>,
    /// How it was written, for the message.
    written: String,
}

/// The line `span` starts on.
fn line_of(span: Span) -> usize {
    span.start().line
}

/// `segments` as written in `module`, from the crate root: `crate::a` is
/// `a`, `super::a` the parent's `a`, `self::a` the module's own. `None` for
/// any other path (a local name, an extern crate, `::std`).
fn resolve(module: &[String], segments: &[String]) -> Option<Vec<String>> {
    let first = segments.first()?;
    let (mut path, rest) = match first.as_str() {
        "crate" | "$crate" => (Vec::new(), segments.get(1..).unwrap_or_default()),
        "self" => (module.to_vec(), segments.get(1..).unwrap_or_default()),
        "super" => {
            let mut path = module.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|part| part == "super") {
                path.pop();
                rest = rest.get(1..).unwrap_or_default();
            }
            (path, rest)
        }
        _ => return None,
    };
    path.extend(rest.iter().cloned());
    Some(path)
}

/// Collects what one file names.
struct Collector {
    /// The module the visitor is in (the file's, deeper in inline `mod`s).
    module: Vec<String>,
    named: Vec<Named>,
    /// Doc strings in file order: module, line, text.
    docs: Vec<(Vec<String>, usize, String)>,
    /// Top-level `mod` items, when the file is the crate root.
    mods: Vec<(String, usize)>,
}

impl Collector {
    /// Notes `segments` if it is a path of the crate; says whether it was.
    fn push(&mut self, line: usize, segments: &[String]) -> bool {
        let Some(path) = resolve(&self.module, segments) else {
            return false;
        };
        self.named.push(Named {
            line,
            path,
            written: segments.join("::"),
        });
        true
    }

    /// Every path of a `use` tree, groups and renames expanded.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let full = if name.ident == "self" {
                    prefix.clone()
                } else {
                    let mut full = prefix.clone();
                    full.push(name.ident.to_string());
                    full
                };
                self.push(line_of(name.ident.span()), &full);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                if rename.ident != "self" {
                    full.push(rename.ident.to_string());
                }
                self.push(line_of(rename.ident.span()), &full);
            }
            syn::UseTree::Glob(glob) => {
                let line = line_of(glob.star_token.spans[0]);
                let prefix = prefix.clone();
                if self.push(line, &prefix)
                    && let Some(named) = self.named.last_mut()
                {
                    named.written.push_str("::*");
                }
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// The `crate::…`, `$crate::…`, `super::…` and `self::…` paths among a
    /// macro's tokens (which syn does not parse).
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut index = 0;
        while let Some(tree) = trees.get(index) {
            match tree {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Ident(ident)
                    if ident == "crate" || ident == "super" || ident == "self" =>
                {
                    let before = index.checked_sub(1).and_then(|i| trees.get(i));
                    let dollar = matches!(before, Some(TokenTree::Punct(p)) if p.as_char() == '$');
                    let after_colon =
                        matches!(before, Some(TokenTree::Punct(p)) if p.as_char() == ':');
                    if !after_colon {
                        let mut segments = vec![if dollar && ident == "crate" {
                            "$crate".to_owned()
                        } else {
                            ident.to_string()
                        }];
                        let mut next = index + 1;
                        while let (
                            Some(TokenTree::Punct(a)),
                            Some(TokenTree::Punct(b)),
                            Some(TokenTree::Ident(part)),
                        ) = (trees.get(next), trees.get(next + 1), trees.get(next + 2))
                        {
                            if a.as_char() != ':' || b.as_char() != ':' {
                                break;
                            }
                            segments.push(part.to_string());
                            next += 3;
                        }
                        if segments.len() > 1 {
                            self.push(line_of(ident.span()), &segments);
                        }
                        index = next;
                        continue;
                    }
                }
                TokenTree::Literal(literal) => {
                    // A path in a string: `#[serde(with = "crate::x")]`.
                    let text = literal.to_string();
                    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'))
                        && is_path_text(inner)
                    {
                        let segments: Vec<String> = inner.split("::").map(str::to_owned).collect();
                        self.push(line_of(literal.span()), &segments);
                    }
                }
                _ => {}
            }
            index += 1;
        }
    }
}

/// `text` is a whole path that starts `crate::`, `super::` or `self::`.
fn is_path_text(text: &str) -> bool {
    ["crate::", "super::", "self::"]
        .iter()
        .any(|start| text.starts_with(start))
        && text
            .split("::")
            .all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        for attr in &item.attrs {
            self.visit_attribute(attr);
        }
        if item.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if self.module.is_empty() {
            self.mods
                .push((item.ident.to_string(), line_of(item.ident.span())));
        }
        for attr in &item.attrs {
            if matches!(attr.style, syn::AttrStyle::Outer) {
                self.visit_attribute(attr);
            }
        }
        if let Some((_, items)) = &item.content {
            self.module.push(item.ident.to_string());
            for attr in &item.attrs {
                if matches!(attr.style, syn::AttrStyle::Inner(_)) {
                    self.visit_attribute(attr);
                }
            }
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none()
            && let Some(first) = path.segments.first()
        {
            let segments: Vec<String> = path
                .segments
                .iter()
                .map(|segment| segment.ident.to_string())
                .collect();
            self.push(line_of(first.ident.span()), &segments);
        }
        syn::visit::visit_path(self, path);
    }

    // `pub(super)` and `pub(in crate::a)` say who may see an item, not
    // what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if attr.path().is_ident("doc") {
            if let syn::Meta::NameValue(value) = &attr.meta
                && let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }) = &value.value
            {
                self.docs
                    .push((self.module.clone(), line_of(text.span()), text.value()));
            }
            return;
        }
        if let syn::Meta::List(list) = &attr.meta {
            self.tokens(list.tokens.clone());
        }
        self.visit_path(attr.path());
    }
}

/// The paths that the intra-doc links of `text` name: inside `[…]`, inside
/// the `(…)` or `[…]` right after one, and after `[…]:` at the start of a
/// line; not in fenced code. Each with the line (counted from 0) it is on.
fn doc_links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    // Open brackets: '[' and the '(' of a link's destination.
    let mut open: Vec<char> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            open.clear();
            continue;
        }
        if fenced {
            continue;
        }
        if trimmed.is_empty() {
            open.clear();
            continue;
        }
        // A reference definition: `[name]: crate::path`.
        let definition = trimmed.starts_with('[')
            && trimmed
                .find("]:")
                .is_some_and(|end| !trimmed[..end].contains(']'));
        let mut previous = ' ';
        let mut seen_definition_colon = false;
        for (at, c) in line.char_indices() {
            match c {
                '[' => open.push('['),
                ']' => {
                    if let Some(place) = open.iter().rposition(|o| *o == '[') {
                        open.truncate(place);
                    }
                }
                '(' if previous == ']' => open.push('('),
                ')' => {
                    if let Some(place) = open.iter().rposition(|o| *o == '(') {
                        open.truncate(place);
                    }
                }
                ':' if definition && previous == ']' => seen_definition_colon = true,
                _ => {}
            }
            let starts_path = ["crate::", "super::", "self::"]
                .iter()
                .any(|start| line[at..].starts_with(start))
                && !(previous.is_alphanumeric() || previous == '_' || previous == ':');
            if starts_path && (!open.is_empty() || seen_definition_colon) {
                let path: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                found.push((number, path.trim_end_matches(':').to_owned()));
            }
            previous = c;
        }
    }
    found
}

/// The names the crate root's `use` items make `crate::Name`, each mapped
/// to the path it stands for (`Agent` → `agent::Agent`).
fn root_exports(root: Option<&Source>) -> BTreeMap<String, Vec<String>> {
    let mut exports = BTreeMap::new();
    let Some(file) = root.and_then(|root| syn::parse_file(&root.text).ok()) else {
        return exports;
    };
    fn walk(
        prefix: &mut Vec<String>,
        tree: &syn::UseTree,
        exports: &mut BTreeMap<String, Vec<String>>,
    ) {
        let with = |prefix: &Vec<String>, name: &syn::Ident| {
            let mut full: Vec<String> = prefix
                .iter()
                .filter(|part| *part != "crate" && *part != "self")
                .cloned()
                .collect();
            if name != "self" {
                full.push(name.to_string());
            }
            full
        };
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                walk(prefix, &path.tree, exports);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let full = with(prefix, &name.ident);
                if let Some(last) = full.last() {
                    exports.insert(last.clone(), full);
                }
            }
            syn::UseTree::Rename(rename) => {
                exports.insert(rename.rename.to_string(), with(prefix, &rename.ident));
            }
            // A glob's names would need the module's items; none is used.
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    walk(prefix, tree, exports);
                }
            }
        }
    }
    for item in &file.items {
        if let syn::Item::Use(item) = item
            && item.leading_colon.is_none()
        {
            walk(&mut Vec::new(), &item.tree, &mut exports);
        }
    }
    exports
}

/// The module (a file of the library) that `path` names: the crate root's
/// re-exports followed, then its longest prefix that is a module.
fn owner(
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
    exports: &BTreeMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    let mut path = path.to_vec();
    // A re-export of a re-export: follow a few.
    for _ in 0..4 {
        let Some(first) = path.first() else { break };
        if modules.contains(&vec![first.clone()]) {
            break;
        }
        let Some(real) = exports.get(first) else {
            break;
        };
        let mut real = real.clone();
        real.extend(path.iter().skip(1).cloned());
        path = real;
    }
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

/// Everything wrong with the layering of `sources`, one line each: a file
/// that does not parse, a top-level module with no layer, an import across
/// layers, an import cycle.
fn breaches(sources: &[Source]) -> Vec<String> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let root = sources.iter().find(|source| source.module.is_empty());
    let exports = root_exports(root);
    let mut problems = Vec::new();

    // Every top-level module has a layer: the files' and the root's `mod`s.
    let mut unlayered: BTreeMap<String, String> = BTreeMap::new();
    for source in sources {
        if let Some(top) = source.module.first()
            && rank(top).is_none()
        {
            unlayered.entry(top.clone()).or_insert(source.file.clone());
        }
    }

    // (from module, to module) → where.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut places: Vec<(Vec<String>, Vec<String>, String)> = Vec::new();
    for source in sources {
        let file = match syn::parse_file(&source.text) {
            Ok(file) => file,
            Err(error) => {
                let line = line_of(error.span());
                problems.push(format!("{}:{line}: does not parse: {error}", source.file));
                continue;
            }
        };
        let mut collector = Collector {
            module: source.module.clone(),
            named: Vec::new(),
            docs: Vec::new(),
            mods: Vec::new(),
        };
        collector.visit_file(&file);
        for (name, line) in &collector.mods {
            if rank(name).is_none() {
                unlayered
                    .entry(name.clone())
                    .or_insert(format!("{}:{line}", source.file));
            }
        }
        // Doc links, consecutive doc lines (of one module) read as one text.
        let mut linked = Vec::new();
        let mut docs = collector.docs.iter().peekable();
        while let Some((module, first_line, text)) = docs.next() {
            let mut pieces = vec![(*first_line, text)];
            while let Some((next_module, next_line, next_text)) = docs.peek() {
                let (line, text) = pieces[pieces.len() - 1];
                if next_module != module || *next_line != line + text.matches('\n').count() + 1 {
                    break;
                }
                pieces.push((*next_line, next_text));
                docs.next();
            }
            // The text, and the file line of each of its lines.
            let mut joined = String::new();
            let mut line_of_text = Vec::new();
            for (line, text) in &pieces {
                if !joined.is_empty() {
                    joined.push('\n');
                }
                joined.push_str(text);
                line_of_text.extend((0..=text.matches('\n').count()).map(|k| line + k));
            }
            for (number, written) in doc_links(&joined) {
                let segments: Vec<String> = written.split("::").map(str::to_owned).collect();
                if let Some(path) = resolve(module, &segments) {
                    linked.push(Named {
                        line: line_of_text.get(number).copied().unwrap_or(*first_line),
                        path,
                        written,
                    });
                }
            }
        }
        collector.named.extend(linked);

        let from_top = source.module.first().map(String::as_str);
        let from_rank = from_top.and_then(rank);
        // A glob of the crate root (`use crate::*`, `use super::*` at the
        // top) names everything the root re-exports.
        let everything: Vec<&Vec<String>> = exports.values().collect();
        let named_paths = collector.named.iter().flat_map(|named| {
            let paths = if named.path.is_empty() {
                everything.clone()
            } else {
                vec![&named.path]
            };
            paths.into_iter().map(move |path| (named, path))
        });
        for (named, path) in named_paths {
            let Some(target) = owner(path, &modules, &exports) else {
                continue;
            };
            let Some(top) = target.first().map(String::as_str) else {
                continue;
            };
            if let (Some(from), Some(to)) = (from_rank, rank(top)) {
                let sibling = from == to && from_top != Some(top);
                if to > from || sibling {
                    problems.push(format!(
                        "{}:{}: {} names {} (`{}`, in {}), a layer it may not name",
                        source.file,
                        named.line,
                        source.module.join("::"),
                        top,
                        named.written,
                        target.join("::"),
                    ));
                }
            }
            // Naming one's own items or submodules is not an import.
            if !source.module.is_empty() && !target.starts_with(&source.module) {
                edges
                    .entry(source.module.clone())
                    .or_default()
                    .insert(target.clone());
                places.push((
                    source.module.clone(),
                    target,
                    format!("{}:{}", source.file, named.line),
                ));
            }
        }
    }
    for (name, place) in &unlayered {
        problems.push(format!(
            "{place}: the top-level module `{name}` has no layer in LAYERS"
        ));
    }
    for cycle in cycles(&edges) {
        let names: Vec<String> = cycle.iter().map(|module| module.join("::")).collect();
        let mut lines: Vec<&str> = places
            .iter()
            .filter(|(from, to, _)| cycle.contains(from) && cycle.contains(to))
            .map(|(_, _, place)| place.as_str())
            .collect();
        lines.sort();
        lines.dedup();
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
    let sources = library_files(&src);
    let mut problems = breaches(&sources);
    for name in top_level_entries(&src) {
        if rank(&name).is_none() && !problems.iter().any(|p| p.contains(&format!("`{name}`"))) {
            problems.push(format!(
                "src/{name}: the top-level module `{name}` has no layer in LAYERS"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}\n\n{NEXT}",
        problems.len(),
        problems.join("\n")
    );
}

/// The crate root of the made-up trees below: every layer a module, and
/// `Agent` re-exported as the real `lib.rs` does.
const ROOT: &str = "pub mod core;\npub mod run;\npub mod tools;\npub mod agent;\n\
                    pub use agent::{Agent, AgentBuilder as Builder};\n";

fn tree(files: &[(&str, &str)]) -> Vec<Source> {
    let mut sources = vec![Source::new("", ROOT)];
    sources.extend(files.iter().map(|(module, text)| Source::new(module, text)));
    sources
}

/// A grouped import, on one line or spread over several, is read item by
/// item.
#[test]
fn a_grouped_import_is_found() {
    let problems = breaches(&tree(&[
        ("core", "pub mod a;\npub mod b;\n"),
        ("core::a", "use crate::{agent::AgentBuilder};\n"),
        (
            "core::b",
            "use crate::{\n    core::a,\n    agent::{self, Agent as A},\n};\n",
        ),
        ("agent", "pub struct Agent;\npub struct AgentBuilder;\n"),
    ]));
    assert_eq!(
        problems,
        [
            "src/core/a.rs:1: core::a names agent (`crate::agent::AgentBuilder`, in agent), \
             a layer it may not name",
            "src/core/b.rs:3: core::b names agent (`crate::agent`, in agent), \
             a layer it may not name",
            "src/core/b.rs:3: core::b names agent (`crate::agent::Agent`, in agent), \
             a layer it may not name",
        ],
    );
}

/// A path through a name the crate root re-exports counts as the module
/// the name comes from: in code, in `use`, and in doc links; a glob of the
/// crate root names all of them.
#[test]
fn a_path_through_a_root_re_export_is_found() {
    let problems = breaches(&tree(&[
        (
            "run",
            "//! Driven by [`Agent`](crate::Agent).\n\
             use crate::Builder;\n\
             /// See [crate::Agent] and\n\
             /// [the agent's run][`crate::Agent::run`].\n\
             pub fn f(agent: &crate::Agent) -> usize {\n\
             \x20   let _ = vec![crate::Agent::new()];\n\
             \x20   0\n\
             }\n",
        ),
        ("core", "use super::*;\n"),
        ("agent", "pub struct Agent;\npub struct AgentBuilder;\n"),
    ]));
    let lines: Vec<&str> = problems
        .iter()
        .map(|problem| problem.split(' ').next().unwrap_or_default())
        .collect();
    assert_eq!(
        lines,
        [
            "src/run.rs:2:",
            "src/run.rs:5:",
            "src/run.rs:6:",
            "src/run.rs:1:",
            "src/run.rs:3:",
            "src/run.rs:4:",
            "src/core.rs:1:",
            "src/core.rs:1:",
        ],
        "{problems:#?}"
    );
    assert!(problems.iter().all(|p| p.contains(" names agent (")));
}

/// A top-level module with no row in LAYERS is reported, as a file or
/// folder of its own and as a `mod` of the crate root.
#[test]
fn a_top_level_module_with_no_layer_is_found() {
    let mut sources = tree(&[("newthing", "pub struct New;\n")]);
    let problems = breaches(&sources);
    assert_eq!(
        problems,
        ["src/newthing.rs: the top-level module `newthing` has no layer in LAYERS"]
    );
    sources[0].text.push_str("mod other;\n");
    let problems = breaches(&sources);
    assert_eq!(
        problems,
        [
            "src/newthing.rs: the top-level module `newthing` has no layer in LAYERS",
            "src/lib.rs:6: the top-level module `other` has no layer in LAYERS",
        ]
    );
}

/// Paths inside a macro call's tokens, in a macro_rules body (`$crate`
/// too) and in an attribute's string are read; a sibling layer is refused
/// as a higher one is.
#[test]
fn paths_in_macros_attributes_and_siblings_are_found() {
    let problems = breaches(&tree(&[
        (
            "run",
            "macro_rules! m { () => { $crate::agent::Agent } }\n\
             #[derive(serde::Serialize)]\n\
             struct S(#[serde(serialize_with = \"crate::tools::f\")] u8);\n\
             fn g() { assert!(matches!(x(), crate::agent::Agent)); }\n",
        ),
        ("tools", "pub fn f() {}\n"),
        ("agent", "pub struct Agent;\npub struct AgentBuilder;\n"),
    ]));
    let lines: Vec<&str> = problems
        .iter()
        .map(|problem| problem.split(' ').next().unwrap_or_default())
        .collect();
    assert_eq!(
        lines,
        ["src/run.rs:1:", "src/run.rs:3:", "src/run.rs:4:"],
        "{problems:#?}"
    );
}

/// A tree that keeps its layers passes: lower layers named through groups,
/// renames, `super::`, `self::`, a root re-export and doc links; a test
/// module's `use super::*`; a doc link in a code block is not a link.
#[test]
fn a_clean_tree_passes() {
    let problems = breaches(&tree(&[
        ("core", "pub mod a;\npub mod b;\npub use self::a::A;\n"),
        (
            "core::a",
            "pub struct A;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        (
            "core::b",
            "use super::{a::{self, A as Alias}};\n\
             /// Made from [`A`](crate::core::a::A).\n\
             ///\n\
             /// ```text\n\
             /// [crate::Agent]\n\
             /// ```\n\
             pub struct B(Alias);\n",
        ),
        (
            "run",
            "use crate::{core::{a::A, b::B}};\n/// [`crate::core::A`]\npub fn f(_: A, _: B) {}\n",
        ),
        (
            "tools",
            "use crate::run;\npub fn t() { run::f(crate::core::A, todo!()) }\n",
        ),
        (
            "agent",
            "//! Uses [tools](crate::tools) and [`crate::run::f`].\n\
             pub struct Agent;\npub struct AgentBuilder;\n\
             fn a() -> crate::Agent { crate::tools::t(); Agent }\n",
        ),
    ]));
    assert!(problems.is_empty(), "{problems:#?}");
}

/// An import cycle between modules of one layer is found, with the lines
/// that close it.
#[test]
fn an_import_cycle_is_found() {
    let problems = breaches(&tree(&[
        ("core", "pub mod a;\npub mod b;\n"),
        ("core::a", "use super::b::B;\npub struct A;\n"),
        (
            "core::b",
            "pub struct B;\n\n/// Next to [`crate::core::a::A`].\nfn f() {}\n",
        ),
    ]));
    assert_eq!(
        problems,
        ["an import cycle among core::a, core::b: src/core/a.rs:1, src/core/b.rs:3"]
    );
}

/// In the binary, `host` (a run configured from settings) sits below `cli`
/// (flags, signals, printing): nothing under `src/host` names `crate::cli`,
/// so the host could serve another front end as it is.
#[test]
fn the_binarys_host_does_not_name_its_cli() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    let mut stack = vec![src.join("host")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let file = syn::parse_file(&text).unwrap();
            let mut collector = Collector {
                module: vec!["host".to_owned()],
                named: Vec::new(),
                docs: Vec::new(),
                mods: Vec::new(),
            };
            collector.visit_file(&file);
            for named in &collector.named {
                if named.path.first().is_some_and(|top| top == "cli") {
                    problems.push(format!(
                        "{}:{}: `{}`",
                        path.display(),
                        named.line,
                        named.written
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the binary's host names its cli:\n{}",
        problems.join("\n")
    );
}

/// Calls that look again after a while instead of being woken: a sleep, an
/// interval, a timed receive or park, a non-blocking wait or lock, made
/// inside a loop.
const POLLS: [&str; 7] = [
    "sleep",
    "interval",
    "recv_timeout",
    "park_timeout",
    "try_wait",
    "try_lock",
    "flock",
];

/// The loops of the library allowed to contain one of [`POLLS`]: (file,
/// function, why it is no poll or why it stays).
const WAITS: [(&str, &str, &str); 5] = [
    (
        "src/run/limits.rs",
        "sleep",
        "a timed wait that a stop unparks; the loop only absorbs spurious wake-ups",
    ),
    (
        "src/run/process.rs",
        "wait_until",
        "a timed wait on the child's pidfd; the sleep is the fallback on kernels without pidfd (before 5.3)",
    ),
    (
        "src/run/shutdown.rs",
        "run",
        "a bounded retry of a lock at termination, on the signal watcher, which must not wait on a lock a stuck thread holds",
    ),
    (
        "src/record/trace.rs",
        "on_shutdown",
        "a bounded retry of the trace's lock at termination, for the same reason",
    ),
    (
        "src/record/target.rs",
        "lock_soon",
        "a bounded retry of flock(LOCK_NB) for the instant a starting process holds a copy of the descriptor; flock has no timed form",
    ),
];

/// Finds calls named in [`POLLS`] inside loops, by the function they are in.
#[derive(Default)]
struct PollFinder {
    function: Vec<String>,
    loops: usize,
    found: Vec<(String, usize, String)>,
}

impl PollFinder {
    fn call(&mut self, name: &str, span: Span) {
        if self.loops > 0 && POLLS.contains(&name) {
            let function = self.function.last().cloned().unwrap_or_default();
            self.found.push((function, line_of(span), name.to_owned()));
        }
    }

    fn in_loop(&mut self, visit: impl FnOnce(&mut Self)) {
        self.loops += 1;
        visit(self);
        self.loops -= 1;
    }
}

impl<'ast> Visit<'ast> for PollFinder {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.function.push(item.sig.ident.to_string());
        let loops = std::mem::take(&mut self.loops);
        syn::visit::visit_item_fn(self, item);
        self.loops = loops;
        self.function.pop();
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.function.push(item.sig.ident.to_string());
        let loops = std::mem::take(&mut self.loops);
        syn::visit::visit_impl_item_fn(self, item);
        self.loops = loops;
        self.function.pop();
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // Unit tests may poll what they watch.
        let is_test = item.attrs.iter().any(|attr| {
            attr.path().is_ident("cfg")
                && attr
                    .parse_args::<syn::Ident>()
                    .is_ok_and(|ident| ident == "test")
        });
        if !is_test {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_expr_loop(&mut self, expr: &'ast syn::ExprLoop) {
        self.in_loop(|me| syn::visit::visit_expr_loop(me, expr));
    }

    fn visit_expr_while(&mut self, expr: &'ast syn::ExprWhile) {
        self.in_loop(|me| syn::visit::visit_expr_while(me, expr));
    }

    fn visit_expr_for_loop(&mut self, expr: &'ast syn::ExprForLoop) {
        self.in_loop(|me| syn::visit::visit_expr_for_loop(me, expr));
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(path) = &*call.func
            && let Some(last) = path.path.segments.last()
        {
            self.call(&last.ident.to_string(), last.ident.span());
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        self.call(&call.method.to_string(), call.method.span());
        syn::visit::visit_expr_method_call(self, call);
    }
}

/// Polls found outside [`WAITS`], as `file:line: name in function`, and
/// the entries of [`WAITS`] that match nothing.
fn polls(sources: &[Source], whole: bool) -> Vec<String> {
    let mut found = Vec::new();
    let mut used = BTreeSet::new();
    for source in sources {
        let Ok(file) = syn::parse_file(&source.text) else {
            found.push(format!("{}: does not parse", source.file));
            continue;
        };
        let mut finder = PollFinder::default();
        finder.visit_file(&file);
        for (function, line, name) in finder.found {
            let allowed = WAITS
                .iter()
                .position(|(file, allowed, _)| *file == source.file && *allowed == function);
            if let Some(index) = allowed {
                used.insert(index);
            } else {
                found.push(format!(
                    "{}:{line}: `{name}` in a loop of `{function}`",
                    source.file
                ));
            }
        }
    }
    for (index, (file, function, _)) in WAITS.iter().enumerate() {
        if whole && !used.contains(&index) {
            found.push(format!(
                "{file}: `{function}` is in WAITS but polls no more"
            ));
        }
    }
    found
}

/// Nothing in the library polls: what waits is woken (a waker, an unpark,
/// a pidfd, a pipe), or waits once with a timeout. The few loops that
/// still look again are listed in [`WAITS`], each with its reason.
#[test]
fn the_library_waits_to_be_woken_and_never_polls() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = polls(&library_files(&src), true);
    assert!(
        found.is_empty(),
        "{} poll(s) in the library:\n{}\n\nWait on what changes instead (a StopSignal or CancelHandle, \
         a condvar, a pidfd, a pipe), or list the loop in WAITS (tests/architecture.rs) with its reason.",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn a_sleep_in_a_loop_is_found_and_a_test_module_is_not() {
    let sources = tree(&[(
        "run/mod.rs",
        "fn wait() { loop { if done() { break; } std::thread::sleep(D); } }\n\
         fn once() { std::thread::sleep(D); }\n\
         #[cfg(test)] mod tests { fn t() { while x() { std::thread::sleep(D); } } }\n\
         impl S { fn f(&self) { for _ in 0..3 { let _ = self.rx.recv_timeout(D); } } }",
    )]);
    let found = polls(&sources, false);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("`sleep` in a loop of `wait`"),
        "{found:?}"
    );
    assert!(
        found[1].contains("`recv_timeout` in a loop of `f`"),
        "{found:?}"
    );
}
