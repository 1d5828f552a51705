//! The `subloop` command line: parses flags, wires [`crate::host`], prints.

mod cli;
mod host;

use std::io::Write;
use std::process::ExitCode;

use crate::cli::{CliError, Command, Invocation, LiveFlags};
use crate::host::Models;

/// The live models, and the `[live]` line to print once the run will go ahead.
#[cfg(feature = "live")]
fn live_client(
    flags: LiveFlags,
    settings: &host::Settings,
) -> Result<(Models, String, String), String> {
    let progress = settings.progress;
    let native = settings.compact_policy() == host::compact::CompactPolicy::Native;
    use crate::cli::Provider;
    use std::sync::Arc;
    use std::time::Duration;
    use subloop::providers::{anthropic, openai};

    let env = |name: &str| std::env::var(name).ok();
    let timeouts = |t: &mut subloop::providers::http::Timeouts| {
        if let Some(secs) = flags.connect {
            t.connect = Duration::from_secs_f64(secs);
        }
        if let Some(secs) = flags.read {
            t.read = Duration::from_secs_f64(secs);
        }
        if let Some(secs) = flags.total {
            t.overall = Duration::from_secs_f64(secs);
        }
    };
    let announce = |model: &str, url: &str| format!("[live] model {model} at {url}");
    let show_stream = flags.stream && progress;
    let sink = |text: &str| {
        let _ = write!(
            std::io::stderr(),
            "{}",
            subloop::core::text::printable_lines(text)
        );
    };
    match flags.provider {
        Provider::Anthropic => {
            let mut config =
                anthropic::LiveConfig::from_env(env, flags.model).map_err(|err| match err {
                    subloop::providers::http::ConfigError::MissingKey => format!("{err} (--live)"),
                    _ => err.to_string(),
                })?;
            if let Some(n) = flags.max_tokens {
                config.max_tokens = n;
            }
            if let Some(n) = flags.retries {
                config.retry.max_retries = n;
            }
            config.stream = flags.stream;
            timeouts(&mut config.timeouts);
            if native {
                // On the server, when the window is known: old tool results
                // cleared past 60% of it, the history compacted past 80%
                // (else the API's defaults, 100,000 and 150,000 tokens).
                let at = |fifths: u64| settings.context_window.map(|window| window / 5 * fifths);
                config.clear_tool_uses = Some(anthropic::ClearToolUses::new(at(3)));
                config.server_compaction = Some(anthropic::ServerCompaction::new(at(4)));
            }
            let line = announce(&config.model, &config.display_base_url());
            let base = config.base_url.clone();
            let mut client = anthropic::Client::new(config);
            if show_stream {
                client = client.with_text_sink(sink);
            }
            Ok((Models::Live(Arc::new(client)), line, base))
        }
        Provider::OpenAi => {
            if native {
                return Err("--compact native is the Messages API's own context editing: use it with --provider anthropic (with openai: auto, clear-results, window or summarize)".to_owned());
            }
            let mut config =
                openai::OpenAiConfig::from_env(env, flags.model).map_err(|err| match err {
                    subloop::providers::http::ConfigError::MissingModel => {
                        format!("{err} with --model")
                    }
                    _ => err.to_string(),
                })?;
            if let Some(n) = flags.max_tokens {
                config.max_tokens = n;
            }
            if let Some(n) = flags.retries {
                config.retry.max_retries = n;
            }
            config.stream = flags.stream;
            timeouts(&mut config.timeouts);
            let line = announce(&config.model, &config.display_base_url());
            let base = config.base_url.clone();
            let mut client = openai::Client::new(config);
            if show_stream {
                client = client.with_text_sink(sink);
            }
            Ok((Models::OpenAi(Arc::new(client)), line, base))
        }
    }
}

#[cfg(not(feature = "live"))]
fn live_client(
    _flags: LiveFlags,
    _settings: &host::Settings,
) -> Result<(Models, String, String), String> {
    Err(
        "this subloop was built without the `live` feature; rebuild with default features"
            .to_owned(),
    )
}

