//! Replays every committed corpus file of every fuzz target through its property, so a
//! `cargo test` checks what the fuzzer found and kept. `AMD_HSMP_FUZZ_SEEDS=1` (re)writes the
//! hand-made seed inputs (`seed-*`) the corpora started from.

use amd_hsmp_fuzz::Alloc;
use amd_hsmp_proto::{
    Core, Energy, Families, Family, ItemError, Message, PROTOCOL_VERSION, Readings, Reply, Request,
    RequestError, Sample, Topology, Unavailable, Value,
};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

#[global_allocator]
static ALLOC: Alloc = Alloc::new(std::alloc::System, usize::MAX);

/// The allocation limit is process-wide: one test at a time. A test that allocated while a
/// replay's limit was set would see its allocation fail, and a panic's backtrace allocates.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

type Property = fn(&[u8], &Alloc);

const TARGETS: &[(&str, Property)] = &[
    ("frame_request", amd_hsmp_fuzz::frame_request),
    ("frame_reply", amd_hsmp_fuzz::frame_reply),
    ("timeout_header", amd_hsmp_fuzz::timeout_header),
    ("accept", amd_hsmp_fuzz::accept),
    ("topology", amd_hsmp_fuzz::topology),
    ("web_config", amd_hsmp_fuzz::web_config),
];

fn corpus(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target)
}

