//! The exporter's web layer end to end: `--web.config.file` (TLS with a real rustls client and
//! certificates made at test time, basic auth with real bcrypt hashes, headers, start-up
//! errors, SIGHUP reload, certificate rotation), gzip, and `--web.systemd-socket`.

use amd_hsmp_e2e::harness::{self, Exposition, Proc};
use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);
use amd_hsmp_e2e::scenario::PROMETHEUS_ACCEPT;

/// A CA and certificates it signed, as PEM files in a directory.
struct Pki {
    ca: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "amd-hsmp-exporter test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
        Pki { ca: Issuer::new(params, key), ca_der: cert.der().clone(), dir: dir.to_owned() }
    }

    /// A leaf certificate `name.pem` and key `name.key` for `purpose`; its DER.
    fn leaf(&self, name: &str, purpose: ExtendedKeyUsagePurpose) -> CertificateDer<'static> {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }

    fn server(&self, name: &str) -> CertificateDer<'static> {
        self.leaf(name, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client configuration trusting this CA, optionally with the client certificate
    /// `client`, limited to `versions` (all when empty).
    fn client(
        &self,
        client: Option<&str>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = if versions.is_empty() { rustls::ALL_VERSIONS } else { versions };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some(name) => {
                let pem = std::fs::read(self.dir.join(format!("{name}.pem"))).unwrap();
                let key = std::fs::read(self.dir.join(format!("{name}.key"))).unwrap();
                use rustls::pki_types::pem::PemObject as _;
                let chain = vec![CertificateDer::from_pem_slice(&pem).unwrap()];
                let key = PrivateKeyDer::from_pem_slice(&key).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        Arc::new(config)
    }
}

/// An HTTPS answer and what the handshake settled.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    version: Option<rustls::ProtocolVersion>,
    peer: Option<CertificateDer<'static>>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path` over TLS with `client`, `Connection: close`, extra `headers`.
fn https_get(
    addr: SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer> {
    let tcp = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    tcp.set_read_timeout(Some(TIMEOUT))?;
    tcp.set_write_timeout(Some(TIMEOUT))?;
    let name = ServerName::try_from("localhost")?.to_owned();
    let connection = rustls::ClientConnection::new(Arc::clone(client), name)?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (n, v) in headers {
        request.push_str(&format!("{n}: {v}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes()).context("sending the request")?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // A peer that closes without close_notify after a complete answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e).context("reading the response"),
    }
    let version = tls.conn.protocol_version();
    let peer = tls.conn.peer_certificates().and_then(|c| c.first()).map(|c| c.clone().into_owned());
    let (status, headers, body) = harness::parse_raw_response(&raw)?;
    Ok(Answer { status, headers, body, version, peer })
}

fn basic(user: &str, password: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// A bcrypt hash as `htpasswd -nB` makes it (`$2y$`, cost 5).
fn htpasswd(password: &str) -> String {
    bcrypt::hash_with_result(password, 5).unwrap().format_for_version(bcrypt::Version::TwoY)
}

/// The exporter with `--web.config.file dir/web.yml` (written from `yaml`) on a free port,
/// waited for until its port accepts connections.
fn start(dir: &Path, yaml: &str, socket: Option<&Path>) -> (Proc, SocketAddr) {
    let config = dir.join("web.yml");
    std::fs::write(&config, yaml).unwrap();
    let socket = socket.map_or_else(|| dir.join("no-broker.sock"), Path::to_owned);
    let addr: SocketAddr = ([127, 0, 0, 1], harness::free_port().unwrap()).into();
    let args: Vec<String> = [
        "--web.listen-address",
        &addr.to_string(),
        "--broker.socket",
        &socket.display().to_string(),
        "--web.config.file",
        &config.display().to_string(),
        "--log.level",
        "debug",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let exe = &harness::binaries().unwrap().exporter;
    let mut proc = Proc::spawn("amd-hsmp-exporter", exe, &args, dir.join("exporter.log")).unwrap();
    harness::wait_until(&mut proc, "exporter port", || TcpStream::connect(addr).is_ok()).unwrap();
    (proc, addr)
}

/// Waits until the exporter's log contains `text` `count` times.
fn wait_for_log(proc: &mut Proc, text: &str, count: usize) {
    let until = Instant::now() + TIMEOUT;
    while proc.log().matches(text).count() < count {
        proc.check_running().unwrap();
        assert!(Instant::now() < until, "{text:?} not logged:\n{}", proc.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tls_yaml(extra_tls: &str, rest: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n{extra_tls}{rest}"
    )
}

#[test]
fn basic_auth_over_tls_lets_the_right_password_in_and_nobody_else() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.server("server");
    let users = format!(
        "basic_auth_users:\n  prometheus: '{}'\n  other: '{}'\nhttp_server_config:\n  \
         headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n",
        htpasswd("s3cret"),
        htpasswd("another")
    );
    let (mut exporter, addr) = start(dir.path(), &tls_yaml("", &users), None);
    let client = pki.client(None, &[]);

    let right =
        https_get(addr, &client, "/metrics", &[("Authorization", &basic("prometheus", "s3cret"))])
            .unwrap();
    assert_eq!(right.status, 200, "{}", right.text());
    assert!(right.text().contains("amd_hsmp_broker_up 0"), "{}", right.text());
    assert_eq!(right.header("x-frame-options"), Some("deny"));
    assert_eq!(right.header("x-content-type-options"), Some("nosniff"));
    // Cached now: the same credentials again, and the landing page, which sits behind auth too.
    let again = https_get(addr, &client, "/", &[("Authorization", &basic("prometheus", "s3cret"))])
        .unwrap();
    assert_eq!(again.status, 200);

    for (what, headers) in [
        ("wrong password", vec![("Authorization", basic("prometheus", "S3cret"))]),
        ("unknown user", vec![("Authorization", basic("nobody", "s3cret"))]),
        ("another user's password", vec![("Authorization", basic("other", "s3cret"))]),
        ("no credentials", vec![]),
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        for path in ["/metrics", "/"] {
            let answer = https_get(addr, &client, path, &headers).unwrap();
            assert_eq!(answer.status, 401, "{what} on {path}: {}", answer.text());
            let challenge = answer.header("www-authenticate").unwrap_or_default();
            assert!(challenge.starts_with("Basic realm="), "{what}: {challenge:?}");
            assert_eq!(answer.header("x-frame-options"), Some("deny"), "{what}");
            assert!(!answer.text().contains("amd_hsmp"), "{what}: {}", answer.text());
        }
    }

    // Plain HTTP to the TLS port gets no metrics.
    let plain = harness::http_get(addr, "/metrics", &[], Duration::from_secs(5));
    assert!(plain.is_err() || plain.unwrap().status != 200);
    exporter.check_running().unwrap();
    assert!(exporter.log().contains("basic authentication failed"), "{}", exporter.log());
}

#[test]
fn a_missing_client_certificate_fails_the_handshake_when_required() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.server("server");
    pki.leaf("client", ExtendedKeyUsagePurpose::ClientAuth);
    let other_dir = tempfile::tempdir().unwrap();
    let stranger = Pki::new(other_dir.path());
    stranger.leaf("client", ExtendedKeyUsagePurpose::ClientAuth);
    let yaml =
        tls_yaml("  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n", "");
    let (mut exporter, addr) = start(dir.path(), &yaml, None);

    let with_cert = https_get(addr, &pki.client(Some("client"), &[]), "/metrics", &[]).unwrap();
    assert_eq!(with_cert.status, 200, "{}", with_cert.text());

    let without = https_get(addr, &pki.client(None, &[]), "/metrics", &[]);
    assert!(without.is_err(), "answered without a client certificate");
    // A certificate from another CA is refused too (the client trusts our server's CA).
    for ext in ["pem", "key"] {
        std::fs::copy(
            other_dir.path().join(format!("client.{ext}")),
            dir.path().join(format!("foreign.{ext}")),
        )
        .unwrap();
    }
    let foreign = https_get(addr, &pki.client(Some("foreign"), &[]), "/metrics", &[]);
    assert!(foreign.is_err(), "answered a certificate of another CA");
    exporter.check_running().unwrap();
}

#[test]
fn tls12_only_min_and_max_negotiate_tls12_and_refuse_a_tls13_only_client() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.server("server");
    let yaml = tls_yaml(
        "  min_version: TLS12\n  max_version: TLS12\n  cipher_suites:\n    - \
         TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384\n  curve_preferences: [CurveP256]\n",
        "",
    );
    let (_exporter, addr) = start(dir.path(), &yaml, None);
    let answer = https_get(addr, &pki.client(None, &[]), "/metrics", &[]).unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.version, Some(rustls::ProtocolVersion::TLSv1_2));
    let tls13_only = https_get(addr, &pki.client(None, &[&rustls::version::TLS13]), "/", &[]);
    assert!(tls13_only.is_err(), "a TLS 1.3-only client was served");
}

#[test]
fn bad_web_config_files_stop_the_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.server("server");
    let exe = &harness::binaries().unwrap().exporter;
    let cases = [
        (
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  cert_fiel: x\n",
            "unknown field `cert_fiel`",
        ),
        ("basic_auth_user:\n  a: b\n", "unknown field `basic_auth_user`"),
        (
            &*tls_yaml("  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n", ""),
            "tls_server_config.cipher_suites: TLS_RSA_WITH_AES_128_CBC_SHA is not supported",
        ),
        (
            &*tls_yaml("  min_version: TLS10\n", ""),
            "tls_server_config.min_version: TLS10 is not supported",
        ),
        (
            &*tls_yaml("  min_version: TLS13\n  max_version: TLS12\n", ""),
            "min_version: above max_version",
        ),
        ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice: not a bcrypt hash"),
        (
            "tls_server_config:\n  cert_file: missing.pem\n  key_file: server.key\n",
            "tls_server_config.cert_file: cannot read",
        ),
        ("http_server_config:\n  http2: true\n", "http_server_config.http2"),
        ("http_server_config:\n  headers:\n    Server: x\n", "http_server_config.headers.Server"),
    ];
    for (yaml, expected) in cases {
        let config = dir.path().join("web.yml");
        std::fs::write(&config, yaml).unwrap();
        let out = Command::new(exe)
            .args(["--web.listen-address", "127.0.0.1:0", "--web.config.file"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{yaml}\n{stderr}");
        assert!(stderr.contains(expected), "{yaml}: expected {expected:?} in:\n{stderr}");
        assert!(stderr.contains("web.yml"), "the file is not named:\n{stderr}");
    }
    let out = Command::new(exe)
        .args(["--web.listen-address", "127.0.0.1:0", "--web.config.file"])
        .arg(dir.path().join("absent.yml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the web configuration"));
}

#[test]
fn sighup_reloads_the_users_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let first = format!("basic_auth_users:\n  alice: '{}'\n", htpasswd("a"));
    let (mut exporter, addr) = start(dir.path(), &first, None);
    let get = |user: &str, password: &str| {
        let auth = basic(user, password);
        harness::http_get(addr, "/metrics", &[("Authorization", &auth)], TIMEOUT).unwrap().status
    };
    assert_eq!((get("alice", "a"), get("bob", "b")), (200, 401));

    std::fs::write(
        dir.path().join("web.yml"),
        format!("basic_auth_users:\n  bob: '{}'\n", htpasswd("b")),
    )
    .unwrap();
    // Not before the signal: the file is read at start-up and on SIGHUP only.
    assert_eq!((get("alice", "a"), get("bob", "b")), (200, 401));
    exporter.signal(libc::SIGHUP).unwrap();
    wait_for_log(&mut exporter, "web configuration reloaded", 1);
    assert_eq!((get("alice", "a"), get("bob", "b")), (401, 200));

    std::fs::write(dir.path().join("web.yml"), "basic_auth_users:\n  carol: not-a-hash\n").unwrap();
    exporter.signal(libc::SIGHUP).unwrap();
    wait_for_log(&mut exporter, "web configuration not reloaded", 1);
    assert!(exporter.log().contains("basic_auth_users.carol"), "{}", exporter.log());
    assert_eq!((get("bob", "b"), get("carol", "x")), (200, 401));
    exporter.check_running().unwrap();
}

#[test]
fn a_rotated_certificate_is_served_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let first = pki.server("server");
    let (mut exporter, addr) = start(dir.path(), &tls_yaml("", ""), None);
    let client = pki.client(None, &[]);
    assert_eq!(https_get(addr, &client, "/", &[]).unwrap().peer.as_ref(), Some(&first));

    // Rotate: a new key and certificate written beside, then renamed into place.
    let second = pki.server("next");
    std::fs::rename(dir.path().join("next.key"), dir.path().join("server.key")).unwrap();
    std::fs::rename(dir.path().join("next.pem"), dir.path().join("server.pem")).unwrap();
    let answer = https_get(addr, &client, "/", &[]).unwrap();
    assert_eq!(answer.peer.as_ref(), Some(&second), "the old certificate is still served");
    wait_for_log(&mut exporter, "configuration reloaded", 1);

    // A broken rotation keeps the certificate that works, and says so once.
    std::fs::write(dir.path().join("server.pem"), "not a certificate\n").unwrap();
    for _ in 0..3 {
        let answer = https_get(addr, &client, "/", &[]).unwrap();
        assert_eq!(answer.peer.as_ref(), Some(&second));
    }
    let log = exporter.log();
    assert_eq!(log.matches("does not load; keeping the old one").count(), 1, "{log}");
    exporter.check_running().unwrap();
}

#[test]
fn gzip_answers_decode_to_the_same_exposition_for_turin_2p() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let _broker =
        harness::start_simulated_broker("turin-2p", &socket, &[], dir.path().join("broker.log"))
            .unwrap();
    let (_exporter, addr) = harness::start_exporter(&socket, &[], None, dir.path()).unwrap();
    for (format, accept) in [("text 0.0.4", None), ("OpenMetrics", Some(PROMETHEUS_ACCEPT))] {
        let mut headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
        let plain = harness::http_get(addr, "/metrics", &headers, TIMEOUT).unwrap();
        assert_eq!(plain.status, 200);
        assert_eq!(plain.header("content-encoding"), None);
        headers.push(("Accept-Encoding", "gzip"));
        let raw = raw_get(addr, "/metrics", &headers);
        let (status, response_headers, body) = harness::parse_raw_response(&raw).unwrap();
        assert_eq!(status, 200);
        let header =
            |name: &str| response_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(header("content-encoding"), Some("gzip"), "{format}");
        assert_eq!(header("content-type"), plain.header("content-type"));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut text).unwrap();
        let zipped = Exposition::parse(&text).unwrap();
        let unzipped = Exposition::parse(&plain.body).unwrap();
        // The same series (values move between two scrapes of the simulator).
        let keys = |e: &Exposition| e.samples.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&zipped), keys(&unzipped), "{format}");
        assert_eq!(zipped.count("amd_hsmp_core_energy_joules_total"), 384);
        eprintln!(
            "turin-2p /metrics, {format}: {} bytes plain, {} bytes gzip",
            plain.body.len(),
            body.len()
        );
        assert!(body.len() * 4 < plain.body.len(), "gzip saves less than 4x: {}", body.len());
    }
}

