//! The one send loop: a request as its [`Protocol`] writes it, sent under
//! the shared retry decisions ([`Attempts`]), and its reply read as the
//! protocol reads it. It is an `async fn` written once for both transports
//! ([`Wire`]): the async transport's futures wait; the blocking
//! transport's are complete when they are made, so a blocking client runs
//! the loop with [`block_on`](crate::run::driver::block_on) on its own
//! thread and it never parks.

use std::future::Future;
use std::io::{BufReader, Read};
use std::pin::Pin;
use std::time::Duration;

use super::protocol::Protocol;
use super::stream::{StreamParser, read_events};
use super::transport::{HttpResponse, Transport, TransportError};
use super::{
    Attempts, ErrorReader, MAX_BODY, MAX_ERROR_BODY, MAX_STREAM, Shown, TextSink, is_event_stream,
};
use crate::core::error::ModelFailure;
use crate::run::limits::StopSignal;
use crate::run::model::Received;

/// What a client calls with each wait between attempts instead of waiting
/// (tests record the delays).
pub(crate) type Sleeper = std::sync::Arc<dyn Fn(Duration) + Send + Sync>;

/// What a [`Wire`] hands back: complete when made for the blocking
/// transport, awaited for the async one.
pub(crate) type WireFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A transport as the send loop uses it: the blocking one
/// ([`Transport`], whose futures are complete when made) or the async one
/// (feature `async`).
pub(crate) trait Wire: Send + Sync {
    /// A response whose body is still to be read.
    type Response: Send;

    /// POSTs `body` to `url` with `headers`.
    fn send<'a>(
        &'a self,
        url: &'a str,
        headers: &'a [(&'a str, &'a str)],
        body: &'a [u8],
    ) -> WireFuture<'a, Result<Self::Response, TransportError>>;

    /// The status and headers of a response.
    fn head(response: &Self::Response) -> (u16, &[(String, String)]);

    /// Up to `cap` bytes of a body; what was read before an error is kept.
    fn read(
        response: &mut Self::Response,
        cap: u64,
    ) -> WireFuture<'_, (Vec<u8>, Option<std::io::Error>)>;

    /// Waits `delay` between attempts, or less when `stop` says the run
    /// stopped (a blocking wait is a timed wait on the signal; an async
    /// one is dropped with the request when the run stops).
    fn pause<'a>(delay: Duration, stop: Option<&'a StopSignal>) -> WireFuture<'a, ()>;

    /// Reads an event stream (at most [`MAX_STREAM`] bytes: past it the
    /// stream just ends) into a reply with `parser`, its text shown on `shown`.
    fn read_stream<'a, S: StreamParser + Send + 'a>(
        response: Self::Response,
        shown: &'a mut Shown<'_>,
        parser: S,
    ) -> WireFuture<'a, Result<Received, ModelFailure>>;
}

impl<'t> Wire for dyn Transport + 't {
    type Response = HttpResponse;

    fn send<'a>(
        &'a self,
        url: &'a str,
        headers: &'a [(&'a str, &'a str)],
        body: &'a [u8],
    ) -> WireFuture<'a, Result<HttpResponse, TransportError>> {
        Box::pin(std::future::ready(self.post(url, headers, body)))
    }

    fn head(response: &HttpResponse) -> (u16, &[(String, String)]) {
        (response.status, &response.headers)
    }

    fn read(
        response: &mut HttpResponse,
        cap: u64,
    ) -> WireFuture<'_, (Vec<u8>, Option<std::io::Error>)> {
        let mut bytes = Vec::new();
        let failed = (&mut response.body).take(cap).read_to_end(&mut bytes).err();
        Box::pin(std::future::ready((bytes, failed)))
    }

    fn pause<'a>(delay: Duration, stop: Option<&'a StopSignal>) -> WireFuture<'a, ()> {
        match stop {
            Some(stop) => {
                stop.sleep(delay);
            }
            None => std::thread::sleep(delay),
        }
        Box::pin(std::future::ready(()))
    }

    fn read_stream<'a, S: StreamParser + Send + 'a>(
        response: HttpResponse,
        shown: &'a mut Shown<'_>,
        parser: S,
    ) -> WireFuture<'a, Result<Received, ModelFailure>> {
        let mut input = BufReader::new(response.body.take(MAX_STREAM));
        let result = read_events(&mut input, parser, &mut |text| shown.text(text));
        if result.is_ok() {
            // The stream ended by its end event: the body's rest (the
            // chunked end) is read so the connection can be reused.
            super::transport::drain(&mut input);
        }
        Box::pin(std::future::ready(result))
    }
}

