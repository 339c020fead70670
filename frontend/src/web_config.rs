//! `--web.config.file`: the exporter-toolkit web configuration (`tls_server_config`,
//! `http_server_config`, `basic_auth_users`), parsed strictly (an unknown key, a setting this
//! exporter cannot honour or a bad value is an error naming the key), turned into what the
//! server uses ([`Web`]), and re-read on SIGHUP or when a TLS file changes ([`WebState`]).

use crate::auth::Users;
use crate::tls::{self, Stamps, TlsFiles};
use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

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

/// A key and what is wrong with it, before the file's path is known.
#[derive(Debug)]
pub(crate) struct KeyError {
    pub(crate) key: String,
    pub(crate) message: String,
}

pub(crate) fn key_error(key: impl Into<String>, message: impl Into<String>) -> KeyError {
    KeyError { key: key.into(), message: message.into() }
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
    /// Refused: see [`refuse`].
    rate_limit: Option<serde_norway::Value>,
}

/// `tls_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsSection {
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) client_ca: Option<String>,
    pub(crate) cert_file: Option<String>,
    pub(crate) key_file: Option<String>,
    pub(crate) client_auth_type: Option<String>,
    pub(crate) client_ca_file: Option<String>,
    pub(crate) client_allowed_sans: Option<serde_norway::Value>,
    pub(crate) min_version: Option<String>,
    pub(crate) max_version: Option<String>,
    pub(crate) cipher_suites: Option<Vec<String>>,
    pub(crate) prefer_server_cipher_suites: Option<bool>,
    pub(crate) curve_preferences: Option<Vec<String>>,
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
}

impl Web {
    /// Plain HTTP, no authentication, no extra header: no `--web.config.file`.
    pub fn open() -> Web {
        Web { tls: None, users: None, headers: Vec::new() }
    }
}

/// Reads and validates `path`, loading the certificates and keys it names (relative paths are
/// taken from the file's directory, as exporter-toolkit does).
pub fn load(path: &Path) -> Result<Web, WebConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| WebConfigError::Read { path: path.to_owned(), source })?;
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
    if file.rate_limit.is_some() {
        return Err(key_error(
            "rate_limit",
            "not supported by amd-hsmp-exporter; --web.max-requests bounds concurrent scrapes",
        )
        .into());
    }
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
    Ok(Web { tls, users, headers })
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

/// The configuration in force, replaced as a whole by a successful reload. A failed reload
/// keeps it and logs why.
#[derive(Debug)]
pub struct WebState {
    path: Option<PathBuf>,
    current: RwLock<Arc<Web>>,
    /// Serializes reloads; holds the TLS files' stamps of the last failed attempt, so a broken
    /// rotation is reported once, not on every connection.
    reload: Mutex<Option<Stamps>>,
}

impl WebState {
    /// No configuration file: plain HTTP, no authentication.
    pub fn open() -> Arc<WebState> {
        Arc::new(WebState {
            path: None,
            current: RwLock::new(Arc::new(Web::open())),
            reload: Mutex::new(None),
        })
    }

    /// Loads `path`; an error here stops the start-up.
    pub fn load(path: &Path) -> Result<Arc<WebState>, WebConfigError> {
        let web = load(path)?;
        Ok(Arc::new(WebState {
            path: Some(path.to_owned()),
            current: RwLock::new(Arc::new(web)),
            reload: Mutex::new(None),
        }))
    }

    /// The configuration file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The configuration in force now.
    pub fn current(&self) -> Arc<Web> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Re-reads the file (SIGHUP). On success the new configuration serves new connections
    /// and every request from now on; on failure the old one stays and the error is returned.
    pub fn reload(&self) -> Result<(), WebConfigError> {
        let Some(path) = &self.path else { return Ok(()) };
        let mut failed = self.reload.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.reload_locked(path);
        *failed = match &result {
            Ok(()) => None,
            Err(_) => self.current().tls.as_ref().map(|t| t.files().stamps()),
        };
        result
    }

    fn reload_locked(&self, path: &Path) -> Result<(), WebConfigError> {
        let web = load(path)?;
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

    /// The configuration for a new connection: if a certificate, key or client CA file
    /// changed since it was loaded (rotation), the whole file is re-read first; a new file
    /// that does not load is logged once and the old configuration kept.
    pub fn for_connection(&self) -> Arc<Web> {
        let current = self.current();
        let (Some(path), Some(tls)) = (&self.path, &current.tls) else { return current };
        let now = tls.files().stamps();
        if now == *tls.stamps() {
            return current;
        }
        let mut failed = self.reload.lock().unwrap_or_else(|p| p.into_inner());
        if failed.as_ref() == Some(&now) {
            return self.current();
        }
        // Another connection may have reloaded while this one waited for the lock.
        let current = self.current();
        if current.tls.as_ref().is_some_and(|t| *t.stamps() == now) {
            return current;
        }
        match self.reload_locked(path) {
            Ok(()) => {
                *failed = None;
                tracing::info!(file = %path.display(), "TLS files changed: configuration reloaded");
            }
            Err(e) => {
                *failed = Some(now);
                tracing::error!(
                    error = %crate::broker::chain(&e),
                    "TLS files changed but the configuration does not load; keeping the old one"
                );
            }
        }
        self.current()
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

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        assert!(err("tls_server_config:\n  cert_fil: x\n").contains("unknown field `cert_fil`"));
        assert!(err("basic_auth: {}\n").contains("unknown field `basic_auth`"));
        assert!(err("http_server_config:\n  header: {}\n").contains("unknown field `header`"));
    }

    #[test]
    fn refused_settings_say_why() {
        assert!(err("rate_limit:\n  interval: 1s\n  burst: 1\n").starts_with("rate_limit:"));
        let e = err("http_server_config:\n  http2: true\n");
        assert!(e.starts_with("http_server_config.http2:") && e.contains("HTTP/1.1"), "{e}");
        assert!(parse("http_server_config:\n  http2: false\n", Path::new(".")).is_ok());
    }

    #[test]
    fn headers_follow_the_exporter_toolkit_allow_list() {
        let web = parse(
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    \
             Content-Security-Policy: \"default-src 'self'\"\n    X-XSS-Protection: \"\"\n",
            Path::new("."),
        )
        .unwrap();
        let names: Vec<&str> = web.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-security-policy", "x-frame-options"]);
        let e = err("http_server_config:\n  headers:\n    X-Frame-Options: allow\n");
        assert!(e.starts_with("http_server_config.headers.X-Frame-Options:"), "{e}");
        let e = err("http_server_config:\n  headers:\n    Server: x\n");
        assert!(e.contains("cannot be configured"), "{e}");
        let e = err(
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Frame-Options: deny\n",
        );
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn a_user_listed_twice_is_an_error() {
        let hash = "$2y$05$mUlr9Rj5lpHs8pxnnpAnGuuaQXHWg7/VtlpBBYXSqAkxZL1UMDDcm";
        let e = err(&format!("basic_auth_users:\n  a: '{hash}'\n  a: '{hash}'\n"));
        assert!(e.contains("duplicate key \"a\""), "{e}");
    }
}
