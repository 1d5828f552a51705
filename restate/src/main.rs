//! `subloop-restate`: serve durable runs, submit them, answer their
//! approvals. `subloop worker|submit|approve|pending` forward here.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use subloop::agent::subagent::ChildBudget;
use subloop::providers::anthropic::{self, LiveConfig};
use subloop::providers::http::HttpModel;
use subloop::providers::openai::{self, OpenAiConfig};
use subloop::run::model::Model;
use subloop::tools::RunSettings;
use subloop::tools::sandbox::Sandbox;
use subloop_restate::{Approvals, DemoModels, Models, RunRequest, Worker, WorkerSettings, client};

const USAGE: &str = "\
usage:
  subloop worker --restate-admin URL --listen ADDR [--advertise URI] [--live [--provider anthropic|openai] [--model NAME]]
                 [--decision ask|allow|deny] [--sandbox workspace-write|read-only|off]
                 [--run-command CMD | --no-run-main] [--timeout SECS] [--child-calls N] [--trace-dir DIR]
                 [--workspace-root DIR] [--max-tools-per-reply N] [--max-delegations N] [--max-tokens-total N]
  subloop submit --restate URL --run-id ID --workspace DIR --question TEXT [--max-calls N] [--json]
  subloop approve --restate URL RUN CALL allow|deny
  subloop pending --restate URL RUN

worker   serves runs on ADDR (HTTP/2) and registers ADVERTISE (default http://ADDR)
         with the Restate admin API; registering again is a no-op, so restarted
         and further workers register without error. Models: the built-in demo
         models, or --live (ANTHROPIC_API_KEY / OPENAI_BASE_URL, as `subloop run`).
         --trace-dir: each run's trace (RUN.jsonl, a child's RUN.child-N.jsonl),
         written anew by the worker that runs its last attempt.
         --workspace-root: submitted workspaces must be inside DIR (without it,
         any folder a submission names is used).
submit   starts run ID (or attaches to the run with that id) through the Restate
         ingress URL and prints its answer (--json: the report `subloop run --json`
         prints, with `repeated`: the steps that ran again after a worker died).
approve  answers the approval run RUN waits for on call CALL.
pending  lists the approvals run RUN waits for.

EXIT: 0 answered, 1 any other status, 2 bad invocation, 3 the Restate server
cannot be reached or refused the request.";

/// A usage error: said on stderr with the usage, exit 2.
struct Usage(String);

impl<E: std::fmt::Display> From<E> for Usage {
    fn from(error: E) -> Self {
        Self(error.to_string())
    }
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let command = args.remove(0);
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        let _ = out(USAGE);
        return ExitCode::SUCCESS;
    }
    let outcome = match command.to_str() {
        Some("worker") => worker(args),
        Some("submit") => submit(args),
        Some("approve") => approve(args),
        Some("pending") => pending(args),
        Some("help" | "--help" | "-h") => {
            let _ = out(USAGE);
            return ExitCode::SUCCESS;
        }
        _ => Err(Usage(format!(
            "unknown command `{}`",
            command.to_string_lossy()
        ))),
    };
    match outcome {
        Ok(code) => code,
        Err(Usage(message)) => {
            eprintln!(
                "subloop {}: {message} (see `subloop {} --help`)",
                command.to_string_lossy(),
                command.to_string_lossy()
            );
            ExitCode::from(2)
        }
    }
}

fn value(parser: &mut lexopt::Parser) -> Result<String, Usage> {
    parser
        .value()?
        .into_string()
        .map_err(|_| Usage("an argument is not UTF-8".into()))
}

/// Writes `text` and a newline to stdout; false (said on stderr) when it
/// cannot be written, a closed pipe included: never a panic.
fn out(text: &str) -> bool {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => true,
        Err(error) => {
            eprintln!("subloop: cannot write the output: {error}");
            false
        }
    }
}

fn unreachable_server(error: &client::ClientError) -> ExitCode {
    eprintln!("subloop: {error}");
    ExitCode::from(3)
}

/// Models for a worker: the demo's, or a live provider's.
struct LiveModels(Arc<dyn Fn() -> Box<dyn Model + Send> + Send + Sync>);

impl Models for LiveModels {
    fn parent(&self) -> Box<dyn Model + Send> {
        (self.0)()
    }

    fn child(&self, _number: usize) -> Box<dyn Model + Send> {
        (self.0)()
    }
}

fn live_models(provider: &str, model: Option<String>) -> Result<LiveModels, Usage> {
    let env = |name: &str| std::env::var(name).ok();
    match provider {
        "anthropic" => {
            let config = LiveConfig::from_env(env, model)?;
            let client = Arc::new(anthropic::Client::new(config));
            Ok(LiveModels(Arc::new(move || {
                Box::new(HttpModel::new(Arc::clone(&client)))
            })))
        }
        "openai" => {
            let config = OpenAiConfig::from_env(env, model)?;
            let client = Arc::new(openai::Client::new(config));
            Ok(LiveModels(Arc::new(move || {
                Box::new(HttpModel::new(Arc::clone(&client)))
            })))
        }
        other => Err(Usage(format!(
            "--provider is anthropic or openai, not `{other}`"
        ))),
    }
}