fn replay(target: &str) {
    let _one = one_at_a_time();
    if std::env::var_os("AMD_HSMP_FUZZ_SEEDS").is_some() {
        write_seeds(target);
    }
    let property = TARGETS.iter().find(|(name, _)| *name == target).unwrap().1;
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus(target))
        .unwrap_or_else(|e| panic!("no corpus for {target}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.iter().any(|f| name_of(f).starts_with("seed-")), "{target} has no seeds");
    for file in &files {
        let data = std::fs::read(file).unwrap();
        let outcome = std::panic::catch_unwind(|| property(&data, &ALLOC));
        assert!(outcome.is_ok(), "{target}: property failed on {}", file.display());
    }
}

fn name_of(path: &std::path::Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn web_config_corpus_holds() {
    replay("web_config");
}

#[test]
fn frame_request_corpus_holds() {
    replay("frame_request");
}

#[test]
fn frame_reply_corpus_holds() {
    replay("frame_reply");
}

#[test]
fn timeout_header_corpus_holds() {
    replay("timeout_header");
}

#[test]
fn accept_corpus_holds() {
    replay("accept");
}

#[test]
fn topology_corpus_holds() {
    replay("topology");
}

#[test]
fn every_target_has_a_replay_and_a_libfuzzer_binary() {
    let _one = one_at_a_time();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cargo-fuzz/Cargo.toml");
    let manifest = std::fs::read_to_string(manifest).unwrap();
    for (name, _) in TARGETS {
        assert!(manifest.contains(&format!("name = \"{name}\"")), "no fuzz binary for {name}");
    }
}

#[test]
fn the_topology_seed_is_discovered_not_refused() {
    let _one = one_at_a_time();
    let seed = std::fs::read(corpus("topology").join("seed-00")).unwrap();
    let t = amd_hsmp_fuzz::discover_from(&seed).expect("the seed describes a machine");
    assert_eq!(t.cores.len(), 2, "{t:?}");
    assert_eq!(t.cores[1].apic_id, 2);
}

/// A property that fails must fail the replay: the check above is not vacuous.
#[test]
fn a_broken_topology_fails_its_property() {
    let _one = one_at_a_time();
    let core =
        |socket, core, apic_id| Core { socket, core, cpu: core, apic_id, threads: vec![core] };
    let mut t = Topology {
        cpu_family: 0x19,
        cpu_model: 0x11,
        sockets: vec![0],
        cores: vec![core(0, 0, 0), core(0, 1, 2)],
    };
    amd_hsmp_fuzz::check_topology(&t);
    t.cores[1].apic_id = 0;
    assert!(std::panic::catch_unwind(|| amd_hsmp_fuzz::check_topology(&t)).is_err());
}

fn write_seeds(target: &str) {
    let dir = corpus(target);
    std::fs::create_dir_all(&dir).unwrap();
    let seeds: Vec<Vec<u8>> = match target {
        "frame_request" => requests().iter().map(|r| r.to_frame().unwrap()).collect(),
        "frame_reply" => replies().iter().map(|r| r.to_frame().unwrap()).collect(),
        "timeout_header" => ["10", "0.5", "1e300", "NaN", "-1", "0.001", " 2.5 ", "inf"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect(),
        "accept" => [
            amd_hsmp_exporter::http::PROMETHEUS_2_ACCEPT,
            "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
            "*/*",
            "text/plain;q=0.9, application/openmetrics-text;q=0.5",
            "gzip",
            "br;q=1, gzip;q=0.8, identity;q=0",
            "gzip;q=0, *",
            "deflate\nx-gzip;q=0.001",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        "topology" => vec![topology_seed()],
        "web_config" => WEB_CONFIG_SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        _ => unreachable!(),
    };
    for (i, seed) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), seed).unwrap();
    }
}

/// Web configuration files as operators write them, and a few that are refused.
const WEB_CONFIG_SEEDS: &[&str] = &[
    "",
    "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
    "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  min_version: TLS13\n",
    "basic_auth_users:\n  prometheus: $2y$10$X0Q8tCVDG4hS3XbXYlhYbOYt3xCTK0xQq4ZKD9sBztz2cCcbBzT1K\n",
    "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n",
    "http_server_config:\n  http2: true\n",
    "rate_limit:\n  interval: 1s\n",
    "tls_server_config:\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n  curve_preferences: [X25519]\n",
    "basic_auth_users:\n  a: $2y$04$abc\n  b: $2y$12$X0Q8tCVDG4hS3XbXYlhYbOYt3xCTK0xQq4ZKD9sBztz2cCcbBzT1K\n",
    "unknown_key: 1\n",
    "- just\n- a list\n",
    "tls_server_config: &a\n  cert: *a\n",
];

fn requests() -> Vec<Request> {
    vec![
        Request::Hello { protocol_version: PROTOCOL_VERSION },
        Request::Topology,
        Request::Sample { what: Families::ALL, deadline_ms: 9750 },
    ]
}

fn replies() -> Vec<Reply> {
    let topology = Topology {
        cpu_family: 0x1A,
        cpu_model: 0x11,
        sockets: vec![0, 1],
        cores: vec![
            Core { socket: 0, core: 0, cpu: 0, apic_id: 0, threads: vec![0, 2] },
            Core { socket: 1, core: 8, cpu: 1, apic_id: 256, threads: vec![1, 3] },
        ],
    };
    let mut sample = Sample {
        energy_resets: 3,
        oldest_read_us: 120_000,
        ..Sample::healthy(&topology, Families::ALL)
    };
    sample.readings[Family::CoreEnergy] = Readings::Values(vec![
        Ok(Value::Energy(Energy { counter: 3 << 16, esu: 16 })),
        Err(ItemError::Io { errno: 5 }),
    ]);
    sample.readings[Family::BoostLimit] =
        Readings::Values(vec![Ok(Value::Mhz(3700)), Err(ItemError::DeadlineExceeded)]);
    sample.readings[Family::Prochot] = Readings::Unavailable(Unavailable::Unsupported);
    vec![
        Reply::Hello {
            protocol_version: PROTOCOL_VERSION,
            broker_version: "0.1.0".into(),
            instance: 7,
            simulated: Some("turin-2p".into()),
        },
        Reply::Topology(topology),
        Reply::Sample(sample),
        Reply::Error(RequestError::VersionMismatch { broker: 2, peer: 1 }),
    ]
}

/// Milan 1P-like: four threads, two cores (SMT), APIC ids apart from CPU numbers.
fn topology_seed() -> Vec<u8> {
    let mut cpuinfo = String::new();
    for (cpu, apic) in [(0, 0), (1, 2), (2, 1), (3, 3)] {
        cpuinfo.push_str(&format!(
            "processor\t: {cpu}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n\
             physical id\t: 0\napicid\t\t: {apic}\nflags\t\t: fpu vme\n\n"
        ));
    }
    let mut out = cpuinfo.into_bytes();
    out.extend_from_slice(b"\x000-3\n");
    for core in ["0", "1", "0", "1"] {
        out.push(0);
        out.extend_from_slice(format!("{core}\n").as_bytes());
        out.extend_from_slice(b"\x000\n");
    }
    out
}
