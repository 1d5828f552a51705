//! The concurrency bench (`examples/concurrent.rs`) on a small scale: its
//! loopback server and harness, in this process, with a 10 ms delay, 20
//! blocking runs and 50 async ones at once. Every run ends with the demo's
//! answer and the server answers exactly 7 model requests per run, also
//! when it refuses every third request with a 429.

#[path = "../../examples/bench/bare.rs"]
mod bare;
#[path = "../../examples/bench/harness.rs"]
mod harness;
#[path = "../../examples/bench/server.rs"]
mod server;

use std::io::{Read, Write};
use std::time::Duration;

use harness::{Figures, Mode, Options, Provider};

fn bench(mode: Mode, provider: Provider, runs: usize, status_429_every: u64) -> Figures {
    let options = Options {
        mode,
        provider,
        runs,
        delay: Duration::from_millis(10),
        status_429_every,
        bare: Some(bare::measure),
        ..Options::default()
    };
    harness::run(&options).expect("the bench runs")
}

fn assert_all_answered(figures: &Figures) {
    let runs = figures.runs as u64;
    let server = figures.server.expect("the in-process server's counters");
    assert_eq!(
        (figures.ok, figures.failed_total()),
        (figures.runs, 0),
        "{:#?}",
        figures.lines()
    );
    assert_eq!(
        server.answered,
        runs * u64::from(harness::CHAIN),
        "{:#?}",
        figures.lines()
    );
    assert_eq!(server.received, server.answered + server.throttled);
    assert_eq!((server.stalled, server.bad), (0, 0));
    // The client counted the same requests (the server's 429s are retries
    // of them), and the bare client sent one run's requests for every run
    // (it does not retry: a 429 is a failure).
    assert_eq!(figures.requests, server.answered);
    let bare = figures.bare.as_ref().expect("the bare client's floor");
    assert_eq!(bare.requests, server.answered);
    if server.throttled == 0 {
        assert_eq!(bare.failed, 0);
    }
    assert!(figures.wall >= figures.floor(), "{:#?}", figures.lines());
}

#[test]
fn blocking_runs_all_answer_with_seven_requests_each() {
    let figures = bench(Mode::Blocking, Provider::Anthropic, 20, 0);
    assert_all_answered(&figures);
    assert_eq!(figures.server.map(|server| server.throttled), Some(0));
}

#[test]
fn blocking_runs_on_the_openai_api_all_answer() {
    assert_all_answered(&bench(Mode::Blocking, Provider::OpenAi, 20, 0));
}

/// (The process's thread count is not asserted: the tests of this binary
/// run side by side.)
#[test]
fn async_runs_all_answer() {
    for provider in [Provider::Anthropic, Provider::OpenAi] {
        assert_all_answered(&bench(Mode::Async, provider, 50, 0));
    }
}

#[test]
fn refused_requests_are_retried_and_every_run_still_answers() {
    for (mode, runs, provider) in [
        (Mode::Blocking, 20, Provider::Anthropic),
        (Mode::Blocking, 20, Provider::OpenAi),
        (Mode::Async, 50, Provider::Anthropic),
        (Mode::Async, 50, Provider::OpenAi),
    ] {
        let figures = bench(mode, provider, runs, 3);
        assert_all_answered(&figures);
        assert!(
            figures
                .server
                .is_some_and(|server| server.throttled >= server.received / 3),
            "{:#?}",
            figures.lines()
        );
    }
}

/// Sends raw bytes and reads the reply up to its end (the server closes
/// the connection after a request it cannot read).
fn exchange(url: &str, bytes: &[u8]) -> String {
    let address = url.strip_prefix("http://").expect("an http URL");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.write_all(bytes).expect("send");
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply
}

#[test]
fn the_server_answers_bad_requests_with_400_and_keeps_serving() {
    let running = server::Running::start(server::Options::default(), 1).expect("server");
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    for (request, status, kind) in [
        (
            "NONSENSE\r\n\r\n".to_owned(),
            "400",
            "invalid_request_error",
        ),
        (
            "POST /v1/messages HTTP/1.1\r\ncontent-length: x\r\n\r\n".to_owned(),
            "400",
            "invalid_request_error",
        ),
        (
            post("/v1/messages", "{not json"),
            "400",
            "invalid_request_error",
        ),
        (
            post("/v1/messages", r#"{"messages": 3}"#),
            "400",
            "invalid_request_error",
        ),
        (
            post("/v1/messages", r#"{"messages": []}"#),
            "400",
            "invalid_request_error",
        ),
        (
            post(
                "/v1/chat/completions",
                r#"{"messages": [{"role": "robot"}]}"#,
            ),
            "400",
            "invalid_request_error",
        ),
        (
            post(
                "/v1/chat/completions",
                r#"{"messages": [{"role": "tool", "content": "x"}]}"#,
            ),
            "400",
            "invalid_request_error",
        ),
        (post("/elsewhere", "{}"), "404", "not_found_error"),
    ] {
        let reply = exchange(&running.url, request.as_bytes());
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status} ")) && reply.contains(kind),
            "{request:?} got {reply:?}"
        );
    }
    // A chunked body is read.
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}"#;
    let (first, second) = body.split_at(10);
    let chunked = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
        first.len(),
        second.len()
    );
    let reply = exchange(&running.url, chunked.as_bytes());
    assert!(
        reply.starts_with("HTTP/1.1 200 ") && reply.contains(r#""name":"task""#),
        "{reply:?}"
    );
    let stats = running.stats.snapshot();
    assert_eq!((stats.answered, stats.bad), (1, 8), "{stats:?}");
}
