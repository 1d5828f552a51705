//! The `--view` / `view -o` page in a real browser (headless Chromium): the
//! pages of the three demo runs (`allow`, `deny`, `--child-calls 1`), of
//! a 1000-turn run, of a compacted run and of a Claude Code session with a
//! subagent (`view` of another agent's history). For each, the page's script finishes (`data-ready`), the
//! lanes, call boxes and result links it drew or folded match the trace line
//! for line,
//! it logs nothing to the console, it requests nothing over the network (its
//! own Resource Timing list is empty and the browser's network log shows no
//! host beyond the browser's own background traffic, which a control page
//! proves the check can see), and a screenshot is taken
//! (`target/tmp/view-*.png`). The long run's page draws only the ends of its
//! lane (a bounded number of call boxes and elements, whatever the length),
//! a fold draws its calls when opened, and a link to a folded call (an
//! invariant's breach) draws it and shows it.
//!
//! Without a Chromium this test says it was skipped (and fails under
//! `SUBLOOP_NO_SKIP`, as in `.ci/run`, which installs Debian's `chromium`).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::TempDir;
use serde_json::Value;

/// The browser: `SUBLOOP_CHROMIUM`, else the first of the usual names on PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SUBLOOP_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome", "chrome"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// A directory under `/tmp` with a short name, removed when dropped.
struct ShortDir(PathBuf);

impl ShortDir {
    fn new() -> Self {
        let path = PathBuf::from(format!("/tmp/slv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("browser scratch dir");
        Self(path)
    }
}

impl Drop for ShortDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One headless browser run on `page` with `mode` (`--dump-dom` or
/// `--screenshot=FILE`); its own profile, HOME and TMPDIR live in `scratch`.
/// Returns stdout, stderr and the hosts of every http(s) URL in its network log.
fn browse(
    browser: &Path,
    scratch: &Path,
    page: &Path,
    mode: &str,
) -> (String, String, BTreeSet<String>) {
    let profile = scratch.join(format!("profile-{}", rand_tag()));
    let net = scratch.join(format!("net-{}.json", rand_tag()));
    std::fs::create_dir_all(&profile).expect("profile dir");
    let url = format!(
        "file://{}{}",
        page.display(),
        if mode == "--dump-dom" {
            "#selftest"
        } else {
            ""
        }
    );
    let output = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--window-size=1500,1100",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--log-net-log={}", net.display()))
        .arg(mode)
        .arg(&url)
        .env("HOME", scratch)
        .env("TMPDIR", scratch)
        .stdin(Stdio::null())
        .output()
        .expect("run the browser");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "the browser failed on {url}: {}\n{stderr}",
        output.status
    );
    let log = std::fs::read_to_string(&net).unwrap_or_default();
    let hosts = log
        .split("\"url\":\"")
        .skip(1)
        .filter_map(|rest| {
            let url = rest.split('"').next()?;
            let after = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))?;
            Some(after.split(['/', '?', ':']).next()?.to_owned())
        })
        .collect();
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr,
        hosts,
    )
}

fn rand_tag() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst).to_string()
}

/// The attributes of the `<html>` start tag of a dumped DOM.
fn root_attributes(dom: &str) -> BTreeMap<String, String> {
    let start = dom.find("<html").expect("an html element");
    let end = dom[start..].find('>').expect("end of the html tag") + start;
    let tag = &dom[start + 5..end];
    let mut attributes = BTreeMap::new();
    let mut rest = tag.trim();
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim().to_owned();
        let value_end = rest[eq + 2..].find('"').expect("quoted value") + eq + 2;
        attributes.insert(name, rest[eq + 2..value_end].to_owned());
        rest = rest[value_end + 1..].trim();
    }
    attributes
}

