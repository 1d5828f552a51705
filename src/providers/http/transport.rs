//! The HTTP boundary: a small trait of our own in front of the HTTP crate,
//! so the providers' logic (request bodies, retries, SSE, errors) is tested on
//! a fake transport with no socket.

use std::cell::RefCell;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use thiserror::Error;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, DefaultConnector, NextTimeout, ShutdownHandle,
};

use crate::run::limits::{OnStop, StopSignal};

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

/// The real transport: one `ureq` agent (so pooled connections are reused
/// across the requests of a run and of every run holding the client),
/// rustls for TLS, HTTP error statuses returned as responses so error
/// bodies and `retry-after` stay readable.
///
/// A request is sent on the caller's thread. Inside a [`stop_scope`] every
/// connection it uses is armed with the run's stop: a stop shuts its
/// socket down, which wakes a read or a write blocked on it at once, and
/// the run's deadline bounds the request's timeout. Nothing polls.
pub(crate) struct UreqTransport {
    agent: ureq::Agent,
}

/// Idle connections the blocking pool keeps, in all and per host: as many
/// as runs are likely to have requests in flight at once, so that a
/// connection is opened again only when more runs than this send at once.
const IDLE_CONNECTIONS: usize = 4096;

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
            .max_idle_connections(IDLE_CONNECTIONS)
            .max_idle_connections_per_host(IDLE_CONNECTIONS)
            .build();
        Self {
            agent: ureq::Agent::with_parts(
                config,
                Watched(DefaultConnector::new()),
                Resolve::default(),
            ),
        }
    }
}

/// How long a host's addresses are used before it is looked up again.
const ADDRESSES_KEPT: Duration = Duration::from_secs(60);

/// ureq looks a host up for every request, on a thread of its own when
/// the request has a timeout. This resolver needs no lookup for an IP
/// address, and keeps a host's addresses for [`ADDRESSES_KEPT`]: a
/// lookup (and its thread) per host a minute, not per request.
#[derive(Debug, Default)]
struct Resolve {
    lookup: DefaultResolver,
    kept: Mutex<Vec<(String, Instant, ResolvedSocketAddrs)>>,
}

impl Resolver for Resolve {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let Some(authority) = uri.authority() else {
            return self.lookup.resolve(uri, config, timeout);
        };
        let port = authority.port_u16().or(match uri.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        });
        let host = authority.host();
        let literal = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>();
        if let (Ok(ip), Some(port)) = (literal, port) {
            let mut addresses = self.empty();
            addresses.push(std::net::SocketAddr::new(ip, port));
            return Ok(addresses);
        }
        let key = authority.as_str();
        let now = Instant::now();
        {
            let kept = self
                .kept
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            if let Some((_, _, addresses)) = kept
                .iter()
                .find(|(host, at, _)| host == key && now.duration_since(*at) < ADDRESSES_KEPT)
            {
                return Ok(addresses.clone());
            }
        }
        let addresses = self.lookup.resolve(uri, config, timeout)?;
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        kept.retain(|(host, at, _)| host != key && now.duration_since(*at) < ADDRESSES_KEPT);
        kept.push((key.to_owned(), now, addresses.clone()));
        Ok(addresses)
    }
}

/// The request this thread is sending on behalf of a run that can stop.
struct Scope {
    /// Tells one request from the next (a pooled connection is armed once per request).
    id: u64,
    deadline: Option<Instant>,
    sockets: Mutex<Sockets>,
}

#[derive(Default)]
struct Sockets {
    stopped: bool,
    armed: Vec<Weak<dyn ShutdownHandle>>,
}

impl Scope {
    fn sockets(&self) -> std::sync::MutexGuard<'_, Sockets> {
        self.sockets
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The run stopped: every socket the request uses is shut down, and
    /// so is any it arms later.
    fn stop(&self) {
        let mut sockets = self.sockets();
        sockets.stopped = true;
        for socket in sockets.armed.drain(..) {
            if let Some(socket) = socket.upgrade() {
                socket.shutdown();
            }
        }
    }

