//! `tls_server_config` as a rustls server configuration (ring provider): certificate and key
//! (files or inline PEM), client certificates by exporter-toolkit's `client_auth_type`,
//! TLS 1.2/1.3 bounds, cipher suites and curves by their Go names, and the file stamps that
//! tell when a rotated certificate is to be loaded.

use crate::files::{KeyError, MAX_FILE_BYTES, key_error, read_regular};
use crate::x509;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, SupportedKxGroup, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme, SupportedCipherSuite,
    SupportedProtocolVersion,
};
use serde::Deserialize;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

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
    pub(crate) client_allowed_sans: Option<Vec<String>>,
    pub(crate) min_version: Option<String>,
    pub(crate) max_version: Option<String>,
    pub(crate) cipher_suites: Option<Vec<String>>,
    pub(crate) prefer_server_cipher_suites: Option<bool>,
    pub(crate) curve_preferences: Option<Vec<String>>,
}

/// The largest certificate chain served, in DER bytes: a TLS 1.3 `Certificate` message above
/// 64 KiB is refused by rustls clients (and Go's limit for other handshake messages is the same).
pub const MAX_CHAIN_BYTES: usize = 60 * 1024;

/// Where the certificate, key and client CA come from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    cert: Source,
    key: Source,
    client_ca: Option<Source>,
    section: Settings,
}

#[derive(Debug, Clone)]
enum Source {
    File(PathBuf),
    Inline(String),
}

/// The settings of `tls_server_config` other than the PEM material.
#[derive(Debug, Clone)]
struct Settings {
    client_auth: ClientAuth,
    min_version: Version,
    max_version: Version,
    cipher_suites: Vec<String>,
    prefer_server_cipher_suites: bool,
    curve_preferences: Vec<String>,
    /// `client_allowed_sans`: a client certificate must name one of these.
    allowed_sans: Option<Vec<String>>,
    /// Where the system's CA bundle is looked for when client certificates are verified without
    /// a client CA (`VerifyClientCertIfGiven` alone), as Go looks: `SSL_CERT_FILE`, else the
    /// first of [`SYSTEM_CA_FILES`] that reads.
    system_ca_files: Vec<PathBuf>,
}

/// Go's list of the system CA bundles on Linux (`crypto/x509/root_linux.go`), in its order.
const SYSTEM_CA_FILES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// exporter-toolkit's `client_auth_type` (Go's `tls.ClientAuthType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    NoClientCert,
    /// One is asked for, not required, and not verified.
    RequestClientCert,
    /// One is required but not verified against a CA (only its key's possession is checked).
    RequireAnyClientCert,
    /// One is optional; if sent, it must chain to `client_ca_file`.
    VerifyClientCertIfGiven,
    /// One is required and must chain to `client_ca_file`.
    RequireAndVerifyClientCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Version {
    Tls12,
    Tls13,
}

/// Identity of the TLS files at one moment (device, inode, size, mtime of each), to notice a
/// rotation without reading them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamps(Vec<Option<Stamp>>);

/// One file's device, inode, size and modification time (seconds, nanoseconds).
type Stamp = (u64, u64, u64, i64, i64);

