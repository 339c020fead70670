//! `--web.config.file`: the exporter-toolkit web configuration (`tls_server_config`,
//! `http_server_config`, `basic_auth_users`), parsed strictly (an unknown key, a setting this
//! exporter cannot honour or a bad value is an error naming the key), turned into what the
//! server uses ([`Web`]), and re-read on SIGHUP or when a TLS file changes ([`WebState`]), on a
//! thread of its own with a timeout: regular files only, each at most [`MAX_FILE_BYTES`].

use crate::auth::{Auth, Users};
use crate::files::{KeyError, MAX_FILE_BYTES, READ_TIMEOUT, key_error, read_regular};
use crate::ratelimit::{RequestRate, TokenBucket};
use crate::refused::Refusals;
use crate::tls::{self, Stamps, TlsFiles, TlsSection};
use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;

/// How long a new TLS connection waits for the check that its certificate files have not
/// changed (a `stat` of each, on the file thread).
const ROTATION_WAIT: Duration = Duration::from_secs(1);

/// What can be wrong with a web configuration file.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// The file cannot be read.
    #[error("cannot read the web configuration file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML of the expected shape (unknown key, wrong type, duplicate key).
    #[error("invalid web configuration file {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why, with the key and the line.
        #[source]
        source: serde_norway::Error,
    },
    /// A key has a value this exporter refuses.
    #[error("invalid web configuration file {path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `tls_server_config.min_version`.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// The file as written. Key names and meanings are exporter-toolkit's
/// (`docs/web-configuration.md`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsSection>,
    http_server_config: Option<HttpSection>,
    #[serde(default, deserialize_with = "unique_map")]
    basic_auth_users: Option<BTreeMap<String, String>>,
    rate_limit: Option<RateLimitSection>,
}

/// `rate_limit`: exporter-toolkit's `RateLimiterConfig`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSection {
    /// A Go duration (`"1s"`, `"500ms"`, `"1m30s"`) or, as YAML decodes a Go `time.Duration`
    /// from a number, nanoseconds; `0` (or absent) turns the limit off.
    interval: Option<serde_norway::Value>,
    burst: Option<serde_norway::Value>,
}

/// `http_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    http2: Option<bool>,
    #[serde(default, deserialize_with = "unique_map")]
    headers: Option<BTreeMap<String, String>>,
}

/// The headers `http_server_config.headers` may set, with the values allowed (`None`: any).
/// The same set as exporter-toolkit, so one file works for every exporter.
const HEADERS: &[(&str, Option<&[&str]>)] = &[
    ("Content-Security-Policy", None),
    ("Strict-Transport-Security", None),
    ("X-Content-Type-Options", Some(&["nosniff"])),
    ("X-Frame-Options", Some(&["deny", "sameorigin"])),
    ("X-XSS-Protection", None),
];

/// A validated configuration, ready to serve with.
#[derive(Debug)]
pub struct Web {
    /// TLS, if the file configures it.
    pub tls: Option<tls::Tls>,
    /// Basic-auth users; `None` when every request is let through.
    pub users: Option<Users>,
    /// Headers added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `rate_limit`: requests over all clients; `None` when off.
    pub rate_limit: Option<RequestRate>,
}

impl Web {
    /// Plain HTTP, no authentication, no extra header: no `--web.config.file`.
    pub fn open() -> Web {
        Web { tls: None, users: None, headers: Vec::new(), rate_limit: None }
    }
}

/// Reads and validates `path`, loading the certificates and keys it names (relative paths are
/// taken from the file's directory, as exporter-toolkit does).
pub fn load(path: &Path) -> Result<Web, WebConfigError> {
    let read = |source| WebConfigError::Read { path: path.to_owned(), source };
    from_bytes(read_regular(path, MAX_FILE_BYTES).map_err(read)?, path)
}

