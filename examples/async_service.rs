//! Many agents at once in one async service: each run is a tokio task
//! awaiting `Agent::run_async`, every parent and child model is a clone of
//! one async HTTP client (one connection pool), children of a `task` batch
//! run side by side on their run's task, and a run that takes too long is
//! dropped, which cancels it. No run holds a thread while it waits.
//!
//! ```text
//! cargo run --release --features async --example async_service -- \
//!     --base-url URL [--provider anthropic|openai] [--model NAME] \
//!     [--runs N] [--threads T] [--deadline-secs S]
//! ```
//!
//! The server is the Anthropic Messages API (`ANTHROPIC_API_KEY`, and the
//! base URL of the API or of a compatible server) or an OpenAI-compatible
//! one (`OPENAI_API_KEY` if it needs one; the base URL up to `/v1`). The
//! question is the demo's: with a model that follows it, each parent
//! delegates a look at `main.py` to a child, reads it, asks to run it (the
//! service's policy denies every program), and answers.

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::policy::permission::DenyAll;
use subloop::providers::demo::DemoParent;
use subloop::providers::{anthropic, openai};
use subloop::run::model::{AsyncChildren, AsyncModel};
use subloop::tools::{ReadFile, RunMain, RunSettings};
use subloop::{Agent, AgentBuilder, Budget, Hooks};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The command line.
struct Options {
    base_url: String,
    provider: String,
    model: Option<String>,
    runs: usize,
    threads: usize,
    deadline: Duration,
}

fn options() -> Result<Options, BoxError> {
    let mut options = Options {
        base_url: String::new(),
        provider: "anthropic".to_owned(),
        model: None,
        runs: 100,
        threads: 2,
        deadline: Duration::from_secs(300),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--base-url" => options.base_url = value()?,
            "--provider" => options.provider = value()?,
            "--model" => options.model = Some(value()?),
            "--runs" => options.runs = value()?.parse()?,
            "--threads" => options.threads = value()?.parse()?,
            "--deadline-secs" => options.deadline = Duration::from_secs_f64(value()?.parse()?),
            "-h" | "--help" => {
                println!(
                    "usage: async_service --base-url URL [--provider anthropic|openai] [--model NAME] [--runs N] [--threads T] [--deadline-secs S]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if options.base_url.is_empty() {
        return Err("--base-url URL is required (the API, or a compatible server)".into());
    }
    if options.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(options)
}

/// Hands out models: the parent's and, for each delegation, a child's —
/// all clones of one client.
#[derive(Clone)]
enum Models {
    Anthropic(Arc<anthropic::AsyncClient>),
    OpenAi(Arc<openai::AsyncClient>),
}

impl Models {
    fn new(options: &Options) -> Result<Self, BoxError> {
        let env = |name: &str| match name {
            "ANTHROPIC_BASE_URL" if options.provider == "anthropic" => {
                Some(options.base_url.clone())
            }
            "OPENAI_BASE_URL" if options.provider == "openai" => Some(options.base_url.clone()),
            _ => std::env::var(name).ok(),
        };
        match options.provider.as_str() {
            "anthropic" => {
                let config = anthropic::LiveConfig::from_env(env, options.model.clone())?;
                Ok(Self::Anthropic(Arc::new(anthropic::AsyncClient::new(
                    config,
                )?)))
            }
            "openai" => {
                let config = openai::OpenAiConfig::from_env(env, options.model.clone())?;
                Ok(Self::OpenAi(Arc::new(openai::AsyncClient::new(config)?)))
            }
            other => Err(format!("unknown provider {other} (anthropic or openai)").into()),
        }
    }

    fn model(&self) -> Box<dyn AsyncModel + Send> {
        match self {
            Self::Anthropic(client) => {
                Box::new(anthropic::AsyncAnthropicModel::new(Arc::clone(client)))
            }
            Self::OpenAi(client) => Box::new(openai::AsyncOpenAiModel::new(Arc::clone(client))),
        }
    }

    /// The client's secrets (its API key), hidden from every tool result
    /// as the client hides them from its replies.
    fn redactor(&self) -> subloop::core::redact::Redactor {
        match self {
            Self::Anthropic(client) => client.redactor(),
            Self::OpenAi(client) => client.redactor(),
        }
    }
}

/// One run's agent: built per run (an agent is consumed by its run); what
/// runs share comes in by `Arc`.
fn agent(workspace: &Path, models: &Models) -> Result<Agent, BoxError> {
    let children = models.clone();
    let children = AsyncChildren(move |_number: usize| children.model());
    Ok(
        AgentBuilder::new(Arc::new(DenyAll)) // a service decides by policy, not by prompt
            .redact(models.redactor())
            .read_only_tool(ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT)?)?
            .tool(RunMain::new(workspace, RunSettings::default())?)?
            .plan()?
            .subagents(
                SubagentConfig::new(Arc::new(children), Hooks::none())
                    .whitelist(&["read_file"])
                    .budget(ChildBudget::new(4)?),
            )?
            .build(),
    )
}

fn main() -> Result<(), BoxError> {
    let options = options()?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads)
        .enable_all()
        .build()?;
    let models = Models::new(&options)?;
    let started = Instant::now();
    let statuses = runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..options.runs {
            let agent = agent(&workspace, &models)?;
            let mut model = models.model();
            let deadline = options.deadline;
            tasks.spawn(async move {
                let run = agent.run_async(DemoParent::QUESTION, Budget::new(8)?, &mut model);
                // Past the deadline the run's future is dropped: its request
                // is abandoned and every conversation ends cancelled.
                match tokio::time::timeout(deadline, run).await {
                    Ok(report) => {
                        let report = report?;
                        Ok::<_, BoxError>((report.outcome.status.to_string(), report.outcome.text))
                    }
                    Err(_) => Ok(("dropped at the deadline".to_owned(), String::new())),
                }
            });
        }
        let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
        let mut first_answer = None;
        while let Some(joined) = tasks.join_next().await {
            let (status, text) = joined??;
            if status == "answered" && first_answer.is_none() {
                first_answer = Some(text);
            }
            *statuses.entry(status).or_default() += 1;
        }
        Ok::<_, BoxError>((statuses, first_answer))
    })?;
    let (statuses, first_answer) = statuses;
    println!(
        "{} runs in {:.2} s on {} worker thread(s)",
        options.runs,
        started.elapsed().as_secs_f64(),
        options.threads
    );
    for (status, count) in &statuses {
        println!("  {count:>6} {status}");
    }
    if let Some(text) = first_answer {
        println!("an answer: {}", text.lines().next().unwrap_or_default());
    }
    Ok(())
}