/// `subloop replay`: the verdict lines (or the JSON object) on stdout; exit
/// 0 reproduced and answered, 1 diverged or another status, 2 a bad trace.
fn replay(cli: &cli::Cli, trace: &std::path::Path, command: Command) -> ExitCode {
    let report = match host::replay(&cli.settings, trace, cli.keep_going) {
        Ok(report) => report,
        Err(err) => return usage_error(CliError::new(Some(command), err)),
    };
    let text = if cli.json {
        report.to_json().to_string()
    } else {
        let mut lines = report.lines(cli.keep_going);
        // The count of divergences not shown names the flag that shows them.
        let hidden = report.divergences.len().saturating_sub(1);
        if !cli.keep_going
            && hidden > 0
            && let Some(last) = lines.last_mut()
        {
            *last = format!("({hidden} more divergence(s); --keep-going lists them all)");
        }
        lines.join("\n")
    };
    if let Err(err) = crate::cli::output::print_stdout(&text, cli.json) {
        let _ = writeln!(std::io::stderr(), "subloop: cannot write the output: {err}");
        return ExitCode::from(1);
    }
    if report.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `subloop chat`: lines from stdin, answers on stdout, the prompt on
/// stderr; exit 0 at `/exit` or the end of input, 2 when a line cannot run.
fn chat(settings: host::Settings, models: Models, live_line: Option<String>) -> ExitCode {
    let command = Command::Chat;
    // A temporary session trace: a fresh file (never an existing one or a
    // link), readable by its owner only.
    let (trace, temporary) = match &settings.trace {
        Some(path) => (path.clone(), false),
        None => match subloop::record::trace::TraceWriter::create_temporary("subloop-chat") {
            Ok(path) => (path, true),
            Err(err) => {
                return usage_error(CliError::new(
                    Some(command),
                    format!("cannot create a temporary session trace: {err}"),
                ));
            }
        },
    };
    if let (Some(line), true) = (live_line, settings.progress) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    // A temporary trace goes when the session does, a SIGTERM included.
    let _remove = temporary.then(|| {
        let path = trace.clone();
        crate::cli::signals::shutdown().on_termination(move |_| {
            let _ = std::fs::remove_file(&path);
        })
    });
    // One reader of stdin: the session's lines and the approval prompt's
    // answers come through the same buffer, and neither holds it between reads.
    let terminal = std::sync::Arc::clone(&settings.input);
    let at_terminal = terminal.is_terminal();
    let mut input = terminal.lines();
    let mut session = crate::host::chat::Chat::new(settings, models, trace.clone())
        .watched(crate::cli::signals::chat_moment);
    let mut say = |text: &str| {
        let _ = crate::cli::output::print_stdout(text, false);
    };
    // The prompt only for a person at a terminal.
    let mut stderr = std::io::stderr();
    let prompt: Option<&mut dyn Write> = if at_terminal { Some(&mut stderr) } else { None };
    let result = session.run(&mut input, &mut say, prompt);
    if temporary {
        let _ = std::fs::remove_file(&trace);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => usage_error(CliError::new(Some(command), err)),
    }
}

/// `subloop view`: the timeline on stdout; exit 0, or 1 under `--check`
/// when an invariant is broken, 2 for an unreadable trace.
fn view(cli: &cli::Cli, trace: &std::path::Path) -> ExitCode {
    // Another agent's history (a Claude Code session, a codex rollout, a
    // request history) is shown as a run, with the rules that apply to it.
    let (run, verdicts) = match crate::cli::check::foreign_run(trace) {
        Some(Ok(foreign)) => (foreign.run, foreign.verdicts),
        Some(Err(err)) => return usage_error(CliError::new(Some(Command::View), err)),
        None => match subloop::record::recorded::RecordedRun::load_up_to_a_cut(trace) {
            Ok((run, cut)) => {
                if let Some(line) = cut {
                    let _ = writeln!(
                        std::io::stderr(),
                        "[view] the last line (line {line}) is cut short, as by a run killed while writing it: the run is shown up to the line before"
                    );
                }
                let verdicts = cli.view_policy.check(&run);
                (run, verdicts)
            }
            Err(err) => return usage_error(CliError::new(Some(Command::View), err)),
        },
    };
    let broken = verdicts.iter().any(|verdict| !verdict.held());
    if let Some(output) = &cli.view_output {
        let written = subloop::record::view_html::PageOutput::write_for_trace(
            trace,
            output,
            &run,
            &verdicts,
            &cli.view_policy,
        );
        if let Err(err) = written {
            return usage_error(CliError::new(Some(Command::View), err));
        }
        let held = if broken {
            "an invariant is broken"
        } else {
            "every invariant held"
        };
        let _ = writeln!(
            std::io::stderr(),
            "[view] wrote {} ({held})",
            subloop::core::text::printable(&output.display().to_string())
        );
        return if cli.check && broken {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        };
    }
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let text = run.timeline(&verdicts, colour);
    if let Err(err) = crate::cli::output::print_stdout(text.trim_end(), false) {
        let _ = writeln!(std::io::stderr(), "subloop: cannot write the output: {err}");
        return ExitCode::from(1);
    }
    if cli.check && broken {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Exit 2 with one line: every usage error ends with the same `--help` hint.
fn usage_error(err: CliError) -> ExitCode {
    // A closed stderr must not turn a usage error into a panic; text from a
    // script or a flag is escaped like every other stderr line, so it stays one line.
    let text = subloop::core::text::printable(&err.to_string());
    let _ = writeln!(std::io::stderr(), "subloop: {text}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    // Not dumpable: no process subloop starts (a hook, an MCP server, a
    // program) and no other process of the same user without
    // CAP_SYS_PTRACE can read this process's memory or
    // /proc/<pid>/environ, where the API keys are; forked helpers (the
    // watchdogs) inherit it.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(2) with integer arguments, on this process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let code = run();
    // A SIGTERM or SIGHUP that ended the run is the process's exit, not the
    // run's status: let its termination finish (it exits 143 / 129).
    crate::cli::signals::wait_if_terminating();
    code
}

fn run() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args
        .first()
        .and_then(|arg| arg.to_str())
        .is_some_and(|arg| crate::cli::durable::COMMANDS.contains(&arg))
    {
        return crate::cli::durable::forward(args);
    }
    let mut cli = match cli::parse(args) {
        Ok(Invocation::Run(cli)) => *cli,
        Ok(Invocation::Print(text)) => {
            return match crate::cli::output::print_stdout(&text, false) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    let _ = writeln!(std::io::stderr(), "subloop: cannot write the output: {err}");
                    ExitCode::from(1)
                }
            };
        }
        Ok(Invocation::Check(args)) => {
            let mut out = Vec::new();
            let status = crate::cli::check::run(&args, &mut out);
            let text = String::from_utf8_lossy(&out);
            return match crate::cli::output::print_stdout(text.trim_end(), false) {
                Ok(()) => ExitCode::from(status),
                Err(err) => {
                    let _ = writeln!(std::io::stderr(), "subloop: cannot write the output: {err}");
                    ExitCode::from(1)
                }
            };
        }
        Ok(Invocation::Repair(args)) => return ExitCode::from(crate::cli::repair::run(&args)),
        Err(err) => return usage_error(err),
    };
    let command = cli.command;
    // The library's handles, wired to this process's signals: Ctrl-C
    // cancels, a terminating signal runs the shutdown actions and kills the
    // programs run_main is running; the first Ctrl-C's line names what the
    // run waits for.
    cli.settings.cancel = crate::cli::signals::install();
    cli.settings.shutdown = Some(crate::cli::signals::shutdown());
    cli.settings.programs = crate::cli::signals::programs();
    cli.settings.watch = Some(crate::cli::signals::tool_watch());
    cli.settings.prompt_watch = Some(crate::cli::signals::prompt_watch());
    // `--otlp`: spans exported until this is dropped, at the end of the run.
    #[cfg(feature = "otel")]
    let _export = match crate::cli::telemetry::start(cli.otlp.as_deref()) {
        Ok(export) => {
            cli.settings.telemetry.capture_content =
                export.is_some() && crate::cli::telemetry::capture_content();
            export
        }
        Err(message) => return usage_error(CliError::new(Some(command), message)),
    };
    #[cfg(not(feature = "otel"))]
    if cli.otlp.is_some() {
        return usage_error(CliError::new(
            Some(command),
            "this subloop was built without the `otel` feature; rebuild with --features otel"
                .to_owned(),
        ));
    }
    let _cleanup = host::TemporaryWorkspace::for_settings(&cli.settings);
    cli.settings.script = cli.script.clone();
    if cli.settings.progress {
        for note in cli.settings.hooks.notes() {
            let _ = writeln!(
                std::io::stderr(),
                "[hooks] {}",
                subloop::core::text::printable(note)
            );
        }
    }
    if let (Command::View, Some(trace)) = (command, &cli.replay) {
        return view(&cli, trace);
    }
    if let Some(trace) = &cli.replay {
        return replay(&cli, trace, command);
    }
    let mut live_line = None;
    let models = match (&cli.command, &cli.script, cli.live) {
        (_, _, Some(flags)) => match live_client(flags, &cli.settings) {
            Ok((models, mut line, base)) => {
                // The window, when not given, from a server that reports it.
                #[cfg(feature = "live")]
                if cli.settings.context_window.is_none()
                    && cli.settings.compact_policy() != host::compact::CompactPolicy::Off
                    && let Some(window) = host::compact::window_of_server(&base)
                {
                    cli.settings.context_window = Some(window);
                    line.push_str(&format!(" (context window {window} tokens)"));
                }
                let _ = base;
                live_line = Some(line);
                models
            }
            Err(err) => return usage_error(CliError::new(Some(command), err)),
        },
        (Command::Run | Command::Chat, Some(path), None) => {
            match subloop::providers::scripted::Script::load(path) {
                Ok(script) => Models::Script(script),
                Err(err) => return usage_error(CliError::new(Some(command), err)),
            }
        }
        _ => Models::Demo,
    };
    if command == Command::Chat {
        return chat(cli.settings, models, live_line);
    }
    // Everything that can refuse the run is checked before any progress line.
    let prepared = match host::prepare(&cli.settings, models) {
        Ok(prepared) => prepared,
        Err(err) => return usage_error(CliError::new(Some(command), err)),
    };
    if let (Some(line), true) = (live_line, cli.settings.progress) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    if cli.settings.progress {
        for line in prepared.mcp_lines() {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }
    if let (Some(line), true) = (prepared.resumed_line(), cli.settings.progress) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    if matches!(cli.command, Command::Demo) && cli.settings.progress {
        let note = if cli.settings.temporary_workspace {
            " (a temporary copy of the built-in files, removed afterwards)"
        } else {
            ""
        };
        let _ = writeln!(
            std::io::stderr(),
            "[demo] workspace: {}{note}",
            cli.settings.workspace.display()
        );
    }
    match prepared.run() {
        Ok(run) => {
            let code = crate::cli::output::finish(&run, cli.json);
            // The process ends here: freeing the whole history first is wasted work.
            std::mem::forget(run);
            code
        }
        Err(err) => usage_error(CliError::new(Some(command), err)),
    }
}
