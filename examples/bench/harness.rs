//! Many demo runs at once in one process against a loopback model server,
//! and what they cost: wall time against the floor, peak RSS, threads, CPU.
//!
//! A run is `subloop demo --live` with `--decision deny`, built as the
//! host builds it: `read_file` and `run_main` over a temporary copy of the
//! demo workspace (one copy, and by default one `read_file` cloned into
//! every run: see [`Tools`]), the plan, and a subagent with `read_file`
//! only, whose model is a live client; every `run_main` is denied
//! (nothing is run).
//! The parent makes 4 model requests (`task`, `read_file`, `run_main`, the
//! answer) and its child 3, so the longest chain of requests one after
//! another is 7: the floor is 7 × the server's delay.
//!
//! * `blocking`: each run on a thread of its own, with the blocking clients
//!   and `Agent::run`.
//! * `async`: every run a tokio task on a multi-threaded runtime, with the
//!   async clients and `Agent::run_async`.
//!
//! Used by `examples/concurrent.rs` and `tests/providers/concurrent_bench.rs`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use subloop::agent::subagent::{ChildBudget, SubagentConfig};
use subloop::policy::permission::DenyAll;
use subloop::providers::anthropic::LiveConfig;
use subloop::providers::http::ApiKey;
use subloop::providers::http::Timeouts;
use subloop::providers::http::retry::RetryPolicy;
use subloop::providers::openai::OpenAiConfig;
use subloop::run::model::ChildModels;
use subloop::tools::{ReadFile, RunMain, RunSettings};
use subloop::{Agent, AgentBuilder, Budget, Hooks, RunReport, StatusKind};

use super::server;

/// The start of the demo's answer when `run_main` is denied.
pub const EXPECTED_ANSWER: &str = "The subagent reports: source derives 42; not run yet. \
expected.txt holds 42. The program was not run (not executed";

/// The longest chain of requests one after another: the parent's 4 around its child's 3.
pub const CHAIN: u32 = 7;

/// The parent's call budget (the CLI's default `--max-calls`).
const PARENT_CALLS: u32 = 8;

/// How the runs are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A thread per run, blocking clients, `Agent::run`.
    Blocking,
    /// A task per run on a tokio runtime, async clients, `Agent::run_async`.
    Async,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "blocking" => Some(Self::Blocking),
            "async" => Some(Self::Async),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Blocking => "blocking",
            Self::Async => "async",
        }
    }
}

/// Which API the runs talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Anthropic,
    OpenAi,
}

impl Provider {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "anthropic" => Some(Self::Anthropic),
            "openai" => Some(Self::OpenAi),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub provider: Provider,
    /// Runs at once.
    pub runs: usize,
    /// The in-process server's delay (with `base_url`, the server's own).
    pub delay: Duration,
    /// The async runtime's worker threads.
    pub threads: usize,
    /// The in-process server's worker threads.
    pub server_threads: usize,
    /// Passed to the in-process server.
    pub status_429_every: u64,
    /// Passed to the in-process server.
    pub stall_every: u64,
    /// A server already running (`http://HOST:PORT`, without `/v1`); none:
    /// one is started in this process.
    pub base_url: Option<String>,
    /// Ask for event streams.
    pub stream: bool,
    /// Blocking mode: each model holds its run's stop probe, as the CLI's
    /// do (a request then waits on a worker thread while the run's thread
    /// checks the probe every 20 ms).
    pub stop_probe: bool,
    /// The client's read timeout (a stalled request gives up after it).
    pub read_timeout: Duration,
    /// Each run opens its own `read_file` (a workspace directory handle
    /// per run) instead of sharing one.
    pub tools_per_run: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            mode: Mode::Blocking,
            provider: Provider::Anthropic,
            runs: 100,
            delay: Duration::from_millis(100),
            threads: 2,
            server_threads: 2,
            status_429_every: 0,
            stall_every: 0,
            base_url: None,
            stream: false,
            stop_probe: true,
            read_timeout: Timeouts::default().read,
            tools_per_run: false,
        }
    }
}