fn worker(args: Vec<OsString>) -> Result<ExitCode, Usage> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut admin, mut listen, mut advertise) = (None, None, None);
    let (mut live, mut provider, mut model) = (false, "anthropic".to_owned(), None);
    let mut settings = WorkerSettings::new();
    let mut run = RunSettings::default();
    let mut run_main = true;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("restate-admin") => admin = Some(value(&mut parser)?),
            Long("listen") => listen = Some(value(&mut parser)?),
            Long("advertise") => advertise = Some(value(&mut parser)?),
            Long("live") => live = true,
            Long("provider") => provider = value(&mut parser)?,
            Long("model") => model = Some(value(&mut parser)?),
            Long("decision") => {
                settings.approvals = match value(&mut parser)?.as_str() {
                    "ask" => Approvals::Ask,
                    "allow" => Approvals::Allow,
                    "deny" => Approvals::Deny,
                    other => {
                        return Err(Usage(format!(
                            "--decision is ask, allow or deny, not `{other}`"
                        )));
                    }
                }
            }
            Long("sandbox") => {
                let name = value(&mut parser)?;
                settings.sandbox = Sandbox::parse(&name).ok_or_else(|| {
                    Usage(format!(
                        "--sandbox is workspace-write, read-only or off, not `{name}`"
                    ))
                })?;
            }
            Long("run-command") => {
                run.command = RunSettings::split_command(&value(&mut parser)?)?;
            }
            Long("no-run-main") => run_main = false,
            Long("max-tools-per-reply") => {
                let text = value(&mut parser)?;
                settings.limits.max_tools_per_reply =
                    text.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Usage(format!(
                            "--max-tools-per-reply is a count above 0, not `{text}`"
                        ))
                    })?;
            }
            Long("max-delegations") => {
                let text = value(&mut parser)?;
                settings.limits.max_delegations = text
                    .parse()
                    .map_err(|_| Usage(format!("--max-delegations is a count, not `{text}`")))?;
            }
            Long("max-tokens-total") => {
                let text = value(&mut parser)?;
                settings.limits.max_tokens_total =
                    Some(text.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Usage(format!(
                            "--max-tokens-total is a count above 0, not `{text}`"
                        ))
                    })?);
            }
            Long("workspace-root") => {
                let dir = std::path::PathBuf::from(value(&mut parser)?);
                if !dir.is_dir() {
                    return Err(Usage(format!(
                        "--workspace-root {} is not a directory",
                        dir.display()
                    )));
                }
                settings.workspace_root = Some(dir);
            }
            Long("trace-dir") => {
                let dir = std::path::PathBuf::from(value(&mut parser)?);
                if !dir.is_dir() {
                    return Err(Usage(format!(
                        "--trace-dir {} is not a directory",
                        dir.display()
                    )));
                }
                settings.trace_dir = Some(dir);
            }
            Long("timeout") => {
                let text = value(&mut parser)?;
                let secs: f64 = text
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                    .ok_or_else(|| {
                        Usage(format!("--timeout is seconds in (0, 86400], not `{text}`"))
                    })?;
                run.timeout = Duration::from_secs_f64(secs);
            }
            Long("child-calls") => {
                let text = value(&mut parser)?;
                settings.child_calls = text
                    .parse()
                    .ok()
                    .filter(|n: &u32| *n == 0 || ChildBudget::new(*n).is_ok())
                    .ok_or_else(|| {
                        Usage(format!(
                            "--child-calls is 1 to 8 model requests (0: no task tool), not `{text}`"
                        ))
                    })?;
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let admin = admin.ok_or_else(|| Usage("worker needs --restate-admin URL".into()))?;
    let listen = listen.ok_or_else(|| Usage("worker needs --listen ADDR".into()))?;
    let address: std::net::SocketAddr = listen.parse().map_err(|_| {
        Usage(format!(
            "--listen is an address such as 127.0.0.1:9080, not `{listen}`"
        ))
    })?;
    settings.run_main = run_main.then_some(run);
    let models: Box<dyn FnOnce(WorkerSettings) -> Worker> = if live {
        let models = live_models(&provider, model)?;
        Box::new(move |settings| Worker::new(models, settings))
    } else {
        Box::new(|settings| Worker::new(DemoModels, settings))
    };
    let worker = models(settings);
    let advertise = advertise.unwrap_or_else(|| format!("http://{address}"));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("subloop: no async runtime: {error}");
            return Ok(ExitCode::FAILURE);
        }
    };
    // Bind first, so a port in use is said at once; register once serving.
    // With SO_REUSEPORT, several workers on one host share the address
    // (one deployment URI); the kernel spreads connections over them.
    let listener = match runtime.block_on(async { subloop_restate::listen_shared(address) }) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("subloop: cannot listen on {address}: {error}");
            return Ok(ExitCode::from(2));
        }
    };
    let serving = runtime.spawn(subloop_restate::serve_on(worker, listener));
    let registered = runtime.block_on(async {
        tokio::task::spawn_blocking(move || {
            client::register(&admin, &advertise).map(|()| advertise)
        })
        .await
    });
    match registered {
        Ok(Ok(uri)) => eprintln!("subloop: serving durable runs at {uri}"),
        Ok(Err(error)) => return Ok(unreachable_server(&error)),
        Err(error) => {
            eprintln!("subloop: registering failed: {error}");
            return Ok(ExitCode::FAILURE);
        }
    }
    let _ = runtime.block_on(serving);
    Ok(ExitCode::SUCCESS)
}

