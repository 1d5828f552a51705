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
//! Each run's models hold its stop signal, as the CLI's do. After the
//! runs, a bare HTTP client (reqwest on the same runtime for `async`, ureq
//! on a thread per run for `blocking`) posts the bytes one run sent, one
//! request after another, for as many runs at once: its wall time and CPU
//! per request are the floor the loop's are measured against.
//!
//! Used by `examples/concurrent.rs` and `tests/providers/concurrent_bench.rs`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Each model holds its run's stop signal, as the CLI's do.
    pub stop_signal: bool,
    /// The bare client whose floor is measured after the runs (none: no floor).
    pub bare: Option<BareClient>,
    /// The client's read timeout (a stalled request gives up after it).
    pub read_timeout: Duration,
    /// Each run opens its own `read_file` (a workspace directory handle
    /// per run) instead of sharing one.
    pub tools_per_run: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            mode: Mode::Async,
            provider: Provider::Anthropic,
            runs: 100,
            delay: Duration::from_millis(100),
            threads: 2,
            server_threads: 2,
            status_429_every: 0,
            stall_every: 0,
            base_url: None,
            stream: false,
            stop_signal: true,
            bare: None,
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
    pub stop_signal: bool,
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
    /// Requests the runs' models sent (counted by the client; retries not included).
    pub requests: u64,
    /// The server's counters over the runs: none from a server without `GET /stats`.
    pub server: Option<server::Snapshot>,
    /// The server ran in this process.
    pub server_in_process: bool,
    /// The bare client's floor, when measured.
    pub bare: Option<Bare>,
}

/// Makes a bare HTTP client (`examples/bench/bare.rs`) and gives what,
/// called, posts `bodies` to `url` one after another for each of
/// `options.runs` runs at once, as bare as an HTTP client goes, and
/// counts the requests that failed. Only the call is measured.
pub type BareClient =
    fn(url: &str, bodies: &[Vec<u8>], options: &Options) -> Result<BareRequests, String>;

/// What a [`BareClient`] made, ready to send.
pub type BareRequests = Box<dyn FnOnce() -> Result<u64, String>>;

/// A bare HTTP client posting the same bytes to the same server, one
/// request after another per run, as many runs at once.
#[derive(Debug, Clone)]
pub struct Bare {
    pub wall: Duration,
    /// CPU of this process (the in-process server's taken out).
    pub cpu: Duration,
    pub requests: u64,
    /// Requests that failed or got no 2xx.
    pub failed: u64,
}

impl Bare {
    pub fn cpu_per_request(&self) -> Duration {
        self.cpu / u32::try_from(self.requests.max(1)).unwrap_or(u32::MAX)
    }
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

    /// The client's own CPU: the process's, the in-process server's taken out.
    pub fn client_cpu(&self) -> Duration {
        self.cpu.saturating_sub(self.server_cpu.unwrap_or_default())
    }

    pub fn cpu_per_request(&self) -> Duration {
        self.client_cpu() / u32::try_from(self.requests.max(1)).unwrap_or(u32::MAX)
    }

    /// Client CPU per request over the bare client's.
    pub fn cpu_ratio(&self) -> Option<f64> {
        let bare = self.bare.as_ref()?.cpu_per_request().as_secs_f64();
        Some(self.cpu_per_request().as_secs_f64() / bare.max(1e-9))
    }

    /// (peak − before) / runs, KiB.
    pub fn rss_per_run_kib(&self) -> f64 {
        self.rss_peak_kib.saturating_sub(self.rss_before_kib) as f64 / self.runs.max(1) as f64
    }