/// What the runs cost.
#[derive(Debug, Clone)]
pub struct Figures {
    pub runs: usize,
    pub mode: Mode,
    pub provider: Provider,
    pub delay: Duration,
    pub threads: usize,
    pub stop_probe: bool,
    pub stream: bool,
    pub tools_per_run: bool,
    /// From the first run's start to the last run's end.
    pub wall: Duration,
    /// Runs that answered as the demo does.
    pub ok: usize,
    /// The others, by how they ended (`answered` for a wrong answer).
    pub failed: BTreeMap<String, usize>,
    /// The first failure's text.
    pub first_failure: Option<String>,
    /// `VmRSS` just before the runs, KiB.
    pub rss_before_kib: u64,
    /// `VmHWM` after the runs (reset before them), KiB.
    pub rss_peak_kib: u64,
    /// The process's threads just before the runs.
    pub threads_before: u64,
    /// The most threads the process had during the runs (sampled every 10 ms).
    pub threads_peak: u64,
    /// Open file descriptors just before the runs.
    pub fds_before: u64,
    /// The most descriptors the process had open during the runs (sampled
    /// every 100 ms, less often past a few thousand).
    pub fds_peak: u64,
    /// The process's limit of open descriptors (raised to the hard limit).
    pub fd_limit: u64,
    /// User + system CPU of the whole process during the runs.
    pub cpu: Duration,
    /// Of which the in-process server's threads; none with `base_url`.
    pub server_cpu: Option<Duration>,
    /// The server's counters over the runs.
    pub server: server::Snapshot,
    /// The server ran in this process.
    pub server_in_process: bool,
}

impl Figures {
    /// [`CHAIN`] × the delay.
    pub fn floor(&self) -> Duration {
        self.delay * CHAIN
    }

    pub fn ratio(&self) -> f64 {
        self.wall.as_secs_f64() / self.floor().as_secs_f64().max(1e-9)
    }

    pub fn failed_total(&self) -> usize {
        self.failed.values().sum()
    }

    /// (peak − before) / runs, KiB.
    pub fn rss_per_run_kib(&self) -> f64 {
        self.rss_peak_kib.saturating_sub(self.rss_before_kib) as f64 / self.runs.max(1) as f64
    }

    /// One line per figure.
    pub fn lines(&self) -> Vec<String> {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let failed = if self.failed.is_empty() {
            "0".to_owned()
        } else {
            let by: Vec<String> = self
                .failed
                .iter()
                .map(|(status, count)| format!("{status} {count}"))
                .collect();
            format!("{} ({})", self.failed_total(), by.join(", "))
        };
        let mut cpu = format!("cpu: {:.2} s user+sys", self.cpu.as_secs_f64());
        if let Some(server) = self.server_cpu {
            cpu.push_str(&format!(
                " (of which the in-process server {:.2} s)",
                server.as_secs_f64()
            ));
        }
        let mut lines = vec![
            format!("runs: {}", self.runs),
            format!(
                "mode: {}{}",
                self.mode.name(),
                match self.mode {
                    Mode::Async => format!(" ({} worker threads)", self.threads),
                    Mode::Blocking if self.stop_probe =>
                        " (stop probe: a worker thread per request)".to_owned(),
                    Mode::Blocking => " (no stop probe)".to_owned(),
                }
            ),
            format!(
                "tools: {}",
                if self.tools_per_run {
                    "a read_file (and its workspace handle) per run"
                } else {
                    "one read_file (one workspace handle) shared by every run"
                }
            ),
            format!(
                "provider: {}{}",
                self.provider.name(),
                if self.stream { " (streamed)" } else { "" }
            ),
            format!("delay: {} ms", self.delay.as_millis()),
            format!("wall: {:.3} s", self.wall.as_secs_f64()),
            format!(
                "floor: {:.3} s ({CHAIN} requests one after another x {} ms)",
                self.floor().as_secs_f64(),
                self.delay.as_millis()
            ),
            format!("wall/floor: {:.2}", self.ratio()),
            format!("ok: {}", self.ok),
            format!("failed: {failed}"),
            format!("rss before: {:.1} MiB", mib(self.rss_before_kib)),
            format!("peak rss: {:.1} MiB", mib(self.rss_peak_kib)),
            format!("rss per run: {:.1} KiB", self.rss_per_run_kib()),
            format!("threads before: {}", self.threads_before),
            format!("threads peak: {}", self.threads_peak),
            format!(
                "descriptors: {} before, {} at most (limit {})",
                self.fds_before, self.fds_peak, self.fd_limit
            ),
            cpu,
            format!(
                "requests served: {} (received {}, 429 {}, stalled {}, bad {}; {} connections, at most {} open; server {})",
                self.server.answered,
                self.server.received,
                self.server.throttled,
                self.server.stalled,
                self.server.bad,
                self.server.connections,
                self.server.peak_open,
                if self.server_in_process {
                    "in this process"
                } else {
                    "another process"
                }
            ),
        ];
        if let Some(first) = &self.first_failure {
            lines.push(format!("first failure: {first}"));
        }
        lines
    }