impl TlsFiles {
    /// The PEM sources and settings of `section`, relative paths taken from `dir`; `None` when
    /// the section configures no TLS at all (an empty `tls_server_config`).
    pub(crate) fn from_section(
        section: TlsSection,
        dir: &Path,
    ) -> Result<Option<TlsFiles>, KeyError> {
        let key = |name: &str| format!("tls_server_config.{name}");
        let enabling = section.cert.is_some()
            || section.cert_file.is_some()
            || section.key.is_some()
            || section.key_file.is_some()
            || section.client_ca.is_some()
            || section.client_ca_file.is_some()
            || section.client_auth_type.is_some();
        let other = section.min_version.is_some()
            || section.max_version.is_some()
            || section.cipher_suites.is_some()
            || section.curve_preferences.is_some()
            || section.prefer_server_cipher_suites.is_some()
            || section.client_allowed_sans.is_some();
        if !enabling {
            if other {
                return Err(key_error(
                    "tls_server_config",
                    "TLS settings without cert_file (or cert) and key_file (or key)",
                ));
            }
            return Ok(None);
        }
        let source =
            |file: Option<String>, inline: Option<String>, name: &str, file_name: &str| match (
                file, inline,
            ) {
                (Some(_), Some(_)) => {
                    Err(key_error(key(file_name), format!("give one of {file_name} and {name}")))
                }
                (Some(f), None) if f.is_empty() => Err(key_error(key(file_name), "an empty path")),
                (Some(f), None) => Ok(Some(Source::File(dir.join(f)))),
                (None, Some(pem)) => Ok(Some(Source::Inline(pem))),
                (None, None) => Ok(None),
            };
        let cert = source(section.cert_file, section.cert, "cert", "cert_file")?
            .ok_or_else(|| key_error(key("cert_file"), "missing (or cert)"))?;
        let pem_key = source(section.key_file, section.key, "key", "key_file")?
            .ok_or_else(|| key_error(key("key_file"), "missing (or key)"))?;
        let client_ca =
            source(section.client_ca_file, section.client_ca, "client_ca", "client_ca_file")?;
        let client_auth = match section.client_auth_type.as_deref() {
            None | Some("" | "NoClientCert") => ClientAuth::NoClientCert,
            Some("RequestClientCert") => ClientAuth::RequestClientCert,
            // The second name is kept by exporter-toolkit for backward compatibility.
            Some("RequireAnyClientCert" | "RequireClientCert") => ClientAuth::RequireAnyClientCert,
            Some("VerifyClientCertIfGiven") => ClientAuth::VerifyClientCertIfGiven,
            Some("RequireAndVerifyClientCert") => ClientAuth::RequireAndVerifyClientCert,
            Some(other) => {
                return Err(key_error(
                    key("client_auth_type"),
                    format!(
                        "{other:?} is not one of NoClientCert, RequestClientCert, \
                         RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
                    ),
                ));
            }
        };
        match (client_auth, &client_ca) {
            (ClientAuth::NoClientCert, Some(_)) => {
                return Err(key_error(
                    key("client_auth_type"),
                    "a client CA is configured but client_auth_type is NoClientCert; use \
                     RequireAndVerifyClientCert",
                ));
            }
            (ClientAuth::RequireAndVerifyClientCert, None) => {
                return Err(key_error(
                    key("client_ca_file"),
                    "required with RequireAndVerifyClientCert (or client_ca): without it Go would \
                     admit a client certificate of any CA the system trusts",
                ));
            }
            _ => {}
        }
        match (&section.client_allowed_sans, client_auth) {
            (Some(sans), _) if sans.is_empty() => {
                return Err(key_error(
                    key("client_allowed_sans"),
                    "an empty list admits no client; list the SANs to admit or remove the key",
                ));
            }
            (Some(_), ClientAuth::NoClientCert) => {
                return Err(key_error(
                    key("client_allowed_sans"),
                    "no client certificate is asked for with client_auth_type NoClientCert, so \
                     no SAN can be checked; use RequireAndVerifyClientCert",
                ));
            }
            _ => {}
        }
        let version = |name: &str, value: Option<String>, default: Version| match value.as_deref() {
            None => Ok(default),
            Some("TLS12") => Ok(Version::Tls12),
            Some("TLS13") => Ok(Version::Tls13),
            Some(v @ ("TLS10" | "TLS11")) => Err(key_error(
                key(name),
                format!("{v} is not supported (rustls implements TLS 1.2 and 1.3 only); use TLS12"),
            )),
            Some(v) => Err(key_error(key(name), format!("{v:?} is not one of TLS12, TLS13"))),
        };
        let min_version = version("min_version", section.min_version, Version::Tls12)?;
        let max_version = version("max_version", section.max_version, Version::Tls13)?;
        if min_version > max_version {
            return Err(key_error(key("min_version"), "above max_version"));
        }
        let settings = Settings {
            client_auth,
            min_version,
            max_version,
            cipher_suites: section.cipher_suites.unwrap_or_default(),
            // exporter-toolkit's default is true.
            prefer_server_cipher_suites: section.prefer_server_cipher_suites.unwrap_or(true),
            curve_preferences: section.curve_preferences.unwrap_or_default(),
            allowed_sans: section.client_allowed_sans,
            system_ca_files: match std::env::var_os("SSL_CERT_FILE") {
                Some(file) if !file.is_empty() => vec![PathBuf::from(file)],
                _ => SYSTEM_CA_FILES.iter().map(PathBuf::from).collect(),
            },
        };
        // Resolve names now, so a bad one is reported even before any file is read.
        settings.provider()?;
        Ok(Some(TlsFiles { cert, key: pem_key, client_ca, section: settings }))
    }

    /// The stamps of the files now (inline PEM has none).
    pub fn stamps(&self) -> Stamps {
        let stamp = |source: &Source| match source {
            Source::Inline(_) => None,
            Source::File(path) => std::fs::metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec())),
        };
        let mut stamps = vec![stamp(&self.cert), stamp(&self.key)];
        stamps.extend(self.client_ca.as_ref().map(stamp));
        Stamps(stamps)
    }
}

/// Go's names of the cipher suites rustls with ring implements.
const CIPHER_SUITES: &[(&str, SupportedCipherSuite)] = {
    use rustls::crypto::ring::cipher_suite as cs;
    &[
        ("TLS_AES_128_GCM_SHA256", cs::TLS13_AES_128_GCM_SHA256),
        ("TLS_AES_256_GCM_SHA384", cs::TLS13_AES_256_GCM_SHA384),
        ("TLS_CHACHA20_POLY1305_SHA256", cs::TLS13_CHACHA20_POLY1305_SHA256),
        ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
        ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
        ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ]
};