    /// One line per figure.
    pub fn lines(&self) -> Vec<String> {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
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
                "mode: {}{}{}",
                self.mode.name(),
                match self.mode {
                    Mode::Async => format!(" ({} worker threads)", self.threads),
                    Mode::Blocking => " (a thread per run)".to_owned(),
                },
                if self.stop_signal {
                    ", models hold the run's stop signal"
                } else {
                    ", no stop signal"
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
                "requests sent: {}, client cpu per request: {:.1} us",
                self.requests,
                us(self.cpu_per_request())
            ),
        ];
        match &self.server {
            Some(server) => lines.push(format!(
                "server: served {} (received {}, 429 {}, stalled {}, bad {}; {} connections, at most {} open; {})",
                server.answered,
                server.received,
                server.throttled,
                server.stalled,
                server.bad,
                server.connections,
                server.peak_open,
                if self.server_in_process {
                    "in this process"
                } else {
                    "another process"
                }
            )),
            None => lines.push("server: another process, without GET /stats".to_owned()),
        }
        if let Some(bare) = &self.bare {
            lines.push(format!(
                "bare client: {:.3} s wall ({:.2} x the floor), {:.1} us cpu per request ({} requests, {} failed); subloop/bare cpu per request: {:.2}",
                bare.wall.as_secs_f64(),
                bare.wall.as_secs_f64() / self.floor().as_secs_f64().max(1e-9),
                us(bare.cpu_per_request()),
                bare.requests,
                bare.failed,
                self.cpu_ratio().unwrap_or(f64::NAN)
            ));
        }
        if let Some(first) = &self.first_failure {
            lines.push(format!("first failure: {first}"));
        }
        lines
    }

    /// The figures as one JSON object.
    pub fn json(&self) -> Value {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        json!({
            "runs": self.runs,
            "mode": self.mode.name(),
            "provider": self.provider.name(),
            "stream": self.stream,
            "threads": self.threads,
            "stop_signal": self.stop_signal,
            "tools_per_run": self.tools_per_run,
            "delay_ms": self.delay.as_millis() as u64,
            "wall_s": self.wall.as_secs_f64(),
            "floor_s": self.floor().as_secs_f64(),
            "ratio": self.ratio(),
            // Runs that ended answered with the demo's answer.
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
            "client_cpu_s": self.client_cpu().as_secs_f64(),
            "requests": self.requests,
            "cpu_per_request_us": us(self.cpu_per_request()),
            "server_in_process": self.server_in_process,
            "server": self.server.map(server::Snapshot::to_json),
            "connections": self.server.map(|server| server.connections),
            "bare": self.bare.as_ref().map(|bare| json!({
                "wall_s": bare.wall.as_secs_f64(),
                "ratio": bare.wall.as_secs_f64() / self.floor().as_secs_f64().max(1e-9),
                "cpu_s": bare.cpu.as_secs_f64(),
                "requests": bare.requests,
                "failed": bare.failed,
                "cpu_per_request_us": us(bare.cpu_per_request()),
            })),
            "cpu_per_request_over_bare": self.cpu_ratio(),
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

    /// The counters, when the server has them (`GET /stats`), less the
    /// connection that asked for them.
    fn snapshot(&self) -> Option<server::Snapshot> {
        match self {
            Self::InProcess(running) => Some(running.stats.snapshot()),
            Self::Elsewhere(url) => remote_stats(url).ok().map(|mut snapshot| {
                snapshot.connections = snapshot.connections.saturating_sub(1);
                snapshot
            }),
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

/// What the runs share for counting: the requests sent, and the bodies
/// of the first run's requests (the bare client sends them again).
#[derive(Default)]
pub struct Counters {
    requests: AtomicU64,
    bodies: Mutex<Option<Vec<Vec<u8>>>>,
}

impl Counters {
    /// Counts a request; keeps its body while recording.
    fn sent(&self, record: bool, body: impl FnOnce() -> Vec<u8>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if record {
            self.bodies
                .lock()
                .unwrap()
                .get_or_insert_with(Vec::new)
                .push(body());
        }
    }
}

/// The URL path of a provider's requests.
fn path(provider: Provider) -> &'static str {
    match provider {
        Provider::Anthropic => "/v1/messages",
        Provider::OpenAi => "/v1/chat/completions",
    }
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
    let counters = Arc::new(Counters::default());
    // The clients (and the async runtime) are made before the clock
    // starts, as a service makes them once.
    let blocking_client = blocking::Client::new(options.provider, &settings);
    let setup = match options.mode {
        Mode::Async => Some(async_runs::Setup::new(options, &settings)?),
        Mode::Blocking => None,
    };
    let sampler = Sampler::start().map_err(|err| format!("sampler thread: {err}"))?;
    // VmHWM is reset, so the peak is the runs' own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before_kib = status_field("VmRSS").unwrap_or(0);
    let threads_before = status_field("Threads").unwrap_or(0);
    let fds_before = open_fds();
    let before = server.snapshot();
    let cpu_before = cpu_time();
    let server_cpu_before = threads_cpu(server::THREAD_NAME);
    let start = Instant::now();
    let ended = match setup {
        None => blocking::run_all(options, &blocking_client, &tools, &counters),
        Some(setup) => async_runs::run_all(options, setup, blocking_client, &tools, &counters),
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
    let after = server.snapshot();
    let bodies = counters.bodies.lock().unwrap().take().unwrap_or_default();
    let bare = if let Some(bare) = options.bare.filter(|_| !bodies.is_empty()) {
        let url = format!("{}{}", server.url(), path(options.provider));
        let requests = bare(&url, &bodies, options)?;
        let cpu_before = cpu_time();
        let server_cpu_before = threads_cpu(server::THREAD_NAME);
        let start = Instant::now();
        let failed = requests()?;
        let wall = start.elapsed();
        let server_cpu = match &server {
            Server::InProcess(_) => {
                threads_cpu(server::THREAD_NAME).saturating_sub(server_cpu_before)
            }
            Server::Elsewhere(_) => Duration::ZERO,
        };
        Some(Bare {
            wall,
            cpu: cpu_time()
                .saturating_sub(cpu_before)
                .saturating_sub(server_cpu),
            requests: (bodies.len() * options.runs) as u64,
            failed,
        })
    } else {
        None
    };
    let mut figures = Figures {
        runs: options.runs,
        mode: options.mode,
        provider: options.provider,
        delay: options.delay,
        threads: options.threads,
        stop_signal: options.stop_signal,
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
        requests: counters.requests.load(Ordering::Relaxed),
        server: after
            .zip(before)
            .map(|(after, before)| after.since(&before)),
        server_in_process: matches!(server, Server::InProcess(_)),
        bare,
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

/// The bytes a client sends for a request.
type BodyOf = dyn Fn(&subloop::core::protocol::Request<'_>) -> Vec<u8> + Send + Sync;

/// A model of `client` (holding the run's stop slot, when given) in a
/// [`Counted`].
macro_rules! counted_model {
    ($model:ident, $client:expr, $stop:expr, $counters:expr, $record:expr) => {{
        let model = match $stop {
            Some(slot) => $model::with_stop(Arc::clone($client), Arc::clone(slot)),
            None => $model::new(Arc::clone($client)),
        };
        let client = Arc::clone($client);
        Box::new(super::Counted {
            inner: model,
            counters: $counters,
            record: $record,
            body: Arc::new(move |request| {
                serde_json::to_vec(&client.request_body(request)).unwrap()
            }),
        })
    }};
}

/// A model that counts its requests (and records their bodies for the
/// first run) before sending them through the model it wraps.
struct Counted<M> {
    inner: M,
    counters: Arc<Counters>,
    record: bool,
    body: Arc<BodyOf>,
}

impl<M: subloop::Model> subloop::Model for Counted<M> {
    fn respond(
        &mut self,
        request: &subloop::core::protocol::Request<'_>,
    ) -> Result<subloop::ModelResponse, subloop::core::error::ModelFailure> {
        self.respond_received(request)
            .map(|received| received.response)
    }

    fn respond_received(
        &mut self,
        request: &subloop::core::protocol::Request<'_>,
    ) -> Result<subloop::run::model::Received, subloop::core::error::ModelFailure> {
        self.counters.sent(self.record, || (self.body)(request));
        self.inner.respond_received(request)
    }

    fn identity(&self) -> Option<subloop::run::model::ModelIdentity> {
        self.inner.identity()
    }
}

impl<M: subloop::run::model::AsyncModel + Send> subloop::run::model::AsyncModel for Counted<M> {
    fn respond_async<'a>(
        &'a mut self,
        request: &'a subloop::core::protocol::Request<'_>,
    ) -> subloop::run::BoxFuture<
        'a,
        Result<subloop::run::model::Received, subloop::core::error::ModelFailure>,
    > {
        self.counters.sent(self.record, || (self.body)(request));
        self.inner.respond_async(request)
    }

    fn identity(&self) -> Option<subloop::run::model::ModelIdentity> {
        self.inner.identity()
    }
}

mod blocking {
    //! A thread per run, the blocking clients, `Agent::run`.

    use std::sync::Arc;

    use subloop::Model;
    use subloop::providers::anthropic::{self, AnthropicModel};
    use subloop::providers::http::StopSlot;
    use subloop::providers::openai::{self, OpenAiModel};

    use super::{Budget, Counters, Ended, Options, PARENT_CALLS, Provider, Settings, Tools};

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

        pub(super) fn model(
            &self,
            stop: Option<&StopSlot>,
            counters: &Arc<Counters>,
            record: bool,
        ) -> Box<dyn Model + Send> {
            let counters = Arc::clone(counters);
            match self {
                Self::Anthropic(client) => {
                    counted_model!(AnthropicModel, client, stop, counters, record)
                }
                Self::OpenAi(client) => {
                    counted_model!(OpenAiModel, client, stop, counters, record)
                }
            }
        }
    }

    fn one(
        client: &Client,
        tools: &Tools,
        stop_signal: bool,
        counters: &Arc<Counters>,
        record: bool,
    ) -> Ended {
        let failed = |why: String| Err(("setup".to_owned(), why));
        let slot: StopSlot = Arc::default();
        let children = {
            let (client, slot, counters) =
                (client.clone(), Arc::clone(&slot), Arc::clone(counters));
            move |_number: usize| client.model(stop_signal.then_some(&slot), &counters, record)
        };
        let agent = match tools.build_agent(Arc::new(children)) {
            Ok(agent) => agent,
            Err(why) => return failed(why),
        };
        if stop_signal {
            let _ = slot.set(agent.stop_signal());
        }
        let mut model = client.model(stop_signal.then_some(&slot), counters, record);
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
        client: &Client,
        tools: &Arc<Tools>,
        counters: &Arc<Counters>,
    ) -> Vec<Ended> {
        let stop_signal = options.stop_signal;
        let handles: Vec<_> = (0..options.runs)
            .map(|index| {
                let (client, tools, counters) =
                    (client.clone(), Arc::clone(tools), Arc::clone(counters));
                std::thread::Builder::new()
                    .name(format!("run-{index}"))
                    .spawn(move || one(&client, &tools, stop_signal, &counters, index == 0))
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
    use subloop::providers::http::StopSlot;
    use subloop::providers::openai::{self, AsyncOpenAiModel};
    use subloop::run::model::{AsyncModel, ChildModels};

    use super::{Budget, Counters, Ended, Options, PARENT_CALLS, Provider, Settings, Tools};

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

        fn model(
            &self,
            stop: Option<&StopSlot>,
            counters: &Arc<Counters>,
            record: bool,
        ) -> Box<dyn AsyncModel + Send> {
            let counters = Arc::clone(counters);
            match self {
                Self::Anthropic(client) => {
                    counted_model!(AsyncAnthropicModel, client, stop, counters, record)
                }
                Self::OpenAi(client) => {
                    counted_model!(AsyncOpenAiModel, client, stop, counters, record)
                }
            }
        }
    }

    /// Each child gets a model of the shared async client with its run's
    /// stop signal; the blocking one is there for `ChildModels::model_for`,
    /// which async runs do not call.
    struct Children {
        client: Client,
        blocking: super::blocking::Client,
        slot: Option<StopSlot>,
        counters: Arc<Counters>,
        record: bool,
    }

    impl ChildModels for Children {
        fn model_for(&self, _number: usize) -> Box<dyn Model + Send> {
            self.blocking.model(None, &self.counters, false)
        }

        fn async_model_for(&self, _number: usize) -> Box<dyn AsyncModel + Send> {
            self.client
                .model(self.slot.as_ref(), &self.counters, self.record)
        }
    }

    async fn one(
        client: Client,
        blocking: super::blocking::Client,
        tools: &Tools,
        stop_signal: bool,
        counters: Arc<Counters>,
        record: bool,
    ) -> Ended {
        let setup = |why: String| ("setup".to_owned(), why);
        let slot = stop_signal.then(StopSlot::default);
        let children = Arc::new(Children {
            client: client.clone(),
            blocking,
            slot: slot.clone(),
            counters: Arc::clone(&counters),
            record,
        });
        let agent = tools.build_agent(children).map_err(setup)?;
        if let Some(slot) = &slot {
            let _ = slot.set(agent.stop_signal());
        }
        let budget = Budget::new(PARENT_CALLS).map_err(|err| setup(err.to_string()))?;
        let mut model = client.model(slot.as_ref(), &counters, record);
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

    /// The runtime and the client, made before the runs.
    pub(super) struct Setup {
        runtime: tokio::runtime::Runtime,
        client: Client,
    }

    impl Setup {
        pub(super) fn new(options: &Options, settings: &Settings) -> Result<Self, String> {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(options.threads.max(1))
                .thread_name("bench-run")
                .enable_all()
                .build()
                .map_err(|err| format!("the runs' runtime: {err}"))?;
            Ok(Self {
                runtime,
                client: Client::new(options.provider, settings)?,
            })
        }
    }

    pub(super) fn run_all(
        options: &Options,
        setup: Setup,
        blocking: super::blocking::Client,
        tools: &Arc<Tools>,
        counters: &Arc<Counters>,
    ) -> Vec<Ended> {
        let Setup { runtime, client } = setup;
        runtime.block_on(async {
            let tasks: Vec<_> = (0..options.runs)
                .map(|index| {
                    let (client, blocking) = (client.clone(), blocking.clone());
                    let (tools, counters) = (Arc::clone(tools), Arc::clone(counters));
                    let stop_signal = options.stop_signal;
                    tokio::spawn(async move {
                        one(client, blocking, &tools, stop_signal, counters, index == 0).await
                    })
                })
                .collect();
            let mut ended = Vec::with_capacity(tasks.len());
            for task in tasks {
                ended.push(task.await.unwrap_or_else(|_| {
                    Err(("panic".to_owned(), "the run's task panicked".to_owned()))
                }));
            }
            ended
        })
    }
}
