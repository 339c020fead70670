//! An honest single flight: concurrent scrapes share one broker request only when its deadline
//! suits each of them. A scrape joins a flight in the air only if that flight's deadline is not
//! later than its own (so the answer comes in time) and not earlier than its own minus a small
//! tolerance (so it does not get less data because another client asked with a shorter
//! timeout); otherwise it starts its own flight with its own deadline.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, timeout_at};

/// The flights in the air, each with the deadline it was started with.
#[derive(Debug)]
pub(crate) struct Flights<T> {
    inner: Mutex<Inner<T>>,
    joins: AtomicU64,
}

#[derive(Debug)]
struct Inner<T> {
    next_id: u64,
    flying: Vec<Entry<T>>,
}

#[derive(Debug)]
struct Entry<T> {
    id: u64,
    deadline: Instant,
    landed: watch::Receiver<Option<T>>,
}

/// A scrape's place on one flight.
#[derive(Debug)]
pub(crate) struct Ticket<T> {
    /// The deadline the flight was started with.
    #[cfg_attr(not(test), expect(dead_code, reason = "the tests check which flight was joined"))]
    pub(crate) deadline: Instant,
    /// True when the scrape joined a flight another scrape started.
    pub(crate) joined: bool,
    landed: watch::Receiver<Option<T>>,
}

/// How a flight ended for one scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Landing<T> {
    /// The flight's result.
    Landed(T),
    /// The flight had not landed when the scrape had to answer; it keeps flying.
    Late,
    /// The flight's task ended without a result (it panicked).
    Lost,
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Flights {
            inner: Mutex::new(Inner { next_id: 0, flying: Vec::new() }),
            joins: AtomicU64::new(0),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Flights<T> {
    /// Joins the flight that suits `deadline` (see [`suits`]), or starts `start()` as a new
    /// flight with that deadline. The new flight runs in its own task, so a scraper that hangs
    /// up does not cancel the request that others wait for.
    pub(crate) fn join_or_start<F, Fut>(
        self: &Arc<Self>,
        deadline: Instant,
        tolerance: Duration,
        start: F,
    ) -> Ticket<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let best = inner
            .flying
            .iter()
            .filter(|f| suits(f.deadline, deadline, tolerance))
            .max_by_key(|f| f.deadline);
        if let Some(flight) = best {
            self.joins.fetch_add(1, Ordering::Relaxed);
            return Ticket {
                deadline: flight.deadline,
                joined: true,
                landed: flight.landed.clone(),
            };
        }
        let (tx, rx) = watch::channel(None);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.flying.push(Entry { id, deadline, landed: rx.clone() });
        drop(inner);
        let flight = start();
        let flights = Arc::clone(self);
        tokio::spawn(async move {
            let grounded = Grounded { flights: &flights, id, tx: Some(tx) };
            let result = flight.await;
            grounded.land(result);
        });
        Ticket { deadline, joined: false, landed: rx }
    }

    /// How many times a scrape joined a flight another had started, since the start.
    pub(crate) fn joins(&self) -> u64 {
        self.joins.load(Ordering::Relaxed)
    }

    /// Flights in the air now.
    pub(crate) fn flying(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).flying.len()
    }
}

impl<T: Clone> Ticket<T> {
    /// Waits for the flight until `by`.
    pub(crate) async fn land_by(mut self, by: Instant) -> Landing<T> {
        match timeout_at(by, self.landed.wait_for(Option::is_some)).await {
            Ok(Ok(result)) => result.clone().map_or(Landing::Lost, Landing::Landed),
            Ok(Err(_)) => Landing::Lost,
            Err(_) => Landing::Late,
        }
    }
}

/// True when a scrape with deadline `own` may join a flight with deadline `flight`: the flight
/// answers no later than the scrape must, and asked the broker for at most `tolerance` less
/// time.
pub(crate) fn suits(flight: Instant, own: Instant, tolerance: Duration) -> bool {
    flight <= own && flight + tolerance >= own
}

