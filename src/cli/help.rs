//! The help texts, rendered from the flag table so that every flag a
//! subcommand accepts is listed in its help, and nothing else.

use super::Command;
use super::flags::{FLAGS, Group};

/// Lines of a help text are wrapped at this many characters.
const WIDTH: usize = 100;

const EXIT: &str = "EXIT: 0 answered (replay: reproduced and answered; chat: the session ended), 1 \
     any other status (replay: also diverged) or an incomplete trace, 2 bad invocation or unusable input (nothing is run), \
     130 / 143 / 129 a second Ctrl-C, SIGTERM or SIGHUP.";

/// `subloop 0.1.0`.
pub fn version() -> String {
    format!("subloop {}", env!("CARGO_PKG_VERSION"))
}

/// The help of `command`, or the overview (`subloop --help`) for `None`.
pub fn help(command: Option<Command>) -> String {
    match command {
        None => overview(),
        Some(command) => command_help(command),
    }
}

fn overview() -> String {
    let usage = [
        usage_lines(Command::Demo),
        usage_lines(Command::Run),
        usage_lines(Command::Replay),
        usage_lines(Command::Chat),
        usage_lines(Command::View),
        vec![
            "subloop check FILE... [--format FORMAT] [--json]".to_owned(),
            "subloop repair FILE -o OUT [--format FORMAT] [--json]".to_owned(),
            "subloop doctor".to_owned(),
            "subloop help [COMMAND]".to_owned(),
            "subloop -h | --help".to_owned(),
            "subloop -V | --version".to_owned(),
        ],
    ]
    .concat();
    let mut text = format!(
        "{}: a tool-using model loop with subagents\n\nUSAGE:\n",
        version()
    );
    for line in usage {
        text.push_str(&format!("    {line}\n"));
    }
    text.push_str("\nCOMMANDS:\n");
    for (name, what) in [
        ("demo", summary(Command::Demo)),
        ("run", summary(Command::Run)),
        ("replay", summary(Command::Replay)),
        ("chat", summary(Command::Chat)),
        ("view", summary(Command::View)),
        (
            "check",
            "check histories by the loop's pairing rules: subloop traces, Claude Code sessions, codex rollouts, Messages API and Chat Completions request histories",
        ),
        (
            "repair",
            "make a broken history sendable again, in its own format, every change listed (Claude Code, codex, Messages API, Chat Completions)",
        ),
        (
            "doctor",
            "what this machine supports of run_main's sandbox (Landlock, seccomp), level by level",
        ),
        (
            "worker",
            "serve durable runs for a Restate server (subloop-restate; `subloop worker --help`)",
        ),
        (
            "submit",
            "start a durable run (or attach to it by id) and print its answer",
        ),
        (
            "approve",
            "answer the approval a durable run waits for; `pending` lists them",
        ),
        (
            "help",
            "this overview, or a command's help: `subloop help run`",
        ),
    ] {
        text.push_str(&entry(name, what, 8));
    }
    text.push_str(
        "\nEach command lists its flags and examples: `subloop demo --help`, `subloop run --help`, \
         `subloop replay --help`, `subloop chat --help`, `subloop view --help`.\n\n",
    );
    text.push_str(wrap(EXIT, 0).trim_end());
    text
}

fn summary(command: Command) -> &'static str {
    match command {
        Command::Demo => {
            "the course's scenario on the built-in offline models (or the Messages API with --live)"
        }
        Command::Run => {
            "the agent against a workspace, on a replay script or on the Messages API (--live)"
        }
        Command::Replay => {
            "a recorded run (a --trace file) re-run offline: recorded replies, real tools, every request compared"
        }
        Command::Chat => {
            "questions one per line, each a follow-up with the whole session's history, in one trace"
        }
        Command::View => {
            "a recorded run (a trace file, or another agent's history) as a timeline, with the loop's invariants checked"
        }
    }
}

