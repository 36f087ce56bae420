//! Exponential backoff with jitter, and reading `Retry-After`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exponential backoff between attempts: `base · 2^retry`, capped at `max`, with "equal
/// jitter" (a uniform draw from the upper half) so that clients that failed together do not
/// retry together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    /// The wait before retry number `retry` (0 for the first retry).
    pub(crate) fn delay(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(30)).unwrap_or(u32::MAX);
        let full = self.base.saturating_mul(factor).min(self.max);
        let half = full / 2;
        let span = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let offset = if span == 0 { 0 } else { random_u64() % span.saturating_add(1) };
        half.saturating_add(Duration::from_nanos(offset))
    }
}

/// A random number from std's per-process hash keys, enough for jitter without a crate.
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// A short random id to correlate a call's log lines and the server's logs (`X-Request-Id`).
pub(crate) fn request_id() -> String {
    format!("ctxwin-{:012x}", random_u64() & 0xffff_ffff_ffff)
}

/// The wait a response asks for: `retry-after-ms` (milliseconds, as OpenAI sends it) or
/// `Retry-After` (delay-seconds or an HTTP date).
pub(crate) fn retry_after(
    retry_after_ms: Option<&str>,
    retry_after: Option<&str>,
) -> Option<Duration> {
    if let Some(ms) = retry_after_ms.and_then(parse_seconds) {
        return Some(ms / 1000);
    }
    let value = retry_after?.trim();
    parse_seconds(value).or_else(|| {
        let at = parse_http_date(value)?;
        Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
    })
}

/// Non-negative seconds, whole or fractional.
fn parse_seconds(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(whole) = value.parse::<u64>() {
        return Some(Duration::from_secs(whole));
    }
    let secs = value.parse::<f64>().ok()?;
    Duration::try_from_secs_f64(secs).ok()
}

/// An IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 §5.6.7).
fn parse_http_date(value: &str) -> Option<SystemTime> {
    let mut parts = value.split_whitespace();
    let _weekday = parts.next()?;
    let day: u32 = parts.next()?.parse().ok()?;
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
    let mut clock = parts.next()?.split(':').map(|n| n.parse::<u64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if parts.next()? != "GMT" || day == 0 || day > 31 || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    let secs = days.checked_mul(86_400)?.checked_add(hour * 3600 + minute * 60 + second)?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_in_the_upper_half_and_respect_the_cap() {
        let backoff =
            Backoff { base: Duration::from_millis(100), max: Duration::from_millis(1000) };
        for _ in 0..50 {
            let first = backoff.delay(0);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = backoff.delay(2);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let capped = backoff.delay(40);
            assert!(capped >= Duration::from_millis(500) && capped <= Duration::from_millis(1000));
        }
        assert_eq!(Backoff { base: Duration::ZERO, max: Duration::ZERO }.delay(3), Duration::ZERO);
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        assert_eq!(retry_after(None, Some(" 3 ")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(None, Some("1.5")), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after(Some("250"), Some("9")), Some(Duration::from_millis(250)));
        assert_eq!(retry_after(None, Some("-1")), None);
        assert_eq!(retry_after(None, Some("soon")), None);
        assert_eq!(retry_after(None, None), None);
        assert_eq!(
            retry_after(None, Some("Sun, 06 Nov 1994 08:49:37 GMT")),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
    }

    #[test]
    fn http_dates_parse_to_the_right_instant() {
        let at = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(at.duration_since(UNIX_EPOCH).unwrap().as_secs(), 784_111_777);
        let leap = parse_http_date("Thu, 29 Feb 2024 00:00:00 GMT").unwrap();
        assert_eq!(leap.duration_since(UNIX_EPOCH).unwrap().as_secs(), 1_709_164_800);
        assert!(parse_http_date("Sun, 06 Nov 1994 08:49:37 PST").is_none());
        assert!(parse_http_date("Sun, 06 Foo 1994 08:49:37 GMT").is_none());
        assert!(parse_http_date("Sun, 06 Nov 1994 25:49:37 GMT").is_none());
    }

    #[test]
    fn request_ids_differ() {
        assert_ne!(request_id(), request_id());
        assert!(request_id().starts_with("ctxwin-"));
    }
}
