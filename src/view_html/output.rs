//! `demo --view FILE.html` / `run --view FILE.html`: the page of a run,
//! written when the run ends, from the run's own trace (`--trace` or
//! `--resume`, or else a temporary trace removed afterwards).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::invariants::{self, Policy};
use crate::model::replay::RecordedRun;
use crate::signals;
use crate::trace_target::{self, FileRole, TraceTargetError};

/// A page to write at the end of a run: the file, already checked and
/// created (so a refused path stops the run before it starts), and the
/// trace it is drawn from.
#[derive(Debug)]
pub struct PageOutput {
    file: File,
    path: PathBuf,
    trace: PageTrace,
    policy: Policy,
}

/// A trace made only for the page.
#[derive(Debug)]
struct TemporaryTrace(PathBuf, #[allow(dead_code)] signals::Registration);

impl Drop for TemporaryTrace {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The trace a page is drawn from: the run's own, or a temporary one made
/// for the page (removed when the page is written, when setting up the run
/// fails, or when a signal ends the process).
#[derive(Debug)]
pub struct PageTrace {
    path: PathBuf,
    _temporary: Option<TemporaryTrace>,
}

impl PageTrace {
    /// `trace` when the run writes one, else a fresh temporary path.
    pub fn for_run(trace: Option<&Path>) -> Self {
        match trace {
            Some(trace) => Self {
                path: trace.to_owned(),
                _temporary: None,
            },
            None => {
                let path =
                    std::env::temp_dir().join(format!("subloop-view-{}.jsonl", std::process::id()));
                let on_exit = path.clone();
                let registration = signals::on_termination(move |_| {
                    let _ = std::fs::remove_file(&on_exit);
                });
                Self {
                    _temporary: Some(TemporaryTrace(path.clone(), registration)),
                    path,
                }
            }
        }
    }

    /// Where the trace is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it was made for the page (the run was given no trace).
    pub fn is_temporary(&self) -> bool {
        self._temporary.is_some()
    }
}

impl PageOutput {
    /// Checks and creates the page file at `path` (the checks of a trace
    /// file: not one of `protected` nor the trace, not inside `workspace`,
    /// not a FIFO, …); the page is drawn from `trace` at the end.
    pub fn open(
        path: &Path,
        workspace: &Path,
        protected: &[(&Path, &'static str)],
        trace: PageTrace,
        policy: Policy,
    ) -> Result<Self, TraceTargetError> {
        let mut guarded: Vec<(&Path, &'static str)> = protected.to_vec();
        guarded.push((trace.path(), "trace file"));
        let file = trace_target::open_output(path, Some(workspace), &guarded, FileRole::Page)?;
        Ok(Self {
            file,
            path: path.to_owned(),
            trace,
            policy,
        })
    }

    /// The page's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the trace and writes the page; the error says what failed.
    pub fn write(mut self) -> Result<(), String> {
        let run = RecordedRun::load(self.trace.path()).map_err(|err| err.to_string())?;
        let verdicts = invariants::check(&run, &self.policy);
        let title = self
            .path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".to_owned());
        let page = super::page(&run, &verdicts, &self.policy, &title);
        self.file
            .write_all(page.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|err| format!("cannot write {}: {err}", self.path.display()))
    }
}