#[cfg(feature = "async")]
mod remote {
    use std::time::Duration;

    use super::super::async_transport::{AsyncBody, AsyncResponse, AsyncTransport};
    use super::super::sse::{LineSplitter, SseDecoder, SseEvent};
    use super::super::stream::{StreamParser, read_failed};
    use super::super::transport::TransportError;
    use super::super::{MAX_STREAM, Shown};
    use super::{Wire, WireFuture};
    use crate::core::error::ModelFailure;
    use crate::run::limits::StopSignal;
    use crate::run::model::Received;

    /// Reads what is left of a body whose content is complete, each piece
    /// waited for [`super::super::transport::DRAIN_WAIT`] at most, at most
    /// [`super::super::transport::DRAIN_CAP`] bytes (as the blocking
    /// client's drain does).
    async fn drain(body: &mut dyn AsyncBody) {
        use super::super::transport::{DRAIN_CAP, DRAIN_WAIT};
        let mut left = DRAIN_CAP;
        while left > 0 {
            match tokio::time::timeout(DRAIN_WAIT, body.chunk()).await {
                Ok(Ok(Some(piece))) => left = left.saturating_sub(piece.len() as u64),
                _ => return,
            }
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

    impl<'t> Wire for dyn AsyncTransport + 't {
        type Response = AsyncResponse;

        fn send<'a>(
            &'a self,
            url: &'a str,
            headers: &'a [(&'a str, &'a str)],
            body: &'a [u8],
        ) -> WireFuture<'a, Result<AsyncResponse, TransportError>> {
            self.post(url, headers, body)
        }

        fn head(response: &AsyncResponse) -> (u16, &[(String, String)]) {
            (response.status, &response.headers)
        }

        fn read(
            response: &mut AsyncResponse,
            cap: u64,
        ) -> WireFuture<'_, (Vec<u8>, Option<std::io::Error>)> {
            Box::pin(read_capped(response.body.as_mut(), cap))
        }

        fn pause<'a>(delay: Duration, _: Option<&'a StopSignal>) -> WireFuture<'a, ()> {
            Box::pin(tokio::time::sleep(delay))
        }

        /// The events are the ones the blocking reader would see, in the
        /// same order: the bytes are split into lines and events by the
        /// same sans-IO code, chunk by chunk.
        fn read_stream<'a, S: StreamParser + Send + 'a>(
            mut response: AsyncResponse,
            shown: &'a mut Shown<'_>,
            mut parser: S,
        ) -> WireFuture<'a, Result<Received, ModelFailure>> {
            Box::pin(async move {
                let (mut splitter, mut decoder) = (LineSplitter::new(), SseDecoder::new());
                let mut events: Vec<SseEvent> = Vec::new();
                let mut read: u64 = 0;
                loop {
                    let piece = match response.body.chunk().await {
                        Ok(Some(piece)) => piece,
                        Ok(None) => return parser.finish(),
                        Err(err) => return Err(read_failed(&err)),
                    };
                    let room =
                        usize::try_from(MAX_STREAM.saturating_sub(read)).unwrap_or(usize::MAX);
                    let piece = piece.get(..room).unwrap_or(&piece);
                    read += piece.len() as u64;
                    splitter.push(piece, |line| events.extend(decoder.line(line)));
                    for event in events.drain(..) {
                        if parser.event(&event, &mut |text| shown.text(text))? {
                            // The body's rest (its end) is read, each
                            // piece waited for a moment at most, so the
                            // connection goes back to the pool.
                            drain(&mut *response.body).await;
                            return parser.finish();
                        }
                    }
                    if read >= MAX_STREAM {
                        return parser.finish();
                    }
                }
            })
        }
    }
}

/// A successful (2xx) response.
enum Success<R> {
    /// A whole body, already read.
    Body(String),
    /// An event stream (`content-type: text/event-stream`), to be read as the protocol says.
    Stream(R),
}