    /// The figures as one JSON object.
    pub fn json(&self) -> Value {
        json!({
            "runs": self.runs,
            // Runs that ended answered with the demo's answer.
            "answered": self.ok,
            "peak_threads": self.threads_peak,
            "mode": self.mode.name(),
            "provider": self.provider.name(),
            "stream": self.stream,
            "threads": self.threads,
            "stop_probe": self.stop_probe,
            "tools_per_run": self.tools_per_run,
            "delay_ms": self.delay.as_millis() as u64,
            "wall_s": self.wall.as_secs_f64(),
            "floor_s": self.floor().as_secs_f64(),
            "ratio": self.ratio(),
            "ok": self.ok,
            "failed": self.failed_total(),
            "failed_by_status": self.failed,
            "first_failure": self.first_failure,
            "rss_before_kib": self.rss_before_kib,
            "rss_peak_kib": self.rss_peak_kib,
            "rss_per_run_kib": self.rss_per_run_kib(),
            "threads_before": self.threads_before,
            "threads_peak": self.threads_peak,
            "fds_before": self.fds_before,
            "fds_peak": self.fds_peak,
            "fd_limit": self.fd_limit,
            "cpu_s": self.cpu.as_secs_f64(),
            "server_cpu_s": self.server_cpu.map(|cpu| cpu.as_secs_f64()),
            "server_in_process": self.server_in_process,
            "requests_served": self.server.answered,
            "server": self.server.to_json(),
        })
    }
}

/// How one run ended: `Ok` when it answered as the demo does, else how it ended.
type Ended = Result<(), (String, String)>;

/// Checks a report: answered, with the demo's answer, 4 parent requests and one child of 3.
pub fn check(report: &RunReport) -> Ended {
    let outcome = &report.outcome;
    let status = serde_json::to_value(outcome.status)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", outcome.status));
    let fail = |why: String| Err((status.clone(), why));
    if outcome.status != StatusKind::Answered {
        return fail(outcome.text.chars().take(300).collect());
    }
    if !outcome.text.contains(EXPECTED_ANSWER) {
        return fail(format!(
            "not the demo's answer: {}",
            outcome.text.chars().take(300).collect::<String>()
        ));
    }
    let child_calls: Vec<u32> = report.children.iter().map(|c| c.outcome.calls).collect();
    if outcome.calls != 4 || child_calls != [3] {
        return fail(format!(
            "{} parent requests and children with {child_calls:?} (expected 4 and [3])",
            outcome.calls
        ));
    }
    Ok(())
}

/// A temporary copy of the demo workspace, removed when dropped.
pub struct Workspace(pub PathBuf);

