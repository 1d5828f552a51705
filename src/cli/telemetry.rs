//! `--otlp URL`: the library's spans sent to an OpenTelemetry collector
//! over OTLP/HTTP (protobuf), with the standard environment variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`; a W3C `TRACEPARENT`
//! makes the run part of the caller's trace). The spans are flushed before
//! the process exits, a cancelled run's and a `SIGTERM`'s included.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;

/// The environment variable that turns on message and tool content.
pub const CAPTURE_CONTENT: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// The tracer provider, for the flush at exit or on a terminating signal.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
/// Set once the main thread has flushed (the run is over).
static FLUSHED: AtomicBool = AtomicBool::new(false);

/// OTLP over the ureq client the Anthropic client already uses.
#[derive(Debug)]
struct Ureq(ureq::Agent);

#[async_trait::async_trait]
impl HttpClient for Ureq {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = request.map(|body| body.to_vec());
        let response = self.0.run(request)?;
        let (parts, mut body) = response.into_parts();
        let bytes = body.with_config().limit(1 << 20).read_to_vec()?;
        Ok(Response::from_parts(parts, Bytes::from(bytes)))
    }
}

/// Exporting is on while this lives; dropping it flushes the spans.
pub struct Export {
    _context: opentelemetry::ContextGuard,
}

impl Drop for Export {
    fn drop(&mut self) {
        flush();
        FLUSHED.store(true, Ordering::SeqCst);
    }
}

/// Sends every span still buffered and stops the exporter.
fn flush() {
    if let Some(provider) = PROVIDER.get() {
        let _ = provider.force_flush();
        let _ = provider.shutdown();
    }
}

/// Whether `name` is set to `true` (any case).
fn env_true(name: &str) -> bool {
    std::env::var(name).is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"))
}

/// Whether content is to be recorded (the standard opt-in variable).
pub fn capture_content() -> bool {
    env_true(CAPTURE_CONTENT)
}

/// The traces URL for a `--otlp` base URL: `/v1/traces` appended unless
/// the URL already names it.
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// Starts exporting when `--otlp` or an OTLP endpoint variable asks for it:
/// `Ok(None)` when neither does.
pub fn start(otlp: Option<&str>) -> Result<Option<Export>, String> {
    let from_env = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty()));
    if otlp.is_none() && !from_env {
        return Ok(None);
    }
    let config: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Ureq(config))
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
    if let Some(base) = otlp {
        exporter = exporter.with_endpoint(traces_url(base));
    }
    let exporter = exporter
        .build()
        .map_err(|err| format!("--otlp: cannot set up the OTLP exporter: {err}"))?;
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "subloop".to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    let tracer = provider.tracer("subloop");
    let _ = PROVIDER.set(provider);
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|err| format!("--otlp: cannot install the span exporter: {err}"))?;
    // A terminating signal ends the process from the signal thread: the
    // run finishes `cancelled` on the main thread meanwhile, which flushes
    // its spans; this waits for that (a few seconds at most) before the exit.
    let registration = crate::cli::signals::shutdown().on_termination(|_| {
        let until = Instant::now() + Duration::from_secs(3);
        while !FLUSHED.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        flush();
    });
    // Kept for the life of the process.
    std::mem::forget(registration);
    // TRACEPARENT: the run's root span is a child of the caller's span.
    let mut carrier = HashMap::new();
    if let Ok(parent) = std::env::var("TRACEPARENT") {
        carrier.insert("traceparent".to_owned(), parent);
    }
    if let Ok(state) = std::env::var("TRACESTATE") {
        carrier.insert("tracestate".to_owned(), state);
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    Ok(Some(Export {
        _context: context.attach(),
    }))
}