    fn arm(&self, socket: &Weak<dyn ShutdownHandle>) {
        let mut sockets = self.sockets();
        if sockets.stopped {
            if let Some(socket) = socket.upgrade() {
                socket.shutdown();
            }
        } else {
            sockets.armed.push(Weak::clone(socket));
        }
    }
}

thread_local! {
    static SCOPE: RefCell<Option<Arc<Scope>>> = const { RefCell::new(None) };
    /// Set while [`drain`] reads what is left of a body on this thread.
    static DRAINING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How long [`drain`] waits for each read of a body's rest.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_millis(50);

/// The most of a body's rest [`drain`] reads.
pub(crate) const DRAIN_CAP: u64 = 64 * 1024;

/// Reads what is left of a body whose content is complete (an event
/// stream after its end event), so that its connection goes back to the
/// pool: the end of a chunked body comes right after the last event. Each
/// read waits at most [`DRAIN_WAIT`], and at most [`DRAIN_CAP`] bytes are
/// read; a server that holds the body open costs that wait once, and its
/// connection is closed rather than kept.
pub(crate) fn drain(body: &mut impl Read) {
    DRAINING.with(|draining| draining.set(true));
    let _ = std::io::copy(&mut body.take(DRAIN_CAP), &mut std::io::sink());
    DRAINING.with(|draining| draining.set(false));
}

/// `timeout`, cut to [`DRAIN_WAIT`] while this thread drains a body.
fn while_draining(timeout: NextTimeout) -> NextTimeout {
    if DRAINING.with(std::cell::Cell::get) {
        let wait = ureq::unversioned::transport::time::Duration::from(DRAIN_WAIT);
        NextTimeout {
            after: timeout.after.min(wait),
            ..timeout
        }
    } else {
        timeout
    }
}

/// While it lives, the blocking requests this thread sends are stopped
/// by `signal` (see [`UreqTransport`]); dropping it ends that.
pub(crate) struct StopScope {
    previous: Option<Arc<Scope>>,
    _registration: OnStop,
}

/// Sends this thread's blocking requests under `signal` until the
/// returned scope is dropped.
pub(crate) fn stop_scope(signal: &StopSignal) -> StopScope {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let scope = Arc::new(Scope {
        id: NEXT.fetch_add(1, Ordering::Relaxed),
        deadline: signal.deadline(),
        sockets: Mutex::default(),
    });
    let stopped = Arc::downgrade(&scope);
    let registration = signal.on_stop(move || {
        if let Some(scope) = stopped.upgrade() {
            scope.stop();
        }
    });
    let previous = SCOPE.with(|current| current.replace(Some(scope)));
    StopScope {
        previous,
        _registration: registration,
    }
}

impl Drop for StopScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        SCOPE.with(|current| *current.borrow_mut() = previous);
    }
}

/// The deadline of this thread's current request, if it has one.
fn scope_deadline() -> Option<Instant> {
    SCOPE.with(|current| current.borrow().as_ref().and_then(|scope| scope.deadline))
}

/// What ureq calls with the shutdown handle of each socket it opens.
type Register = dyn Fn(Weak<dyn ShutdownHandle>) -> Result<(), ureq::Error> + Send + Sync;

/// ureq's connectors, each connection they make wrapped so that it arms
/// itself with the stop of the request using it.
#[derive(Debug)]
struct Watched(DefaultConnector);