impl Workspace {
    pub fn new() -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir =
            std::env::temp_dir().join(format!("subloop-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        for (name, text) in [
            ("main.py", include_str!("../workspace/main.py")),
            ("expected.txt", include_str!("../workspace/expected.txt")),
        ] {
            std::fs::write(dir.join(name), text)?;
        }
        Ok(Self(dir))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tools of every run over the workspace: one `read_file` (with its
/// directory handle) and one `run_main` cloned into each run's agent, as a
/// service's runs over one workspace can share them, or (`per_run`) new
/// ones for each run, as separate CLI processes have.
pub struct Tools {
    workspace: PathBuf,
    shared: Option<(ReadFile, RunMain)>,
}

fn setup_text(error: subloop::core::error::SetupError) -> String {
    error.to_string()
}

fn new_tools(workspace: &Path) -> Result<(ReadFile, RunMain), String> {
    Ok((
        ReadFile::new(workspace, ReadFile::DEFAULT_LIMIT).map_err(setup_text)?,
        RunMain::new(workspace, RunSettings::default()).map_err(setup_text)?,
    ))
}

impl Tools {
    pub fn new(workspace: &Path, per_run: bool) -> Result<Self, String> {
        Ok(Self {
            workspace: workspace.to_owned(),
            shared: if per_run {
                None
            } else {
                Some(new_tools(workspace)?)
            },
        })
    }

    /// The demo's agent as the host builds it, with every `run_main` denied.
    pub fn build_agent(&self, children: Arc<dyn ChildModels>) -> Result<Agent, String> {
        let (read_file, run_main) = match &self.shared {
            Some(tools) => tools.clone(),
            None => new_tools(&self.workspace)?,
        };
        let subagents = SubagentConfig::new(children, Hooks::none())
            .budget(ChildBudget::new(ChildBudget::DEFAULT).map_err(setup_text)?)
            .whitelist(&["read_file"]);
        Ok(AgentBuilder::new(Arc::new(DenyAll))
            .read_only_tool(read_file)
            .map_err(setup_text)?
            .tool(run_main)
            .map_err(setup_text)?
            .plan()
            .map_err(setup_text)?
            .subagents(subagents)
            .map_err(setup_text)?
            .build())
    }
}

/// The clients' settings: a base URL, retries enough for a server that
/// refuses every K-th request (each refusal says to wait 50 ms).
struct Settings {
    anthropic: LiveConfig,
    openai: OpenAiConfig,
}

fn settings(base_url: &str, options: &Options) -> Settings {
    let timeouts = Timeouts {
        read: options.read_timeout,
        ..Timeouts::default()
    };
    let retry = RetryPolicy::default().with_max_retries(10);
    let mut anthropic = LiveConfig::new(ApiKey::new("bench-key-not-secret"), base_url);
    anthropic.model = "bench".to_owned();
    anthropic.max_tokens = 1024;
    anthropic.timeouts = timeouts;
    anthropic.retry = retry;
    anthropic.stream = options.stream;
    let mut openai = OpenAiConfig::new("bench", format!("{base_url}/v1"));
    openai.max_tokens = 1024;
    openai.timeouts = timeouts;
    openai.retry = retry;
    openai.stream = options.stream;
    Settings { anthropic, openai }
}

/// Reads a `kB` field of `/proc/self/status` (or a plain number, for `Threads`).
pub fn status_field(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// User + system CPU of the process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |tv: libc::timeval| {
        Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// User + system CPU of this process's threads named `name` (from `/proc/self/task`).
fn threads_cpu(name: &str) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten() {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        // After the name: state, ppid, ... utime is field 14, stime 15.
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let field = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok());
        total += field(11).unwrap_or(0) + field(12).unwrap_or(0);
    }
    Duration::from_secs_f64(total as f64 / ticks)
}

/// The process's open file descriptors.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64)
}

/// Samples the process's thread count every 10 ms and its open
/// descriptors every 100 ms, or less often when listing them takes long
/// (about 20 ms for 17,000): at most 1% of a core goes to the listing.
/// Runs until stopped; gives the most of each seen.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl Sampler {
    fn start() -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("bench-sampler".to_owned())
            .spawn(move || {
                let (mut threads, mut fds) = (0, 0);
                let mut next_listing = Instant::now();
                loop {
                    threads = threads.max(status_field("Threads").unwrap_or(0));
                    if Instant::now() >= next_listing {
                        let listing = Instant::now();
                        fds = fds.max(open_fds());
                        next_listing = Instant::now()
                            + (listing.elapsed() * 100).max(Duration::from_millis(100));
                    }
                    if stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                (threads, fds.max(open_fds()))
            })?;
        Ok(Self { stop, thread })
    }

