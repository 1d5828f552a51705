//! The bare HTTP clients the concurrency bench measures its floor with:
//! the same bytes posted to the same server, one request after another
//! per run, as many runs at once, and nothing else (no parsing, no
//! retries, no loop). `async`: one reqwest client on a tokio runtime with
//! the runs' worker threads. `blocking`: one ureq agent, a thread per run.

use std::sync::Arc;

use super::harness::{BareRequests, Mode, Options};

/// See [`super::harness::BareClient`].
pub fn measure(url: &str, bodies: &[Vec<u8>], options: &Options) -> Result<BareRequests, String> {
    match options.mode {
        Mode::Async => with_reqwest(url, bodies, options),
        Mode::Blocking => Ok(with_ureq(url, bodies, options.runs)),
    }
}

fn with_reqwest(url: &str, bodies: &[Vec<u8>], options: &Options) -> Result<BareRequests, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads.max(1))
        .enable_all()
        .build()
        .map_err(|err| format!("the bare client's runtime: {err}"))?;
    // The TLS provider the library's client uses (the server is http://).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .http1_only()
        .build()
        .map_err(|err| format!("the bare client: {err}"))?;
    let (url, bodies, runs) = (url.to_owned(), Arc::new(bodies.to_vec()), options.runs);
    Ok(Box::new(move || {
        runtime.block_on(async {
            let tasks: Vec<_> = (0..runs)
                .map(|_| {
                    let (client, bodies, url) = (client.clone(), Arc::clone(&bodies), url.clone());
                    tokio::spawn(async move {
                        let mut failed = 0u64;
                        for body in bodies.iter() {
                            let sent = client
                                .post(&url)
                                .header("content-type", "application/json")
                                .body(body.clone())
                                .send()
                                .await;
                            let ok = match sent {
                                Ok(response) if response.status().is_success() => {
                                    response.bytes().await.is_ok()
                                }
                                _ => false,
                            };
                            failed += u64::from(!ok);
                        }
                        failed
                    })
                })
                .collect();
            let mut failed = 0;
            for task in tasks {
                failed += task.await.unwrap_or(1);
            }
            Ok(failed)
        })
    }))
}

fn with_ureq(url: &str, bodies: &[Vec<u8>], runs: usize) -> BareRequests {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(4096)
        .max_idle_connections_per_host(4096)
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let (url, bodies) = (url.to_owned(), Arc::new(bodies.to_vec()));
    Box::new(move || Ok(requests(&agent, &url, &bodies, runs)))
}

fn requests(agent: &ureq::Agent, url: &str, bodies: &Arc<Vec<Vec<u8>>>, runs: usize) -> u64 {
    let handles: Vec<_> = (0..runs)
        .map(|_| {
            let (agent, bodies, url) = (agent.clone(), Arc::clone(bodies), url.to_owned());
            std::thread::spawn(move || {
                let mut failed = 0;
                for body in bodies.iter() {
                    let ok = agent
                        .post(&url)
                        .header("content-type", "application/json")
                        .send(&body[..])
                        .ok()
                        .filter(|response| response.status().is_success())
                        .and_then(|mut response| response.body_mut().read_to_vec().ok());
                    failed += u64::from(ok.is_none());
                }
                failed
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|handle| handle.join().unwrap_or(bodies.len() as u64))
        .sum()
}
