//! An honest single flight: concurrent scrapes share one broker request only when it costs none
//! of them data. A flight departs (sends its request) when one of the broker client's
//! connections is free for it (a runway). A scrape joins a flight in the air only if
//!
//! - what the flight's request reads is fresh for the joiner: the flight has not departed yet,
//!   or departed no more than the broker's freshness bound (`Sample::max_age_ms` of its last
//!   answer; unknown before the first answer, when only flights still waiting to depart are
//!   joined) before the joiner arrived. Every value the broker reads for that request is then
//!   read no earlier than the bound before the joiner's own arrival. A value the broker took
//!   from an earlier request's reads may still be older: the scrape checks the answer (see
//!   `Answer::fresh_for` in `scrape.rs`);
//! - its deadline is not later than the joiner's own (so the answer comes in time) and not
//!   earlier than the joiner's minus a small tolerance (so the joiner does not get less data
//!   because another client asked with a shorter timeout).
//!
//! Otherwise the scrape starts its own flight with its own deadline: the broker shares reads
//! between requests within its bound, so nothing is read twice for it.
//!
//! A flight whose passengers all left (their clients hung up, or they stopped waiting) before
//! it took a runway is cancelled: it has read nothing, and its task ends, giving back the work
//! it holds (the scrape's place in `--web.max-requests`, see [`crate::work`]). One that
//! departed flies to the end, since its request is in the broker.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, timeout_at};

/// The flights in the air, each with its deadline and when it departed.
#[derive(Debug)]
pub(crate) struct Flights<T> {
    inner: Mutex<Inner<T>>,
    joins: AtomicU64,
    /// One permit per connection of the broker client ([`RUNWAYS`]): a flight departs only
    /// with one, so that the board knows which requests have been sent.
    runways: Semaphore,
    /// The broker's freshness bound in milliseconds as of its last answer; [`UNKNOWN`] before
    /// any.
    bound_ms: AtomicU64,
}

/// `bound_ms` before the broker's first answer.
const UNKNOWN: u64 = u64::MAX;

/// Flights that may have departed at once: the broker client's pool, whose connections they
/// would otherwise wait for out of the board's sight.
const RUNWAYS: usize = crate::broker::MAX_CONNECTIONS;

/// What a scrape needs of a flight to join it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    /// When the scrape arrived: the values it is served must be fresh for this instant.
    pub(crate) arrived: Instant,
    /// The scrape's own broker deadline.
    pub(crate) deadline: Instant,
    /// How much earlier than `deadline` a flight's deadline may be.
    pub(crate) tolerance: Duration,
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
    /// When it took a runway; `None` while it waits for one.
    departed: Option<Instant>,
    /// Its passengers subscribe here; the flight's task holds the other sender and knows them
    /// by their receivers.
    landed: watch::Sender<Option<Landing<T>>>,
}

/// A scrape's place on one flight.
#[derive(Debug)]
pub(crate) struct Ticket<T> {
    /// The deadline the flight was started with.
    #[cfg_attr(not(test), expect(dead_code, reason = "the tests check which flight was joined"))]
    pub(crate) deadline: Instant,
    /// True when the scrape joined a flight another scrape started.
    pub(crate) joined: bool,
    landed: watch::Receiver<Option<Landing<T>>>,
}