/// What the trace holds, counted from its lines (not through the library):
/// agents with a request, requests, tool lines.
fn trace_counts(trace: &Path) -> (usize, usize, usize) {
    let text = std::fs::read_to_string(trace).expect("trace");
    let mut agents = BTreeSet::new();
    let (mut requests, mut tools) = (0, 0);
    for line in text.lines() {
        let value: Value = serde_json::from_str(line).expect("trace line");
        match value["kind"].as_str() {
            Some("request") => {
                agents.insert(value["agent"].as_str().unwrap_or_default().to_owned());
                requests += 1;
            }
            Some("tool") => tools += 1,
            _ => {}
        }
    }
    (agents.len(), requests, tools)
}

/// `turns` rounds of one `read_file` call, then an answer.
fn long_script(turns: usize, file: &str) -> Value {
    let mut parent: Vec<Value> = (1..=turns)
        .map(|turn| {
            serde_json::json!({
                "content": [{"type": "tool_use", "id": format!("toolu_{turn}"), "name": "read_file", "input": {"path": file}}],
                "stop_reason": "tool_use"
            })
        })
        .collect();
    parent.push(serde_json::json!({
        "content": [{"type": "text", "text": format!("Read {file} {turns} times.")}],
        "stop_reason": "end_turn"
    }));
    serde_json::json!({ "parent": parent })
}