    /// The most threads and descriptors seen.
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or((0, 0))
    }
}

/// Where the server's counters come from.
enum Server {
    InProcess(server::Running),
    Elsewhere(String),
}

impl Server {
    fn url(&self) -> &str {
        match self {
            Self::InProcess(running) => &running.url,
            Self::Elsewhere(url) => url,
        }
    }

    fn snapshot(&self) -> Result<server::Snapshot, String> {
        match self {
            Self::InProcess(running) => Ok(running.stats.snapshot()),
            Self::Elsewhere(url) => remote_stats(url),
        }
    }
}

/// `GET /stats` from a server at `http://HOST:PORT`.
fn remote_stats(url: &str) -> Result<server::Snapshot, String> {
    let address = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs"))?
        .trim_end_matches('/');
    let fail = |err: std::io::Error| format!("GET {url}/stats: {err}");
    let mut stream = std::net::TcpStream::connect(address).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    write!(
        stream,
        "GET /stats HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n"
    )
    .map_err(fail)?;
    let mut text = String::new();
    stream.read_to_string(&mut text).map_err(fail)?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    serde_json::from_str::<Value>(body)
        .ok()
        .as_ref()
        .and_then(server::Snapshot::from_json)
        .ok_or_else(|| format!("GET {url}/stats: not the bench server's counters: {body:.200}"))
}

/// Runs `options.runs` demo runs at once and measures them.
pub fn run(options: &Options) -> Result<Figures, String> {
    if options.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let fd_limit = server::raise_nofile_limit().unwrap_or(0);
    let workspace = Workspace::new().map_err(|err| format!("workspace: {err}"))?;
    let tools = Arc::new(Tools::new(&workspace.0, options.tools_per_run)?);
    let server = match &options.base_url {
        Some(url) => Server::Elsewhere(url.trim_end_matches('/').to_owned()),
        None => Server::InProcess(
            server::Running::start(
                server::Options {
                    delay: options.delay,
                    status_429_every: options.status_429_every,
                    stall_every: options.stall_every,
                },
                options.server_threads,
            )
            .map_err(|err| format!("starting the server: {err}"))?,
        ),
    };
    let settings = settings(server.url(), options);
    let sampler = Sampler::start().map_err(|err| format!("sampler thread: {err}"))?;
    // VmHWM is reset, so the peak is the runs' own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before_kib = status_field("VmRSS").unwrap_or(0);
    let threads_before = status_field("Threads").unwrap_or(0);
    let fds_before = open_fds();
    let before = server.snapshot()?;
    let cpu_before = cpu_time();
    let server_cpu_before = threads_cpu(server::THREAD_NAME);
    let start = Instant::now();
    let ended = match options.mode {
        Mode::Blocking => blocking::run_all(options, &settings, &tools),
        Mode::Async => async_runs::run_all(options, &settings, &tools)?,
    };
    let wall = start.elapsed();
    let cpu = cpu_time().saturating_sub(cpu_before);
    let server_cpu = match &server {
        Server::InProcess(_) => {
            Some(threads_cpu(server::THREAD_NAME).saturating_sub(server_cpu_before))
        }
        Server::Elsewhere(_) => None,
    };
    let rss_peak_kib = status_field("VmHWM").unwrap_or(0);
    let (threads_peak, fds_peak) = sampler.finish();
    let after = server.snapshot()?;
    let mut figures = Figures {
        runs: options.runs,
        mode: options.mode,
        provider: options.provider,
        delay: options.delay,
        threads: options.threads,
        stop_probe: options.stop_probe,
        stream: options.stream,
        tools_per_run: options.tools_per_run,
        wall,
        ok: 0,
        failed: BTreeMap::new(),
        first_failure: None,
        rss_before_kib,
        rss_peak_kib,
        threads_before,
        threads_peak,
        fds_before,
        fds_peak,
        fd_limit,
        cpu,
        server_cpu,
        server: after.since(&before),
        server_in_process: matches!(server, Server::InProcess(_)),
    };
    for result in ended {
        match result {
            Ok(()) => figures.ok += 1,
            Err((status, why)) => {
                *figures.failed.entry(status).or_insert(0) += 1;
                figures.first_failure.get_or_insert(why);
            }
        }
    }
    Ok(figures)
}