/// How a flight ended for one scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Landing<T> {
    /// The flight's result.
    Landed(T),
    /// The flight had not landed when the scrape had to answer; it keeps flying.
    Late,
    /// No runway was free before the flight's deadline: its request was never sent.
    Grounded,
    /// The flight's task ended without a result (it panicked).
    Lost,
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Flights {
            inner: Mutex::new(Inner { next_id: 0, flying: Vec::new() }),
            joins: AtomicU64::new(0),
            bound_ms: AtomicU64::new(UNKNOWN),
            runways: Semaphore::new(RUNWAYS),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Flights<T> {
    /// Joins the flight that suits `needs` (see [`suits`]), or starts a new flight with its
    /// deadline, which runs `start()` once it has a runway (and lands [`Landing::Grounded`] if
    /// none is free before the deadline). The new flight runs in its own task, so a scraper
    /// that hangs up does not cancel the request that others wait for.
    pub(crate) fn join_or_start<F, Fut>(self: &Arc<Self>, needs: Needs, start: F) -> Ticket<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let bound = match self.bound_ms.load(Ordering::Relaxed) {
            UNKNOWN => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let best = inner
            .flying
            .iter()
            .filter(|f| suits(f.departed, f.deadline, needs, bound))
            .max_by_key(|f| f.deadline);
        if let Some(flight) = best {
            self.joins.fetch_add(1, Ordering::Relaxed);
            return Ticket {
                deadline: flight.deadline,
                joined: true,
                landed: flight.landed.subscribe(),
            };
        }
        let (tx, rx) = watch::channel(None);
        let id = inner.next_id;
        inner.next_id += 1;
        let deadline = needs.deadline;
        inner.flying.push(Entry { id, deadline, departed: None, landed: tx.clone() });
        drop(inner);
        let flights = Arc::clone(self);
        tokio::spawn(async move {
            let ending = Ending { flights: &flights, id };
            let runway = tokio::select! {
                // Never closed.
                runway = timeout_at(deadline, flights.runways.acquire()) => runway,
                () = flights.abandoned(id, &tx) => {
                    tracing::debug!("every scrape on a broker request left before it was sent; cancelled");
                    // Drops `start` and what it holds, unsent.
                    return;
                }
            };
            let Ok(Ok(runway)) = runway else {
                ending.land(&tx, Landing::Grounded);
                return;
            };
            flights.depart(id);
            let result = start().await;
            drop(runway);
            ending.land(&tx, Landing::Landed(result));
        });
        Ticket { deadline, joined: false, landed: rx }
    }

    /// Returns once flight `id`, which has not departed, has no passenger left, having taken it
    /// off the board (under the board's lock, so that no scrape joins it after).
    async fn abandoned(&self, id: u64, tx: &watch::Sender<Option<Landing<T>>>) {
        loop {
            tx.closed().await;
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            // A scrape may have joined between the last passenger leaving and the lock.
            if tx.receiver_count() == 0 {
                inner.flying.retain(|f| f.id != id);
                return;
            }
        }
    }

    /// Notes that flight `id` took a runway now: its request is sent from here on.
    fn depart(&self, id: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(flight) = inner.flying.iter_mut().find(|f| f.id == id) {
            flight.departed = Some(Instant::now());
        }
    }

    /// Takes note of the broker's freshness bound, as its latest answer states it.
    pub(crate) fn learn_bound(&self, bound: Duration) {
        let ms = u64::try_from(bound.as_millis()).unwrap_or(UNKNOWN - 1).min(UNKNOWN - 1);
        self.bound_ms.store(ms, Ordering::Relaxed);
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
            Ok(Ok(landing)) => landing.clone().unwrap_or(Landing::Lost),
            Ok(Err(_)) => Landing::Lost,
            Err(_) => Landing::Late,
        }
    }
}

/// True when a scrape with `needs` may join a flight with deadline `deadline` that `departed`
/// then (`None`: not yet), the broker's freshness bound being `bound` (`None`: not known yet):
/// the flight's request leaves after the scrape arrived, or left no more than the bound before
/// (so what the broker reads for it is fresh for the scrape); it answers no later than the
/// scrape must, and asked the broker for at most the tolerance less time.
pub(crate) fn suits(
    departed: Option<Instant>,
    deadline: Instant,
    needs: Needs,
    bound: Option<Duration>,
) -> bool {
    departed.is_none_or(|departed| bound.is_some_and(|bound| departed + bound >= needs.arrived))
        && deadline <= needs.deadline
        && deadline + needs.tolerance >= needs.deadline
}