/// Suites Go's `tls.CipherSuites()` lists (so exporter-toolkit accepts them) that rustls does
/// not implement: CBC modes and RSA key exchange.
const GO_ONLY_CIPHER_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
];

impl Settings {
    /// The ring provider narrowed to the configured suites and curves, in their order.
    fn provider(&self) -> Result<CryptoProvider, KeyError> {
        let mut provider = rustls::crypto::ring::default_provider();
        let mut tls12 = Vec::new();
        let mut tls13 = Vec::new();
        for name in &self.cipher_suites {
            let key = "tls_server_config.cipher_suites";
            let Some((_, suite)) = CIPHER_SUITES.iter().find(|(n, _)| n == name) else {
                if GO_ONLY_CIPHER_SUITES.contains(&name.as_str()) {
                    return Err(key_error(
                        key,
                        format!("{name} is not supported by rustls (no CBC or RSA key exchange)"),
                    ));
                }
                let known: Vec<&str> = CIPHER_SUITES.iter().map(|(n, _)| *n).collect();
                return Err(key_error(
                    key,
                    format!("unknown cipher suite {name:?}; supported: {}", known.join(", ")),
                ));
            };
            match suite {
                SupportedCipherSuite::Tls12(_) => tls12.push(*suite),
                SupportedCipherSuite::Tls13(_) => tls13.push(*suite),
            }
        }
        // A family left out of the list keeps rustls' defaults, as Go keeps its TLS 1.3 ones.
        if !tls12.is_empty() || !tls13.is_empty() {
            let defaults = std::mem::take(&mut provider.cipher_suites);
            let keep = |tls13_family: bool| {
                defaults
                    .iter()
                    .filter(move |s| matches!(s, SupportedCipherSuite::Tls13(_)) == tls13_family)
                    .copied()
            };
            let tls13: Vec<_> = if tls13.is_empty() { keep(true).collect() } else { tls13 };
            let tls12: Vec<_> = if tls12.is_empty() { keep(false).collect() } else { tls12 };
            provider.cipher_suites = tls13.into_iter().chain(tls12).collect();
        }
        if !self.curve_preferences.is_empty() {
            let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
            for name in &self.curve_preferences {
                use rustls::crypto::ring::kx_group;
                let group: &'static dyn SupportedKxGroup = match name.as_str() {
                    "X25519" => kx_group::X25519,
                    "CurveP256" => kx_group::SECP256R1,
                    "CurveP384" => kx_group::SECP384R1,
                    "CurveP521" => {
                        return Err(key_error(
                            "tls_server_config.curve_preferences",
                            "CurveP521 is not supported by rustls' ring provider",
                        ));
                    }
                    other => {
                        return Err(key_error(
                            "tls_server_config.curve_preferences",
                            format!("{other:?} is not one of X25519, CurveP256, CurveP384"),
                        ));
                    }
                };
                groups.push(group);
            }
            provider.kx_groups = groups;
        }
        Ok(provider)
    }

    fn versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        let mut versions = Vec::new();
        if self.max_version >= Version::Tls13 {
            versions.push(&rustls::version::TLS13);
        }
        if self.min_version <= Version::Tls12 {
            versions.push(&rustls::version::TLS12);
        }
        versions
    }
}

/// A loaded TLS configuration.
#[derive(Debug)]
pub struct Tls {
    config: Arc<ServerConfig>,
    files: TlsFiles,
    stamps: Stamps,
}

impl Tls {
    /// Reads the certificate, key and client CA and builds the rustls configuration.
    pub(crate) fn load(files: Option<TlsFiles>) -> Result<Option<Tls>, KeyError> {
        let Some(files) = files else { return Ok(None) };
        // Stamped before reading, so a file replaced while being read is read again later.
        let stamps = files.stamps();
        let config = files.server_config()?;
        Ok(Some(Tls { config: Arc::new(config), files, stamps }))
    }

    /// Accepts TLS connections with this configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.config))
    }

    /// Where the PEM material came from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The files' stamps when they were read.
    pub fn stamps(&self) -> &Stamps {
        &self.stamps
    }
}

fn read(source: &Source, key: &str) -> Result<Vec<u8>, KeyError> {
    match source {
        Source::Inline(pem) => Ok(pem.as_bytes().to_vec()),
        Source::File(path) => read_regular(path, MAX_FILE_BYTES).map_err(|e| {
            key_error(
                format!("tls_server_config.{key}"),
                format!("cannot read {}: {e}", path.display()),
            )
        }),
    }
}

fn certificates(pem: &[u8], key: &str) -> Result<Vec<CertificateDer<'static>>, KeyError> {
    let key = format!("tls_server_config.{key}");
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| key_error(&key, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(key_error(key, "no PEM certificate in it"));
    }
    Ok(certs)
}

