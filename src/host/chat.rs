//! `subloop chat`: one question per line, each answered with the whole
//! session's history, all in one trace.
//!
//! The first line starts a run; each later line is a follow-up question
//! ([`subloop::Conversation::follow_up`]) asked by resuming the session's
//! trace ([`subloop::record::resume`]), so the session's trace is exactly what `run
//! --resume` and `replay` read, and a history rebuilt for each question is
//! checked by the conversation's rules. A question that ends other than
//! answered (Ctrl-C, its call budget, a model error) leaves the session
//! open: `/continue` resumes that question; a new question needs an
//! answered one. `/exit` or the end of input ends the session.

use std::io::{BufRead, Write};

/// Where answers and notes go, one whole text at a time.
pub type Say<'a> = &'a mut dyn FnMut(&str);
use std::path::PathBuf;

use crate::host::{AppError, Models, Settings};
use subloop::core::conversation::StatusKind;

/// What one line of the session led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The line as typed (a question or `/continue`).
    pub line: String,
    /// How the question ended, or `None` when the line was refused.
    pub status: Option<StatusKind>,
    /// The answer, what stopped the question, or why the line was refused.
    pub text: String,
}

/// Where a session is, for a host that treats Ctrl-C by it (see [`Chat::watched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Moment {
    /// Waiting for the next line: no question runs.
    Waiting,
    /// A line came.
    Read,
    /// A question is about to run.
    Asking,
    /// The question ended.
    Asked,
}

/// A chat session over `settings` (workspace, policy, limits) and `models`.
pub struct Chat {
    settings: Settings,
    models: Models,
    trace: PathBuf,
    last: Option<StatusKind>,
    turns: Vec<Turn>,
    /// Parent calls the session has made (the run's count goes on).
    calls_before: u32,
    watch: Option<Box<dyn FnMut(Moment)>>,
}

impl std::fmt::Debug for Chat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chat")
            .field("trace", &self.trace)
            .field("last", &self.last)
            .field("turns", &self.turns)
            .finish_non_exhaustive()
    }
}

impl Chat {
    /// A session whose trace is `trace` (created by the first question).
    /// `settings.question`, `trace`, `resume` and `follow_up` are set per line.
    pub fn new(settings: Settings, models: Models, trace: PathBuf) -> Self {
        Self {
            settings,
            models,
            trace,
            last: None,
            turns: Vec::new(),
            calls_before: 0,
            watch: None,
        }
    }

    /// Tells `watch` where the session is (waiting for a line, running a
    /// question): the CLI's Ctrl-C cancels a question but nothing at the
    /// session's own prompt.
    pub fn watched(mut self, watch: impl FnMut(Moment) + 'static) -> Self {
        self.watch = Some(Box::new(watch));
        self
    }

    fn tell(&mut self, moment: Moment) {
        if let Some(watch) = self.watch.as_mut() {
            watch(moment);
        }
    }

    /// The lines handled so far.
    #[allow(dead_code)] // the tests that include this module read it
    pub fn turns(&self) -> &[Turn] {
        &self.turns
    }

    /// Handles one line: a question, `/continue`, or (returning `false`)
    /// `/exit`. Blank lines are skipped. The turn is recorded, and its text
    /// said through `say`.
    pub fn line(&mut self, line: &str, say: Say<'_>) -> Result<bool, AppError> {
        let line = line.trim();
        if line.is_empty() {
            return Ok(true);
        }
        if line == "/exit" {
            return Ok(false);
        }
        // A Ctrl-C at the prompt is not this question's.
        self.tell(Moment::Asking);
        let mut settings = self.settings.clone();
        match (line, self.last) {
            (_, None) if line != "/continue" => {
                settings.question = line.to_owned();
                settings.trace = Some(self.trace.clone());
            }
            ("/continue", Some(status)) if status != StatusKind::Answered => {
                settings.resume = Some(self.trace.clone());
            }
            (question, Some(StatusKind::Answered)) if question != "/continue" => {
                settings.resume = Some(self.trace.clone());
                settings.follow_up = Some(question.to_owned());
            }
            (_, last) => {
                let text = match last {
                    None | Some(StatusKind::Answered) => {
                        "nothing to continue: ask a question".to_owned()
                    }
                    Some(status) => format!(
                        "the last question ended {status}: /continue goes on with it (a new question needs an answered one), /exit leaves"
                    ),
                };
                say(&text);
                self.turns.push(Turn {
                    line: line.to_owned(),
                    status: None,
                    text,
                });
                return Ok(true);
            }
        }
        let models = self.models_for_next();
        // A line that cannot run (e.g. `/continue` of a question whose call
        // budget is spent) is said and refused; nothing ran, the session goes on.
        let run = match super::prepare(&settings, models).and_then(super::Prepared::run) {
            Ok(run) => run,
            Err(err) => {
                let text = format!("cannot ask this: {err}");
                say(&text);
                self.turns.push(Turn {
                    line: line.to_owned(),
                    status: None,
                    text,
                });
                return Ok(true);
            }
        };
        let outcome = &run.report.outcome;
        say(&outcome.text);
        if let Some(error) = &outcome.output_error {
            say(&format!(
                "(the answer does not match the output schema: {error})"
            ));
        }
        self.last = Some(outcome.status);
        self.consumed(&run.report);
        self.turns.push(Turn {
            line: line.to_owned(),
            status: Some(outcome.status),
            text: outcome.text.clone(),
        });
        // A Ctrl-C cancelled this question, not the session.
        self.tell(Moment::Asked);
        Ok(true)
    }

    /// Reads lines from `input` until `/exit` or its end; `prompt` (if any)
    /// is written before each line. A line that cannot run is answered with
    /// why, and the session goes on; nothing already recorded is lost.
    pub fn run(
        &mut self,
        input: &mut dyn BufRead,
        say: Say<'_>,
        mut prompt: Option<&mut dyn Write>,
    ) -> Result<(), AppError> {
        let mut line = Vec::new();
        loop {
            line.clear();
            // A Ctrl-C while the session waits for a line (from the moment
            // its prompt shows) has no question to cancel.
            self.tell(Moment::Waiting);
            if let Some(prompt) = prompt.as_mut() {
                let _ = write!(prompt, "> ");
                let _ = prompt.flush();
            }
            let read = input.read_until(b'\n', &mut line);
            self.tell(Moment::Read);
            match read {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                // Said and refused like any line that cannot run; the session goes on.
                let text = format!(
                    "this line is not UTF-8 text ({}): nothing was asked; type it again in UTF-8",
                    subloop::core::text::printable(&String::from_utf8_lossy(&line))
                );
                say(&text);
                self.turns.push(Turn {
                    line: String::from_utf8_lossy(&line).trim().to_owned(),
                    status: None,
                    text,
                });
                continue;
            };
            if !self.line(text, say)? {
                return Ok(());
            }
        }
    }

    /// The models for the next line: a script goes on after the replies
    /// and delegations the session has used.
    fn models_for_next(&self) -> Models {
        self.models.clone()
    }

    /// Drops the script replies a question used.
    fn consumed(&mut self, report: &subloop::RunReport) {
        if let Models::Script(script) = &self.models {
            let used = report.outcome.calls.saturating_sub(self.calls_before);
            let used = usize::try_from(used).unwrap_or(usize::MAX);
            self.models = Models::Script(script.after(used, report.children.len()));
        }
        self.calls_before = report.outcome.calls;
        if let Models::Script(_) = &self.models {}
    }
}
