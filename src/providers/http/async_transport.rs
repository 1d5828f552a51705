//! The async HTTP boundary (feature `async`): the same small trait as the
//! blocking [`super::transport::Transport`], awaited, and its real
//! implementation on reqwest (tokio, hyper, rustls with ring and the
//! webpki roots — the TLS setup the blocking client has).
//!
//! What is decided about a response (retries, waits, error texts) is not
//! here: it is the HTTP layer's retry decisions, shared with the blocking client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::transport::{Timeouts, TransportError, TransportErrorKind};

/// The next piece of a body: `Ok(None)` at its end.
pub type ChunkFuture<'a> =
    Pin<Box<dyn Future<Output = std::io::Result<Option<Vec<u8>>>> + Send + 'a>>;

/// A response body read piece by piece as it arrives.
pub trait AsyncBody: Send {
    /// The next piece of the body, `Ok(None)` at its end.
    fn chunk(&mut self) -> ChunkFuture<'_>;
}

/// A response as the async client needs it: status, headers, and a body
/// to read (possibly a stream).
pub struct AsyncResponse {
    /// The HTTP status code.
    pub status: u16,
    /// Header names (lower-case) and values.
    pub headers: Vec<(String, String)>,
    /// The body, read as it arrives.
    pub body: Box<dyn AsyncBody>,
}

impl std::fmt::Debug for AsyncResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

/// What [`AsyncTransport::post`] returns.
pub type ResponseFuture<'a> =
    Pin<Box<dyn Future<Output = Result<AsyncResponse, TransportError>> + Send + 'a>>;

/// Sends one POST and returns the response, whatever its status. Dropping
/// the future abandons the request (the connection is closed).
pub trait AsyncTransport: Send + Sync {
    /// POSTs `body` to `url` with `headers`.
    fn post<'a>(
        &'a self,
        url: &'a str,
        headers: &'a [(&'a str, &'a str)],
        body: &'a [u8],
    ) -> ResponseFuture<'a>;
}

/// The real async transport: one reqwest client (so its connection pool is
/// shared by every request and every run that holds it), HTTP/1.1 over
/// rustls, redirects not followed (an API does not redirect a POST, and a
/// redirect must not carry the key elsewhere).
#[derive(Clone)]
pub(crate) struct ReqwestTransport {
    client: reqwest::Client,
    /// The first URL posted to, parsed once: a client's requests all go
    /// to its one endpoint (another URL is parsed each time).
    endpoint: Arc<std::sync::OnceLock<(String, reqwest::Url)>>,
}

impl std::fmt::Debug for ReqwestTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReqwestTransport")
    }
}

impl ReqwestTransport {
    /// A transport with these timeouts. It needs a tokio runtime to be
    /// awaited on, not to be made.
    pub fn new(timeouts: Timeouts) -> Result<Self, TransportError> {
        let other = |message: String| TransportError {
            kind: TransportErrorKind::Other,
            message,
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| other(format!("TLS setup failed: {err}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.read)
            .timeout(timeouts.overall)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("subloop/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| {
                other(format!(
                    "the HTTP client could not be made: {}",
                    describe(&err)
                ))
            })?;
        Ok(Self {
            client,
            endpoint: Arc::default(),
        })
    }
}

/// An error and its sources, one after the other, without the URL (which
/// may carry a password; the key never is in it).
fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// The causes of an error, the error first; an `io::Error`'s inner error
/// counts as its cause (its `source` skips it).
fn causes<'e>(
    err: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |err| {
        err.downcast_ref::<std::io::Error>()
            .and_then(|io| {
                io.get_ref()
                    .map(|inner| inner as &(dyn std::error::Error + 'static))
            })
            .or_else(|| err.source())
    })
}

/// Whether a TLS failure (a bad certificate, a failed handshake) is among
/// the causes: not worth retrying.
fn is_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    causes(err).any(|cause| cause.is::<rustls::Error>())
}

/// The kind of the first `io::Error` among the causes.
fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    causes(err).find_map(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
    })
}

/// A reqwest error as the shared retry decisions read it, as the blocking
/// transport does: a timeout before the request was sent is retried, one
/// after it is not (the server may still be working on it), a refused or
/// reset connection is retried, TLS and the rest are not.
fn classify(err: reqwest::Error) -> TransportError {
    let err = err.without_url();
    let message = describe(&err);
    let kind = if is_tls(&err) || err.is_builder() || err.is_redirect() {
        TransportErrorKind::Other
    } else if err.is_timeout() && err.is_connect() {
        TransportErrorKind::Timeout
    } else if err.is_timeout() {
        TransportErrorKind::ResponseTimeout
    } else if err.is_connect() {
        TransportErrorKind::Connection
    } else {
        match io_kind(&err) {
            Some(std::io::ErrorKind::TimedOut) => TransportErrorKind::ResponseTimeout,
            Some(
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof,
            ) => TransportErrorKind::Connection,
            // hyper's "connection closed before message completed" and the
            // like: the request went out on a connection that broke.
            _ if err.is_request() => TransportErrorKind::Connection,
            _ => TransportErrorKind::Other,
        }
    };
    TransportError { kind, message }
}

/// A body read error as the readers take it: a timeout stays one.
fn body_error(err: reqwest::Error) -> std::io::Error {
    let err = err.without_url();
    let kind = if err.is_timeout() {
        std::io::ErrorKind::TimedOut
    } else {
        io_kind(&err).unwrap_or(std::io::ErrorKind::ConnectionReset)
    };
    std::io::Error::new(kind, describe(&err))
}

struct ReqwestBody(reqwest::Response);

impl AsyncBody for ReqwestBody {
    fn chunk(&mut self) -> ChunkFuture<'_> {
        Box::pin(async move {
            match self.0.chunk().await {
                Ok(Some(piece)) => Ok(Some(piece.to_vec())),
                Ok(None) => {
                    // The body is whole: its connection goes back to the
                    // pool when its task runs next. Letting it run now
                    // keeps this run's next request (or a child's) from
                    // finding no idle connection and opening another.
                    tokio::task::yield_now().await;
                    Ok(None)
                }
                Err(err) => Err(body_error(err)),
            }
        })
    }
}

impl AsyncTransport for ReqwestTransport {
    fn post<'a>(
        &'a self,
        url: &'a str,
        headers: &'a [(&'a str, &'a str)],
        body: &'a [u8],
    ) -> ResponseFuture<'a> {
        Box::pin(async move {
            let endpoint = match self.endpoint.get() {
                Some(endpoint) => Some(endpoint),
                None => reqwest::Url::parse(url)
                    .ok()
                    .map(|parsed| self.endpoint.get_or_init(|| (url.to_owned(), parsed))),
            };
            let mut request = match endpoint.filter(|(text, _)| text == url) {
                Some((_, parsed)) => self.client.post(parsed.clone()),
                None => self.client.post(url),
            };
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let response = request.body(body.to_vec()).send().await.map_err(classify)?;
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
            Ok(AsyncResponse {
                status,
                headers,
                body: Box::new(ReqwestBody(response)),
            })
        })
    }
}