impl TlsFiles {
    fn names(&self, file: &'static str, inline: &'static str, source: &Source) -> &'static str {
        match source {
            Source::File(_) => file,
            Source::Inline(_) => inline,
        }
    }

    fn server_config(&self) -> Result<ServerConfig, KeyError> {
        let cert_key = self.names("cert_file", "cert", &self.cert);
        let key_key = self.names("key_file", "key", &self.key);
        let chain = certificates(&read(&self.cert, cert_key)?, cert_key)?;
        let size: usize = chain.iter().map(|c| c.len()).sum();
        if size > MAX_CHAIN_BYTES {
            return Err(key_error(
                format!("tls_server_config.{cert_key}"),
                format!(
                    "the certificate chain is {size} bytes ({} certificates) in DER, above the \
                     {MAX_CHAIN_BYTES}-byte limit: TLS clients refuse a chain that large",
                    chain.len()
                ),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key, key_key)?).map_err(|e| {
            key_error(
                format!("tls_server_config.{key_key}"),
                format!("no usable PEM private key: {e}"),
            )
        })?;
        let settings = &self.section;
        let provider = Arc::new(settings.provider()?);
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&settings.versions())
            .map_err(|e| {
                key_error(
                    "tls_server_config.cipher_suites",
                    format!("no cipher suite left for the TLS versions allowed: {e}"),
                )
            })?;
        let verifier = self.client_verifier(&provider)?;
        let mut config = builder
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| {
            key_error(
                format!("tls_server_config.{key_key}"),
                format!("the key does not go with the certificate: {e}"),
            )
        })?;
        config.ignore_client_order = settings.prefer_server_cipher_suites;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    fn client_verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, KeyError> {
        let settings = &self.section;
        let auth = settings.client_auth;
        if auth == ClientAuth::NoClientCert {
            return Ok(WebPkiClientVerifier::no_client_auth());
        }
        let mut roots = RootCertStore::empty();
        let mut anchors = Vec::new();
        if let Some(ca) = &self.client_ca {
            let name = self.names("client_ca_file", "client_ca", ca);
            for cert in certificates(&read(ca, name)?, name)? {
                roots.add(cert.clone()).map_err(|e| {
                    key_error(
                        format!("tls_server_config.{name}"),
                        format!("not a CA certificate: {e}"),
                    )
                })?;
                anchors.push(cert);
            }
        }
        // The configured CAs only are named to the client, as Go names its ClientCAs.
        let hints = roots.subjects();
        let verify = matches!(
            auth,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        );
        if verify && self.client_ca.is_none() {
            system_roots(&settings.system_ca_files, &mut roots);
        }
        let chain = if verify {
            let webpki = if roots.is_empty() {
                None
            } else {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(provider),
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| {
                    key_error("tls_server_config.client_ca_file", format!("unusable: {e}"))
                })?;
                Some(verifier)
            };
            Some(Chain { anchors, webpki })
        } else {
            None
        };
        Ok(Arc::new(ClientVerifier {
            // Go calls exporter-toolkit's SAN check also when no certificate is given, and it
            // fails then: with client_allowed_sans a certificate is required.
            mandatory: matches!(
                auth,
                ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert
            ) || settings.allowed_sans.is_some(),
            chain,
            allowed_sans: settings.allowed_sans.clone(),
            hints,
            algorithms: provider.signature_verification_algorithms,
        }))
    }
}

/// Adds the system's CA bundle to `roots`, as Go's `x509.SystemCertPool` reads it on Linux:
/// the first of `files` that can be read (certificates it cannot use skipped, as Go skips them).
/// Without one, a given client certificate is refused, as Go refuses it then.
fn system_roots(files: &[PathBuf], roots: &mut RootCertStore) {
    for file in files {
        let Ok(pem) = read_regular(file, MAX_FILE_BYTES) else { continue };
        let certs = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok);
        let (added, _) = roots.add_parsable_certificates(certs);
        if added > 0 {
            tracing::info!(
                file = %file.display(),
                added,
                "VerifyClientCertIfGiven without client_ca_file: a client certificate given is \
                 verified against the system's CAs, as exporter-toolkit does"
            );
            return;
        }
    }
    tracing::warn!(
        "VerifyClientCertIfGiven without client_ca_file and no system CA bundle found: clients \
         without a certificate are admitted, a client certificate given is refused"
    );
}

/// The verification of `VerifyClientCertIfGiven` and `RequireAndVerifyClientCert`.
#[derive(Debug)]
struct Chain {
    /// The configured client CA certificates: one presented as the client's certificate is
    /// taken, as Go's `x509.Verify` takes a certificate of its root pool as a chain of one.
    anchors: Vec<CertificateDer<'static>>,
    /// A chain to the configured CAs (or the system's); `None` without any CA.
    webpki: Option<Arc<dyn ClientCertVerifier>>,
}