/// Validates `bytes` as the web configuration file `path` (which names the file in errors and
/// whose directory relative paths are taken from), loading the files it names.
pub fn from_bytes(bytes: Vec<u8>, path: &Path) -> Result<Web, WebConfigError> {
    let read = |source| WebConfigError::Read { path: path.to_owned(), source };
    let text =
        String::from_utf8(bytes).map_err(|_| read(std::io::Error::other("not UTF-8 text")))?;
    parse(&text, path.parent().unwrap_or(Path::new("."))).map_err(|e| match e {
        ParseError::Yaml(source) => WebConfigError::Parse { path: path.to_owned(), source },
        ParseError::Key(KeyError { key, message }) => {
            WebConfigError::Invalid { path: path.to_owned(), key, message }
        }
    })
}

#[derive(Debug)]
enum ParseError {
    Yaml(serde_norway::Error),
    Key(KeyError),
}

impl From<KeyError> for ParseError {
    fn from(e: KeyError) -> ParseError {
        ParseError::Key(e)
    }
}

fn parse(text: &str, dir: &Path) -> Result<Web, ParseError> {
    // An empty file is a valid configuration that changes nothing, as in exporter-toolkit.
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_norway::from_str::<Option<File>>(text).map_err(ParseError::Yaml)?.unwrap_or_default()
    };
    let rate_limit = match file.rate_limit {
        Some(section) => rate_limit(section)?,
        None => None,
    };
    let tls = match file.tls_server_config {
        Some(section) => tls::Tls::load(TlsFiles::from_section(section, dir)?)?,
        None => None,
    };
    let mut headers = Vec::new();
    if let Some(http) = file.http_server_config {
        if http.http2 == Some(true) {
            return Err(key_error(
                "http_server_config.http2",
                "amd-hsmp-exporter serves HTTP/1.1 only (what Prometheus scrapes with); remove \
                 the key or set it to false",
            )
            .into());
        }
        for (name, value) in http.headers.unwrap_or_default() {
            if let Some(header) = header(&name, &value)? {
                headers.push(header);
            }
        }
    }
    let users = match file.basic_auth_users {
        Some(users) if !users.is_empty() => Some(Users::new(users)?),
        _ => None,
    };
    Ok(Web { tls, users, headers, rate_limit })
}

/// `rate_limit` as exporter-toolkit reads it: off when `interval` is 0 or absent (whatever
/// `burst` says), otherwise a [`RequestRate`]; `burst` absent is 0, which refuses every request.
fn rate_limit(section: RateLimitSection) -> Result<Option<RequestRate>, KeyError> {
    use serde_norway::Value;
    let interval = match section.interval {
        None | Some(Value::Null) => Duration::ZERO,
        Some(Value::String(text)) => go_duration(&text)
            .map_err(|e| key_error("rate_limit.interval", format!("{text:?}: {e}")))?,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(nanos) => Duration::from_nanos(nanos),
            None => {
                return Err(key_error(
                    "rate_limit.interval",
                    format!("{n} is not a duration; write it as \"1s\" or \"500ms\""),
                ));
            }
        },
        Some(_) => {
            return Err(key_error(
                "rate_limit.interval",
                "not a duration; write it as \"1s\" or \"500ms\"",
            ));
        }
    };
    let burst = match section.burst {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => {
            n.as_u64().and_then(|b| u32::try_from(b).ok()).ok_or_else(|| {
                key_error("rate_limit.burst", format!("{n} is not a whole number from 0 to 2^32-1"))
            })?
        }
        Some(_) => return Err(key_error("rate_limit.burst", "not a whole number")),
    };
    if interval.is_zero() {
        return Ok(None);
    }
    if burst == 0 {
        tracing::warn!(
            "web configuration: rate_limit.burst is 0 with an interval: every request is refused \
             with 429, as in exporter-toolkit"
        );
    }
    Ok(Some(RequestRate { interval, burst }))
}