fn usage_lines(command: Command) -> Vec<String> {
    match command {
        Command::Demo => vec![
            "subloop demo [OPTIONS]".to_owned(),
            "subloop demo --live [OPTIONS]".to_owned(),
        ],
        Command::Run => vec![
            "subloop run --workspace DIR --script FILE [OPTIONS]".to_owned(),
            "subloop run --workspace DIR --live [OPTIONS]".to_owned(),
            "subloop run --workspace DIR --resume TRACE [--script FILE | --live] [OPTIONS]"
                .to_owned(),
        ],
        Command::Replay => vec!["subloop replay TRACE --workspace DIR [OPTIONS]".to_owned()],
        Command::Chat => {
            vec!["subloop chat [--workspace DIR] [--script FILE | --live] [OPTIONS]".to_owned()]
        }
        Command::View => vec!["subloop view TRACE [--check] [OPTIONS]".to_owned()],
    }
}

fn description(command: Command) -> &'static str {
    match command {
        Command::Demo => {
            "subloop demo: the course's scenario. The parent delegates reading main.py and \
             expected.txt to a subagent, reads expected.txt itself, asks to run main.py and \
             compares its output with expected.txt. The models are built in and offline (they \
             adapt to what the tools return); --live puts the Anthropic Messages API in their \
             place. Progress goes to stderr, the answer to stdout."
        }
        Command::Run => {
            "subloop run: the agent (read_file, run_main, todo_write, task) against a workspace, \
             on a replay script (--script) or on the Anthropic Messages API (--live). A script \
             is {\"parent\": [REPLY, ...], \"children\": [[REPLY, ...], ...]}, where REPLY is a \
             Messages API response object (content, stop_reason, ...) or {\"error\": \"text\"} \
             for a failed request; children[i] is replayed by the i-th delegation. --resume TRACE \
             continues a run that ended early (call_limit, deadline, token_limit, cancelled, \
             model_error) or was killed: its history is rebuilt from the trace and checked, calls \
             it left unfinished are answered \"not executed\" (never run again), the limits count \
             both parts, and the new lines are appended to TRACE."
        }
        Command::Replay => {
            "subloop replay: re-runs the run recorded in TRACE (a --trace file of run or demo, \
             also of a live run) offline, with no API key. Every model reply of the parent and \
             of each child comes from the trace; the tools run for real against the workspace, \
             through the same gate and hooks; each request is compared with the recorded one \
             (system, tools, messages, plan). Give the recorded run's policy and limit flags \
             (--decision, --max-calls, ...). The question is the recorded one. The first \
             divergence stops the replay unless --keep-going."
        }
        Command::View => {
            "subloop view: shows the run recorded in TRACE (the trace file of a demo, run, chat \
             or replay) on the terminal, from the trace alone: one line per model call (stop reason, \
             tokens, text) and per tool call (decision, result), each subagent indented under the \
             task call that started it, then the outcome, the counts, and every loop invariant \
             held or broken with where it breaks. TRACE may also be another agent's history (a \
             Claude Code session, with its subagents' files beside it; a codex rollout; a \
             Messages API or Chat Completions request history): it is shown as a run, a model \
             call per reply, with the rules that apply to any history (see `subloop check`). \
             Colour only when stdout is a terminal and NO_COLOR is unset. Exit 0; with --check, \
             1 when an invariant is broken; 2 for an unreadable trace."
        }
        Command::Chat => {
            "subloop chat: an interactive session. Type a question per line; the answer is \
             printed on stdout, progress and the `> ` prompt go to stderr. Each question after \
             the first is a follow-up with the whole earlier history (as `subloop run` asks one \
             when it resumes a trace); --max-calls is each question's budget, the other limits are the \
             session's. Ctrl-C cancels the current question, not the session; `/continue` goes \
             on with a question that was stopped; `/exit` or the end of input leaves. The session \
             is one trace (--trace FILE, else a temporary file removed at the end) that `subloop \
             run` can resume and `subloop replay` reads. Models: --script (replies for the whole session, in \
             order), --live, or the demo's."
        }
    }
}

