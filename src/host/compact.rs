//! The CLI's compaction policies (`--compact`, `--context-window`), as the
//! library's [`Compaction`]s, and the policy a trace records for a replay.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;
use subloop::core::compaction::{
    ClearToolResults, Compaction, SlidingWindow, Summarize, Threshold, Tiered,
};

/// How a run compacts its histories (`--compact`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactPolicy {
    /// The tiered default: clear old tool results, then drop old rounds.
    Auto,
    /// Never: a request refused for its length ends the run `context_overflow`.
    Off,
    /// Clear every tool result but the last two.
    ClearResults,
    /// Keep the question and the last four rounds.
    Window,
    /// A summary the model writes of all but the last two rounds; `auto`
    /// when it cannot write one.
    Summarize,
    /// The Messages API clears old tool results on its side (context
    /// editing); `auto` here when a request is refused all the same.
    Native,
}

impl CompactPolicy {
    /// Every policy, in help order.
    pub const ALL: [Self; 6] = [
        Self::Auto,
        Self::Off,
        Self::ClearResults,
        Self::Window,
        Self::Summarize,
        Self::Native,
    ];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
            Self::ClearResults => "clear-results",
            Self::Window => "window",
            Self::Summarize => "summarize",
            Self::Native => "native",
        }
    }

    /// The policy named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|policy| policy.as_str() == name)
    }

    /// The library's compaction: the compactor, on an overflow, and past
    /// [`Threshold::DEFAULT_FRACTION`] of `window` when it is known.
    pub fn compaction(self, window: Option<u64>) -> Option<Compaction> {
        let compaction = match self {
            Self::Off => return None,
            Self::Auto | Self::Native => Compaction::new(Tiered::standard()),
            Self::ClearResults => Compaction::new(ClearToolResults::new(2)),
            Self::Window => Compaction::new(SlidingWindow::new(4)),
            Self::Summarize => Compaction::new(Tiered::standard()).summarizing(Summarize::new(2)),
        };
        Some(match window {
            // The server clears before the window fills; here only a refusal compacts.
            _ if self == Self::Native => compaction,
            Some(window) => {
                compaction.when(Threshold::of_window(window, Threshold::DEFAULT_FRACTION))
            }
            None => compaction,
        })
    }
}

/// The compaction policy and context window the trace at `path` records on
/// the parent's first request, if it records one it names.
pub fn recorded(path: &Path) -> Option<(CompactPolicy, Option<u64>)> {
    let file = std::fs::File::open(path).ok()?;
    for line in std::io::BufReader::new(file).lines().take(10_000) {
        let Ok(line) = line else { return None };
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let first = value.get("kind").and_then(Value::as_str) == Some("request")
            && value.get("agent").and_then(Value::as_str) == Some("parent");
        if !first {
            continue;
        }
        let compaction = value.get("compaction")?;
        let policy = CompactPolicy::parse(compaction.get("policy")?.as_str()?)?;
        let window = compaction.get("context_window").and_then(Value::as_u64);
        return Some((policy, window));
    }
    None
}

/// The context window a model server reports, in tokens: llama.cpp's
/// `llama-server` answers `GET /props` with
/// `default_generation_settings.n_ctx`. Asked of servers other than the
/// two official APIs (which have no such endpoint), within one second;
/// `None` when the server does not say.
#[cfg(feature = "live")]
pub fn window_of_server(base_url: &str) -> Option<u64> {
    let root = base_url.trim_end_matches('/');
    let root = root.strip_suffix("/v1").unwrap_or(root);
    let official = ["://api.anthropic.com", "://api.openai.com"];
    if official.iter().any(|host| root.contains(host)) {
        return None;
    }
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(std::time::Duration::from_secs(1)))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut response = agent.get(format!("{root}/props")).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    let text = response
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_string()
        .ok()?;
    let props: Value = serde_json::from_str(&text).ok()?;
    props
        .pointer("/default_generation_settings/n_ctx")
        .or_else(|| props.get("n_ctx"))
        .and_then(Value::as_u64)
        .filter(|tokens| *tokens > 0)
}
