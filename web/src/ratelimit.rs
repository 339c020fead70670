//! Log lines at a bounded rate: a trigger any network client can pull (a timed-out scrape, a
//! refused connection) writes at most one line per interval, and says how many it held back.

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

#[cfg(test)]
mod tests {
    use super::*;

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
