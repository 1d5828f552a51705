//! One reader of standard input, shared by everything that reads it.
//!
//! `subloop chat` reads its questions from standard input, and the
//! approval prompt (`Allow? [y/N]`) reads its answer from the same place.
//! Two readers with buffers of their own would each hold part of what was
//! typed (or one would wait for a lock the other keeps); a
//! [`TerminalInput`] is the single buffer both read lines from, one line
//! at a time, and a read can be given up when a run is cancelled (a Ctrl-C
//! at the approval prompt).

use std::io::{self, BufRead, Read};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a read that may be given up looks at its stop condition.
const POLL: Duration = Duration::from_millis(50);

/// What one [`TerminalInput::read_line`] gave.
#[derive(Debug)]
#[non_exhaustive]
pub(crate) enum LineRead {
    /// A line, with its `\n` when it had one (the last line may not).
    Line(Vec<u8>),
    /// The end of input: nothing more will come.
    End,
    /// The stop condition held before a whole line came (what was typed
    /// so far stays for the next read).
    Stopped,
    /// Reading failed.
    Failed(io::Error),
}

/// Where the bytes come from: a file descriptor (standard input) or, for
/// tests, any reader.
enum Source {
    Fd(libc::c_int),
    Reader(Box<dyn Read + Send>),
}

struct Buffered {
    source: Source,
    bytes: Vec<u8>,
    ended: bool,
}

/// Standard input (or another reader) read line by line through one
/// buffer; share it with [`Arc`] between the readers of one process.
pub struct TerminalInput {
    inner: Mutex<Buffered>,
}

impl std::fmt::Debug for TerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalInput").finish_non_exhaustive()
    }
}

impl TerminalInput {
    /// The process's standard input (file descriptor 0), read directly:
    /// nothing else in the process should read `std::io::stdin()`.
    pub fn stdin() -> Arc<Self> {
        Arc::new(Self::with_source(Source::Fd(libc::STDIN_FILENO)))
    }

    /// Lines from `reader` (tests, hosts with their own input).
    pub fn from_reader(reader: impl Read + Send + 'static) -> Arc<Self> {
        Arc::new(Self::with_source(Source::Reader(Box::new(reader))))
    }

    fn with_source(source: Source) -> Self {
        Self {
            inner: Mutex::new(Buffered {
                source,
                bytes: Vec::new(),
                ended: false,
            }),
        }
    }

    /// Whether the input is a terminal (a person can answer a prompt).
    pub fn is_terminal(&self) -> bool {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match inner.source {
            // SAFETY: isatty only inspects the descriptor.
            Source::Fd(fd) => unsafe { libc::isatty(fd) == 1 },
            Source::Reader(_) => false,
        }
    }

    /// The lines of this input as a [`BufRead`], one line at a time (a
    /// read never waits for more than the line it is in); a prompt reading
    /// the same input between two lines reads the line after.
    pub fn lines(self: Arc<Self>) -> impl BufRead {
        TerminalLines::new(self)
    }

    /// The next line. `stop` is asked about every few tens of milliseconds
    /// while nothing has come (only for a file descriptor; a reader is read
    /// as it is): when it says `true`, the read gives up with
    /// [`LineRead::Stopped`].
    pub(crate) fn read_line(&self, stop: &dyn Fn() -> bool) -> LineRead {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        loop {
            if let Some(end) = inner.bytes.iter().position(|&byte| byte == b'\n') {
                let rest = inner.bytes.split_off(end + 1);
                return LineRead::Line(std::mem::replace(&mut inner.bytes, rest));
            }
            if inner.ended {
                if inner.bytes.is_empty() {
                    return LineRead::End;
                }
                return LineRead::Line(std::mem::take(&mut inner.bytes));
            }
            if stop() {
                return LineRead::Stopped;
            }
            let mut chunk = [0u8; 4096];
            let read = match &mut inner.source {
                Source::Reader(reader) => reader.read(&mut chunk),
                Source::Fd(fd) => match wait_readable(*fd) {
                    Ok(false) => continue,
                    Ok(true) => read_fd(*fd, &mut chunk),
                    Err(err) => Err(err),
                },
            };
            match read {
                Ok(0) => inner.ended = true,
                Ok(n) => inner.bytes.extend_from_slice(chunk.get(..n).unwrap_or(&[])),
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) => {}
                Err(err) => return LineRead::Failed(err),
            }
        }
    }
}

/// Whether `fd` has something to read (or its end) within [`POLL`].
fn wait_readable(fd: libc::c_int) -> io::Result<bool> {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::c_int::try_from(POLL.as_millis()).unwrap_or(50);
    // SAFETY: one valid pollfd on the stack.
    match unsafe { libc::poll(&mut poll, 1, timeout) } {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(err)
            }
        }
    }
}

fn read_fd(fd: libc::c_int, buffer: &mut [u8]) -> io::Result<usize> {
    // SAFETY: reads at most buffer.len() bytes into a valid buffer.
    let n = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// A [`BufRead`] over a shared [`TerminalInput`], one line at a time (a
/// read never waits for more than the line it is in).
#[derive(Debug)]
pub(crate) struct TerminalLines {
    input: Arc<TerminalInput>,
    line: Vec<u8>,
    at: usize,
}

impl TerminalLines {
    /// Lines of `input`.
    pub fn new(input: Arc<TerminalInput>) -> Self {
        Self {
            input,
            line: Vec::new(),
            at: 0,
        }
    }
}

impl Read for TerminalLines {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        if let (Some(to), Some(from)) = (buf.get_mut(..n), available.get(..n)) {
            to.copy_from_slice(from);
        }
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for TerminalLines {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.at >= self.line.len() {
            self.at = 0;
            self.line = match self.input.read_line(&|| false) {
                LineRead::Line(line) => line,
                LineRead::End | LineRead::Stopped => Vec::new(),
                LineRead::Failed(err) => return Err(err),
            };
        }
        Ok(self.line.get(self.at..).unwrap_or(&[]))
    }

    fn consume(&mut self, amount: usize) {
        self.at = self.at.saturating_add(amount).min(self.line.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_readers_share_one_buffer() {
        let input = TerminalInput::from_reader(io::Cursor::new(b"first\ny\nsecond".to_vec()));
        let mut lines = TerminalLines::new(Arc::clone(&input));
        let mut line = Vec::new();
        lines.read_until(b'\n', &mut line).expect("read");
        assert_eq!(line, b"first\n");
        // The other reader (the approval prompt) gets the very next line.
        assert!(matches!(input.read_line(&|| false), LineRead::Line(l) if l == b"y\n"));
        line.clear();
        lines.read_until(b'\n', &mut line).expect("read");
        assert_eq!(line, b"second");
        line.clear();
        assert_eq!(lines.read_until(b'\n', &mut line).expect("read"), 0);
        assert!(matches!(input.read_line(&|| false), LineRead::End));
    }

    #[test]
    fn a_stopped_read_keeps_nothing_back() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        let fd = std::os::fd::IntoRawFd::into_raw_fd(reader);
        let input = TerminalInput::with_source(Source::Fd(fd));
        std::io::Write::write_all(&mut writer, b"partial").expect("write");
        assert!(matches!(input.read_line(&|| true), LineRead::Stopped));
        std::io::Write::write_all(&mut writer, b" line\n").expect("write");
        let read = input.read_line(&|| false);
        assert!(matches!(read, LineRead::Line(l) if l == b"partial line\n"));
        // SAFETY: the descriptor was taken from the pipe above and is closed once.
        unsafe { libc::close(fd) };
    }
}
