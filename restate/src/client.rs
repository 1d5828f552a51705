//! Talking to a Restate server over HTTP: register a worker, submit a run
//! (or attach to the one with that id), wait for its result, answer its
//! approvals. Blocking calls (`ureq`), for a CLI or a test.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{Answer, Pending, RunRequest, RunResult};

/// What went wrong talking to the Restate server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server could not be reached (down, wrong address).
    #[error("the Restate server at {url} cannot be reached: {reason}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("the Restate server answered {status} to {url}: {body}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What it said.
        body: String,
    },
    /// The server's answer does not read.
    #[error("the Restate server's answer to {url} does not read: {reason}")]
    Answer {
        /// The URL asked.
        url: String,
        /// Why.
        reason: String,
    },
}

fn agent(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(timeout)
        .timeout_connect(Some(Duration::from_secs(5)))
        .build()
        .into()
}

/// How a request is sent.
enum Body {
    /// A `GET`.
    Get,
    /// A `POST` without a body.
    Empty,
    /// A `POST` of JSON.
    Json(serde_json::Value),
}

fn call<T: DeserializeOwned>(
    url: &str,
    body: Body,
    timeout: Option<Duration>,
) -> Result<T, ClientError> {
    let agent = agent(timeout);
    let answer = match body {
        Body::Json(body) => agent
            .post(url)
            .header("accept", "application/json")
            .send_json(body),
        Body::Empty => agent.post(url).send_empty(),
        Body::Get => agent.get(url).call(),
    };
    let mut answer = answer.map_err(|error| ClientError::Unreachable {
        url: url.to_owned(),
        reason: error.to_string(),
    })?;
    let status = answer.status().as_u16();
    let text = answer
        .body_mut()
        .read_to_string()
        .map_err(|error| ClientError::Answer {
            url: url.to_owned(),
            reason: error.to_string(),
        })?;
    if !(200..300).contains(&status) {
        return Err(ClientError::Status {
            url: url.to_owned(),
            status,
            body: text.trim().chars().take(2000).collect(),
        });
    }
    let text = if text.trim().is_empty() {
        "null"
    } else {
        &text
    };
    serde_json::from_str(text).map_err(|error| ClientError::Answer {
        url: url.to_owned(),
        reason: error.to_string(),
    })
}

fn trim(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// Registers the worker at `worker_uri` with the server's admin API at
/// `admin`. Registering the same URI again is a no-op, so a restarted
/// worker (or a second one behind the same URI) registers without error.
pub fn register(admin: &str, worker_uri: &str) -> Result<(), ClientError> {
    let url = format!("{}/deployments", trim(admin));
    call::<serde_json::Value>(
        &url,
        Body::Json(json!({"uri": worker_uri, "force": false})),
        Some(Duration::from_secs(60)),
    )
    .map(|_| ())
}

/// Starts run `id` with `request`, or finds the run with that id: a
/// client that retries gets the same run, not a second one.
pub fn submit(ingress: &str, id: &str, request: &RunRequest) -> Result<(), ClientError> {
    let url = format!("{}/DurableRun/{}/run/send", trim(ingress), encode(id));
    let body = serde_json::to_value(request).map_err(|error| ClientError::Answer {
        url: url.clone(),
        reason: error.to_string(),
    })?;
    call::<serde_json::Value>(&url, Body::Json(body), Some(Duration::from_secs(60))).map(|_| ())
}

/// Waits for run `id` to end and gives its result.
pub fn attach(ingress: &str, id: &str) -> Result<RunResult, ClientError> {
    let url = format!(
        "{}/restate/workflow/DurableRun/{}/attach",
        trim(ingress),
        encode(id)
    );
    call(&url, Body::Get, None)
}

/// The approvals run `id` waits for.
pub fn pending(ingress: &str, id: &str) -> Result<Vec<Pending>, ClientError> {
    let url = format!("{}/DurableRun/{}/pending", trim(ingress), encode(id));
    call(&url, Body::Empty, Some(Duration::from_secs(60)))
}

/// Answers the approval of `call` in run `id`: `allow` runs the call,
/// `deny` answers the model `not executed: permission denied`.
pub fn approve(ingress: &str, id: &str, call_id: &str, allow: bool) -> Result<(), ClientError> {
    let url = format!("{}/DurableRun/{}/approve", trim(ingress), encode(id));
    let answer = Answer {
        call: call_id.to_owned(),
        decision: if allow { "allow" } else { "deny" }.to_owned(),
    };
    let body = serde_json::to_value(answer).map_err(|error| ClientError::Answer {
        url: url.clone(),
        reason: error.to_string(),
    })?;
    call::<serde_json::Value>(&url, Body::Json(body), Some(Duration::from_secs(60))).map(|_| ())
}

/// Run `id`'s invocation as the server's admin API at `admin` records it
/// (`sys_invocation`): its status (`running`, `suspended`, `backing-off`,
/// `completed`, …) and why its last attempt failed, if one did; `None`
/// when there is no such run.
pub fn invocation(admin: &str, id: &str) -> Result<Option<(String, Option<String>)>, ClientError> {
    let url = format!("{}/query", trim(admin));
    let key = id.replace('\'', "''");
    let query = format!(
        "SELECT status, last_failure FROM sys_invocation WHERE target_service_name = 'DurableRun' \
         AND target_service_key = '{key}' AND target_handler_name = 'run'"
    );
    let answer: serde_json::Value = call(
        &url,
        Body::Json(json!({ "query": query })),
        Some(Duration::from_secs(30)),
    )?;
    Ok(answer["rows"]
        .as_array()
        .and_then(|rows| rows.first())
        .map(|row| {
            (
                row["status"].as_str().unwrap_or_default().to_owned(),
                row["last_failure"].as_str().map(str::to_owned),
            )
        }))
}

/// `text` as one URL path segment.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
