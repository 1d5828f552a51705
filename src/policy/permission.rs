//! The permission gate: read-only tools pass; a tool that executes runs only
//! after an [`Approver`] allows that call. A denial is answered
//! `not executed: permission denied` and the tool does not start.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::core::agent_id::AgentId;
use crate::core::conversation::ToolCall;
use crate::policy::terminal::{LineRead, TerminalInput};
use crate::run::limits::CancelHandle;

/// The approver's answer for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// Run it.
    Allow,
    /// Do not run it.
    Deny,
}

/// What the approver is asked about.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ApprovalRequest<'a> {
    /// The agent asking.
    pub agent: &'a AgentId,
    /// The call.
    pub call: &'a ToolCall,
    /// A one-line description of what would happen (e.g. the command line).
    pub action: &'a str,
}

/// Decides calls of tools that need approval. Shared by the parent and every child.
///
/// A blocking run asks [`Approver::decide`]; an async run awaits
/// [`Approver::decide_async`], whose default asks `decide` at once, on
/// the runtime's worker: right for an approver that answers at once
/// ([`AllowAll`], [`DenyAll`], a rule). An approver whose answer comes
/// from elsewhere (a person on another machine, a durable promise)
/// overrides `decide_async`, and the run waits for it without holding a
/// thread; one whose `decide` waits (a prompt, a blocking call) is given
/// to an async run wrapped in [`OffWorker`], which asks it off the
/// runtime's worker. [`AskTerminal`] does so itself.
pub trait Approver: Send + Sync {
    /// Allow or deny one call.
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision;

    /// Allow or deny one call in an async run. The default asks
    /// [`Approver::decide`] when called, on the caller's thread.
    fn decide_async<'a>(
        &'a self,
        request: &'a ApprovalRequest<'a>,
    ) -> crate::run::BoxFuture<'a, Decision> {
        Box::pin(std::future::ready(self.decide(request)))
    }
}

/// Allows every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Approver for AllowAll {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        Decision::Allow
    }
}

/// Denies every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct DenyAll;

impl Approver for DenyAll {
    fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
        Decision::Deny
    }
}

/// Asks on the terminal: a `y/N` prompt on stderr, the answer from stdin.
///
/// A stdin that is not a terminal, closed, or unreadable counts as "no",
/// and so does a stderr the prompt cannot be written to. The answer is
/// read through a shared [`TerminalInput`], so a host that reads its own
/// lines from stdin (`subloop chat`) and this prompt take turns on one
/// buffer; a cancelled run (a Ctrl-C at the prompt) gives up the question
/// and counts as "no".
#[derive(Clone)]
pub struct AskTerminal {
    lock: Arc<Mutex<()>>,
    input: Arc<TerminalInput>,
    cancel: CancelHandle,
    watch: Option<PromptWatch>,
    /// What the denial without a terminal adds: how the host allows calls.
    how_to_allow: Option<String>,
}

/// Told when an approval prompt opens (with the tool it asks about) and
/// when it closes (`None`).
type PromptWatch = Arc<dyn Fn(Option<&str>) + Send + Sync>;

impl std::fmt::Debug for AskTerminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AskTerminal")
            .field("input", &self.input)
            .field("cancel", &self.cancel)
            .field("watched", &self.watch.is_some())
            .finish()
    }
}

impl Default for AskTerminal {
    fn default() -> Self {
        Self::new()
    }
}

impl AskTerminal {
    /// A terminal approver reading stdin, never cancelled.
    pub fn new() -> Self {
        Self::with_input(TerminalInput::stdin(), CancelHandle::new())
    }

    /// A terminal approver that reads its answers from `input` and gives
    /// up a question (denying the call) once `cancel` is cancelled.
    pub fn with_input(input: Arc<TerminalInput>, cancel: CancelHandle) -> Self {
        Self {
            lock: Arc::default(),
            input,
            cancel,
            watch: None,
            how_to_allow: None,
        }
    }

    /// Says `how` (the host's own way to allow calls, such as a flag) when
    /// a call is denied because stdin is not a terminal.
    pub fn how_to_allow(mut self, how: impl Into<String>) -> Self {
        self.how_to_allow = Some(how.into());
        self
    }

    /// Tells `watch` when each prompt opens (with the tool it asks about)
    /// and when it closes (`None`): a host's Ctrl-C handling can then say
    /// that the call will not run, since it has not started.
    pub fn watched(mut self, watch: Option<PromptWatch>) -> Self {
        self.watch = watch;
        self
    }
}