/// Takes a flight off the board when its task ends, even by panic, before its passengers are
/// told (by [`Ending::land`], or by the task's sender being dropped after the board's), so no
/// later scrape joins a landed or dead flight.
struct Ending<'a, T> {
    flights: &'a Flights<T>,
    id: u64,
}

impl<T> Ending<'_, T> {
    fn land(self, tx: &watch::Sender<Option<Landing<T>>>, result: Landing<T>) {
        drop(self);
        tx.send_replace(Some(result));
    }
}

impl<T> Drop for Ending<'_, T> {
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

    /// The broker's default freshness bound.
    const BOUND: Duration = Duration::from_millis(500);

    /// A scrape arriving now with deadline `deadline`.
    fn now_until(deadline: Instant, tolerance: Duration) -> Needs {
        Needs { arrived: Instant::now(), deadline, tolerance }
    }

    /// Flights whose broker stated `BOUND` in its last answer.
    fn flights() -> Arc<Flights<u32>> {
        let flights = Arc::new(Flights::default());
        flights.learn_bound(BOUND);
        flights
    }

    /// A flight that lands `value` once `release` is sent.
    fn held(value: u32) -> (oneshot::Sender<()>, impl FnOnce() -> BoxFuture + Send + 'static) {
        let (release, held) = oneshot::channel::<()>();
        (release, move || -> BoxFuture {
            Box::pin(async move {
                let _ = held.await;
                value
            })
        })
    }

    type BoxFuture = std::pin::Pin<Box<dyn Future<Output = u32> + Send>>;

    /// Yields until `n` flights have taken a runway.
    async fn departed(flights: &Flights<u32>, n: usize) {
        let count = || {
            let inner = flights.inner.lock().unwrap();
            inner.flying.iter().filter(|f| f.departed.is_some()).count()
        };
        while count() != n {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn a_flight_suits_only_deadlines_it_neither_shortens_nor_outlasts() {
        let t = Instant::now();
        let tol = 100 * MS;
        let own = |deadline| Needs { arrived: t, deadline, tolerance: tol };
        let suits = |deadline, needs| suits(Some(t), deadline, needs, Some(BOUND));
        assert!(suits(t, own(t)));
        assert!(suits(t, own(t + 100 * MS)), "at most the tolerance shorter");
        assert!(!suits(t, own(t + 101 * MS)), "shorter than the tolerance allows");
        assert!(!suits(t + MS, own(t)), "would answer after the scrape must");
        assert!(!suits(t, own(t + 9_000 * MS)), "a 1 ms flight never serves a 10 s scrape");
    }

    #[test]
    fn a_flight_suits_only_scrapes_arriving_within_the_bound_after_it_departed() {
        let t = Instant::now();
        let (deadline, tolerance) = (t + 10_000 * MS, 1_000 * MS);
        let arriving = |after| Needs { arrived: t + after, deadline: deadline + after, tolerance };
        let left = Some(t);
        assert!(suits(left, deadline, arriving(500 * MS), Some(BOUND)), "within the bound");
        assert!(!suits(left, deadline, arriving(501 * MS), Some(BOUND)), "past the bound");
        assert!(!suits(left, deadline, arriving(MS), Some(Duration::ZERO)), "a bound of 0");
        assert!(!suits(left, deadline, arriving(Duration::ZERO), None), "no bound known yet");
        // A flight still waiting for a runway sends its request after the scrape arrived.
        assert!(suits(None, deadline, arriving(900 * MS), Some(Duration::ZERO)));
        assert!(suits(None, deadline, arriving(900 * MS), None));
        assert!(!suits(None, deadline, arriving(1_001 * MS), None), "the tolerance still holds");
    }

    /// Regression (P5): a scrape 0.7 s after another with the same 10 s timeout joined its
    /// flight (the deadlines are within a tenth of the budget), though the broker's bound of
    /// 0.5 s made every value that flight read too old for it.
    #[tokio::test(start_paused = true)]
    async fn a_flight_departed_more_than_the_bound_before_a_scrape_is_not_joined() {
        let flights = flights();
        let (release, flight) = held(1);
        let first = flights.join_or_start(now_until(Instant::now() + 9_000 * MS, 900 * MS), flight);
        departed(&flights, 1).await;
        tokio::time::advance(300 * MS).await;
        let within =
            flights.join_or_start(now_until(first.deadline + 300 * MS, 900 * MS), || async { 2 });
        assert!(within.joined, "0.3 s after, within the bound");
        tokio::time::advance(400 * MS).await;
        let past =
            flights.join_or_start(now_until(first.deadline + 700 * MS, 900 * MS), || async { 3 });
        assert!(!past.joined, "0.7 s after, past the bound: its own flight");
        assert_eq!(past.land_by(Instant::now() + 60_000 * MS).await, Landing::Landed(3));
        release.send(()).unwrap();
        assert_eq!(within.land_by(Instant::now() + 60_000 * MS).await, Landing::Landed(1));
        assert_eq!(flights.joins(), 1);
    }

    #[tokio::test]
    async fn before_the_bound_is_known_only_flights_waiting_for_a_runway_are_joined() {
        let flights = Arc::new(Flights::<u32>::default());
        let deadline = Instant::now() + 1_000 * MS;
        let needs = now_until(deadline, 100 * MS);
        let mut releases = Vec::new();
        let mut tickets = Vec::new();
        for i in 0..RUNWAYS {
            let (release, flight) = held(i as u32);
            let ticket = flights.join_or_start(needs, flight);
            assert!(!ticket.joined, "no departed flight is joined before the bound is known");
            departed(&flights, i + 1).await;
            releases.push(release);
            tickets.push(ticket);
        }
        // Every runway is taken: this flight waits, and a scrape may join it.
        let waiting = flights.join_or_start(needs, || async { 10 });
        assert!(!waiting.joined);
        let joiner = flights.join_or_start(needs, || async { 11 });
        assert!(joiner.joined, "the waiting flight sends after the joiner arrived");
        for release in releases {
            release.send(()).unwrap();
        }
        for (i, ticket) in tickets.into_iter().enumerate() {
            assert_eq!(ticket.land_by(deadline).await, Landing::Landed(i as u32));
        }
        assert_eq!(joiner.land_by(deadline).await, Landing::Landed(10));
        assert_eq!(flights.joins(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flight_without_a_runway_before_its_deadline_is_grounded_unsent() {
        let flights = flights();
        let now = Instant::now();
        let (_release, flight) = held(1);
        let hold = flights.join_or_start(now_until(now + 60_000 * MS, MS), flight);
        let (_release, flight) = held(2);
        let _hold = flights.join_or_start(now_until(now + 50_000 * MS, MS), flight);
        let sent = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&sent);
        let grounded = flights.join_or_start(now_until(now + 1_000 * MS, MS), move || async move {
            counted.fetch_add(1, Ordering::Relaxed);
            3
        });
        assert_eq!(grounded.land_by(now + 10_000 * MS).await, Landing::Grounded);
        assert_eq!(sent.load(Ordering::Relaxed), 0, "the request was never sent");
        assert_eq!(flights.flying(), 2);
        drop(hold);
    }

    #[tokio::test]
    async fn scrapes_join_a_suitable_flight_and_start_their_own_otherwise() {
        let flights = flights();
        let now = Instant::now();
        let (release, flight) = held(1);
        let long = flights.join_or_start(now_until(now + 10_000 * MS, 1_000 * MS), flight);
        assert!(!long.joined);
        // A deadline 0.5 s later with the same timeout: within tolerance.
        let joiner =
            flights.join_or_start(now_until(now + 10_500 * MS, 1_000 * MS), || async { 2 });
        assert!(joiner.joined);
        assert_eq!(joiner.deadline, long.deadline);
        // A short deadline never joins the long flight (it would answer too late)...
        let short = flights.join_or_start(now_until(now + 100 * MS, 10 * MS), || async { 3 });
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
        let flights = flights();
        let now = Instant::now();
        let (release, flight) = held(7);
        let first = flights.join_or_start(now_until(now + 1_000 * MS, 100 * MS), flight);
        let second = flights.join_or_start(now_until(now + 1_000 * MS, 100 * MS), || async { 8 });
        assert!(second.joined);
        assert_eq!(first.land_by(Instant::now()).await, Landing::Late);
        release.send(()).unwrap();
        assert_eq!(second.land_by(now + 60_000 * MS).await, Landing::Landed(7));
    }

    /// Regression (Q2): scrapes with distinct timeouts that hung up at once each left a flight
    /// waiting for a runway until its deadline, holding its scrape's place: one client address
    /// could hold every place of `--web.max-requests`.
    #[tokio::test(start_paused = true)]
    async fn a_flight_whose_scrapes_all_left_before_it_departed_gives_back_its_place() {
        let flights = flights();
        let now = Instant::now();
        let mut releases = Vec::new();
        let mut tickets = Vec::new();
        for i in 0..RUNWAYS {
            let (release, flight) = held(i as u32);
            releases.push(release);
            tickets.push(
                flights.join_or_start(now_until(now + (60_000 + 10 * i as u32) * MS, MS), flight),
            );
        }
        departed(&flights, RUNWAYS).await;
        // Stands for the scrape's place in --web.max-requests, which its request holds.
        let place = Arc::new(());
        let sent = Arc::new(AtomicU64::new(0));
        let start = |place: Arc<()>, sent: Arc<AtomicU64>| {
            move || async move {
                sent.fetch_add(1, Ordering::Relaxed);
                drop(place);
                9
            }
        };
        // Kept: a scrape that joined stays on it when the one that started it leaves.
        let started = flights.join_or_start(
            now_until(now + 30_000 * MS, MS),
            start(Arc::clone(&place), Arc::clone(&sent)),
        );
        let joiner = flights.join_or_start(now_until(now + 30_000 * MS, MS), || async { 10 });
        assert!(joiner.joined);
        drop(started);
        tokio::time::advance(MS).await;
        assert_eq!(flights.flying(), RUNWAYS + 1, "a passenger is still waiting");
        drop(joiner);
        // Cancelled: nobody waits for it any more.
        let deadline = now + 20_000 * MS;
        let alone = flights
            .join_or_start(now_until(deadline, MS), start(Arc::clone(&place), Arc::clone(&sent)));
        assert!(!alone.joined);
        assert_eq!(Arc::strong_count(&place), 3);
        drop(alone);
        while flights.flying() != RUNWAYS {
            tokio::time::sleep(MS).await;
        }
        assert!(Instant::now() < now + 10 * MS, "not held until its deadline");
        assert_eq!(Arc::strong_count(&place), 1, "the place came back");
        for release in releases {
            release.send(()).unwrap();
        }
        for (i, ticket) in tickets.into_iter().enumerate() {
            assert_eq!(ticket.land_by(now + 60_000 * MS).await, Landing::Landed(i as u32));
        }
        assert_eq!(sent.load(Ordering::Relaxed), 0, "neither request was sent");
    }

    #[tokio::test]
    async fn a_flight_whose_task_panics_is_lost_and_grounded() {
        let flights = flights();
        let now = Instant::now();
        let ticket = flights.join_or_start(now_until(now + 1_000 * MS, 100 * MS), || async {
            panic!("flight task panics")
        });
        assert_eq!(ticket.land_by(now + 60_000 * MS).await, Landing::Lost);
        assert_eq!(flights.flying(), 0);
    }
}
