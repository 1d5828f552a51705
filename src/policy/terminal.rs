//! One reader of standard input, shared by everything that reads it.
//!
//! `subloop chat` reads its questions from standard input, and the
//! approval prompt (`Allow? [y/N]`) reads its answer from the same place.
//! Two readers with buffers of their own would each hold part of what was
//! typed (or one would wait for a lock the other keeps); a
//! [`TerminalInput`] is the single buffer both read lines from, one line
//! at a time, and a read can be given up when a run is cancelled (a Ctrl-C
//! at the approval prompt).

use std::io::{self, BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use crate::run::limits::CancelHandle;

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

    /// The next line. With `cancel`, a read from a file descriptor waits
    /// on the descriptor and on the cancel together (no timeout): once
    /// the handle is cancelled, the read gives up with
    /// [`LineRead::Stopped`]. A reader is read as it is.
    pub(crate) fn read_line(&self, cancel: Option<&CancelHandle>) -> LineRead {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        // Woken by the cancel: a pipe it writes a byte to.
        let wake = cancel.and_then(|cancel| {
            let (reader, writer) = io::pipe().ok()?;
            let writer = Arc::new(writer);
            let registration = cancel.on_cancel(move || {
                let _ = (&*writer).write(&[1]);
            });
            Some((reader, registration))
        });
        let stopped = || cancel.is_some_and(CancelHandle::is_cancelled);
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
            if stopped() {
                return LineRead::Stopped;
            }
            let mut chunk = [0u8; 4096];
            let read = match &mut inner.source {
                Source::Reader(reader) => reader.read(&mut chunk),
                Source::Fd(fd) => {
                    let woken = wake.as_ref().map(|(reader, _)| reader.as_raw_fd());
                    match wait_readable(*fd, woken) {
                        Ok(false) => continue,
                        Ok(true) => read_fd(*fd, &mut chunk),
                        Err(err) => Err(err),
                    }
                }
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

/// Waits, with no timeout, until `fd` has something to read (or its end):
/// true; or until `woken` (the cancel's pipe) has: false.
fn wait_readable(fd: libc::c_int, woken: Option<libc::c_int>) -> io::Result<bool> {
    let mut polls = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: woken.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: valid pollfds on the stack (a negative descriptor is skipped).
    match unsafe { libc::poll(polls.as_mut_ptr(), 2, -1) } {
        n if n > 0 => Ok(polls[0].revents != 0),
        0 => Ok(false),
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
            self.line = match self.input.read_line(None) {
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
        assert!(matches!(input.read_line(None), LineRead::Line(l) if l == b"y\n"));
        line.clear();
        lines.read_until(b'\n', &mut line).expect("read");
        assert_eq!(line, b"second");
        line.clear();
        assert_eq!(lines.read_until(b'\n', &mut line).expect("read"), 0);
        assert!(matches!(input.read_line(None), LineRead::End));
    }

    /// A read waiting on an empty pipe is woken by the cancel, from
    /// another thread: no timeout ends it.
    #[test]
    fn a_cancel_wakes_a_waiting_read() {
        let (reader, writer) = std::io::pipe().expect("pipe");
        let fd = std::os::fd::IntoRawFd::into_raw_fd(reader);
        let input = TerminalInput::with_source(Source::Fd(fd));
        let cancel = CancelHandle::new();
        let cancelling = cancel.clone();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            cancelling.cancel();
        });
        assert!(matches!(input.read_line(Some(&cancel)), LineRead::Stopped));
        canceller.join().expect("join");
        drop(writer);
        // SAFETY: the descriptor was taken from the pipe above and is closed once.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn a_stopped_read_keeps_nothing_back() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        let fd = std::os::fd::IntoRawFd::into_raw_fd(reader);
        let input = TerminalInput::with_source(Source::Fd(fd));
        std::io::Write::write_all(&mut writer, b"partial").expect("write");
        let cancel = CancelHandle::new();
        cancel.cancel();
        assert!(matches!(input.read_line(Some(&cancel)), LineRead::Stopped));
        std::io::Write::write_all(&mut writer, b" line\n").expect("write");
        let read = input.read_line(None);
        assert!(matches!(read, LineRead::Line(l) if l == b"partial line\n"));
        // SAFETY: the descriptor was taken from the pipe above and is closed once.
        unsafe { libc::close(fd) };
    }
}
