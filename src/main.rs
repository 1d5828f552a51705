//! The `subloop` command line: parses flags, wires [`subloop::app`], prints.

use std::io::Write;
use std::process::ExitCode;

use subloop::app::{self, Models};
use subloop::cli::{self, CliError, Command, Invocation, LiveFlags};

#[cfg(feature = "live")]
fn live_client(flags: LiveFlags, progress: bool) -> Result<Models, String> {
    use std::sync::Arc;
    use std::time::Duration;
    use subloop::cli::Provider;
    use subloop::model::{anthropic, openai};

    let env = |name: &str| std::env::var(name).ok();
    let timeouts = |t: &mut subloop::model::http::transport::Timeouts| {
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
    let announce = |model: &str, url: &str| {
        if progress {
            let _ = writeln!(std::io::stderr(), "[live] model {model} at {url}");
        }
    };
    let show_stream = flags.stream && progress;
    let sink = |text: &str| {
        let _ = write!(
            std::io::stderr(),
            "{}",
            subloop::progress::printable_lines(text)
        );
    };
    match flags.provider {
        Provider::Anthropic => {
            let mut config =
                anthropic::LiveConfig::from_env(env, flags.model).map_err(|err| err.to_string())?;
            if let Some(n) = flags.max_tokens {
                config.max_tokens = n;
            }
            if let Some(n) = flags.retries {
                config.retry.max_retries = n;
            }
            config.stream = flags.stream;
            timeouts(&mut config.timeouts);
            announce(&config.model, &config.display_base_url());
            let mut client = anthropic::Client::new(config);
            if show_stream {
                client = client.with_text_sink(sink);
            }
            Ok(Models::Live(Arc::new(client)))
        }
        Provider::OpenAi => {
            let mut config =
                openai::OpenAiConfig::from_env(env, flags.model).map_err(|err| err.to_string())?;
            if let Some(n) = flags.max_tokens {
                config.max_tokens = n;
            }
            if let Some(n) = flags.retries {
                config.retry.max_retries = n;
            }
            config.stream = flags.stream;
            timeouts(&mut config.timeouts);
            announce(&config.model, &config.display_base_url());
            let mut client = openai::Client::new(config);
            if show_stream {
                client = client.with_text_sink(sink);
            }
            Ok(Models::OpenAi(Arc::new(client)))
        }
    }
}

#[cfg(not(feature = "live"))]
fn live_client(_flags: LiveFlags, _progress: bool) -> Result<Models, String> {
    Err(
        "this subloop was built without the `live` feature; rebuild with default features"
            .to_owned(),
    )
}

/// Exit 2 with one line: every usage error ends with the same `--help` hint.
fn usage_error(err: CliError) -> ExitCode {
    // A closed stderr must not turn a usage error into a panic.
    let _ = writeln!(std::io::stderr(), "subloop: {err}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut cli = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Invocation::Run(cli)) => *cli,
        Ok(Invocation::Print(text)) => {
            return match subloop::output::print_stdout(&text, false) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    let _ = writeln!(std::io::stderr(), "subloop: cannot write the output: {err}");
                    ExitCode::from(1)
                }
            };
        }
        Err(err) => return usage_error(err),
    };
    let command = cli.command;
    let _cleanup = app::TemporaryWorkspace::for_settings(&cli.settings);
    cli.settings.cancel = subloop::limits::CancelHandle::on_ctrl_c();
    cli.settings.script = cli.script.clone();
    let models = match (&cli.command, &cli.script, cli.live) {
        (_, _, Some(flags)) => match live_client(flags, cli.settings.progress) {
            Ok(models) => models,
            Err(err) => return usage_error(CliError::new(Some(command), err)),
        },
        (Command::Run, Some(path), None) => match subloop::Script::load(path) {
            Ok(script) => Models::Script(script),
            Err(err) => return usage_error(CliError::new(Some(command), err)),
        },
        _ => Models::Demo,
    };
    // Everything that can refuse the run is checked before any progress line.
    let prepared = match app::prepare(&cli.settings, models) {
        Ok(prepared) => prepared,
        Err(err) => return usage_error(CliError::new(Some(command), err)),
    };
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
        Ok(run) => run.finish(cli.json),
        Err(err) => usage_error(CliError::new(Some(command), err)),
    }
}