mod blocking {
    //! A thread per run, the blocking clients, `Agent::run`.

    use std::sync::Arc;

    use subloop::Model;
    use subloop::providers::anthropic::{self, AnthropicModel};
    use subloop::providers::http::StopSlot;
    use subloop::providers::openai::{self, OpenAiModel};

    use super::{Budget, Ended, Options, PARENT_CALLS, Provider, Settings, Tools};

    /// One client for every run, as a service would hold.
    #[derive(Clone)]
    pub(super) enum Client {
        Anthropic(Arc<anthropic::Client>),
        OpenAi(Arc<openai::Client>),
    }

    impl Client {
        pub(super) fn new(provider: Provider, settings: &Settings) -> Self {
            match provider {
                Provider::Anthropic => {
                    Self::Anthropic(Arc::new(anthropic::Client::new(settings.anthropic.clone())))
                }
                Provider::OpenAi => {
                    Self::OpenAi(Arc::new(openai::Client::new(settings.openai.clone())))
                }
            }
        }

        pub(super) fn model(&self, stop: Option<&StopSlot>) -> Box<dyn Model + Send> {
            match (self, stop) {
                (Self::Anthropic(client), None) => {
                    Box::new(AnthropicModel::new(Arc::clone(client)))
                }
                (Self::Anthropic(client), Some(slot)) => Box::new(AnthropicModel::with_stop(
                    Arc::clone(client),
                    Arc::clone(slot),
                )),
                (Self::OpenAi(client), None) => Box::new(OpenAiModel::new(Arc::clone(client))),
                (Self::OpenAi(client), Some(slot)) => {
                    Box::new(OpenAiModel::with_stop(Arc::clone(client), Arc::clone(slot)))
                }
            }
        }
    }

    fn one(client: &Client, tools: &Tools, stop_probe: bool) -> Ended {
        let failed = |why: String| Err(("setup".to_owned(), why));
        let slot: StopSlot = Arc::default();
        let children = {
            let (client, slot) = (client.clone(), Arc::clone(&slot));
            move |_number: usize| client.model(stop_probe.then_some(&slot))
        };
        let agent = match tools.build_agent(Arc::new(children)) {
            Ok(agent) => agent,
            Err(why) => return failed(why),
        };
        if stop_probe {
            let _ = slot.set(agent.stop_probe());
        }
        let mut model = client.model(stop_probe.then_some(&slot));
        let budget =
            Budget::new(PARENT_CALLS).map_err(|err| ("setup".to_owned(), err.to_string()))?;
        match agent.run(
            subloop::providers::demo::DemoParent::QUESTION,
            budget,
            model.as_mut(),
        ) {
            Ok(report) => super::check(&report),
            Err(err) => failed(err.to_string()),
        }
    }

    pub(super) fn run_all(
        options: &Options,
        settings: &Settings,
        tools: &Arc<Tools>,
    ) -> Vec<Ended> {
        let client = Client::new(options.provider, settings);
        let stop_probe = options.stop_probe;
        let handles: Vec<_> = (0..options.runs)
            .map(|index| {
                let (client, tools) = (client.clone(), Arc::clone(tools));
                std::thread::Builder::new()
                    .name(format!("run-{index}"))
                    .spawn(move || one(&client, &tools, stop_probe))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(handle) => handle.join().unwrap_or_else(|_| {
                    Err(("panic".to_owned(), "the run's thread panicked".to_owned()))
                }),
                Err(err) => Err(("spawn".to_owned(), format!("no thread for the run: {err}"))),
            })
            .collect()
    }
}

