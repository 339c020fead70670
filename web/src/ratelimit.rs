//! Rates: log lines at a bounded rate ([`RateLimit`]: a trigger any network client can pull, a
//! timed-out scrape, a refused connection, writes at most one line per interval, and says how
//! many it held back), and the web configuration's `rate_limit` ([`TokenBucket`]: requests over
//! all clients, as exporter-toolkit's `golang.org/x/time/rate` limiter).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Allows one event per `interval` through; counts the others.
#[derive(Debug)]
pub struct RateLimit {
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// At most one event per `interval`.
    pub const fn new(interval: Duration) -> RateLimit {
        RateLimit { interval, state: Mutex::new(State { last: None, suppressed: 0 }) }
    }

    /// `Some(n)` when an event may be logged now, `n` being how many were held back since the
    /// last one that was; `None` when this one is to be held back.
    pub fn check(&self) -> Option<u64> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                state.suppressed += 1;
                None
            }
            _ => {
                state.last = Some(now);
                Some(std::mem::take(&mut state.suppressed))
            }
        }
    }
}

/// The web configuration's `rate_limit`: one request per `interval` on average, `burst` at
/// once, over all clients together (exporter-toolkit's `rate.NewLimiter(rate.Every(interval),
/// burst)`, one limiter for the whole server). `burst: 0` refuses every request, as there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRate {
    /// The time one token takes to come back (above zero).
    pub interval: Duration,
    /// The bucket's size: the requests allowed at once after a quiet spell.
    pub burst: u32,
}

/// A token bucket of a [`RequestRate`]: full at the start, one token back per `interval`
/// (fractions count, as in Go), capped at `burst`.
#[derive(Debug)]
pub struct TokenBucket {
    state: Mutex<Option<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    rate: RequestRate,
    tokens: f64,
    last: Instant,
}

impl Default for TokenBucket {
    fn default() -> TokenBucket {
        TokenBucket { state: Mutex::new(None) }
    }
}

impl TokenBucket {
    /// Whether a request may pass now under `rate`. A bucket is kept across reloads while the
    /// rate stays the same; a changed rate starts a full bucket.
    pub fn allow(&self, rate: RequestRate) -> bool {
        self.allow_at(rate, Instant::now())
    }

    fn allow_at(&self, rate: RequestRate, now: Instant) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = match &mut *state {
            Some(bucket) if bucket.rate == rate => bucket,
            other => other.insert(Bucket { rate, tokens: f64::from(rate.burst), last: now }),
        };
        let elapsed = now.saturating_duration_since(bucket.last);
        bucket.last = bucket.last.max(now);
        let back = elapsed.as_secs_f64() / rate.interval.as_secs_f64().max(f64::MIN_POSITIVE);
        bucket.tokens = (bucket.tokens + back).min(f64::from(rate.burst));
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_beyond_the_burst_wait_for_the_interval() {
        let bucket = TokenBucket::default();
        let rate = RequestRate { interval: Duration::from_secs(1), burst: 2 };
        let t0 = Instant::now();
        assert!(bucket.allow_at(rate, t0));
        assert!(bucket.allow_at(rate, t0));
        assert!(!bucket.allow_at(rate, t0 + Duration::from_millis(10)));
        assert!(!bucket.allow_at(rate, t0 + Duration::from_millis(999)));
        // One interval gives one token back, not the whole burst.
        assert!(bucket.allow_at(rate, t0 + Duration::from_secs(1)));
        assert!(!bucket.allow_at(rate, t0 + Duration::from_secs(1)));
        // A long quiet spell fills the bucket up to the burst only.
        let later = t0 + Duration::from_secs(60);
        assert!(bucket.allow_at(rate, later));
        assert!(bucket.allow_at(rate, later));
        assert!(!bucket.allow_at(rate, later));
        // Half intervals add up, as Go's fractional tokens do.
        assert!(!bucket.allow_at(rate, later + Duration::from_millis(500)));
        assert!(bucket.allow_at(rate, later + Duration::from_millis(1000)));
        // A clock going backwards gives nothing back.
        assert!(!bucket.allow_at(rate, t0));
    }

    #[test]
    fn a_changed_rate_starts_a_full_bucket_and_a_burst_of_zero_refuses_all() {
        let bucket = TokenBucket::default();
        let one = RequestRate { interval: Duration::from_secs(3600), burst: 1 };
        let t0 = Instant::now();
        assert!(bucket.allow_at(one, t0));
        assert!(!bucket.allow_at(one, t0));
        let three = RequestRate { burst: 3, ..one };
        assert!((0..3).all(|_| bucket.allow_at(three, t0)));
        assert!(!bucket.allow_at(three, t0));
        let none = RequestRate { interval: Duration::from_millis(1), burst: 0 };
        assert!(!bucket.allow_at(none, t0));
        assert!(!bucket.allow_at(none, t0 + Duration::from_secs(10)));
    }

    #[test]
    fn one_event_per_interval_passes_and_the_rest_are_counted() {
        let limit = RateLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.check_at(t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(limit.check_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(limit.check_at(t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(limit.check_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(limit.check_at(t0 + Duration::from_secs(25)), Some(1));
    }
}
