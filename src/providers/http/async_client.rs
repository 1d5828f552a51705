//! The sending half every async provider shares (feature `async`): the
//! blocking [`super::HttpClient`]'s loop, awaited. What it decides — which
//! attempt to retry, how long to wait, what a failure says — is the shared
//! [`Attempts`]; what it reads — SSE lines and events, a provider's stream
//! parser — is the shared sans-IO code, fed chunk by chunk.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::async_transport::{AsyncBody, AsyncResponse, AsyncTransport};
use super::retry::RetryPolicy;
use super::sse::{LineSplitter, SseDecoder, SseEvent};
use super::stream::{StreamParser, read_failed};
use super::{
    Attempts, ErrorReader, MAX_BODY, MAX_ERROR_BODY, MAX_STREAM, Secrets, Shown, StopProbe,
    TextSink, is_event_stream,
};
use crate::core::error::ModelFailure;
use crate::run::model::Received;

type Recorder = Arc<dyn Fn(Duration) + Send + Sync>;

/// A successful (2xx) response to an async request.
#[derive(Debug)]
pub enum AsyncSuccess {
    /// A whole body, already read.
    Body(String),
    /// An event stream, to be read by the provider.
    Stream(AsyncResponse),
}

/// The async sending half: transport, retries, waits and secrets.
pub struct AsyncHttpClient {
    transport: Arc<dyn AsyncTransport>,
    attempts: Attempts,
    /// Replaces the wait between attempts (tests record instead of waiting).
    recorder: Option<Recorder>,
}

impl std::fmt::Debug for AsyncHttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncHttpClient")
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// Reads up to `cap` bytes of a body; what was read before an error is kept.
async fn read_capped(body: &mut dyn AsyncBody, cap: u64) -> (Vec<u8>, Option<std::io::Error>) {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    while bytes.len() < cap {
        match body.chunk().await {
            Ok(Some(piece)) => {
                let room = cap - bytes.len();
                bytes.extend_from_slice(piece.get(..room).unwrap_or(&piece));
            }
            Ok(None) => break,
            Err(err) => return (bytes, Some(err)),
        }
    }
    (bytes, None)
}

impl AsyncHttpClient {
    /// A client sending through `transport` with `policy`, hiding `secrets`.
    pub fn new(transport: Arc<dyn AsyncTransport>, policy: RetryPolicy, secrets: Secrets) -> Self {
        Self {
            transport,
            attempts: Attempts::new(policy, secrets),
            recorder: None,
        }
    }

    /// Calls `record` with each wait between attempts instead of waiting
    /// (tests record the delays; the wait itself is a tokio timer).
    pub fn set_sleeper(&mut self, record: impl Fn(Duration) + Send + Sync + 'static) {
        self.recorder = Some(Arc::new(record));
    }

    /// The retry decisions and secrets this client sends with.
    pub fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// POSTs `body` to `url`, retrying what is worth retrying, exactly as
    /// [`super::HttpClient::post`] does; no retry starts once `stop` says
    /// the run was stopped. Dropping the future abandons the request.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        stop: Option<&StopProbe>,
        read_error: ErrorReader<'_>,
    ) -> Result<AsyncSuccess, ModelFailure> {
        let mut retry = 0;
        loop {
            let delay = match self.transport.post(url, headers, body).await {
                Ok(mut response) if (200..300).contains(&response.status) => {
                    if is_event_stream(&response.headers) {
                        return Ok(AsyncSuccess::Stream(response));
                    }
                    match read_capped(response.body.as_mut(), MAX_BODY).await {
                        (bytes, None) => {
                            return Ok(AsyncSuccess::Body(
                                String::from_utf8_lossy(&bytes).into_owned(),
                            ));
                        }
                        (_, Some(err)) => self.attempts.body_failed(retry, &err)?,
                    }
                }
                Ok(mut response) => {
                    let (bytes, _) = read_capped(response.body.as_mut(), MAX_ERROR_BODY).await;
                    let text = String::from_utf8_lossy(&bytes);
                    self.attempts.status_failed(
                        retry,
                        response.status,
                        &response.headers,
                        &text,
                        read_error,
                    )?
                }
                Err(err) => self.attempts.transport_failed(retry, &err)?,
            };
            if stop.is_some_and(|probe| probe()) {
                return Err(self.attempts.abandoned());
            }
            match &self.recorder {
                Some(record) => record(delay),
                None => tokio::time::sleep(delay).await,
            }
            retry += 1;
        }
    }
}

/// Reads an async event stream into a reply with `parser`, showing its
/// text on `sink` (see [`Shown`]) with `redactor`'s secrets hidden: the
/// events are the ones the blocking reader would see, in the same order.
/// Past 64 MiB the stream just ends.
pub async fn read_stream_async<P: StreamParser + Send>(
    mut response: AsyncResponse,
    sink: Option<&TextSink>,
    whole_lines: bool,
    redactor: &crate::core::redact::Redactor,
    mut parser: P,
) -> Result<Received, ModelFailure> {
    let mut shown = Shown::new(sink, whole_lines, redactor);
    let (mut splitter, mut decoder) = (LineSplitter::new(), SseDecoder::new());
    let mut events: Vec<SseEvent> = Vec::new();
    let mut read: u64 = 0;
    let result = 'reading: loop {
        let piece = match response.body.chunk().await {
            Ok(Some(piece)) => piece,
            Ok(None) => break parser.finish(),
            Err(err) => break Err(read_failed(&err)),
        };
        let room = usize::try_from(MAX_STREAM.saturating_sub(read)).unwrap_or(usize::MAX);
        let piece = piece.get(..room).unwrap_or(&piece);
        read += piece.len() as u64;
        splitter.push(piece, |line| events.extend(decoder.line(line)));
        for event in events.drain(..) {
            match parser.event(&event, &mut |text| shown.text(text)) {
                Ok(true) => break 'reading parser.finish(),
                Ok(false) => {}
                Err(failure) => break 'reading Err(failure),
            }
        }
        if read >= MAX_STREAM {
            break parser.finish();
        }
    };
    shown.end();
    result
}

/// Awaits `work`, giving up when `probe` says the run was stopped (checked
/// every 20 ms by a timer, not a thread): cancelling or a deadline does not
/// wait for the HTTP timeouts. `None` when it gave up.
pub async fn until_stopped_async<T>(
    probe: Option<StopProbe>,
    work: impl Future<Output = T>,
) -> Option<T> {
    let Some(probe) = probe else {
        return Some(work.await);
    };
    let work = std::pin::pin!(work);
    let mut work = work;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = work.as_mut() => return Some(out),
            _ = tick.tick() => {
                if probe() {
                    return None;
                }
            }
        }
    }
}