fn examples(command: Command) -> &'static [(&'static str, &'static str)] {
    match command {
        Command::Demo => &[
            (
                "subloop demo --decision allow",
                "runs main.py without asking",
            ),
            (
                "subloop demo --child-calls 1 --json",
                "a subagent that runs out of calls, as one JSON object",
            ),
            (
                "subloop demo --live --decision allow",
                "the same scenario on the API (export ANTHROPIC_API_KEY first)",
            ),
        ],
        Command::Run => &[
            (
                "subloop run --workspace examples/workspace --script examples/scripts/check_and_run.json --decision allow",
                "",
            ),
            (
                "subloop run --workspace . --live --question \"Does main.py print what expected.txt says?\"",
                "",
            ),
            (
                "subloop run --workspace ws --resume run.jsonl --script rest.json --max-calls 12",
                "continues the run run.jsonl records, with the rest of the replies",
            ),
        ],
        Command::View => &[
            ("subloop view run.jsonl", "the timeline and the invariants"),
            (
                "subloop view run.jsonl --check --max-calls 8 --child-calls 4",
                "exit 1 if a rule of the loop is broken, budgets included",
            ),
        ],
        Command::Chat => &[
            (
                "subloop chat --live --workspace . --trace session.jsonl",
                "ask, then ask follow-ups; the trace can be resumed later with `subloop run`",
            ),
            (
                "subloop chat --workspace ws --script session.json --decision deny",
                "a scripted session (one reply list for all its questions)",
            ),
        ],
        Command::Replay => &[
            (
                "subloop replay run.jsonl --workspace examples/workspace --decision allow",
                "prints `reproduced: ...` or the first divergence, e.g. `diverged: parent call 3: tool_result toolu_02 content differs: ...`",
            ),
            (
                "subloop replay run.jsonl --workspace ws --decision allow --keep-going --json",
                "every divergence, as one JSON object",
            ),
        ],
    }
}

fn heading(group: Group) -> &'static str {
    match group {
        Group::Options => "OPTIONS:",
        Group::Limits => {
            "RUN LIMITS (the parent and every child together; Ctrl-C cancels, twice exits at once):"
        }
        Group::Live => {
            "LIVE (every flag but --live needs --live). --provider anthropic (the default): \
             the Messages API, or a server that speaks it; reads ANTHROPIC_API_KEY (required), \
             ANTHROPIC_MODEL and ANTHROPIC_BASE_URL. --provider openai: a Chat Completions \
             server (OpenAI, llama.cpp, vLLM, Ollama, ...); reads OPENAI_MODEL (required unless \
             --model), OPENAI_BASE_URL and OPENAI_API_KEY (optional):"
        }
    }
}

fn command_help(command: Command) -> String {
    let mut text = wrap(description(command), 0);
    text.push_str("\nUSAGE:\n");
    for line in usage_lines(command) {
        text.push_str(&format!("    {line}\n"));
    }
    let column = FLAGS
        .iter()
        .filter(|flag| flag.on(command))
        .map(|flag| flag.usage().len())
        .max()
        .unwrap_or(0);
    for group in [Group::Options, Group::Limits, Group::Live] {
        let flags: Vec<_> = FLAGS
            .iter()
            .filter(|flag| flag.on(command) && flag.group == group)
            .collect();
        if flags.is_empty() {
            continue;
        }
        text.push('\n');
        text.push_str(&wrap(heading(group), 0));
        for flag in flags {
            text.push_str(&entry(&flag.usage(), flag.help, column));
        }
    }
    text.push('\n');
    text.push_str(&wrap(
        "SECS are seconds, more than 0 and at most 86400 (a day); fractions are allowed.",
        0,
    ));
    text.push_str("\nEXAMPLES:\n");
    for (example, what) in examples(command) {
        text.push_str(&format!("    {example}\n"));
        if !what.is_empty() {
            text.push_str(&wrap(what, 8));
        }
    }
    text.push('\n');
    text.push_str(wrap(EXIT, 0).trim_end());
    text
}

/// `    NAME   what`, with `what` wrapped under itself.
fn entry(name: &str, what: &str, column: usize) -> String {
    let indent = 4 + column + 2;
    let wrapped = wrap(what, indent);
    let first = wrapped.get(indent..).unwrap_or_default();
    format!("    {name:<column$}  {first}")
}

/// `text` wrapped at [`WIDTH`], every line indented by `indent` spaces, each ending in `\n`.
fn wrap(text: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent + line.len() + 1 + word.len() > WIDTH {
            out.push_str(&format!("{:indent$}{line}\n", ""));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&format!("{:indent$}{line}\n", ""));
    out
}
