//! HTTP basic authentication against `basic_auth_users` (bcrypt hashes as `htpasswd -B` makes
//! them), and the middleware that applies it and the configured headers to every path.
//!
//! A bcrypt check costs tens of milliseconds by design, so its cost is bounded here:
//! - The checks run on [`BCRYPT_THREADS`] threads of their own, never on the async workers and
//!   never on tokio's blocking pool. The bound is the number of threads, so a client that hangs
//!   up frees nothing early: a running check runs to its end on its thread, and the next one
//!   starts only then.
//! - Checks wait in a queue per client address (IPv6 by /64, as the connection share), at most
//!   [`QUEUED_PER_CLIENT`] each and [`MAX_QUEUED`] in all, and the threads take them round-robin
//!   over the addresses, so a flood from a few addresses costs a scraper from another address at
//!   most one check per flooding address. Past either bound a request gets `503` with
//!   `Retry-After` at once. A queued check whose client has gone is dropped unverified.
//! - A successful (user, hash, password) is remembered, under an HMAC with a key made at
//!   start-up (no password is kept), in a bounded cache that lives as long as the process: a
//!   reload or a certificate rotation keeps it, and a user whose hash changed misses it.
//! - A failed check costs bcrypt at the highest configured cost, whoever it names: an unknown
//!   user is checked against a configured hash of that cost (the decoy), and a failed check of a
//!   user whose hash has a lower cost `c` is followed by checks at costs `c`, `c+1`, ... up to
//!   the highest minus one (`2^c + ... + 2^(max-1) = 2^max - 2^c` more rounds), so the time it
//!   takes does not tell which users exist. A file that mixes costs is served, with a warning.
//! - bcrypt uses the first 72 bytes of a password only; a presented password longer than
//!   [`MAX_PASSWORD_BYTES`] is refused without a check, so no suffix rides along.

use crate::client::client_key;
use crate::files::{KeyError, key_error};
use axum::http::HeaderValue;
use base64::Engine as _;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use tokio::sync::oneshot;

/// Successful checks remembered; the oldest is forgotten first.
pub const CACHE_SIZE: usize = 64;

/// Threads that run bcrypt: at most this many cores are spent on checks.
pub const BCRYPT_THREADS: usize = 1;

/// Checks one client address (IPv6: one /64) may have waiting.
pub const QUEUED_PER_CLIENT: usize = 4;

/// Checks waiting over all client addresses.
pub const MAX_QUEUED: usize = 64;

/// The longest password bcrypt takes whole.
pub const MAX_PASSWORD_BYTES: usize = 72;

/// The realm sent in `WWW-Authenticate`.
pub(crate) const CHALLENGE: &str = "Basic realm=\"amd-hsmp-exporter\", charset=\"UTF-8\"";

/// The users of one configuration.
#[derive(Debug)]
pub struct Users {
    hashes: BTreeMap<String, String>,
    decoy: String,
    /// Per cost below the highest: the hashes a failed check at that cost is followed by.
    padding: BTreeMap<u32, Vec<String>>,
}

