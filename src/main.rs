//! The `subloop` command line: parses flags, wires [`subloop::app`], prints.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use lexopt::prelude::*;
use subloop::StatusKind;
use subloop::app::{self, DecisionMode, Models, Settings};
use subloop::tools::split_command;

const USAGE: &str = "\
subloop: a tool-using model loop with subagents

USAGE:
    subloop demo [OPTIONS]                         the course's scenario on the built-in offline models
    subloop run --script FILE [OPTIONS]            replay a scripted model against a workspace

OPTIONS:
    --workspace DIR        the workspace (run: required; demo: examples/workspace or a temporary copy)
    --script FILE          run: the replay script {\"parent\": [...], \"children\": [[...], ...]}
    --question TEXT        run: the question for the parent
    --decision MODE        allow | deny | ask (default ask; a non-terminal stdin denies)
    --max-calls N          the parent's model-call budget (default 8)
    --child-calls N        each subagent's model-call budget, 1..=8 (default 4)
    --read-limit BYTES     read_file shows at most this many bytes (default 65536)
    --run-command CMD      run_main's command, split without a shell (default \"python3 main.py\")
    --run-timeout SECS     run_main's timeout (default 10)
    --trace FILE           write a JSON Lines trace of every request and reply
    --json                 print one JSON object on stdout instead of the final text
    --quiet                no progress lines on stderr

RUN LIMITS (the parent and every child together; Ctrl-C cancels, twice exits at once):
    --max-tools-per-reply N   tool calls run per model reply; the rest are refused (default 16)
    --max-delegations N       subagents started per run; later `task` calls get `delegation_limit` (default 8)
    --deadline SECS           wall-clock limit of the run: status `deadline` (default none)
    --max-tokens-total N      input + output tokens of the run: status `token_limit` (default none)

LIVE (the Anthropic Messages API; reads ANTHROPIC_API_KEY, ANTHROPIC_MODEL, ANTHROPIC_BASE_URL):
    --live                 use the API instead of the built-in or scripted models (not with --script)
    --model NAME           the model (default: ANTHROPIC_MODEL, else claude-sonnet-4-5)
    --max-tokens N         max_tokens of each reply (default 4096)
    --retries N            retries of a failed request at the transport (default 2)
    --stream               use the SSE stream; text is shown on stderr as it arrives
    --timeout-connect SECS connect timeout (default 10)
    --timeout-read SECS    per-read timeout (default 120)
    --timeout-total SECS   whole-request timeout (default 600)
    -h, --help             this help

EXIT: 0 answered, 1 any other status, 2 bad invocation or unusable input (nothing is run).";

enum Command {
    Demo,
    Run,
}

struct Cli {
    command: Command,
    settings: Settings,
    script: Option<PathBuf>,
    json: bool,
    live: Option<LiveFlags>,
}

/// The live flags, turned into a client once parsing is done.
#[derive(Default)]
struct LiveFlags {
    model: Option<String>,
    max_tokens: Option<u32>,
    retries: Option<u32>,
    stream: bool,
    connect: Option<f64>,
    read: Option<f64>,
    total: Option<f64>,
}

fn seconds(parser: &mut lexopt::Parser, flag: &str) -> Result<f64, String> {
    let secs: f64 = number(parser, flag)?;
    if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
        return Err(format!(
            "{flag} takes seconds between 0 and 86400, got {secs}"
        ));
    }
    Ok(secs)
}

/// The next value as text (a non-UTF-8 value is an error).
fn text(parser: &mut lexopt::Parser) -> Result<String, String> {
    let value = parser.value().map_err(|err| err.to_string())?;
    value.string().map_err(|err| err.to_string())
}

/// The next value as a path.
fn path(parser: &mut lexopt::Parser) -> Result<PathBuf, String> {
    parser
        .value()
        .map(PathBuf::from)
        .map_err(|err| err.to_string())
}

fn number<T: std::str::FromStr>(parser: &mut lexopt::Parser, flag: &str) -> Result<T, String> {
    let text = text(parser)?;
    text.parse()
        .map_err(|_| format!("{flag} takes a number, got `{text}`"))
}