/// A duration as Go's `time.ParseDuration` reads it: a sequence of decimal numbers, each with a
/// unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), or `0`; a negative one is refused.
fn go_duration(text: &str) -> Result<Duration, String> {
    const UNITS: &[(&str, f64)] = &[
        ("ns", 1.0),
        ("us", 1e3),
        ("µs", 1e3),
        ("μs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
        ("m", 60e9),
        ("h", 3600e9),
    ];
    let grammar = "not a Go duration such as \"1s\", \"500ms\" or \"1m30s\"";
    if text.starts_with('-') {
        return Err("a negative duration".into());
    }
    let rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(grammar.into());
    }
    let mut nanos = 0.0;
    let mut rest = rest;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| grammar.to_string())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let (_, scale) =
            UNITS.iter().find(|(u, _)| *u == unit).ok_or_else(|| grammar.to_string())?;
        nanos += value * scale;
        rest = tail;
    }
    let nanos = nanos.round();
    if !(0.0..=u64::MAX as f64).contains(&nanos) {
        return Err("too long".into());
    }
    Ok(Duration::from_nanos(nanos as u64))
}

fn header(name: &str, value: &str) -> Result<Option<(HeaderName, HeaderValue)>, KeyError> {
    let key = format!("http_server_config.headers.{name}");
    let Some((_, allowed)) = HEADERS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = HEADERS.iter().map(|(n, _)| *n).collect();
        return Err(key_error(
            key,
            format!("this header cannot be configured; the ones that can: {}", names.join(", ")),
        ));
    };
    // "Unset if blank", as in exporter-toolkit.
    if value.is_empty() {
        return Ok(None);
    }
    if let Some(allowed) = allowed
        && !allowed.contains(&value)
    {
        return Err(key_error(key, format!("{value:?} is not one of {allowed:?}")));
    }
    let value = HeaderValue::from_str(value)
        .map_err(|_| key_error(&key, "the value is not a valid HTTP header value"))?;
    let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
        .map_err(|_| key_error(&key, "not a valid HTTP header name"))?;
    Ok(Some((name, value)))
}

/// A YAML mapping into a `BTreeMap`, refusing a key given twice (a user listed twice is a
/// mistake to report, not a coin toss over which hash wins).
fn unique_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping of strings to strings")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((key, value)) = map.next_entry::<String, String>()? {
                if out.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                }
                out.insert(key, value);
            }
            Ok(Some(out))
        }
    }
    deserializer.deserialize_option(Unique)
}