impl Users {
    /// Users from `user → bcrypt hash`; a hash that is not bcrypt is an error naming the user.
    /// Costs that differ are logged (a warning) and evened out on failure ([`Users::padding`]).
    pub(crate) fn new(hashes: BTreeMap<String, String>) -> Result<Users, KeyError> {
        let mut costs: BTreeMap<u32, &str> = BTreeMap::new();
        let mut decoy = None;
        for (user, hash) in &hashes {
            let key = format!("basic_auth_users.{user}");
            if user.contains(':') {
                return Err(key_error(key, "a user name cannot contain ':' in basic auth"));
            }
            let parts: bcrypt::HashParts = hash.parse().map_err(|e| {
                key_error(
                    &key,
                    format!("not a bcrypt hash (make one with htpasswd -nBC 10 \"\"): {e}"),
                )
            })?;
            let cost = parts.get_cost();
            costs.entry(cost).or_insert(user);
            if decoy.as_ref().is_none_or(|(c, _)| cost > *c) {
                decoy = Some((cost, hash.clone()));
            }
        }
        let (max, decoy) = decoy.unwrap_or_default();
        if let (Some((low, low_user)), Some((high, high_user))) =
            (costs.first_key_value(), costs.last_key_value())
            && low != high
        {
            tracing::warn!(
                lowest = format!("{low} ({low_user})"),
                highest = format!("{high} ({high_user})"),
                "basic_auth_users: the bcrypt costs differ; every failed check costs as the highest \
                 (a check of a cheaper hash is followed by extra bcrypt work), so a failed check \
                 takes longer than a successful one of a cheaper hash; make the hashes again with \
                 one cost (htpasswd -nBC {high} \"\")"
            );
        }
        // The decoy's salt and digest at lower costs: any well-formed hash of cost k costs 2^k.
        let tail = decoy.rsplit('$').next().unwrap_or_default().to_owned();
        let padding = costs
            .keys()
            .filter(|c| **c < max)
            .map(|c| (*c, (*c..max).map(|k| format!("$2b${k:02}${tail}")).collect()))
            .collect();
        Ok(Users { hashes, decoy, padding })
    }

    /// The hashes a failed check of `hash` is followed by so that it costs as the highest
    /// cost: none for the highest cost (and the decoy).
    fn padding(&self, hash: &str) -> Vec<String> {
        let cost = hash.parse::<bcrypt::HashParts>().map(|p| p.get_cost()).ok();
        cost.and_then(|c| self.padding.get(&c)).cloned().unwrap_or_default()
    }
}

/// What a check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A configured user with the right password.
    Pass,
    /// No credentials, an unknown user or a wrong password.
    Fail,
    /// The queue of checks is full for this client or overall; try again later.
    Busy,
}

/// The process's checks: their threads and queue, the success cache and its key. One for the
/// whole process, so a reload keeps it.
#[derive(Debug)]
pub struct Auth {
    key: OnceLock<Option<ring::hmac::Key>>,
    cache: Mutex<Cache>,
    checks: Checks,
}

impl Default for Auth {
    fn default() -> Auth {
        Auth::new(BCRYPT_THREADS)
    }
}

impl Auth {
    /// Checks on at most `threads` threads (at least one).
    pub fn new(threads: usize) -> Auth {
        Auth {
            key: OnceLock::new(),
            cache: Mutex::new(Cache::default()),
            checks: Checks::new(threads.max(1)),
        }
    }

    /// Whether `authorization` (the header's value) names one of `users` with the right
    /// password; `client` is the address the request came from.
    pub async fn check(
        &self,
        users: &Users,
        client: IpAddr,
        authorization: Option<&HeaderValue>,
    ) -> Verdict {
        let Some((user, password)) = authorization.and_then(credentials) else {
            return Verdict::Fail;
        };
        if password.len() > MAX_PASSWORD_BYTES {
            return Verdict::Fail;
        }
        let known = users.hashes.get(&user);
        let hash = known.unwrap_or(&users.decoy);
        let tag = self.tag(&user, hash, &password);
        if known.is_some() && tag.is_some_and(|t| lock(&self.cache).set.contains(&t)) {
            return Verdict::Pass;
        }
        let padding = users.padding(hash);
        let job = (password, hash.clone(), padding);
        let Some(reply) = self.checks.submit(client_key(client), job) else {
            return Verdict::Busy;
        };
        let verified = reply.await.unwrap_or(false);
        if !(verified && known.is_some()) {
            return Verdict::Fail;
        }
        if let Some(tag) = tag {
            lock(&self.cache).insert(tag);
        }
        Verdict::Pass
    }

    /// Successful checks remembered now.
    pub fn cached(&self) -> usize {
        lock(&self.cache).set.len()
    }

    /// bcrypt computations running now.
    pub fn running(&self) -> usize {
        self.checks.shared.running.load(Ordering::SeqCst)
    }

