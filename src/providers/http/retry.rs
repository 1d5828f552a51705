//! When and how long to retry, as the official SDKs do: 408, 409, 429 and
//! 5xx (529 "overloaded" included), connection failures and timeouts are
//! retried with exponential backoff and jitter, about `min(0.5 · 2^n, 8)` s,
//! unless the server says otherwise with `retry-after-ms`, `retry-after`
//! (seconds or an HTTP date, honoured when more than 0 and at most 60 s) or `x-should-retry`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How many times, and how long to wait.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 2).
    pub max_retries: u32,
    /// The first backoff (0.5 s).
    pub initial: Duration,
    /// The longest backoff (8 s).
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 2,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// This policy with `retries` retries after the first attempt.
    #[must_use]
    pub fn with_max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// This policy with backoffs from `initial`, doubling, up to `max`.
    #[must_use]
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial = initial;
        self.max = max;
        self
    }
}

/// Whether a status is worth retrying, absent an `x-should-retry` header.
pub(crate) fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// The server's explicit say: `x-should-retry: true|false`.
pub(crate) fn should_retry_header(value: Option<&str>) -> Option<bool> {
    match value.map(str::trim) {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => None,
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based), from the headers if
    /// they name a usable delay, else exponential backoff with jitter in
    /// `[0.75, 1.0]` of the nominal delay.
    pub fn delay(
        &self,
        retry: u32,
        retry_after_ms: Option<&str>,
        retry_after: Option<&str>,
        now: SystemTime,
    ) -> Duration {
        if let Some(delay) = server_delay(retry_after_ms, retry_after, now) {
            return delay;
        }
        let nominal = self.initial.as_secs_f64() * 2f64.powi(retry.min(30) as i32);
        let capped = nominal.min(self.max.as_secs_f64());
        Duration::from_secs_f64(capped * (1.0 - 0.25 * jitter()))
    }
}

/// A delay the server asked for, when it is more than 0 and at most 60 s
/// (as the official SDKs do; anything else falls back to backoff).
pub(crate) fn server_delay(
    retry_after_ms: Option<&str>,
    retry_after: Option<&str>,
    now: SystemTime,
) -> Option<Duration> {
    let usable = |secs: f64| {
        (secs.is_finite() && secs > 0.0 && secs <= 60.0).then(|| Duration::from_secs_f64(secs))
    };
    if let Some(delay) = retry_after_ms
        .and_then(|text| text.trim().parse::<f64>().ok())
        .and_then(|ms| usable(ms / 1000.0))
    {
        return Some(delay);
    }
    let text = retry_after?.trim();
    match text.parse::<f64>() {
        Ok(secs) => usable(secs),
        Err(_) => {
            let at = parse_http_date(text)?;
            usable(at.duration_since(now).ok()?.as_secs_f64())
        }
    }
}

/// A number in `[0, 1)` from the clock's nanoseconds: enough spread for
/// jitter without a random-number crate.
fn jitter() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut x = u64::from(nanos) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    (x % 10_000) as f64 / 10_000.0
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub(crate) fn parse_http_date(text: &str) -> Option<SystemTime> {
    let mut parts = text.split_whitespace();
    let _weekday = parts.next()?;
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    if !(1970..=9999).contains(&year) {
        return None;
    }
    let mut clock = parts.next()?.split(':').map(|n| n.parse::<u64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if parts.next()? != "GMT" || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day as i64);
    let secs = u64::try_from(days).ok()? * 86_400 + hour * 3600 + minute * 60 + second;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = if year >= 0 { year } else { year - 399 } / 400;
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_date_parses_to_the_right_instant() {
        let at = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT")
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        assert_eq!(at, Some(Duration::from_secs(784_111_777)));
        assert_eq!(parse_http_date("yesterday"), None);
    }

    #[test]
    fn server_delays_are_honoured_only_within_a_minute() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770);
        assert_eq!(
            server_delay(Some("250"), None, now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            server_delay(None, Some("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(server_delay(None, Some("61"), now), None);
        assert_eq!(server_delay(None, Some("-1"), now), None);
        assert_eq!(
            server_delay(None, Some("0"), now),
            None,
            "0 falls back to backoff"
        );
        assert_eq!(server_delay(Some("1e300"), Some("1e300"), now), None);
        assert_eq!(server_delay(Some("NaN"), Some("inf"), now), None);
        assert_eq!(
            server_delay(None, Some("Sun, 06 Nov 1994 08:49:00 GMT"), now),
            None,
            "a past date"
        );
        assert_eq!(
            parse_http_date("Sun, 06 Nov 999999999999999 08:49:37 GMT"),
            None
        );
        assert_eq!(
            server_delay(None, Some("Sun, 06 Nov 1994 08:49:37 GMT"), now),
            Some(Duration::from_secs(7))
        );
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps_at_eight_seconds() {
        let policy = RetryPolicy::default();
        for retry in 0..8 {
            let delay = policy
                .delay(retry, None, None, SystemTime::now())
                .as_secs_f64();
            let nominal = (0.5 * 2f64.powi(retry as i32)).min(8.0);
            assert!(
                delay <= nominal && delay >= nominal * 0.75,
                "retry {retry}: {delay}"
            );
        }
    }

    #[test]
    fn statuses() {
        for status in [408, 409, 429, 500, 502, 503, 529] {
            assert!(retryable_status(status), "{status}");
        }
        for status in [400, 401, 403, 404, 413, 422] {
            assert!(!retryable_status(status), "{status}");
        }
        assert_eq!(should_retry_header(Some("false")), Some(false));
        assert_eq!(should_retry_header(Some("maybe")), None);
    }
}