/// `GET path` over plain HTTP/1.1 with `Connection: close`; the raw answer.
fn raw_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        request.push_str(&format!("{n}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    raw
}

#[test]
fn systemd_socket_activation_serves_on_the_passed_socket() -> Result<()> {
    let exe = &harness::binaries()?.exporter;
    // Without a passed socket it is a start-up error, not a silent bind.
    let out = Command::new(exe).args(["--web.systemd-socket"]).env_remove("LISTEN_FDS").output()?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("systemd passed no socket"));

    let dir = tempfile::tempdir()?;
    let addr: SocketAddr = ([127, 0, 0, 1], harness::free_port()?).into();
    let activate = harness::which("systemd-socket-activate").context("systemd-socket-activate")?;
    let args: Vec<String> = vec![
        "--listen".into(),
        addr.to_string(),
        exe.display().to_string(),
        "--web.systemd-socket".into(),
        "--broker.socket".into(),
        dir.path().join("no-broker.sock").display().to_string(),
    ];
    let mut proc =
        Proc::spawn("systemd-socket-activate", &activate, &args, dir.path().join("log"))?;
    // systemd-socket-activate listens at once and starts the exporter on the first connection.
    let until = Instant::now() + TIMEOUT;
    let answer = loop {
        match harness::http_get(addr, "/metrics", &[], TIMEOUT) {
            Ok(answer) => break answer,
            Err(e) if Instant::now() > until => bail!("no answer: {e}\n{}", proc.log()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("amd_hsmp_broker_up 0"));
    proc.check_running()?;
    assert!(proc.log().contains("listening"), "{}", proc.log());
    Ok(())
}

/// Makes `path` a FIFO (nobody ever writes to it).
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

#[test]
fn a_fifo_a_directory_or_a_huge_chain_as_the_certificate_are_refused_once_each_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let first = pki.server("server");
    let (mut exporter, addr) = start(dir.path(), &tls_yaml("", ""), None);
    let client = pki.client(None, &[]);
    let served = |what: &str| {
        let answer = https_get(addr, &client, "/metrics", &[])
            .unwrap_or_else(|e| panic!("{what}: no answer: {e:#}"));
        assert_eq!(answer.status, 200, "{what}");
        assert_eq!(answer.peer.as_ref(), Some(&first), "{what}: not the certificate that works");
    };
    let cert = dir.path().join("server.pem");
    let pem = std::fs::read_to_string(&cert).unwrap();
    let chain_10mb = pem.repeat(10_000_000 / pem.len() + 1);
    let chain_200kb = pem.repeat(200_000 / pem.len() + 1);
    let cases: [(&str, &dyn Fn(), &str); 4] = [
        ("a FIFO", &|| mkfifo(&cert), "not a regular file (a FIFO)"),
        (
            "a directory",
            &|| std::fs::create_dir(&cert).unwrap(),
            "not a regular file (a directory)",
        ),
        ("a 10 MB chain", &|| std::fs::write(&cert, &chain_10mb).unwrap(), "byte limit"),
        (
            "a 200 KB chain",
            &|| std::fs::write(&cert, &chain_200kb).unwrap(),
            "the certificate chain is",
        ),
    ];
    for (what, make, logged) in cases {
        if cert.is_dir() {
            std::fs::remove_dir(&cert).unwrap();
        } else {
            std::fs::remove_file(&cert).unwrap();
        }
        make();
        // Each connection checks the files; the broken one is reported once.
        for _ in 0..3 {
            served(what);
        }
        wait_for_log(&mut exporter, logged, 1);
        let log = exporter.log();
        assert_eq!(log.matches(logged).count(), 1, "{what}:\n{log}");
        assert!(log.contains("tls_server_config.cert_file"), "{what}: the key is not named");
    }

    // SIGTERM still ends the exporter at once.
    let asked = Instant::now();
    exporter.signal(libc::SIGTERM).unwrap();
    let status = exporter.wait_exit(Duration::from_secs(5)).unwrap();
    assert!(status.success(), "{status:?} after {:?}", asked.elapsed());
}

#[test]
fn a_fifo_as_the_configuration_with_sighup_is_refused_and_sigterm_still_ends_the_exporter() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!("basic_auth_users:\n  prometheus: '{}'\n", htpasswd("s3cret"));
    let (mut exporter, addr) = start(dir.path(), &yaml, None);
    let auth = basic("prometheus", "s3cret");
    let get = || harness::http_get(addr, "/metrics", &[("Authorization", &auth)], TIMEOUT);
    assert_eq!(get().unwrap().status, 200);
    std::fs::remove_file(dir.path().join("web.yml")).unwrap();
    mkfifo(&dir.path().join("web.yml"));
    // Nobody ever writes to the FIFO: the reload is refused at once, the old users stay.
    exporter.signal(libc::SIGHUP).unwrap();
    wait_for_log(&mut exporter, "web configuration not reloaded", 1);
    let log = exporter.log();
    assert_eq!(log.matches("not a regular file (a FIFO)").count(), 1, "{log}");
    assert_eq!(get().unwrap().status, 200);
    let asked = Instant::now();
    exporter.signal(libc::SIGTERM).unwrap();
    let status = exporter.wait_exit(Duration::from_secs(5)).unwrap();
    eprintln!("SIGTERM after a FIFO configuration and SIGHUP: exited in {:?}", asked.elapsed());
    assert!(status.success(), "{status:?}");
}