fn submit(args: Vec<OsString>) -> Result<ExitCode, Usage> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut ingress, mut id, mut workspace, mut question) = (None, None, None, None);
    let (mut calls, mut json) = (8u32, false);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("restate") => ingress = Some(value(&mut parser)?),
            Long("run-id") => id = Some(value(&mut parser)?),
            Long("workspace") => workspace = Some(value(&mut parser)?),
            Long("question") => question = Some(value(&mut parser)?),
            Long("max-calls") => {
                let text = value(&mut parser)?;
                calls = text.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    Usage(format!("--max-calls is a count above 0, not `{text}`"))
                })?;
            }
            Long("json") => json = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    let ingress = ingress.ok_or_else(|| Usage("submit needs --restate URL".into()))?;
    let id = id
        .filter(|id| !id.trim().is_empty())
        .ok_or_else(|| Usage("submit needs --run-id ID".into()))?;
    let workspace = workspace.ok_or_else(|| Usage("submit needs --workspace DIR".into()))?;
    let question = question
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| Usage("submit needs --question TEXT".into()))?;
    let request = RunRequest {
        question,
        calls,
        workspace,
    };
    if let Err(error) = client::submit(&ingress, &id, &request) {
        return Ok(unreachable_server(&error));
    }
    let result = match client::attach(&ingress, &id) {
        Ok(result) => result,
        Err(error) => return Ok(unreachable_server(&error)),
    };
    if json {
        let mut report = result.report.clone();
        if let Some(object) = report.as_object_mut() {
            object.insert("run_id".into(), serde_json::json!(id));
            object.insert("repeated".into(), serde_json::json!(result.repeated));
        }
        if !out(&report.to_string()) {
            return Ok(ExitCode::FAILURE);
        }
    } else {
        if !out(&result.text) {
            return Ok(ExitCode::FAILURE);
        }
        eprintln!("status: {} ({} calls)", result.status, result.calls);
        for step in &result.repeated {
            eprintln!("ran again after a worker died: {step}");
        }
    }
    Ok(if result.status == "answered" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn positional(parser: &mut lexopt::Parser, what: &str) -> Result<String, Usage> {
    use lexopt::prelude::*;
    match parser.next()? {
        Some(Value(value)) => value
            .into_string()
            .map_err(|_| Usage(format!("{what} is not UTF-8"))),
        Some(other) => Err(other.unexpected().into()),
        None => Err(Usage(format!("missing {what}"))),
    }
}

fn restate_flag(parser: &mut lexopt::Parser) -> Result<String, Usage> {
    use lexopt::prelude::*;
    match parser.next()? {
        Some(Long("restate")) => value(parser),
        Some(other) => Err(other.unexpected().into()),
        None => Err(Usage("missing --restate URL".into())),
    }
}

fn approve(args: Vec<OsString>) -> Result<ExitCode, Usage> {
    let mut parser = lexopt::Parser::from_args(args);
    let ingress = restate_flag(&mut parser)?;
    let run = positional(&mut parser, "RUN")?;
    let call = positional(&mut parser, "CALL")?;
    let allow = match positional(&mut parser, "allow|deny")?.as_str() {
        "allow" => true,
        "deny" => false,
        other => return Err(Usage(format!("the answer is allow or deny, not `{other}`"))),
    };
    if let Some(extra) = parser.next()? {
        return Err(extra.unexpected().into());
    }
    match client::approve(&ingress, &run, &call, allow) {
        Ok(()) => {
            eprintln!(
                "subloop: {} call {call} of run {run}",
                if allow { "allowed" } else { "denied" }
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => Ok(unreachable_server(&error)),
    }
}

fn pending(args: Vec<OsString>) -> Result<ExitCode, Usage> {
    let mut parser = lexopt::Parser::from_args(args);
    let ingress = restate_flag(&mut parser)?;
    let run = positional(&mut parser, "RUN")?;
    if let Some(extra) = parser.next()? {
        return Err(extra.unexpected().into());
    }
    match client::pending(&ingress, &run) {
        Ok(pending) => {
            for waiting in pending {
                if !out(&format!("{}\t{}", waiting.call, waiting.action)) {
                    return Ok(ExitCode::FAILURE);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => Ok(unreachable_server(&error)),
    }
}