    /// The bcrypt work done so far, in rounds (a check at cost `c` is `2^c`).
    pub fn rounds(&self) -> u64 {
        self.checks.shared.rounds.load(Ordering::SeqCst)
    }

    /// Checks waiting now.
    pub fn queued(&self) -> usize {
        lock(&self.checks.shared.queue).queued
    }

    fn tag(&self, user: &str, hash: &str, password: &str) -> Option<[u8; 32]> {
        let key = self.key.get_or_init(|| {
            let rng = ring::rand::SystemRandom::new();
            ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng).ok()
        });
        let mut ctx = ring::hmac::Context::with_key(key.as_ref()?);
        for part in [user, hash] {
            ctx.update(&(part.len() as u64).to_le_bytes());
            ctx.update(part.as_bytes());
        }
        ctx.update(password.as_bytes());
        let mut tag = [0u8; 32];
        tag.copy_from_slice(ctx.sign().as_ref());
        Some(tag)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct Cache {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl Cache {
    fn insert(&mut self, tag: [u8; 32]) {
        if !self.set.insert(tag) {
            return;
        }
        self.order.push_back(tag);
        if self.order.len() > CACHE_SIZE
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
    }
}

/// The bcrypt threads and their queue, fair over client addresses.
#[derive(Debug)]
struct Checks {
    shared: Arc<Shared>,
    threads: usize,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    running: AtomicUsize,
    rounds: AtomicU64,
}

#[derive(Debug, Default)]
struct Queue {
    /// The checks waiting, per client address.
    clients: HashMap<IpAddr, VecDeque<Job>>,
    /// The client addresses with checks waiting, in the order they are served.
    ring: VecDeque<IpAddr>,
    queued: usize,
    /// Threads started.
    started: usize,
    closed: bool,
}

#[derive(Debug)]
struct Job {
    password: String,
    hash: String,
    /// Checked after `hash` fails, to even out the cost ([`Users::padding`]).
    padding: Vec<String>,
    reply: oneshot::Sender<bool>,
}

/// What a check is: the password, the hash, the padding hashes.
type Check = (String, String, Vec<String>);

impl Queue {
    /// The next check to run: the first of the next client in the ring; checks whose client
    /// has gone are dropped.
    fn next(&mut self) -> Option<Job> {
        while let Some(client) = self.ring.pop_front() {
            let Some(jobs) = self.clients.get_mut(&client) else { continue };
            let job = jobs.pop_front();
            if jobs.is_empty() {
                self.clients.remove(&client);
            } else {
                self.ring.push_back(client);
            }
            let Some(job) = job else { continue };
            self.queued -= 1;
            if !job.reply.is_closed() {
                return Some(job);
            }
        }
        None
    }
}

impl Checks {
    fn new(threads: usize) -> Checks {
        Checks { shared: Arc::default(), threads }
    }

    /// Queues a check for `client`; its answer, or `None` when the queue is full for `client`
    /// or overall.
    fn submit(&self, client: IpAddr, check: Check) -> Option<oneshot::Receiver<bool>> {
        let (password, hash, padding) = check;
        let mut queue = lock(&self.shared.queue);
        // Checks of requests that have gone (their client hung up) hold no place.
        if let Some(jobs) = queue.clients.get_mut(&client) {
            let before = jobs.len();
            jobs.retain(|job| !job.reply.is_closed());
            let gone = before - jobs.len();
            queue.queued -= gone;
        }
        if queue.queued >= MAX_QUEUED
            || queue.clients.get(&client).is_some_and(|jobs| jobs.len() >= QUEUED_PER_CLIENT)
        {
            return None;
        }
        if queue.started < self.threads {
            let shared = Arc::clone(&self.shared);
            match std::thread::Builder::new().name("bcrypt".into()).spawn(move || work(&shared)) {
                Ok(_) => queue.started += 1,
                Err(e) if queue.started == 0 => {
                    tracing::error!(error = %e, "cannot start a thread for basic-auth checks");
                    return None;
                }
                Err(_) => {}
            }
        }
        let (reply, answer) = oneshot::channel();
        // A client is in the ring exactly while it has an entry in `clients`.
        if !queue.clients.contains_key(&client) {
            queue.ring.push_back(client);
        }
        queue.clients.entry(client).or_default().push_back(Job { password, hash, padding, reply });
        queue.queued += 1;
        drop(queue);
        self.shared.ready.notify_one();
        Some(answer)
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
    }
}

/// A bcrypt thread: runs checks one after the other until the queue is closed.
fn work(shared: &Shared) {
    loop {
        let job = {
            let mut queue = lock(&shared.queue);
            loop {
                if queue.closed {
                    return;
                }
                if let Some(job) = queue.next() {
                    break job;
                }
                queue = shared.ready.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        };
        shared.running.fetch_add(1, Ordering::SeqCst);
        let verify = |hash: &str| {
            let cost = hash.parse::<bcrypt::HashParts>().map_or(0, |p| p.get_cost());
            shared.rounds.fetch_add(1u64.checked_shl(cost).unwrap_or(0), Ordering::SeqCst);
            bcrypt::verify(&job.password, hash).unwrap_or(false)
        };
        let verified = verify(&job.hash);
        if !verified {
            for hash in &job.padding {
                verify(hash);
            }
        }
        shared.running.fetch_sub(1, Ordering::SeqCst);
        let _ = job.reply.send(verified);
    }
}

/// `Basic base64(user:password)` → (user, password).
fn credentials(value: &HeaderValue) -> Option<(String, String)> {
    let value = value.to_str().ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    pub(crate) fn basic(user: &str, password: &str) -> HeaderValue {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    pub(crate) fn hash(password: &str, cost: u32) -> String {
        bcrypt::hash_with_result(password, cost).unwrap().format_for_version(bcrypt::Version::TwoY)
    }

    fn users(list: &[(&str, &str)]) -> Users {
        Users::new(list.iter().map(|(u, p)| (u.to_string(), hash(p, 4))).collect()).unwrap()
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[tokio::test]
    async fn right_password_passes_wrong_and_unknown_do_not() {
        let auth = Auth::default();
        let users = users(&[("prometheus", "s3cret"), ("other", "x")]);
        let check = |h: Option<HeaderValue>| {
            let (auth, users) = (&auth, &users);
            async move { auth.check(users, ip(2), h.as_ref()).await }
        };
        assert_eq!(check(Some(basic("prometheus", "s3cret"))).await, Verdict::Pass);
        assert_eq!(check(Some(basic("prometheus", "wrong"))).await, Verdict::Fail);
        assert_eq!(check(Some(basic("nobody", "s3cret"))).await, Verdict::Fail);
        assert_eq!(check(None).await, Verdict::Fail);
        assert_eq!(check(Some(HeaderValue::from_static("Bearer abc"))).await, Verdict::Fail);
        assert_eq!(check(Some(HeaderValue::from_static("Basic !!!"))).await, Verdict::Fail);
        // The password may contain ':'; the user may not.
        let users = self::users(&[("a", "b:c")]);
        assert_eq!(auth.check(&users, ip(2), Some(&basic("a", "b:c"))).await, Verdict::Pass);
    }

    #[tokio::test]
    async fn only_successes_are_cached_and_the_cache_is_bounded() {
        let auth = Auth::default();
        let users = users(&[("u", "p")]);
        assert_eq!(auth.check(&users, ip(2), Some(&basic("u", "bad"))).await, Verdict::Fail);
        assert_eq!(auth.check(&users, ip(2), Some(&basic("ghost", "p"))).await, Verdict::Fail);
        assert_eq!(auth.cached(), 0);
        assert_eq!(auth.check(&users, ip(2), Some(&basic("u", "p"))).await, Verdict::Pass);
        assert_eq!(auth.check(&users, ip(2), Some(&basic("u", "p"))).await, Verdict::Pass);
        assert_eq!(auth.cached(), 1);
        let mut cache = Cache::default();
        for i in 0..(CACHE_SIZE as u8 + 10) {
            cache.insert([i; 32]);
        }
        assert_eq!(cache.set.len(), CACHE_SIZE);
        assert_eq!(cache.order.len(), CACHE_SIZE);
        assert!(!cache.set.contains(&[0; 32]) && cache.set.contains(&[CACHE_SIZE as u8 + 9; 32]));
    }

    #[tokio::test]
    async fn the_cache_outlives_a_reload_for_an_unchanged_hash_and_not_for_a_changed_one() {
        let auth = Auth::default();
        let before = users(&[("u", "p")]);
        assert_eq!(auth.check(&before, ip(2), Some(&basic("u", "p"))).await, Verdict::Pass);
        // The same file read again: the remembered success still holds, without a queue.
        let reloaded = Users::new(before.hashes.clone()).unwrap();
        let auth_without_threads = Auth { checks: Checks::new(0), ..auth };
        assert_eq!(
            auth_without_threads.check(&reloaded, ip(2), Some(&basic("u", "p"))).await,
            Verdict::Pass
        );
        // A new hash for the user (same password): not in the cache, so a check is queued.
        let changed = users(&[("u", "p")]);
        let header = basic("u", "p");
        let pending = auth_without_threads.check(&changed, ip(2), Some(&header));
        tokio::pin!(pending);
        assert!(futures_poll_once(pending.as_mut()).await.is_none());
        assert_eq!(auth_without_threads.queued(), 1);
    }

    /// Polls `future` once: its output if ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await
    }

    /// Hashes of costs 4, 5 and 7: every failed check, of a known user or not, costs 2^7
    /// bcrypt rounds; a success costs its own hash's.
    #[tokio::test]
    async fn hashes_of_different_costs_are_served_and_every_failure_costs_the_highest() {
        let hashes = [("a", hash("pa", 4)), ("b", hash("pb", 5)), ("c", hash("pc", 7))];
        let users = Users::new(hashes.map(|(u, h)| (u.to_string(), h)).into()).unwrap();
        assert_eq!(users.decoy, users.hashes["c"]);
        // The padding is real bcrypt work: well-formed hashes of the costs below the highest.
        assert_eq!(users.padding[&4].len(), 3);
        for padding in users.padding.values().flatten() {
            assert_eq!(bcrypt::verify("x", padding).ok(), Some(false), "{padding}");
        }
        let auth = Auth::default();
        let cost = async |user: &str, password: &str, verdict: Verdict| {
            let before = auth.rounds();
            assert_eq!(auth.check(&users, ip(2), Some(&basic(user, password))).await, verdict);
            auth.rounds() - before
        };
        for user in ["a", "b", "c", "nobody"] {
            assert_eq!(cost(user, "wrong", Verdict::Fail).await, 1 << 7, "{user}");
        }
        // A right password of another user is no help.
        assert_eq!(cost("a", "pc", Verdict::Fail).await, 1 << 7);
        assert_eq!(cost("nobody", "pc", Verdict::Fail).await, 1 << 7);
        assert_eq!(cost("a", "pa", Verdict::Pass).await, 1 << 4);
        assert_eq!(cost("b", "pb", Verdict::Pass).await, 1 << 5);
        // One cost: no padding at all.
        let same = Users::new([("a".into(), hash("a", 4)), ("b".into(), hash("b", 4))].into());
        assert!(same.unwrap().padding.is_empty());
    }

    #[tokio::test]
    async fn a_password_longer_than_72_bytes_is_refused_even_if_its_first_72_bytes_match() {
        let auth = Auth::default();
        let long = "x".repeat(80);
        let users = users(&[("u", &long), ("v", &long[..72])]);
        // bcrypt alone would take any 80 bytes that start with the right 72.
        assert!(bcrypt::verify(format!("{}yyyyyyyy", &long[..72]), &users.hashes["u"]).unwrap());
        for password in [long.clone(), format!("{}yyyyyyyy", &long[..72])] {
            assert_eq!(
                auth.check(&users, ip(2), Some(&basic("u", &password))).await,
                Verdict::Fail
            );
        }
        assert_eq!(auth.check(&users, ip(2), Some(&basic("v", &long[..72]))).await, Verdict::Pass);
    }

    #[test]
    fn checks_are_taken_round_robin_over_client_addresses() {
        let checks = Checks::new(0);
        let mut answers = Vec::new();
        for (client, password) in [(2, "a1"), (2, "a2"), (2, "a3"), (3, "b1"), (4, "c1"), (3, "b2")]
        {
            answers.push(
                checks.submit(ip(client), (password.into(), String::new(), Vec::new())).unwrap(),
            );
        }
        let mut queue = lock(&checks.shared.queue);
        let order: Vec<String> = std::iter::from_fn(|| queue.next()).map(|j| j.password).collect();
        assert_eq!(order, ["a1", "b1", "c1", "a2", "b2", "a3"]);
        assert_eq!(queue.queued, 0);
    }

    #[test]
    fn past_its_share_or_the_whole_queue_a_check_is_refused_at_once_and_gone_clients_are_skipped() {
        let checks = Checks::new(0);
        let mut answers = Vec::new();
        for _ in 0..QUEUED_PER_CLIENT {
            answers.push(checks.submit(ip(2), ("p".into(), String::new(), Vec::new())).unwrap());
        }
        assert!(checks.submit(ip(2), ("p".into(), String::new(), Vec::new())).is_none());
        // Another address still gets in, up to the whole queue's bound.
        let mut last = 3u8;
        while lock(&checks.shared.queue).queued < MAX_QUEUED {
            last += 1;
            for _ in 0..QUEUED_PER_CLIENT {
                if lock(&checks.shared.queue).queued < MAX_QUEUED {
                    answers.push(
                        checks.submit(ip(last), ("p".into(), String::new(), Vec::new())).unwrap(),
                    );
                }
            }
        }
        assert!(checks.submit(ip(250), ("p".into(), String::new(), Vec::new())).is_none());
        // Clients that went away leave their checks to be dropped unverified.
        answers.clear();
        assert!(lock(&checks.shared.queue).next().is_none());
        assert_eq!(lock(&checks.shared.queue).queued, 0);
        let kept = checks.submit(ip(2), ("kept".into(), String::new(), Vec::new()));
        let mut queue = lock(&checks.shared.queue);
        assert_eq!(queue.next().map(|j| j.password), Some("kept".into()));
        drop(kept);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_hangs_up_during_basic_auth_frees_no_bcrypt_thread_early() {
        let auth = Arc::new(Auth::new(1));
        let users = Arc::new(Users::new([("u".into(), hash("p", 9))].into()).unwrap());
        let mut peak = 0;
        for round in 0..3u8 {
            let (a, u) = (Arc::clone(&auth), Arc::clone(&users));
            let first =
                tokio::spawn(async move { a.check(&u, ip(2), Some(&basic("u", "x"))).await });
            while auth.running() == 0 {
                tokio::task::yield_now().await;
            }
            // The client hangs up while its bcrypt runs; others arrive at once.
            first.abort();
            let others: Vec<_> = (0..4u8)
                .map(|i| {
                    let (a, u) = (Arc::clone(&auth), Arc::clone(&users));
                    tokio::spawn(async move {
                        a.check(&u, ip(10 + round * 4 + i), Some(&basic("u", "y"))).await
                    })
                })
                .collect();
            while others.iter().any(|o| !o.is_finished()) {
                peak = peak.max(auth.running());
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(peak, 1, "bcrypt ran {peak} at once");
    }

    #[test]
    fn a_hash_that_is_not_bcrypt_names_the_user() {
        let e = Users::new([("alice".into(), "plain".into())].into_iter().collect()).unwrap_err();
        assert_eq!(e.key, "basic_auth_users.alice");
        let hash = bcrypt::hash("x", 4).unwrap();
        let e = Users::new([("a:b".into(), hash)].into_iter().collect()).unwrap_err();
        assert!(e.message.contains("':'"), "{}", e.message);
    }
}