fn parse() -> Result<Option<Cli>, String> {
    let mut parser = lexopt::Parser::from_env();
    let command = match parser.next().map_err(|err| err.to_string())? {
        Some(Value(word)) if word == "demo" => Command::Demo,
        Some(Value(word)) if word == "run" => Command::Run,
        Some(Short('h') | Long("help")) => return Ok(None),
        None => return Err("no command: use `subloop demo` or `subloop run`".to_owned()),
        Some(Value(word)) => return Err(format!("unknown command `{}`", word.to_string_lossy())),
        Some(other) => return Err(other.unexpected().to_string()),
    };
    let mut settings = Settings::new(PathBuf::new());
    let mut workspace = None;
    let mut script = None;
    let mut question = None;
    let mut json = false;
    let mut live = false;
    let mut flags = LiveFlags::default();
    while let Some(arg) = parser.next().map_err(|err| err.to_string())? {
        match arg {
            Long("workspace") => workspace = Some(path(&mut parser)?),
            Long("script") => script = Some(path(&mut parser)?),
            Long("question") => question = Some(text(&mut parser)?),
            Long("decision") => {
                let text = text(&mut parser)?;
                settings.decision = DecisionMode::parse(&text)
                    .ok_or_else(|| format!("--decision takes allow, deny or ask, got `{text}`"))?;
            }
            Long("max-calls") => settings.max_calls = number(&mut parser, "--max-calls")?,
            Long("child-calls") => {
                settings.child_budget = number(&mut parser, "--child-calls")?;
                if !(1..=8).contains(&settings.child_budget) {
                    return Err(format!(
                        "--child-calls takes 1 to 8, got {}",
                        settings.child_budget
                    ));
                }
            }
            Long("read-limit") => {
                settings.read_limit = number(&mut parser, "--read-limit")?;
                if settings.read_limit == 0 {
                    return Err("--read-limit must be at least 1 byte".to_owned());
                }
            }
            Long("run-command") => {
                let text = text(&mut parser)?;
                settings.run.command =
                    split_command(&text).map_err(|err| format!("--run-command: {err}"))?;
            }
            Long("run-timeout") => {
                let secs: f64 = number(&mut parser, "--run-timeout")?;
                if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                    return Err(format!(
                        "--run-timeout takes seconds between 0 and 86400, got {secs}"
                    ));
                }
                settings = settings.run_timeout(secs);
            }
            Long("trace") => settings.trace = Some(path(&mut parser)?),
            Long("max-tools-per-reply") => {
                settings.limits.max_tools_per_reply = number(&mut parser, "--max-tools-per-reply")?;
                if settings.limits.max_tools_per_reply == 0 {
                    return Err("--max-tools-per-reply must be at least 1".to_owned());
                }
            }
            Long("max-delegations") => {
                settings.limits.max_delegations = number(&mut parser, "--max-delegations")?
            }
            Long("deadline") => {
                settings.limits.deadline = Some(std::time::Duration::from_secs_f64(seconds(
                    &mut parser,
                    "--deadline",
                )?))
            }
            Long("max-tokens-total") => {
                let n: u64 = number(&mut parser, "--max-tokens-total")?;
                if n == 0 {
                    return Err("--max-tokens-total must be at least 1".to_owned());
                }
                settings.limits.max_tokens_total = Some(n);
            }
            Long("json") => json = true,
            Long("live") => live = true,
            Long("model") => flags.model = Some(text(&mut parser)?),
            Long("max-tokens") => {
                let n: u32 = number(&mut parser, "--max-tokens")?;
                if n == 0 {
                    return Err("--max-tokens must be at least 1".to_owned());
                }
                flags.max_tokens = Some(n);
            }
            Long("retries") => flags.retries = Some(number(&mut parser, "--retries")?),
            Long("stream") => flags.stream = true,
            Long("timeout-connect") => {
                flags.connect = Some(seconds(&mut parser, "--timeout-connect")?)
            }
            Long("timeout-read") => flags.read = Some(seconds(&mut parser, "--timeout-read")?),
            Long("timeout-total") => flags.total = Some(seconds(&mut parser, "--timeout-total")?),
            Long("quiet") => settings.progress = false,
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let live = if live {
        if script.is_some() {
            return Err("--live and --script cannot be used together".to_owned());
        }
        Some(flags)
    } else {
        if flags.model.is_some()
            || flags.max_tokens.is_some()
            || flags.retries.is_some()
            || flags.stream
            || flags.connect.is_some()
            || flags.read.is_some()
            || flags.total.is_some()
        {
            return Err(
                "--model, --max-tokens, --retries, --stream and --timeout-* go with --live"
                    .to_owned(),
            );
        }
        None
    };
    if settings.max_calls == 0 {
        return Err("--max-calls must be at least 1".to_owned());
    }
    match command {
        Command::Demo => {
            if script.is_some() || question.is_some() {
                return Err("demo takes no --script or --question (use `subloop run`)".to_owned());
            }
            let demo = app::demo_settings(workspace).map_err(|err| err.to_string())?;
            settings.workspace = demo.workspace;
            settings.question = demo.question;
            settings.temporary_workspace = demo.temporary_workspace;
        }
        Command::Run => {
            settings.workspace = workspace.ok_or("run needs --workspace DIR")?;
            if script.is_none() && live.is_none() {
                return Err("run needs --script FILE (or --live)".to_owned());
            }
            if let Some(question) = question {
                if question.trim().is_empty() {
                    return Err(
                        "--question is empty: give the parent something to answer".to_owned()
                    );
                }
                settings.question = question;
            }
        }
    }
    Ok(Some(Cli {
        command,
        settings,
        script,
        json,
        live,
    }))
}

#[cfg(feature = "live")]
fn live_client(flags: LiveFlags, progress: bool) -> Result<Models, String> {
    use std::sync::Arc;
    use std::time::Duration;
    use subloop::model::anthropic::{Client, LiveConfig};

    let mut config = LiveConfig::from_env(|name| std::env::var(name).ok(), flags.model)
        .map_err(|err| err.to_string())?;
    if let Some(n) = flags.max_tokens {
        config.max_tokens = n;
    }
    if let Some(n) = flags.retries {
        config.retry.max_retries = n;
    }
    config.stream = flags.stream;
    if let Some(secs) = flags.connect {
        config.timeouts.connect = Duration::from_secs_f64(secs);
    }
    if let Some(secs) = flags.read {
        config.timeouts.read = Duration::from_secs_f64(secs);
    }
    if let Some(secs) = flags.total {
        config.timeouts.overall = Duration::from_secs_f64(secs);
    }
    if progress {
        eprintln!("[live] model {} at {}", config.model, config.base_url);
    }
    let mut client = Client::new(config);
    if flags.stream && progress {
        client =
            client.with_text_sink(|text| eprint!("{}", subloop::progress::printable_lines(text)));
    }
    Ok(Models::Live(Arc::new(client)))
}

#[cfg(not(feature = "live"))]
fn live_client(_flags: LiveFlags, _progress: bool) -> Result<Models, String> {
    Err(
        "this subloop was built without the `live` feature; rebuild with default features"
            .to_owned(),
    )
}

fn main() -> ExitCode {
    let mut cli = match parse() {
        Ok(Some(cli)) => cli,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("subloop: {err} (see `subloop --help`)");
            return ExitCode::from(2);
        }
    };
    let _cleanup = app::TemporaryWorkspace::for_settings(&cli.settings);
    cli.settings.cancel = subloop::limits::CancelHandle::on_ctrl_c();
    let models = match (&cli.command, &cli.script, cli.live) {
        (_, _, Some(flags)) => match live_client(flags, cli.settings.progress) {
            Ok(models) => models,
            Err(err) => {
                eprintln!("subloop: {err}");
                return ExitCode::from(2);
            }
        },
        (Command::Run, Some(path), None) => match subloop::Script::load(path) {
            Ok(script) => Models::Script(script),
            Err(err) => {
                eprintln!("subloop: {err}");
                return ExitCode::from(2);
            }
        },
        _ => Models::Demo,
    };
    if matches!(cli.command, Command::Demo) && cli.settings.progress {
        let note = if cli.settings.temporary_workspace {
            " (a temporary copy of the built-in files, removed afterwards)"
        } else {
            ""
        };
        eprintln!(
            "[demo] workspace: {}{note}",
            cli.settings.workspace.display()
        );
    }
    let report = match app::execute(&cli.settings, models) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("subloop: {err}");
            return ExitCode::from(2);
        }
    };
    if cli.json {
        // Serialized straight from the report, in 64 KiB writes.
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        let written = report
            .write_json(&mut out)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(err) = written {
            eprintln!("subloop: cannot write the output: {err}");
            return ExitCode::from(1);
        }
    } else {
        println!("{}", report.outcome.text);
    }
    let answered = report.outcome.status == StatusKind::Answered;
    // The process ends here: freeing the whole history first is wasted work.
    std::mem::forget(report);
    if answered {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
