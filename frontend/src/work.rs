//! The bound on the work requests start: one mechanism for every piece of blocking or
//! expensive work a scrape or a page view sets going.
//!
//! A request takes a [`Permit`] (`--web.max-requests`) before it starts anything, and every
//! piece of work it starts holds a clone of that permit for as long as the work runs, not as
//! long as the request: the broker request of a flight (its task holds it until the flight
//! lands) and the core-owner walk (the walker's thread holds it until the walk ends). A client
//! that hangs up drops its request future, and with it nothing but its own clone: the place in
//! `--web.max-requests` comes back only when the last piece of work it started has ended. So
//! `--web.max-requests` bounds work, not only requests, and a request that hangs up frees
//! nothing early and, being dropped, starts nothing new. Work that waits to start holds no
//! place: a flight waiting for a runway is cancelled when its last scrape leaves
//! (`crate::flight`), and a walk queued behind a running one keeps only a [`QueuedPermit`],
//! which it turns into its place when it starts, if a request that wanted it still holds it.
//!
//! Work is shared, not repeated: concurrent scrapes share a broker request when its values are
//! fresh for each of them (`crate::flight`) and a walk of the cgroup hierarchy that began no
//! more than `owner::WALK_MAX_AGE` before they arrived (`crate::owner::Walker`). The other work
//! a request does is bounded where it is: bcrypt runs on one thread of its own fed by a fair
//! queue that drops the checks of clients that hung up (`amd_hsmp_web::auth`); the web
//! configuration's files are read on one thread of their own with a timeout
//! (`amd_hsmp_web::config`); the `process_*` metrics read `/proc/self`, which the kernel
//! serves without blocking.

use std::sync::{Arc, Weak};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A place within `--web.max-requests`, shared by a request and the work it started; the
/// place is free again when the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Permit {
    /// `None` inside without a limit; the `Arc` still tells whether the request lives.
    held: Arc<Option<OwnedSemaphorePermit>>,
}

impl Permit {
    /// A handle that holds no place: work queued for a request keeps this until it starts, so
    /// that waiting holds nothing, and then takes the place only if the request (or other
    /// work it started) still holds it.
    pub(crate) fn downgrade(&self) -> QueuedPermit {
        QueuedPermit { held: Arc::downgrade(&self.held) }
    }
}

/// A [`Permit`] that holds no place; see [`Permit::downgrade`].
#[derive(Debug, Clone)]
pub(crate) struct QueuedPermit {
    held: Weak<Option<OwnedSemaphorePermit>>,
}

impl QueuedPermit {
    /// The place, if the request or work it started still holds it.
    pub(crate) fn upgrade(&self) -> Option<Permit> {
        self.held.upgrade().map(|held| Permit { held })
    }

    /// Whether the place is still held.
    pub(crate) fn is_held(&self) -> bool {
        self.held.strong_count() > 0
    }
}

/// The places of `--web.max-requests`.
#[derive(Debug)]
pub(crate) struct Permits {
    /// `None` without a limit.
    semaphore: Option<Arc<Semaphore>>,
}

impl Permits {
    /// `limit` places; 0 means no limit.
    pub(crate) fn new(limit: usize) -> Permits {
        Permits { semaphore: (limit > 0).then(|| Arc::new(Semaphore::new(limit))) }
    }

    /// A place, if one is free.
    pub(crate) fn try_take(&self) -> Option<Permit> {
        let Some(semaphore) = &self.semaphore else { return Some(Permit { held: Arc::new(None) }) };
        let permit = Arc::clone(semaphore).try_acquire_owned().ok()?;
        Some(Permit { held: Arc::new(Some(permit)) })
    }

    /// Places free now (`usize::MAX` without a limit).
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.semaphore.as_ref().map_or(usize::MAX, |s| s.available_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_comes_back_only_when_the_last_piece_of_work_holding_it_ends() {
        let permits = Permits::new(2);
        let request = permits.try_take().unwrap();
        let flight = request.clone();
        let walk = request.clone();
        drop(request); // the client hung up
        assert_eq!(permits.available(), 1, "the work it started still holds the place");
        drop(flight);
        assert_eq!(permits.available(), 1);
        drop(walk);
        assert_eq!(permits.available(), 2);
    }

    #[test]
    fn queued_work_holds_no_place_and_starts_only_while_its_request_holds_one() {
        for limit in [1, 0] {
            let permits = Permits::new(limit);
            let request = permits.try_take().unwrap();
            let queued = request.downgrade();
            if limit > 0 {
                assert_eq!(permits.available(), 0);
            }
            let started = queued.upgrade().expect("the request still holds its place");
            drop(request);
            assert!(queued.is_held(), "the started work holds it");
            drop(started);
            assert!(!queued.is_held() && queued.upgrade().is_none(), "limit {limit}");
            if limit > 0 {
                assert_eq!(permits.available(), 1);
            }
        }
    }

    #[test]
    fn no_place_is_given_past_the_limit_and_none_is_needed_without_one() {
        let permits = Permits::new(1);
        let _held = permits.try_take().unwrap();
        assert!(permits.try_take().is_none());
        let unlimited = Permits::new(0);
        let all: Vec<_> = (0..100).map(|_| unlimited.try_take()).collect();
        assert!(all.iter().all(Option::is_some));
    }
}