impl Approver for AskTerminal {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        let _guard = self
            .lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut stderr = std::io::stderr().lock();
        if !self.input.is_terminal() {
            // Denied either way; a broken stderr only loses the explanation.
            let how = match &self.how_to_allow {
                Some(how) => format!(" ({})", crate::core::text::printable(how)),
                None => String::new(),
            };
            let _ = writeln!(
                stderr,
                "[permission] {} wants to run `{}`: denied, stdin is not a terminal{how}",
                request.agent,
                crate::core::text::printable(request.action)
            );
            return Decision::Deny;
        }
        if self.cancel.is_cancelled() {
            return Decision::Deny;
        }
        // What a Ctrl-C says from the moment the prompt shows is about this
        // call, which has not started, not about a running one.
        let _asking = Asking::open(self.watch.as_ref(), request.call.name());
        // Nobody can see a prompt that cannot be written: deny without asking.
        let prompt = write!(
            stderr,
            "[permission] {} wants to run `{}` ({}). Allow? [y/N] ",
            request.agent,
            crate::core::text::printable(request.action),
            crate::core::text::printable(request.call.name())
        )
        .and_then(|()| stderr.flush());
        if prompt.is_err() {
            return Decision::Deny;
        }
        drop(stderr);
        match self.input.read_line(Some(&self.cancel)) {
            LineRead::Line(line) if is_yes(&line) => Decision::Allow,
            LineRead::Line(_) | LineRead::Failed(_) => Decision::Deny,
            LineRead::End | LineRead::Stopped => {
                // The prompt's line stays open: end it so the next output
                // starts on a line of its own.
                let _ = writeln!(std::io::stderr());
                Decision::Deny
            }
        }
    }

    /// Asks off the runtime's worker: the prompt waits for a person.
    fn decide_async<'a>(
        &'a self,
        request: &'a ApprovalRequest<'a>,
    ) -> crate::run::BoxFuture<'a, Decision> {
        decide_off_worker(self.clone(), request)
    }
}

/// A blocking approver made fit for async runs: [`Approver::decide_async`]
/// asks the wrapped approver's `decide` off the runtime's worker (on
/// tokio's blocking pool inside a tokio runtime, else on a thread of its
/// own), so a prompt or a slow call holds no worker while it waits.
///
/// ```
/// use std::sync::Arc;
/// use subloop::policy::permission::{AllowAll, OffWorker};
/// let approver = Arc::new(OffWorker::new(AllowAll));
/// # let _ = subloop::AgentBuilder::new(approver);
/// ```
#[derive(Debug)]
pub struct OffWorker<A>(Arc<A>);

impl<A> Clone for OffWorker<A> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<A: Approver + 'static> OffWorker<A> {
    /// `approver`, asked off the worker in async runs.
    pub fn new(approver: A) -> Self {
        Self(Arc::new(approver))
    }
}

impl<A: Approver + 'static> Approver for OffWorker<A> {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        self.0.decide(request)
    }

    fn decide_async<'a>(
        &'a self,
        request: &'a ApprovalRequest<'a>,
    ) -> crate::run::BoxFuture<'a, Decision> {
        decide_off_worker(self.clone(), request)
    }
}

/// Asks `approver`'s `decide` about (a copy of) `request` off the worker.
fn decide_off_worker<'a, A: Approver + Send + 'static>(
    approver: A,
    request: &ApprovalRequest<'_>,
) -> crate::run::BoxFuture<'a, Decision> {
    let (agent, call, action) = (
        request.agent.clone(),
        request.call.clone(),
        request.action.to_owned(),
    );
    Box::pin(crate::run::offload::off_worker(move || {
        approver.decide(&ApprovalRequest {
            agent: &agent,
            call: &call,
            action: &action,
        })
    }))
}

/// An open prompt, told to the watcher; closed when dropped.
struct Asking<'a>(Option<&'a PromptWatch>);

impl<'a> Asking<'a> {
    fn open(watch: Option<&'a PromptWatch>, tool: &str) -> Self {
        if let Some(watch) = watch {
            watch(Some(tool));
        }
        Self(watch)
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(watch) = self.0 {
            watch(None);
        }
    }
}

/// `y` or `yes` (any case the usual way), around blanks.
fn is_yes(line: &[u8]) -> bool {
    matches!(line.trim_ascii(), b"y" | b"Y" | b"yes" | b"YES" | b"Yes")
}
