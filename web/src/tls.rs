//! `tls_server_config` as a rustls server configuration (ring provider): certificate and key
//! (files or inline PEM), client certificates by exporter-toolkit's `client_auth_type`,
//! TLS 1.2/1.3 bounds, cipher suites and curves by their Go names, and the file stamps that
//! tell when a rotated certificate is to be loaded.

use crate::files::{KeyError, MAX_FILE_BYTES, key_error, read_regular};
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
    pub(crate) client_allowed_sans: Option<serde_norway::Value>,
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
}

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
        if section.client_allowed_sans.is_some() {
            return Err(key_error(
                key("client_allowed_sans"),
                "not supported by amd-hsmp-exporter; verify client certificates with \
                 client_ca_file and RequireAndVerifyClientCert, and keep a CA for the scrapers only",
            ));
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
            (
                ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert,
                None,
            ) => {
                return Err(key_error(
                    key("client_ca_file"),
                    "required to verify client certificates (or client_ca)",
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
        let auth = self.section.client_auth;
        if auth == ClientAuth::NoClientCert {
            return Ok(WebPkiClientVerifier::no_client_auth());
        }
        let mut roots = RootCertStore::empty();
        if let Some(ca) = &self.client_ca {
            let name = self.names("client_ca_file", "client_ca", ca);
            for cert in certificates(&read(ca, name)?, name)? {
                roots.add(cert).map_err(|e| {
                    key_error(
                        format!("tls_server_config.{name}"),
                        format!("not a CA certificate: {e}"),
                    )
                })?;
            }
        }
        let algorithms = provider.signature_verification_algorithms;
        match auth {
            ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert => {
                Ok(Arc::new(AnyClientCert {
                    mandatory: auth == ClientAuth::RequireAnyClientCert,
                    hints: roots.subjects(),
                    algorithms,
                }))
            }
            _ => {
                let builder = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(provider),
                );
                let builder = if auth == ClientAuth::VerifyClientCertIfGiven {
                    builder.allow_unauthenticated()
                } else {
                    builder
                };
                builder.build().map_err(|e| {
                    key_error("tls_server_config.client_ca_file", format!("unusable: {e}"))
                })
            }
        }
    }
}

/// `RequestClientCert` and `RequireAnyClientCert`: any certificate is taken, as in Go; the
/// handshake signature still proves the client holds its key.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
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
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
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
mod tests {
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
        assert!(e.starts_with("tls_server_config.client_allowed_sans:"), "{e}");
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
}
