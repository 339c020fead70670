//! HTTP basic authentication against `basic_auth_users` (bcrypt hashes as `htpasswd -B` makes
//! them), and the middleware that applies it and the configured headers to every path.
//!
//! A bcrypt check costs tens of milliseconds by design, so a successful (user, password) pair
//! is remembered, under an HMAC of the pair with a key made at start-up (no password is kept),
//! in a bounded cache; a scraper that sends the same credentials every 15 s pays once. Checks
//! run off the async workers, one at a time. An unknown user is checked against a configured
//! hash of the highest cost (the decoy), so the time taken does not tell whether a user exists.

use crate::ratelimit::RateLimit;
use crate::web_config::{KeyError, WebState, key_error};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Successful checks remembered per configuration; the oldest is forgotten first.
pub const CACHE_SIZE: usize = 64;

/// At most one "authentication failed" line per this interval.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The realm sent in `WWW-Authenticate`.
const CHALLENGE: &str = "Basic realm=\"amd-hsmp-exporter\", charset=\"UTF-8\"";

/// The users of one configuration, and its cache.
#[derive(Debug)]
pub struct Users {
    hashes: BTreeMap<String, String>,
    decoy: String,
    key: ring::hmac::Key,
    cache: Mutex<Cache>,
    bcrypt: Arc<Semaphore>,
    failures: RateLimit,
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

impl Users {
    /// Users from `user → bcrypt hash`; a hash that is not bcrypt is an error naming the user.
    pub(crate) fn new(hashes: BTreeMap<String, String>) -> Result<Users, KeyError> {
        let mut decoy: Option<(u32, &String)> = None;
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
            if decoy.is_none_or(|(c, _)| cost > c) {
                decoy = Some((cost, hash));
            }
        }
        let decoy = decoy.map(|(_, h)| h.clone()).unwrap_or_default();
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .map_err(|_| key_error("basic_auth_users", "no randomness for the cache key"))?;
        Ok(Users {
            hashes,
            decoy,
            key,
            cache: Mutex::new(Cache::default()),
            bcrypt: Arc::new(Semaphore::new(1)),
            failures: RateLimit::new(FAILURE_LOG_INTERVAL),
        })
    }

    /// Whether `authorization` (the header's value) names a user with the right password.
    pub async fn check(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some((user, password)) = authorization.and_then(credentials) else { return false };
        let known = self.hashes.get(&user);
        let hash = known.unwrap_or(&self.decoy).clone();
        let tag = self.tag(&user, &password);
        if known.is_some()
            && self.cache.lock().unwrap_or_else(|p| p.into_inner()).set.contains(&tag)
        {
            return true;
        }
        let Ok(_permit) = self.bcrypt.acquire().await else { return false };
        let verified = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .is_ok_and(|r| r.unwrap_or(false));
        let ok = verified && known.is_some();
        if ok {
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(tag);
        }
        ok
    }

    /// Successful checks remembered now.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).set.len()
    }

    fn tag(&self, user: &str, password: &str) -> [u8; 32] {
        let mut ctx = ring::hmac::Context::with_key(&self.key);
        ctx.update(&(user.len() as u64).to_le_bytes());
        ctx.update(user.as_bytes());
        ctx.update(password.as_bytes());
        let mut tag = [0u8; 32];
        tag.copy_from_slice(ctx.sign().as_ref());
        tag
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

/// The middleware in front of every path: the configured headers on every response, and a
/// `401` with `WWW-Authenticate` for a request without valid credentials when users are
/// configured.
pub async fn middleware(
    State(web): State<Arc<WebState>>,
    request: Request,
    next: Next,
) -> Response {
    let config = web.current();
    let mut response = match &config.users {
        None => next.run(request).await,
        Some(users) => {
            let authorization = request.headers().get(header::AUTHORIZATION).cloned();
            if users.check(authorization.as_ref()).await {
                next.run(request).await
            } else {
                if let Some(suppressed) = users.failures.check() {
                    tracing::info!(
                        path = %request.uri().path(),
                        credentials = authorization.is_some(),
                        suppressed,
                        "HTTP request refused: basic authentication failed"
                    );
                }
                let mut response = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
                response
            }
        }
    };
    for (name, value) in &config.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> HeaderValue {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    fn users(list: &[(&str, &str)]) -> Users {
        let hashes = list
            .iter()
            .map(|(u, p)| {
                let parts = bcrypt::hash_with_result(p, 4).unwrap();
                (u.to_string(), parts.format_for_version(bcrypt::Version::TwoY))
            })
            .collect();
        Users::new(hashes).unwrap()
    }

    #[tokio::test]
    async fn right_password_passes_wrong_and_unknown_do_not() {
        let users = users(&[("prometheus", "s3cret"), ("other", "x")]);
        assert!(users.check(Some(&basic("prometheus", "s3cret"))).await);
        assert!(!users.check(Some(&basic("prometheus", "wrong"))).await);
        assert!(!users.check(Some(&basic("nobody", "s3cret"))).await);
        assert!(!users.check(None).await);
        assert!(!users.check(Some(&HeaderValue::from_static("Bearer abc"))).await);
        assert!(!users.check(Some(&HeaderValue::from_static("Basic !!!"))).await);
        // The password may contain ':'; the user may not.
        let users = self::users(&[("a", "b:c")]);
        assert!(users.check(Some(&basic("a", "b:c"))).await);
    }

    #[tokio::test]
    async fn only_successes_are_cached_and_the_cache_is_bounded() {
        let users = users(&[("u", "p")]);
        assert!(!users.check(Some(&basic("u", "bad"))).await);
        assert!(!users.check(Some(&basic("ghost", "p"))).await);
        assert_eq!(users.cached(), 0);
        assert!(users.check(Some(&basic("u", "p"))).await);
        assert!(users.check(Some(&basic("u", "p"))).await);
        assert_eq!(users.cached(), 1);
        let mut cache = Cache::default();
        for i in 0..(CACHE_SIZE as u8 + 10) {
            cache.insert([i; 32]);
        }
        assert_eq!(cache.set.len(), CACHE_SIZE);
        assert_eq!(cache.order.len(), CACHE_SIZE);
        assert!(!cache.set.contains(&[0; 32]) && cache.set.contains(&[CACHE_SIZE as u8 + 9; 32]));
    }

    #[tokio::test]
    async fn an_unknown_user_is_checked_against_the_costliest_hash() {
        let cheap = bcrypt::hash("a", 4).unwrap();
        let dear = bcrypt::hash("b", 6).unwrap();
        let users =
            Users::new([("a".into(), cheap), ("b".into(), dear.clone())].into_iter().collect())
                .unwrap();
        assert_eq!(users.decoy, dear);
        // The decoy's own password does not let an unknown user in.
        assert!(!users.check(Some(&basic("ghost", "b"))).await);
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