/// [`load`] on a thread of its own, waited for at most [`READ_TIMEOUT`]. `reading` is set
/// while such a thread runs: one that never returned (a file on a hung mount) is not joined
/// by another.
fn load_in_time(path: &Path, reading: &Arc<AtomicBool>) -> Result<Web, WebConfigError> {
    let stuck = |message: &str| WebConfigError::Invalid {
        path: path.to_owned(),
        key: "--web.config.file".into(),
        message: message.into(),
    };
    if reading.swap(true, Ordering::SeqCst) {
        return Err(stuck(
            "the last read of this file or of a file it names has not returned yet (a file on              a hung mount?); not read again until it does",
        ));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (owned, flag) = (path.to_owned(), Arc::clone(reading));
    let spawned = std::thread::Builder::new().name("web-config-read".into()).spawn(move || {
        let _ = tx.send(load(&owned));
        flag.store(false, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        reading.store(false, Ordering::SeqCst);
        return Err(WebConfigError::Read { path: path.to_owned(), source: e });
    }
    rx.recv_timeout(READ_TIMEOUT).unwrap_or_else(|_| {
        Err(stuck(&format!(
            "reading it and the files it names took longer than {}s; given up",
            READ_TIMEOUT.as_secs()
        )))
    })
}

/// The configuration in force, replaced as a whole by a successful reload. A failed reload
/// keeps it and logs why. Every file is read on a thread of its own ([`load_in_time`]) driven by
/// the file thread, never on an async worker; no lock is held while a file is read.
#[derive(Debug)]
pub struct WebState {
    path: Option<PathBuf>,
    current: RwLock<Arc<Web>>,
    auth: Auth,
    requests: TokenBucket,
    refusals: Refusals,
    files: Option<FileThread>,
}

/// What the file thread is asked to do.
#[derive(Debug, Clone, Copy)]
enum Task {
    /// Re-read the file (SIGHUP).
    Reload,
    /// Re-read it if a TLS file changed (a new TLS connection).
    Rotation,
}

/// The handle of the thread that reads the files.
#[derive(Debug)]
struct FileThread {
    tasks: std::sync::mpsc::Sender<Task>,
    /// Rotation checks started, and finished.
    started: AtomicU64,
    finished: watch::Sender<u64>,
    /// When the rotation check in progress started.
    checking: Mutex<Option<std::time::Instant>>,
}

impl WebState {
    /// No configuration file: plain HTTP, no authentication.
    pub fn open() -> Arc<WebState> {
        Arc::new(WebState {
            path: None,
            current: RwLock::new(Arc::new(Web::open())),
            auth: Auth::default(),
            requests: TokenBucket::default(),
            refusals: Refusals::default(),
            files: None,
        })
    }

    /// Loads `path`; an error here stops the start-up.
    pub fn load(path: &Path) -> Result<Arc<WebState>, WebConfigError> {
        let reading = Arc::new(AtomicBool::new(false));
        let web = load_in_time(path, &reading)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let state = Arc::new(WebState {
            path: Some(path.to_owned()),
            current: RwLock::new(Arc::new(web)),
            auth: Auth::default(),
            requests: TokenBucket::default(),
            refusals: Refusals::default(),
            files: Some(FileThread {
                tasks: tx,
                started: AtomicU64::new(0),
                finished: watch::Sender::new(0),
                checking: Mutex::new(None),
            }),
        });
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("web-config".into())
            .spawn(move || watch_files(&weak, &rx, &reading))
            .map_err(|source| WebConfigError::Read { path: path.to_owned(), source })?;
        Ok(state)
    }

    /// The configuration file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The configuration in force now.
    pub fn current(&self) -> Arc<Web> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The basic-auth checks and their cache, the same for every configuration loaded.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// The handshakes and requests refused so far, by reason.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// Whether a request may pass `rate_limit` now (always, without one). One bucket for the
    /// whole server, kept across reloads while the rate stays the same.
    pub fn allow_request(&self, web: &Web) -> bool {
        web.rate_limit.is_none_or(|rate| self.requests.allow(rate))
    }

    /// Asks for the file to be re-read (SIGHUP), without waiting: the file thread reads it,
    /// swaps the configuration in on success (new connections and every request from then
    /// on), and logs the outcome. `false` without a configuration file.
    pub fn request_reload(&self) -> bool {
        self.send(Task::Reload)
    }

    fn send(&self, task: Task) -> bool {
        let Some(files) = &self.files else { return false };
        files.tasks.send(task).is_ok()
    }

    /// The configuration for a new connection: with TLS, a check that a certificate, key or
    /// client CA file has not changed since it was loaded (rotation) is made first, on the
    /// file thread, after this call began; a changed file gets the whole configuration re-read.
    /// The wait is at most [`ROTATION_WAIT`], and none while a check is stuck past it: the
    /// configuration in force is used then.
    pub async fn for_connection(&self) -> Arc<Web> {
        let current = self.current();
        let (Some(files), Some(_)) = (&self.files, &current.tls) else { return current };
        let stuck = files
            .checking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|since| since.elapsed() > ROTATION_WAIT);
        if stuck {
            return current;
        }
        let after = files.started.load(Ordering::SeqCst);
        let mut finished = files.finished.subscribe();
        if !self.send(Task::Rotation) {
            return current;
        }
        let _ = tokio::time::timeout(ROTATION_WAIT, finished.wait_for(|n| *n > after)).await;
        self.current()
    }

    /// Reads the file and swaps the new configuration in; the old one stays on error.
    fn swap_in(&self, path: &Path, reading: &Arc<AtomicBool>) -> Result<(), WebConfigError> {
        let web = load_in_time(path, reading)?;
        let was_tls = self.current().tls.is_some();
        if web.tls.is_some() != was_tls {
            return Err(WebConfigError::Invalid {
                path: path.to_owned(),
                key: "tls_server_config".into(),
                message: "a reload cannot turn TLS on or off; restart amd-hsmp-exporter".into(),
            });
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(web);
        Ok(())
    }
}

/// The file thread: serves reloads and rotation checks until the [`WebState`] is gone. Holds
/// the TLS files' stamps of the last failed attempt, so a broken rotation is reported once,
/// not on every connection.
fn watch_files(
    state: &std::sync::Weak<WebState>,
    tasks: &std::sync::mpsc::Receiver<Task>,
    reading: &Arc<AtomicBool>,
) {
    let mut failed: Option<Stamps> = None;
    while let Ok(first) = tasks.recv() {
        let (mut reload, mut rotation) = (false, false);
        for task in std::iter::once(first).chain(tasks.try_iter()) {
            match task {
                Task::Reload => reload = true,
                Task::Rotation => rotation = true,
            }
        }
        let Some(state) = state.upgrade() else { return };
        let (Some(path), Some(files)) = (&state.path, &state.files) else { return };
        if reload {
            match state.swap_in(path, reading) {
                Ok(()) => {
                    failed = None;
                    tracing::info!(file = %path.display(), "SIGHUP: web configuration reloaded");
                }
                Err(e) => {
                    failed = state.current().tls.as_ref().map(|t| t.files().stamps());
                    tracing::error!(
                        error = %amd_hsmp_cli::chain(&e),
                        "SIGHUP: web configuration not reloaded, the old one stays"
                    );
                }
            }
        }
        if rotation {
            let number = files.started.fetch_add(1, Ordering::SeqCst) + 1;
            *files.checking.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(std::time::Instant::now());
            check_rotation(&state, path, reading, &mut failed);
            *files.checking.lock().unwrap_or_else(|p| p.into_inner()) = None;
            files.finished.send_replace(number);
        }
    }
}

/// Re-reads the configuration if a TLS file changed since it was loaded.
fn check_rotation(
    state: &WebState,
    path: &Path,
    reading: &Arc<AtomicBool>,
    failed: &mut Option<Stamps>,
) {
    let current = state.current();
    let Some(tls) = &current.tls else { return };
    let now = tls.files().stamps();
    if now == *tls.stamps() || failed.as_ref() == Some(&now) {
        return;
    }
    match state.swap_in(path, reading) {
        Ok(()) => {
            *failed = None;
            tracing::info!(file = %path.display(), "TLS files changed: configuration reloaded");
        }
        Err(e) => {
            *failed = Some(now);
            tracing::error!(
                error = %amd_hsmp_cli::chain(&e),
                "TLS files changed but the configuration does not load; keeping the old one"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse(text, Path::new("/nonexistent")) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(ParseError::Yaml(e)) => e.to_string(),
            Err(ParseError::Key(KeyError { key, message })) => format!("{key}: {message}"),
        }
    }

    #[test]
    fn an_empty_file_serves_plain_http_without_auth() {
        for text in ["", "\n", "---\n", "{}"] {
            let web = parse(text, Path::new(".")).unwrap();
            assert!(web.tls.is_none() && web.users.is_none() && web.headers.is_empty());
        }
    }

    /// The cases of `web/testdata/`, one file each as exporter-toolkit's `web/testdata/`.
    fn testdata() -> Vec<(String, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        let mut cases: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&path).unwrap())
            })
            .collect();
        cases.sort();
        cases
    }

    /// A `*.good.yml` loads; a `*.bad.yml` is refused with the error its first line names
    /// (`# error: ...`): unknown keys named, refused settings saying why, the header allow-list,
    /// duplicate users and headers.
    #[test]
    fn every_testdata_case_loads_or_is_refused_as_it_says() {
        let (mut good, mut bad) = (0, 0);
        for (name, text) in testdata() {
            if name.ends_with(".good.yml") {
                if let Err(e) = parse(&text, Path::new(".")) {
                    panic!("{name} refused: {e:?}");
                }
                good += 1;
            } else if name.ends_with(".bad.yml") {
                let Some(expected) = text.lines().next().and_then(|l| l.strip_prefix("# error: "))
                else {
                    panic!("{name}: its first line must be `# error: <what the error says>`");
                };
                let e = err(&text);
                assert!(e.contains(expected), "{name}: {e:?} does not say {expected:?}");
                bad += 1;
            } else {
                panic!("{name}: a case is a .good.yml or a .bad.yml");
            }
        }
        assert!(good >= 5 && bad >= 9, "{good} good and {bad} bad cases");
    }

    #[test]
    fn rate_limit_reads_go_durations_and_zero_turns_it_off() {
        let rate = |text: &str| parse(text, Path::new(".")).map(|w| w.rate_limit).unwrap();
        let expect =
            |ms: u64, burst: u32| Some(RequestRate { interval: Duration::from_millis(ms), burst });
        assert_eq!(rate("rate_limit:\n  interval: 1s\n  burst: 5\n"), expect(1000, 5));
        assert_eq!(rate("rate_limit:\n  interval: 1m30s\n  burst: 1\n"), expect(90_000, 1));
        assert_eq!(
            rate("rate_limit:\n  interval: 1.5ms\n  burst: 1\n"),
            expect(1, 1).map(|r| { RequestRate { interval: Duration::from_micros(1500), ..r } })
        );
        // A number is nanoseconds, as YAML decodes a Go time.Duration.
        assert_eq!(rate("rate_limit:\n  interval: 250000000\n  burst: 2\n"), expect(250, 2));
        // No interval, or 0: off, whatever the burst, as in exporter-toolkit.
        assert_eq!(rate("rate_limit:\n  burst: 5\n"), None);
        assert_eq!(rate("rate_limit:\n  interval: 0\n  burst: 5\n"), None);
        assert_eq!(rate("rate_limit:\n  interval: \"0\"\n"), None);
        assert_eq!(rate("rate_limit: {}\n"), None);
        // An interval without a burst refuses every request, as there.
        assert_eq!(rate("rate_limit:\n  interval: 1s\n"), expect(1000, 0));
        for (text, says) in [
            ("rate_limit:\n  interval: 1\n  burst: -1\n", "rate_limit.burst: -1"),
            ("rate_limit:\n  interval: 1s\n  burst: 1.5\n", "rate_limit.burst:"),
            ("rate_limit:\n  interval: -1s\n", "rate_limit.interval: \"-1s\": a negative"),
            ("rate_limit:\n  interval: 10\n  burst: x\n", "rate_limit.burst: not a whole"),
            ("rate_limit:\n  interval: 1d\n", "rate_limit.interval: \"1d\": not a Go duration"),
            ("rate_limit:\n  interval: 1s5\n", "rate_limit.interval:"),
            ("rate_limit:\n  interval: s\n", "rate_limit.interval:"),
            ("rate_limit:\n  interval: [1]\n", "rate_limit.interval: not a duration"),
            ("rate_limit:\n  interval: 1s\n  per_client: true\n", "unknown field `per_client`"),
        ] {
            let e = err(text);
            assert!(e.contains(says), "{text:?}: {e:?} does not say {says:?}");
        }
    }

    #[test]
    fn headers_follow_the_exporter_toolkit_allow_list_in_its_order() {
        let (_, text) = testdata().into_iter().find(|(n, _)| n == "headers.good.yml").unwrap();
        let web = parse(&text, Path::new(".")).unwrap();
        let names: Vec<&str> = web.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-security-policy", "x-frame-options"]);
    }

    #[test]
    fn only_regular_files_within_the_cap_are_read_and_a_fifo_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        // No writer ever opens it: a blocking open would wait here for good.
        let e = read_regular(&fifo, 10).unwrap_err();
        assert!(e.to_string().contains("not a regular file (a FIFO)"), "{e}");
        let e = read_regular(dir.path(), 10).unwrap_err();
        assert!(e.to_string().contains("(a directory)"), "{e}");
        let e = read_regular(Path::new("/dev/null"), 10).unwrap_err();
        assert!(e.to_string().contains("(a device)"), "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(read_regular(&file, 10).unwrap(), b"0123456789");
        let e = read_regular(&file, 9).unwrap_err();
        assert!(e.to_string().contains("larger than the 9-byte limit"), "{e}");
        // A FIFO as the configuration file is an error naming it, at once.
        let e = load(&fifo).unwrap_err();
        assert!(amd_hsmp_cli::chain(&e).contains("not a regular file (a FIFO)"), "{e:?}");
    }
}