fn subloop(args: &[&str]) -> std::process::Output {
    Command::new(common::bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

#[test]
fn the_pages_of_the_demo_runs_and_a_long_run_draw_in_a_browser() {
    let Some(browser) = chromium() else {
        common::skipped("no Chromium found (install Debian's `chromium`, or set SUBLOOP_CHROMIUM)");
        return;
    };
    let dir = TempDir::new("view-browser");
    // The browser's profile, HOME and TMPDIR: a short path, since Chromium
    // puts a Unix socket in its TMPDIR (at most 107 bytes of path).
    let scratch = ShortDir::new();
    let scratch = scratch.0.as_path();
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&shots).expect("screenshot dir");

    // Pages: the three demo runs through `--view`, a 1000-turn run through
    // `view -o`, and the same run compacted, through `--view`.
    let mut pages: Vec<(&str, PathBuf, PathBuf)> = Vec::new();
    for (name, flags) in [
        ("allow", &["--decision", "allow"][..]),
        ("deny", &["--decision", "deny"][..]),
        (
            "child-calls-1",
            &["--decision", "deny", "--child-calls", "1"][..],
        ),
    ] {
        let trace = dir.path().join(format!("{name}.jsonl"));
        let page = dir.path().join(format!("{name}.html"));
        let mut args = vec!["demo", "--quiet"];
        args.extend_from_slice(flags);
        args.extend(["--trace", trace.to_str().expect("utf-8")]);
        args.extend(["--view", page.to_str().expect("utf-8")]);
        let out = subloop(&args);
        assert!(
            out.status.code() == Some(0) || name == "child-calls-1",
            "demo {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(page.is_file(), "demo {name} wrote no page");
        pages.push((name, trace, page));
    }
    let workspace = dir.path().join("long-ws");
    std::fs::create_dir_all(&workspace).expect("workspace");
    std::fs::write(workspace.join("data.txt"), "x".repeat(4096)).expect("data");
    let script = dir.path().join("long-script.json");
    std::fs::write(&script, long_script(1000, "data.txt").to_string()).expect("script");
    let trace = dir.path().join("long.jsonl");
    let page = dir.path().join("long.html");
    let out = subloop(&[
        "run",
        "--quiet",
        "--decision",
        "deny",
        "--max-calls",
        "1001",
        "--workspace",
        workspace.to_str().expect("utf-8"),
        "--script",
        script.to_str().expect("utf-8"),
        "--trace",
        trace.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = subloop(&[
        "view",
        trace.to_str().expect("utf-8"),
        "--max-calls",
        "1001",
        "-o",
        page.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pages.push(("long", trace, page));
    // The same run compacted under a 20,000-token window: its requests
    // after each compaction open the history that compaction made.
    let trace = dir.path().join("compacted.jsonl");
    let page = dir.path().join("compacted.html");
    let out = subloop(&[
        "run",
        "--quiet",
        "--decision",
        "deny",
        "--max-calls",
        "1001",
        "--context-window",
        "20000",
        "--workspace",
        workspace.to_str().expect("utf-8"),
        "--script",
        script.to_str().expect("utf-8"),
        "--trace",
        trace.to_str().expect("utf-8"),
        "--view",
        page.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read_to_string(&trace)
            .expect("trace")
            .contains("\"kind\":\"compaction\""),
        "the compacted run compacted"
    );
    pages.push(("compacted", trace, page));

    // A Claude Code session with a subagent, shown by `view`: the page of
    // the run it reads as (whose trace gives the counts).
    let (session, agent) = super::foreign::session_with_a_subagent();
    let file = dir.write("cc/s1.jsonl", &session);
    dir.write("cc/s1/subagents/agent-ab12cd.jsonl", &agent);
    let page = dir.path().join("claude-code.html");
    let out = subloop(&[
        "view",
        file.to_str().expect("utf-8"),
        "-o",
        page.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let foreign = subloop::record::foreign::Foreign::read(
        &session,
        None,
        &[("agent-ab12cd.jsonl".to_owned(), agent)],
    )
    .expect("a session");
    let trace = dir.write("claude-code.trace.jsonl", &foreign.trace);
    pages.push(("claude-code", trace, page));

    // The browser's own traffic, from a page with nothing in it; and a
    // control page that does fetch, so the check is seen to catch a request.
    let empty = dir.write("empty.html", "<!DOCTYPE html><html><body></body></html>");
    let (_, _, background) = browse(&browser, scratch, &empty, "--dump-dom");
    let fetching = dir.write(
        "fetching.html",
        "<!DOCTYPE html><html><body><img src=\"http://subloop-control.invalid/x.png\"></body></html>",
    );
    let (fetch_dom, fetch_log, fetched) = browse(&browser, scratch, &fetching, "--dump-dom");
    assert!(
        fetched.contains("subloop-control.invalid"),
        "the network check cannot see a page's request: {fetched:?}\n{fetch_dom}\n{fetch_log}"
    );

    for (name, trace, page) in &pages {
        let (dom, log, hosts) = browse(&browser, scratch, page, "--dump-dom");
        let root = root_attributes(&dom);
        assert_eq!(
            root.get("data-ready").map(String::as_str),
            Some("1"),
            "{name}: the page's script did not finish: {root:?}\n{log}"
        );
        assert!(!root.contains_key("data-error"), "{name}: {root:?}");
        // Its controls work: a call's request and a result open as JSON, a
        // link shows its result, teaching notes show, a fold opens.
        assert_eq!(
            root.get("data-selftest").map(String::as_str),
            Some("ok"),
            "{name}: {root:?}"
        );
        let (lanes, calls, links) = trace_counts(trace);
        let count = |key: &str| root.get(key).and_then(|v| v.parse::<usize>().ok());
        assert_eq!(count("data-lanes"), Some(lanes), "{name}: lanes");
        assert_eq!(count("data-calls"), Some(calls), "{name}: call boxes");
        assert_eq!(count("data-links"), Some(links), "{name}: result links");
        assert_eq!(
            count("data-broken"),
            Some(0),
            "{name}: an invariant is shown broken"
        );
        assert_eq!(
            count("data-resources"),
            Some(0),
            "{name}: the page fetched something"
        );
        let console: Vec<&str> = log
            .lines()
            .filter(|line| line.contains(":CONSOLE"))
            .collect();
        assert!(console.is_empty(), "{name}: console output: {console:?}");
        let new_hosts: Vec<&String> = hosts.difference(&background).collect();
        assert!(
            new_hosts.is_empty(),
            "{name}: the page made requests to {new_hosts:?}"
        );
        if *name == "long" {
            // Drawn: the ends of the lane, not its 1001 calls; the page is
            // no bigger than the trace it shows, give or take its script.
            let drawn = count("data-drawn-calls").unwrap_or(usize::MAX);
            let elements = count("data-elements").unwrap_or(usize::MAX);
            assert!(drawn <= 50, "{name}: {drawn} call boxes drawn at first");
            assert!(
                elements <= 1500,
                "{name}: {elements} elements drawn at first"
            );
            let page_bytes = std::fs::metadata(page).map_or(u64::MAX, |meta| meta.len());
            let trace_bytes = std::fs::metadata(trace).map_or(0, |meta| meta.len());
            assert!(
                page_bytes <= trace_bytes + trace_bytes / 2 + 100_000,
                "{name}: a page of {page_bytes} bytes for a trace of {trace_bytes}"
            );
        }
        let shot = shots.join(format!("view-{name}.png"));
        let _ = std::fs::remove_file(&shot);
        browse(
            &browser,
            scratch,
            page,
            &format!("--screenshot={}", shot.display()),
        );
        let png = std::fs::read(&shot).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 10_000,
            "{name}: no screenshot at {}",
            shot.display()
        );
        eprintln!(
            "view {name}: {lanes} lane(s), {calls} call(s) ({} drawn, the rest folded), {links} link(s); {} elements drawn in {} ms; screenshot {}",
            root.get("data-drawn-calls").map_or("?", String::as_str),
            root.get("data-elements").map_or("?", String::as_str),
            root.get("data-draw-ms").map_or("?", String::as_str),
            shot.display()
        );
    }
    // A hand-broken trace (the denied call's result shows it ran): the
    // panel marks the rule broken and its link leads to the call.
    let deny_trace = std::fs::read_to_string(&pages[1].1).expect("deny trace");
    assert!(deny_trace.contains("not executed: permission denied"));
    let broken_trace = dir.write(
        "broken.jsonl",
        deny_trace.replace(
            "not executed: permission denied",
            "exit code 0\\nstdout:\\n42",
        ),
    );
    let broken_page = dir.path().join("broken.html");
    let out = subloop(&[
        "view",
        "--check",
        broken_trace.to_str().expect("utf-8"),
        "-o",
        broken_page.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (dom, log, _) = browse(&browser, scratch, &broken_page, "--dump-dom");
    let root = root_attributes(&dom);
    assert_eq!(
        root.get("data-broken").map(String::as_str),
        Some("1"),
        "{root:?}\n{log}"
    );
    assert_eq!(
        root.get("data-selftest").map(String::as_str),
        Some("ok"),
        "{root:?}"
    );

    // The long run checked against a budget of 500: the breach is at call
    // 501, folded; its link draws that call and shows it.
    let (_, long_trace, _) = &pages[3];
    let over_page = dir.path().join("over.html");
    let out = subloop(&[
        "view",
        "--check",
        long_trace.to_str().expect("utf-8"),
        "--max-calls",
        "500",
        "-o",
        over_page.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (dom, log, _) = browse(&browser, scratch, &over_page, "--dump-dom");
    let root = root_attributes(&dom);
    assert_eq!(
        root.get("data-broken").map(String::as_str),
        Some("1"),
        "{root:?}\n{log}"
    );
    assert_eq!(
        root.get("data-selftest").map(String::as_str),
        Some("ok"),
        "{root:?}"
    );
    assert!(
        dom.contains("id=\"c-0-501\""),
        "the breach link did not draw the folded call 501"
    );
    assert!(
        !dom.contains("id=\"c-0-400\""),
        "calls far from the breach were drawn too"
    );

    // The delegations are drawn: the demo runs each start one child.
    let (dom, _, _) = browse(&browser, scratch, &pages[0].2, "--dump-dom");
    assert_eq!(
        root_attributes(&dom)
            .get("data-delegations")
            .map(String::as_str),
        Some("1")
    );
}
