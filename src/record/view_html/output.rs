//! `demo --view FILE.html` / `run --view FILE.html`: the page of a run,
//! written when the run ends, from the run's own trace (`--trace` or
//! `--resume`, or else a temporary trace removed afterwards).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::record::invariants::{self, Policy};
use crate::record::recorded::RecordedRun;
use crate::record::target::{self, FileRole, TraceTargetError};
use crate::run::shutdown::{Registration, Shutdown};

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
struct TemporaryTrace(PathBuf, #[allow(dead_code)] Option<Registration>);

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
    temporary: Option<TemporaryTrace>,
}

impl PageTrace {
    /// `trace` when the run writes one (it must be a regular file: the page
    /// is read back from it), else a fresh temporary file, readable by its
    /// owner only (removed when a signal ends the process too, if the host
    /// gives its `shutdown`).
    pub fn for_run(trace: Option<&Path>, shutdown: Option<&Arc<Shutdown>>) -> Result<Self, String> {
        match trace {
            Some(trace) => {
                if let Ok(meta) = std::fs::metadata(trace)
                    && !meta.is_file()
                {
                    return Err(format!(
                        "the page is drawn from the trace, but the trace file {} is not a regular file; give a regular file as the trace, or none",
                        trace.display()
                    ));
                }
                Ok(Self {
                    path: trace.to_owned(),
                    temporary: None,
                })
            }
            None => {
                let path = target::create_private("subloop-view").map_err(|err| {
                    format!("cannot create a temporary trace for the view page: {err}")
                })?;
                let on_exit = path.clone();
                let registration = shutdown.map(|shutdown| {
                    shutdown.on_termination(move |_| {
                        let _ = std::fs::remove_file(&on_exit);
                    })
                });
                Ok(Self {
                    temporary: Some(TemporaryTrace(path.clone(), registration)),
                    path,
                })
            }
        }
    }

    /// Where the trace is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl PageOutput {
    /// Checks the page file at `path` before the run starts (the checks of
    /// a trace file: not one of `protected` nor the trace, even one not
    /// created yet, not inside `workspace`, not a FIFO, …) and locks it; an
    /// existing page keeps its content until the new one is written. The
    /// page is drawn from `trace` at the end.
    pub fn open(
        path: &Path,
        workspace: &Path,
        protected: &[(&Path, &'static str)],
        trace: PageTrace,
        policy: Policy,
    ) -> Result<Self, TraceTargetError> {
        let mut guarded: Vec<(&Path, &'static str)> = protected.to_vec();
        guarded.push((trace.path(), "trace file"));
        // A trace not created yet has no inode to compare: compare names.
        for (other, kind) in &guarded {
            if !other.exists() && same_name(path, other) {
                return Err(TraceTargetError::Protected {
                    path: path.to_owned(),
                    what: FileRole::Page,
                    protected: other.to_path_buf(),
                    kind,
                });
            }
        }
        let file = target::open_output(path, Some(workspace), &guarded, FileRole::Page)?;
        Ok(Self {
            file,
            path: path.to_owned(),
            trace,
            policy,
        })
    }

    /// The trace the page is drawn from.
    pub fn trace_path(&self) -> &Path {
        self.trace.path()
    }

    /// The page's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the trace and writes the page; the error says what failed.
    pub fn write(mut self) -> Result<(), String> {
        let run = RecordedRun::load(self.trace.path()).map_err(|err| err.to_string())?;
        let verdicts = invariants::check(&run, &self.policy);
        // Named after the trace, as `view TRACE -o` names it, unless the
        // trace is a temporary file whose name would mean nothing.
        let named_after = match self.trace.temporary {
            Some(_) => &self.path,
            None => self.trace.path(),
        };
        let title = title_of(named_after);
        replace_content(&mut self.file, |out| {
            super::write_page(out, &run, &verdicts, &self.policy, &title)
        })
        .map_err(|err| format!("cannot write {}: {err}", self.path.display()))
    }
}

impl PageOutput {
    /// `subloop view TRACE -o FILE`: the page of `run` (read from `trace`)
    /// and its `verdicts` written to `output` (checked like a trace file, never
    /// the trace itself; an old page is replaced only by the new one).
    pub fn write_for_trace(
        trace: &Path,
        output: &Path,
        run: &RecordedRun,
        verdicts: &[invariants::Verdict],
        policy: &Policy,
    ) -> Result<(), String> {
        let title = title_of(trace);
        let mut file = target::open_output(output, None, &[(trace, "trace file")], FileRole::Page)
            .map_err(|err| err.to_string())?;
        replace_content(&mut file, |out| {
            super::write_page(out, run, verdicts, policy, &title)
        })
        .map_err(|err| format!("cannot write {}: {err}", output.display()))
    }
}

/// A page's title: the file name of `path`.
fn title_of(path: &Path) -> String {
    path.file_name().map_or_else(
        || "run".to_owned(),
        |name| name.to_string_lossy().into_owned(),
    )
}

/// Replaces what `file` holds with what `write` writes (buffered, as it
/// is made: a long run's page is never held whole in memory). The page is
/// made in a nameless temporary file first (nothing is left behind, even
/// by a kill) and copied in only when it is whole, so the old page stays
/// while the new one is made; where the temporary directory cannot hold a
/// nameless file, the page is made in place.
fn replace_content(
    file: &mut File,
    write: impl FnOnce(&mut std::io::BufWriter<&mut File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::Seek;
    use std::os::unix::fs::OpenOptionsExt as _;
    let staged = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(std::env::temp_dir());
    if let Ok(mut staged) = staged {
        let mut out = std::io::BufWriter::with_capacity(1 << 16, &mut staged);
        write(&mut out)?;
        out.flush()?;
        drop(out);
        staged.seek(std::io::SeekFrom::Start(0))?;
        if file.metadata()?.is_file() {
            file.set_len(0)?;
            file.seek(std::io::SeekFrom::Start(0))?;
        }
        std::io::copy(&mut staged, file)?;
        return file.flush();
    }
    if file.metadata()?.is_file() {
        file.set_len(0)?;
        file.seek(std::io::SeekFrom::Start(0))?;
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
    write(&mut out)?;
    out.flush()
}

/// Whether two paths name the same file, by their directory (resolved) and
/// file name, for a file that does not exist yet.
fn same_name(a: &Path, b: &Path) -> bool {
    let resolve = |path: &Path| {
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        Some((
            std::fs::canonicalize(dir).ok()?,
            path.file_name()?.to_owned(),
        ))
    };
    matches!((resolve(a), resolve(b)), (Some(x), Some(y)) if x == y)
}