mod async_runs {
    //! Every run a task on a tokio runtime, the async clients, `Agent::run_async`.

    use std::sync::Arc;

    use subloop::Model;
    use subloop::providers::anthropic::{self, AsyncAnthropicModel};
    use subloop::providers::openai::{self, AsyncOpenAiModel};
    use subloop::run::model::{AsyncModel, ChildModels};

    use super::{Budget, Ended, Options, PARENT_CALLS, Provider, Settings, Tools};

    /// One client for every run: the runs share its connection pool.
    #[derive(Clone)]
    enum Client {
        Anthropic(Arc<anthropic::AsyncClient>),
        OpenAi(Arc<openai::AsyncClient>),
    }

    impl Client {
        fn new(provider: Provider, settings: &Settings) -> Result<Self, String> {
            Ok(match provider {
                Provider::Anthropic => Self::Anthropic(Arc::new(
                    anthropic::AsyncClient::new(settings.anthropic.clone())
                        .map_err(|err| err.to_string())?,
                )),
                Provider::OpenAi => Self::OpenAi(Arc::new(
                    openai::AsyncClient::new(settings.openai.clone())
                        .map_err(|err| err.to_string())?,
                )),
            })
        }

        fn model(&self) -> Box<dyn AsyncModel + Send> {
            match self {
                Self::Anthropic(client) => Box::new(AsyncAnthropicModel::new(Arc::clone(client))),
                Self::OpenAi(client) => Box::new(AsyncOpenAiModel::new(Arc::clone(client))),
            }
        }
    }

    /// Each child gets a model of the shared async client; the blocking
    /// one is there for `ChildModels::model_for`, which async runs do not call.
    struct Children {
        client: Client,
        blocking: super::blocking::Client,
    }

    impl ChildModels for Children {
        fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
            self.blocking.model(None)
        }

        fn async_model_for(&self, _number: usize) -> Box<dyn AsyncModel + Send> {
            self.client.model()
        }
    }

    async fn one(client: Client, children: Arc<dyn ChildModels>, tools: &Tools) -> Ended {
        let setup = |why: String| ("setup".to_owned(), why);
        let agent = tools.build_agent(children).map_err(setup)?;
        let budget = Budget::new(PARENT_CALLS).map_err(|err| setup(err.to_string()))?;
        let mut model = client.model();
        match agent
            .run_async(
                subloop::providers::demo::DemoParent::QUESTION,
                budget,
                &mut model,
            )
            .await
        {
            Ok(report) => super::check(&report),
            Err(err) => Err(setup(err.to_string())),
        }
    }

    pub(super) fn run_all(
        options: &Options,
        settings: &Settings,
        tools: &Arc<Tools>,
    ) -> Result<Vec<Ended>, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads.max(1))
            .thread_name("bench-run")
            .enable_all()
            .build()
            .map_err(|err| format!("the runs' runtime: {err}"))?;
        runtime.block_on(async {
            let client = Client::new(options.provider, settings)?;
            let children: Arc<dyn ChildModels> = Arc::new(Children {
                client: client.clone(),
                blocking: super::blocking::Client::new(options.provider, settings),
            });
            let tasks: Vec<_> = (0..options.runs)
                .map(|_| {
                    let (client, children) = (client.clone(), Arc::clone(&children));
                    let tools = Arc::clone(tools);
                    tokio::spawn(async move { one(client, children, &tools).await })
                })
                .collect();
            let mut ended = Vec::with_capacity(tasks.len());
            for task in tasks {
                ended.push(task.await.unwrap_or_else(|_| {
                    Err(("panic".to_owned(), "the run's task panicked".to_owned()))
                }));
            }
            Ok(ended)
        })
    }
}
