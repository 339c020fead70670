//! How long one scrape may take: Prometheus' `X-Prometheus-Scrape-Timeout-Seconds`, parsed
//! without any possible panic and clamped to [`MIN_SCRAPE_TIMEOUT`] ..= the
//! `--web.max-scrape-timeout` cap, minus a margin for encoding and sending the answer.

use std::time::Duration;

/// Shortest scrape timeout honoured. A header asking for less (e.g. `0.001`) gets this much:
/// a shorter budget reads nothing useful, and honouring it would let any client ask the broker
/// for samples that are over before they start.
pub const MIN_SCRAPE_TIMEOUT: Duration = Duration::from_millis(100);

/// Largest margin kept between Prometheus' timeout and the deadline given to the broker.
const MAX_MARGIN: Duration = Duration::from_millis(250);

/// How long one scrape may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Given to the broker as its deadline ([`amd_hsmp_proto::Request::sample`]): past it, it reads nothing more.
    pub broker_deadline: Duration,
    /// How long the scrape waits for the broker's reply before answering without it.
    pub wait: Duration,
}

impl Budget {
    /// The budget for a scrape whose `X-Prometheus-Scrape-Timeout-Seconds` header holds
    /// `header` (raw bytes, as they came off the wire). See [`requested_timeout`] for what is
    /// accepted. The broker gets the timeout minus a margin of 10 % (at most 250 ms); the
    /// scrape waits until half of that margin is left, keeping the rest for encoding and
    /// sending the answer.
    pub fn new(header: Option<&[u8]>, max: Duration) -> Budget {
        Budget::of(requested_timeout(header, max))
    }

    /// The budget for a scrape timeout of `total`.
    pub(crate) fn of(total: Duration) -> Budget {
        let margin = (total / 10).min(MAX_MARGIN);
        Budget { broker_deadline: total - margin, wait: total - margin / 2 }
    }
}

/// The scrape timeout a header asks for, within `MIN_SCRAPE_TIMEOUT ..= max`:
///
/// - absent, not UTF-8, not a number, NaN, zero or negative: `max` (as without the header);
/// - below [`MIN_SCRAPE_TIMEOUT`]: [`MIN_SCRAPE_TIMEOUT`];
/// - above `max`, including `inf` and `1e300`: `max`.
///
/// `max` itself is first clamped to at least [`MIN_SCRAPE_TIMEOUT`]. Never panics.
pub fn requested_timeout(header: Option<&[u8]>, max: Duration) -> Duration {
    let max = max.max(MIN_SCRAPE_TIMEOUT);
    let Some(seconds) = header
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|h| h.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
    else {
        return max;
    };
    // NaN failed the filter above; +inf and huge values are caught before any conversion.
    if seconds >= max.as_secs_f64() {
        return max;
    }
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) => d.clamp(MIN_SCRAPE_TIMEOUT, max),
        Err(_) => max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(10);

    fn requested(header: &str) -> Duration {
        requested_timeout(Some(header.as_bytes()), MAX)
    }

    #[test]
    fn budget_follows_the_prometheus_header_with_a_margin() {
        let b = Budget::new(Some(b"1"), MAX);
        assert_eq!(b.broker_deadline, Duration::from_millis(900));
        assert_eq!(b.wait, Duration::from_millis(950));
        let b = Budget::new(Some(b"5.5"), MAX);
        assert_eq!(b.broker_deadline, Duration::from_millis(5250));
        assert_eq!(b.wait, Duration::from_millis(5375));
        assert_eq!(Budget::new(Some(b" 2 "), MAX).broker_deadline, Duration::from_millis(1800));
    }

    #[test]
    fn budget_is_capped_by_the_flag_and_ignores_unusable_headers() {
        let max = Duration::from_secs(2);
        assert_eq!(Budget::new(Some(b"120"), max), Budget::new(None, max));
        assert_eq!(Budget::new(Some(b"-3"), max), Budget::new(None, max));
        assert_eq!(Budget::new(Some(b"soon"), max), Budget::new(None, max));
        assert_eq!(Budget::new(None, max).broker_deadline, Duration::from_millis(1800));
    }

    #[test]
    fn timeout_header_of_1e300_is_capped_not_a_panic() {
        // Regression: Duration::from_secs_f64(1e300) panicked in the request task.
        assert_eq!(requested("1e300"), MAX);
        assert_eq!(Budget::new(Some(b"1e300"), MAX), Budget::of(MAX));
        assert_eq!(requested("1.8e19"), MAX);
        assert_eq!(requested_timeout(Some(b"1e300"), Duration::MAX), Duration::MAX);
    }

    #[test]
    fn absurd_timeout_headers_are_clamped_to_the_documented_range() {
        for (header, expected) in [
            ("inf", MAX),
            ("+inf", MAX),
            ("infinity", MAX),
            ("-inf", MAX),
            ("NaN", MAX),
            ("-0", MAX),
            ("0", MAX),
            ("-1e300", MAX),
            ("", MAX),
            ("1s", MAX),
            ("0x10", MAX),
            ("1e-300", MIN_SCRAPE_TIMEOUT),
            ("5e-324", MIN_SCRAPE_TIMEOUT),
            ("0.001", MIN_SCRAPE_TIMEOUT),
            ("0.1", MIN_SCRAPE_TIMEOUT),
            ("0.25", Duration::from_millis(250)),
            ("9.999", Duration::from_millis(9999)),
            ("10.000001", MAX),
        ] {
            assert_eq!(requested(header), expected, "{header:?}");
        }
        assert_eq!(requested_timeout(Some(&[0xff, 0xfe, b'1']), MAX), MAX, "not UTF-8");
        assert_eq!(requested_timeout(None, MAX), MAX);
    }

    #[test]
    fn shortest_budget_still_gives_the_broker_time() {
        let b = Budget::new(Some(b"0.000000001"), MAX);
        assert_eq!(b.broker_deadline, Duration::from_millis(90));
        assert_eq!(b.wait, Duration::from_millis(95));
    }

    #[test]
    fn a_cap_below_the_minimum_is_raised_to_it() {
        assert_eq!(requested_timeout(None, Duration::from_millis(1)), MIN_SCRAPE_TIMEOUT);
        assert_eq!(requested_timeout(Some(b"5"), Duration::ZERO), MIN_SCRAPE_TIMEOUT);
    }
}