impl Connector<()> for Watched {
    type Out = Box<dyn ureq::unversioned::transport::Transport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<()>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let caught: Arc<Mutex<Option<Weak<dyn ShutdownHandle>>>> = Arc::default();
        let forward = Arc::clone(&details.register_shutdown);
        let into = Arc::clone(&caught);
        let register: Arc<Register> = Arc::new(move |socket: Weak<dyn ShutdownHandle>| {
            // Armed at once: a stop during the TLS handshake shuts it too.
            SCOPE.with(|current| {
                if let Some(scope) = current.borrow().as_ref() {
                    scope.arm(&socket);
                }
            });
            into.lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .get_or_insert_with(|| Weak::clone(&socket));
            forward(socket)
        });
        let mine = ConnectionDetails {
            uri: details.uri,
            addrs: details.addrs.clone(),
            config: details.config,
            request_level: details.request_level,
            resolver: details.resolver,
            now: details.now,
            timeout: details.timeout,
            current_time: Arc::clone(&details.current_time),
            run_connector: Arc::clone(&details.run_connector),
            register_shutdown: register,
        };
        let Some(inner) = self.0.connect(&mine, chained)? else {
            return Ok(None);
        };
        let socket = caught
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        let armed_for = SCOPE.with(|current| current.borrow().as_ref().map_or(0, |scope| scope.id));
        Ok(Some(Box::new(Armed {
            inner,
            socket,
            armed_for,
        })))
    }
}

/// A connection that arms itself with the stop of each request using it.
struct Armed {
    inner: Box<dyn ureq::unversioned::transport::Transport>,
    socket: Option<Weak<dyn ShutdownHandle>>,
    /// The request it was last armed for (0: none).
    armed_for: u64,
}

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed")
            .field("armed_for", &self.armed_for)
            .finish_non_exhaustive()
    }
}

impl Armed {
    fn arm(&mut self) {
        let Some(socket) = &self.socket else { return };
        SCOPE.with(|current| {
            if let Some(scope) = current.borrow().as_ref()
                && scope.id != self.armed_for
            {
                self.armed_for = scope.id;
                scope.arm(socket);
            }
        });
    }
}

impl ureq::unversioned::transport::Transport for Armed {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.arm();
        self.inner.transmit_output(amount, timeout)
    }

    fn maybe_await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.arm();
        self.inner.maybe_await_input(while_draining(timeout))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.arm();
        self.inner.await_input(while_draining(timeout))
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
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
        // The run's deadline bounds the request: past it the request ends
        // as timed out, and the send loop sees the run stopped.
        if let Some(deadline) = scope_deadline() {
            let left = deadline.saturating_duration_since(Instant::now());
            let overall = self.agent.config().timeouts().global;
            let bound = overall.map_or(left, |overall| overall.min(left));
            request = request
                .config()
                .timeout_global(Some(bound.max(Duration::from_millis(1))))
                .build();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(resolver: &Resolve, url: &str) -> Vec<std::net::SocketAddr> {
        let uri: ureq::http::Uri = url.parse().expect("uri");
        let config = ureq::config::Config::default();
        let timeout = NextTimeout {
            after: ureq::unversioned::transport::time::Duration::from_secs(5),
            reason: ureq::Timeout::Resolve,
            ..NextTimeout::default()
        };
        resolver
            .resolve(&uri, &config, timeout)
            .expect("resolved")
            .iter()
            .copied()
            .collect()
    }

    /// An IP address is its own answer; a host name is looked up once and
    /// then kept (no lookup, and no lookup thread, per request).
    #[test]
    fn addresses_need_no_lookup_and_names_are_kept() {
        let resolver = Resolve::default();
        assert_eq!(
            resolve(&resolver, "http://127.0.0.1:8080/v1"),
            ["127.0.0.1:8080"
                .parse::<std::net::SocketAddr>()
                .expect("addr")]
        );
        assert_eq!(
            resolve(&resolver, "https://[::1]/v1"),
            ["[::1]:443".parse::<std::net::SocketAddr>().expect("addr")]
        );
        assert!(resolver.kept.lock().expect("lock").is_empty());
        let first = resolve(&resolver, "http://localhost:9/x");
        assert!(!first.is_empty());
        assert_eq!(resolver.kept.lock().expect("lock").len(), 1);
        assert_eq!(resolve(&resolver, "http://localhost:9/y"), first);
        assert_eq!(resolver.kept.lock().expect("lock").len(), 1);
    }
}