/// Takes a flight off the board when its task ends, even by panic, before its passengers are
/// told (its sender is a field, dropped after `drop` ran), so no later scrape joins a landed
/// or dead flight.
struct Grounded<'a, T> {
    flights: &'a Flights<T>,
    id: u64,
    tx: Option<watch::Sender<Option<T>>>,
}

impl<T> Grounded<'_, T> {
    fn land(mut self, result: T) {
        let tx = self.tx.take();
        drop(self);
        if let Some(tx) = tx {
            tx.send_replace(Some(result));
        }
    }
}

impl<T> Drop for Grounded<'_, T> {
    fn drop(&mut self) {
        let mut inner = self.flights.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.flying.retain(|f| f.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_flight_suits_only_deadlines_it_neither_shortens_nor_outlasts() {
        let t = Instant::now();
        let tol = 100 * MS;
        assert!(suits(t, t, tol));
        assert!(suits(t, t + 100 * MS, tol), "at most the tolerance shorter");
        assert!(!suits(t, t + 101 * MS, tol), "shorter than the tolerance allows");
        assert!(!suits(t + MS, t, tol), "would answer after the scrape must");
        assert!(!suits(t, t + 9_000 * MS, tol), "a 1 ms flight never serves a 10 s scrape");
    }

    #[tokio::test]
    async fn scrapes_join_a_suitable_flight_and_start_their_own_otherwise() {
        let flights = Arc::new(Flights::<u32>::default());
        let now = Instant::now();
        let (release, held) = oneshot::channel::<()>();
        let long = flights.join_or_start(now + 10_000 * MS, 1_000 * MS, move || async move {
            let _ = held.await;
            1
        });
        assert!(!long.joined);
        // 0.5 s later with the same timeout: its deadline is 0.5 s later, within tolerance.
        let joiner = flights.join_or_start(now + 10_500 * MS, 1_000 * MS, || async { 2 });
        assert!(joiner.joined);
        assert_eq!(joiner.deadline, long.deadline);
        // A short deadline never joins the long flight (it would answer too late)...
        let short = flights.join_or_start(now + 100 * MS, 10 * MS, || async { 3 });
        assert!(!short.joined);
        // ...and a long one never joins a short flight (it would get less).
        assert_eq!(short.land_by(now + 10_000 * MS).await, Landing::Landed(3));
        release.send(()).unwrap();
        assert_eq!(long.land_by(now + 10_000 * MS).await, Landing::Landed(1));
        assert_eq!(joiner.land_by(now + 10_000 * MS).await, Landing::Landed(1));
        // Landed flights leave the board.
        tokio::task::yield_now().await;
        assert_eq!(flights.flying(), 0);
    }

    #[tokio::test]
    async fn a_late_flight_keeps_flying_for_its_other_passengers() {
        let flights = Arc::new(Flights::<u32>::default());
        let now = Instant::now();
        let (release, held) = oneshot::channel::<()>();
        let first = flights.join_or_start(now + 1_000 * MS, 100 * MS, move || async move {
            let _ = held.await;
            7
        });
        let second = flights.join_or_start(now + 1_000 * MS, 100 * MS, || async { 8 });
        assert!(second.joined);
        assert_eq!(first.land_by(Instant::now()).await, Landing::Late);
        release.send(()).unwrap();
        assert_eq!(second.land_by(now + 60_000 * MS).await, Landing::Landed(7));
    }

    #[tokio::test]
    async fn a_flight_whose_task_panics_is_lost_and_grounded() {
        let flights = Arc::new(Flights::<u32>::default());
        let now = Instant::now();
        let ticket = flights
            .join_or_start(now + 1_000 * MS, 100 * MS, || async { panic!("flight task panics") });
        assert_eq!(ticket.land_by(now + 60_000 * MS).await, Landing::Lost);
        assert_eq!(flights.flying(), 0);
    }
}
