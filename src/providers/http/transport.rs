//! The HTTP boundary: a small trait of our own in front of the HTTP crate,
//! so the providers' logic (request bodies, retries, SSE, errors) is tested on
//! a fake transport with no socket.

use std::io::Read;
use std::time::Duration;

use thiserror::Error;

/// A response as the client needs it: status, headers, and a body to read
/// (possibly a stream).
pub struct HttpResponse {
    /// The HTTP status code.
    pub status: u16,
    /// Header names (lower-case) and values.
    pub headers: Vec<(String, String)>,
    /// The body, read incrementally.
    pub body: Box<dyn Read + Send>,
}

impl std::fmt::Debug for HttpResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl HttpResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// What went wrong below HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// A timeout before the request was sent (resolving, connecting,
    /// sending): retried.
    Timeout,
    /// The request was sent, and its response did not come within the read
    /// or overall timeout: the server may still be working on it (a local
    /// model generating a long reply), so it is not sent again.
    ResponseTimeout,
    /// Connection refused, reset or closed early.
    Connection,
    /// Anything else (bad URL, TLS, ...): not retried.
    Other,
}

/// A request that got no HTTP response.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct TransportError {
    /// What kind of failure.
    pub kind: TransportErrorKind,
    /// A readable message (never holding the API key).
    pub message: String,
}

/// Sends one POST and returns the response, whatever its status.
pub trait Transport: Send + Sync {
    /// POSTs `body` to `url` with `headers`.
    fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, TransportError>;
}

/// Timeouts of the HTTP client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing the connection.
    pub connect: Duration,
    /// Waiting for each read of the response (a stalled server trips this).
    pub read: Duration,
    /// The whole request, from send to the end of the body.
    pub overall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(120),
            overall: Duration::from_secs(600),
        }
    }
}

/// The real transport: one `ureq` agent (so one pooled connection is reused
/// across the requests of a run), rustls for TLS, HTTP error statuses
/// returned as responses so error bodies and `retry-after` stay readable.
pub(crate) struct UreqTransport {
    agent: ureq::Agent,
}

impl std::fmt::Debug for UreqTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UreqTransport")
    }
}

impl UreqTransport {
    /// A transport with these timeouts.
    pub fn new(timeouts: Timeouts) -> Self {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeouts.connect))
            .timeout_per_read(Some(timeouts.read))
            .timeout_global(Some(timeouts.overall))
            .user_agent(concat!("subloop/", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            agent: ureq::Agent::new_with_config(config),
        }
    }
}

fn classify(err: ureq::Error) -> TransportError {
    let kind = match &err {
        ureq::Error::Timeout(
            ureq::Timeout::Resolve
            | ureq::Timeout::Connect
            | ureq::Timeout::SendRequest
            | ureq::Timeout::SendBody
            | ureq::Timeout::PerWrite,
        ) => TransportErrorKind::Timeout,
        ureq::Error::Timeout(_) => TransportErrorKind::ResponseTimeout,
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => TransportErrorKind::Connection,
        ureq::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                TransportErrorKind::Timeout
            }
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof => TransportErrorKind::Connection,
            _ => TransportErrorKind::Other,
        },
        ureq::Error::Protocol(_) => TransportErrorKind::Connection,
        _ => TransportErrorKind::Other,
    };
    TransportError {
        kind,
        message: err.to_string(),
    }
}

impl Transport for UreqTransport {
    fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, TransportError> {
        let mut request = self.agent.post(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send(body).map_err(classify)?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let reader = response
            .into_body()
            .into_with_config()
            .limit(u64::MAX)
            .reader();
        Ok(HttpResponse {
            status,
            headers,
            body: Box::new(IoReader(reader)),
        })
    }
}

/// Maps ureq's body errors (timeouts included) to `std::io::Error`s the SSE reader understands.
struct IoReader(ureq::BodyReader<'static>);

impl Read for IoReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}