/// The client certificate check of every `client_auth_type` that asks for one: the chain
/// (`Verify*` only), then `client_allowed_sans`; the handshake signature always proves the
/// client holds the certificate's key.
#[derive(Debug)]
struct ClientVerifier {
    mandatory: bool,
    chain: Option<Chain>,
    allowed_sans: Option<Vec<String>>,
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

/// A client certificate byte-identical to a configured CA, as Go checks it: within its
/// validity period, and an extended key usage that allows client authentication (none, any,
/// or clientAuth).
fn anchor_as_client(end_entity: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    use rustls::CertificateError;
    let bad = |e: CertificateError| rustls::Error::InvalidCertificate(e);
    let parsed = x509::parse(end_entity).ok_or(bad(CertificateError::BadEncoding))?;
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if now < parsed.not_before {
        return Err(bad(CertificateError::NotValidYet));
    }
    if now > parsed.not_after {
        return Err(bad(CertificateError::Expired));
    }
    match &parsed.eku {
        Some(usages)
            if !usages.iter().any(|u| u.as_slice() == x509::CLIENT_AUTH || u == x509::ANY_EKU) =>
        {
            Err(bad(CertificateError::InvalidPurpose))
        }
        _ => Ok(()),
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if let Some(chain) = &self.chain {
            if chain.anchors.iter().any(|a| a.as_ref() == end_entity.as_ref()) {
                anchor_as_client(end_entity, now)?;
            } else if let Some(webpki) = &chain.webpki {
                webpki.verify_client_cert(end_entity, intermediates, now)?;
            } else {
                return Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer,
                ));
            }
        }
        if let Some(allowed) = &self.allowed_sans {
            // exporter-toolkit's rule: one of the certificate's DNS names, e-mail addresses,
            // IP addresses or URIs equals (case and all) one of the list.
            let parsed = x509::parse(end_entity)
                .ok_or(rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
            if !parsed.sans.iter().any(|san| allowed.contains(san)) {
                return Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ));
            }
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn section(yaml: &str) -> TlsSection {
        serde_norway::from_str(yaml).unwrap()
    }

    fn error(yaml: &str) -> String {
        match TlsFiles::from_section(section(yaml), Path::new("/etc/x")) {
            Ok(_) => panic!("accepted:\n{yaml}"),
            Err(KeyError { key, message }) => format!("{key}: {message}"),
        }
    }

    const FILES: &str = "cert_file: c.pem\nkey_file: k.pem\n";

    #[test]
    fn settings_that_rustls_cannot_honour_name_their_key() {
        let e = error(&format!("{FILES}min_version: TLS11\n"));
        assert!(e.starts_with("tls_server_config.min_version: TLS11 is not supported"), "{e}");
        let e = error(&format!("{FILES}max_version: TLS10\n"));
        assert!(e.starts_with("tls_server_config.max_version:"), "{e}");
        let e = error(&format!("{FILES}cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]\n"));
        assert!(e.contains("not supported by rustls"), "{e}");
        let e = error(&format!("{FILES}cipher_suites: [TLS_MADE_UP]\n"));
        assert!(e.contains("unknown cipher suite") && e.contains("supported:"), "{e}");
        let e = error(&format!("{FILES}curve_preferences: [CurveP521]\n"));
        assert!(e.starts_with("tls_server_config.curve_preferences:"), "{e}");
        let e = error(&format!("{FILES}client_allowed_sans: [a]\n"));
        assert!(e.starts_with("tls_server_config.client_allowed_sans: no client certificate"));
        let e = error(&format!(
            "{FILES}client_auth_type: RequestClientCert\nclient_allowed_sans: []\n"
        ));
        assert!(e.starts_with("tls_server_config.client_allowed_sans: an empty list"), "{e}");
        let e = error(&format!("{FILES}client_auth_type: Sometimes\n"));
        assert!(e.starts_with("tls_server_config.client_auth_type:"), "{e}");
    }

    #[test]
    fn client_auth_and_client_ca_must_agree() {
        let e = error(&format!("{FILES}client_ca_file: ca.pem\n"));
        assert!(e.contains("NoClientCert"), "{e}");
        let e = error(&format!("{FILES}client_auth_type: RequireAndVerifyClientCert\n"));
        assert!(e.starts_with("tls_server_config.client_ca_file: required"), "{e}");
        let e = error("cert: x\ncert_file: c.pem\nkey_file: k.pem\n");
        assert!(e.contains("give one of cert_file and cert"), "{e}");
        let e = error("min_version: TLS12\n");
        assert!(e.contains("without cert_file"), "{e}");
        assert!(error("cert_file: c.pem\n").starts_with("tls_server_config.key_file: missing"));
    }