/// What the send loop needs of a client: its transport, its retry
/// decisions and secrets, how it waits, where its streamed text goes.
pub(crate) struct Sending<'c, W: ?Sized> {
    /// The transport.
    pub wire: &'c W,
    /// The retry decisions and the secrets.
    pub attempts: &'c Attempts,
    /// Replaces the wait between attempts (tests record instead of waiting).
    pub sleeper: Option<&'c Sleeper>,
    /// Where streamed text is shown.
    pub sink: Option<&'c TextSink>,
}

impl<W: Wire + ?Sized> Sending<'_, W> {
    /// POSTs `body` to `url`, retrying what is worth retrying (see
    /// [`super::retry`] and [`Attempts`]); no retry starts once `stop`
    /// says the run was stopped. A 2xx body is read inside the loop, so a
    /// timeout or a reset while reading it is retried like one before the
    /// headers; an event stream is handed back unread.
    async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        stop: Option<&StopSignal>,
        read_error: ErrorReader<'_>,
    ) -> Result<Success<W::Response>, ModelFailure> {
        let attempts = self.attempts;
        let mut retry = 0;
        loop {
            let delay = match self.wire.send(url, headers, body).await {
                Ok(mut response) => {
                    let (status, head) = W::head(&response);
                    if (200..300).contains(&status) {
                        if is_event_stream(head) {
                            return Ok(Success::Stream(response));
                        }
                        match W::read(&mut response, MAX_BODY).await {
                            (bytes, None) => {
                                return Ok(Success::Body(
                                    String::from_utf8_lossy(&bytes).into_owned(),
                                ));
                            }
                            (_, Some(err)) => attempts.body_failed(retry, &err),
                        }
                    } else {
                        let (bytes, _) = W::read(&mut response, MAX_ERROR_BODY).await;
                        let text = String::from_utf8_lossy(&bytes);
                        let (status, head) = W::head(&response);
                        attempts.status_failed(retry, status, head, &text, read_error)
                    }
                }
                Err(err) => attempts.transport_failed(retry, &err),
            };
            // A stop shuts the request's socket down: what failed then is
            // the stop, and no retry starts after one.
            if stop.is_some_and(StopSignal::is_stopped) {
                return Err(attempts.abandoned());
            }
            let delay = delay?;
            match self.sleeper {
                Some(record) => record(delay),
                None => W::pause(delay, stop).await,
            }
            retry += 1;
        }
    }

    /// Sends a serialized request body as `protocol` says and reads its
    /// reply: a whole body through [`Protocol::reply`], an event stream
    /// through the protocol's parser, its text shown on the sink (by whole
    /// lines with `whole_lines`). When the request fails and the protocol
    /// has another body for it ([`Protocol::resend`]), that body is sent
    /// once. Every reply and failure has the secrets scrubbed.
    pub async fn request<P: Protocol>(
        &self,
        protocol: &P,
        state: &P::State,
        body: &[u8],
        stop: Option<&StopSignal>,
        whole_lines: bool,
    ) -> Result<Received, ModelFailure> {
        let url = protocol.url();
        let exchange = protocol.exchange(state);
        let headers = protocol.headers(&exchange);
        let read_error = |status: u16, text: &str| protocol.read_error(&exchange, status, text);
        let success = match self.post(&url, &headers, body, stop, &read_error).await {
            Ok(success) => success,
            Err(failure) if stop.is_some_and(StopSignal::is_stopped) => return Err(failure),
            Err(failure) => {
                let Some(body) = protocol.resend(&exchange, body) else {
                    return Err(failure);
                };
                let success = self.post(&url, &headers, &body, stop, &read_error).await?;
                protocol.resent(state, &exchange);
                success
            }
        };
        let attempts = self.attempts;
        match success {
            Success::Body(text) => {
                let value = attempts.json_body(&text)?;
                match protocol.reply(&value) {
                    Ok(response) => Ok(attempts.received(Received {
                        response,
                        raw: Some(value),
                    })),
                    Err((kind, message)) => Err(attempts.fail(kind, message)),
                }
            }
            Success::Stream(response) => {
                let mut shown = Shown::new(self.sink, whole_lines, attempts.redactor());
                let result = W::read_stream(response, &mut shown, protocol.stream()).await;
                shown.end();
                if result.is_err() && stop.is_some_and(StopSignal::is_stopped) {
                    return Err(attempts.abandoned());
                }
                attempts.streamed(result)
            }
        }
    }
}