    #[test]
    fn suites_narrow_only_the_version_they_name_and_paths_are_relative_to_the_file() {
        let yaml = format!(
            "{FILES}cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n\
             curve_preferences: [CurveP384, X25519]\nclient_auth_type: RequireClientCert\n"
        );
        let files = TlsFiles::from_section(section(&yaml), Path::new("/etc/x")).unwrap().unwrap();
        assert!(matches!(&files.cert, Source::File(p) if p == Path::new("/etc/x/c.pem")));
        assert_eq!(files.section.client_auth, ClientAuth::RequireAnyClientCert);
        let provider = files.section.provider().unwrap();
        let names: Vec<String> =
            provider.cipher_suites.iter().map(|s| format!("{:?}", s.suite())).collect();
        assert_eq!(names.iter().filter(|n| n.starts_with("TLS13_")).count(), 3, "{names:?}");
        assert_eq!(names.last().unwrap(), "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "{names:?}");
        assert_eq!(names.len(), 4);
        let groups: Vec<String> =
            provider.kx_groups.iter().map(|g| format!("{:?}", g.name())).collect();
        assert_eq!(groups, ["secp384r1", "X25519"]);
    }

    #[test]
    fn a_key_that_does_not_go_with_the_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let one = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let two = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.path().join("c.pem"), one.cert.pem()).unwrap();
        std::fs::write(dir.path().join("k.pem"), two.serialize_pem()).unwrap();
        let files = TlsFiles::from_section(section(FILES), dir.path()).unwrap();
        let e = Tls::load(files).unwrap_err();
        assert_eq!(e.key, "tls_server_config.key_file", "{}", e.message);
        std::fs::write(dir.path().join("k.pem"), one.signing_key.serialize_pem()).unwrap();
        let files = TlsFiles::from_section(section(FILES), dir.path()).unwrap();
        let tls = Tls::load(files).unwrap().unwrap();
        assert_eq!(*tls.stamps(), tls.files().stamps());
    }

    #[test]
    fn a_certificate_chain_above_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let one = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let pem = one.cert.pem();
        let copies = MAX_CHAIN_BYTES / one.cert.der().len() + 1;
        std::fs::write(dir.path().join("c.pem"), pem.repeat(copies)).unwrap();
        std::fs::write(dir.path().join("k.pem"), one.signing_key.serialize_pem()).unwrap();
        let files = TlsFiles::from_section(section(FILES), dir.path()).unwrap();
        let e = Tls::load(files).unwrap_err();
        assert_eq!(e.key, "tls_server_config.cert_file", "{}", e.message);
        assert!(e.message.contains(&format!("{copies} certificates")), "{}", e.message);
        // A file above the read cap is refused before it is parsed.
        std::fs::write(
            dir.path().join("c.pem"),
            pem.repeat(MAX_FILE_BYTES as usize / pem.len() + 1),
        )
        .unwrap();
        let files = TlsFiles::from_section(section(FILES), dir.path()).unwrap();
        let e = Tls::load(files).unwrap_err();
        assert!(e.message.contains("byte limit"), "{}", e.message);
    }

    /// A CA, a server certificate it signed, and client certificates made on demand, as PEM
    /// files in a directory; handshakes in memory against a loaded [`Tls`].
    pub(crate) struct Pki {
        ca: rcgen::Issuer<'static, rcgen::KeyPair>,
        ca_der: CertificateDer<'static>,
        pub(crate) dir: tempfile::TempDir,
    }

    pub(crate) type Client = (CertificateDer<'static>, PrivateKeyDer<'static>);

    impl Pki {
        pub(crate) fn new() -> Pki {
            let dir = tempfile::tempdir().unwrap();
            let (params, key, cert) = ca("test CA", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
            std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
            let pki = Pki { ca: rcgen::Issuer::new(params, key), ca_der: cert.der().clone(), dir };
            let (cert, key) =
                pki.signed(&["localhost"], rcgen::ExtendedKeyUsagePurpose::ServerAuth);
            std::fs::write(pki.dir.path().join("c.pem"), cert.pem()).unwrap();
            std::fs::write(pki.dir.path().join("k.pem"), key.serialize_pem()).unwrap();
            pki
        }

        fn signed(
            &self,
            names: &[&str],
            purpose: rcgen::ExtendedKeyUsagePurpose,
        ) -> (rcgen::Certificate, rcgen::KeyPair) {
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let mut params = rcgen::CertificateParams::new(names).unwrap();
            params.extended_key_usages = vec![purpose];
            let key = rcgen::KeyPair::generate().unwrap();
            (params.signed_by(&key, &self.ca).unwrap(), key)
        }

        /// A client certificate for `names` signed by the CA.
        pub(crate) fn client(&self, names: &[&str]) -> Client {
            let (cert, key) = self.signed(names, rcgen::ExtendedKeyUsagePurpose::ClientAuth);
            (cert.der().clone(), PrivateKeyDer::try_from(key.serialize_der()).unwrap())
        }

        fn load(&self, tls_yaml: &str) -> Tls {
            let yaml = format!("{FILES}{tls_yaml}");
            let files = TlsFiles::from_section(section(&yaml), self.dir.path()).unwrap();
            Tls::load(files).unwrap().unwrap()
        }

        /// The server's verdict on a handshake by a client trusting the CA, presenting `client`.
        async fn handshake(&self, tls: &Tls, client: Option<Client>) -> Result<(), String> {
            let connector = self.connector(client);
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let (server_side, client_side) = tokio::io::duplex(1 << 16);
            let acceptor = tls.acceptor();
            // The client stream is held until the server has decided: with TLS 1.3 the client
            // is done before the server has checked its certificate.
            let (server, _client) =
                tokio::join!(acceptor.accept(server_side), connector.connect(name, client_side));
            server.map(drop).map_err(|e| e.to_string())
        }

        /// A client trusting the CA, presenting `client`.
        pub(crate) fn connector(&self, client: Option<Client>) -> tokio_rustls::TlsConnector {
            let mut roots = RootCertStore::empty();
            roots.add(self.ca_der.clone()).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
            let config = match client {
                None => builder.with_no_client_auth(),
                Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
            };
            tokio_rustls::TlsConnector::from(Arc::new(config))
        }
    }

    /// A self-signed CA certificate (CA:TRUE) whose extended key usage is `purpose`.
    fn ca(
        name: &str,
        purpose: rcgen::ExtendedKeyUsagePurpose,
    ) -> (rcgen::CertificateParams, rcgen::KeyPair, rcgen::Certificate) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![purpose];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (params, key, cert)
    }

    pub(crate) fn self_signed(names: &[&str]) -> Client {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let one = rcgen::generate_simple_self_signed(names).unwrap();
        (one.cert.der().clone(), PrivateKeyDer::try_from(one.signing_key.serialize_der()).unwrap())
    }

    /// Go verifies a given certificate against the system's CAs when there is no client CA:
    /// no certificate is admitted, one of a CA the system trusts too, any other refused.
    #[tokio::test]
    async fn verify_client_cert_if_given_without_a_ca_checks_a_given_certificate_against_the_system()
     {
        let pki = Pki::new();
        let mut files = TlsFiles::from_section(
            section(&format!("{FILES}client_auth_type: VerifyClientCertIfGiven\n")),
            pki.dir.path(),
        )
        .unwrap()
        .unwrap();
        // The system bundle: a file that does not exist first, then one with the test CA.
        files.section.system_ca_files =
            vec![pki.dir.path().join("missing.pem"), pki.dir.path().join("ca.pem")];
        let tls = Tls::load(Some(files.clone())).unwrap().unwrap();
        assert_eq!(pki.handshake(&tls, None).await, Ok(()));
        assert_eq!(pki.handshake(&tls, Some(pki.client(&["scraper"]))).await, Ok(()));
        let e = pki.handshake(&tls, Some(self_signed(&["scraper"]))).await.unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");
        // No system bundle at all: still served; a given certificate cannot be verified.
        files.section.system_ca_files = vec![pki.dir.path().join("missing.pem")];
        let tls = Tls::load(Some(files)).unwrap().unwrap();
        assert_eq!(pki.handshake(&tls, None).await, Ok(()));
        let e = pki.handshake(&tls, Some(pki.client(&["scraper"]))).await.unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");
    }

    #[tokio::test]
    async fn verify_client_cert_if_given_with_a_ca_admits_none_or_a_verified_one() {
        let pki = Pki::new();
        let tls = pki.load("client_auth_type: VerifyClientCertIfGiven\nclient_ca_file: ca.pem\n");
        assert_eq!(pki.handshake(&tls, None).await, Ok(()));
        assert_eq!(pki.handshake(&tls, Some(pki.client(&["scraper"]))).await, Ok(()));
        assert!(pki.handshake(&tls, Some(self_signed(&["scraper"]))).await.is_err());
    }

    /// `prefer_server_cipher_suites` (true when absent, as in exporter-toolkit) is rustls'
    /// `ignore_client_order`: the server's order of the cipher suites wins.
    #[test]
    fn prefer_server_cipher_suites_decides_whose_order_wins() {
        let pki = Pki::new();
        assert!(pki.load("").config.ignore_client_order);
        assert!(pki.load("prefer_server_cipher_suites: true\n").config.ignore_client_order);
        assert!(!pki.load("prefer_server_cipher_suites: false\n").config.ignore_client_order);
    }

    /// Each `client_auth_type` admits what Go's `tls.ClientAuthType` of the same name admits:
    /// no certificate, one of the configured CA, or one of no known CA (self-signed).
    #[tokio::test]
    async fn each_client_auth_type_admits_what_go_admits() {
        let pki = Pki::new();
        // (client_auth_type, with client_ca_file, admits: none, the CA's, a self-signed one)
        let table = [
            ("NoClientCert", false, [true, true, true]),
            ("RequestClientCert", false, [true, true, true]),
            ("RequireAnyClientCert", false, [false, true, true]),
            ("VerifyClientCertIfGiven", true, [true, true, false]),
            ("RequireAndVerifyClientCert", true, [false, true, false]),
        ];
        for (auth, with_ca, admits) in table {
            let ca = if with_ca { "client_ca_file: ca.pem\n" } else { "" };
            let tls = pki.load(&format!("client_auth_type: {auth}\n{ca}"));
            let clients = [None, Some(pki.client(&["scraper"])), Some(self_signed(&["scraper"]))];
            for (client, admitted) in clients.into_iter().zip(admits) {
                let given = client.is_some();
                let verdict = pki.handshake(&tls, client).await;
                assert_eq!(verdict.is_ok(), admitted, "{auth}, certificate {given}: {verdict:?}");
            }
        }
    }

    /// exporter-toolkit's rule: one of the client certificate's SANs equals one listed.
    #[tokio::test]
    async fn client_allowed_sans_admit_a_listed_san_and_refuse_any_other() {
        let pki = Pki::new();
        let tls = pki.load(
            "client_auth_type: RequireAndVerifyClientCert\nclient_ca_file: ca.pem\n\
             client_allowed_sans: [prometheus.example, 10.0.0.7]\n",
        );
        for names in [&["other.example", "prometheus.example"][..], &["10.0.0.7"]] {
            let verdict = pki.handshake(&tls, Some(pki.client(names))).await;
            assert_eq!(verdict, Ok(()), "{names:?}");
        }
        for names in [&["other.example"][..], &["PROMETHEUS.example"], &["10.0.0.8"]] {
            let e = pki.handshake(&tls, Some(pki.client(names))).await.unwrap_err();
            assert!(e.contains("ApplicationVerificationFailure"), "{names:?}: {e}");
        }
        assert!(pki.handshake(&tls, None).await.is_err());
        // A listed SAN does not make up for a certificate of another CA.
        let e = pki.handshake(&tls, Some(self_signed(&["prometheus.example"]))).await.unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");
    }

    /// With a client_auth_type that does not verify, Go checks the SANs of the certificate as
    /// given, and one is required (its check fails without one).
    #[tokio::test]
    async fn client_allowed_sans_with_request_client_cert_require_a_certificate_naming_one() {
        let pki = Pki::new();
        let tls = pki.load("client_auth_type: RequestClientCert\nclient_allowed_sans: [scraper]\n");
        assert_eq!(pki.handshake(&tls, Some(self_signed(&["scraper"]))).await, Ok(()));
        assert!(pki.handshake(&tls, Some(self_signed(&["intruder"]))).await.is_err());
        assert!(pki.handshake(&tls, None).await.is_err());
    }

    /// Go's `x509.Verify` takes a certificate of its root pool as a chain of one, so a client
    /// may present the configured CA itself (CA:TRUE), if its key usage allows clientAuth.
    #[tokio::test]
    async fn a_client_presenting_the_configured_ca_itself_is_admitted_as_go_does() {
        let pki = Pki::new();
        let dir = pki.dir.path();
        let (_, key, cert) = ca("scraper", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
        let (_, server_only_key, server_only) =
            ca("server only", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
        let (_, unlisted_key, unlisted) =
            ca("unlisted", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
        let bundle = [pki.ca_der.clone(), cert.der().clone(), server_only.der().clone()];
        let pem: String = bundle
            .iter()
            .map(|der| {
                let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
                let lines: Vec<&str> =
                    b64.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap()).collect();
                format!(
                    "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    lines.join("\n")
                )
            })
            .collect();
        std::fs::write(dir.join("clients.pem"), pem).unwrap();
        for auth in ["RequireAndVerifyClientCert", "VerifyClientCertIfGiven"] {
            let tls = pki.load(&format!("client_auth_type: {auth}\nclient_ca_file: clients.pem\n"));
            let der = |k: &rcgen::KeyPair| PrivateKeyDer::try_from(k.serialize_der()).unwrap();
            let verdict = pki.handshake(&tls, Some((cert.der().clone(), der(&key)))).await;
            assert_eq!(verdict, Ok(()), "{auth}");
            let e = pki
                .handshake(&tls, Some((server_only.der().clone(), der(&server_only_key))))
                .await
                .unwrap_err();
            assert!(e.contains("InvalidPurpose"), "{auth}: {e}");
            let e = pki
                .handshake(&tls, Some((unlisted.der().clone(), der(&unlisted_key))))
                .await
                .unwrap_err();
            assert!(e.contains("UnknownIssuer") || e.contains("CaUsedAsEndEntity"), "{auth}: {e}");
            // Certificates of the CAs in the file still chain as before.
            assert_eq!(pki.handshake(&tls, Some(pki.client(&["s"]))).await, Ok(()), "{auth}");
        }
    }
}
