//! End-to-end tests of the real `amd-hsmp-broker` binary on the simulated Turin 2P: the sample
//! over the socket, robustness against bad frames, the peer allow-list and the lock-down.

use amd_hsmp_proto::{
    self as proto, Families, Message, PROTOCOL_VERSION, Readings, Reply, Request,
};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A broker child process that is killed when the test ends, pass or fail.
struct Broker {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Broker {
    fn start(extra: &[&str]) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("broker.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_amd-hsmp-broker"))
            .args(["--simulate", "turin-2p", "--log.level", "warn", "--log.format", "json"])
            .arg("--listen")
            .arg(&socket)
            .args(extra)
            .stderr(std::fs::File::create(dir.path().join("broker.log")).unwrap())
            .spawn()
            .unwrap();
        let mut broker = Broker { child, socket, _dir: dir };
        let started = Instant::now();
        while UnixStream::connect(&broker.socket).is_err() {
            assert!(broker.child.try_wait().unwrap().is_none(), "broker exited at start-up");
            assert!(started.elapsed() < Duration::from_secs(10), "broker did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        broker
    }

    /// A broker whose socket file anyone may reach, so that the broker's own peer check is
    /// what decides. Needs root, to run clients under other uids.
    fn start_open_to_all(extra: &[&str]) -> Broker {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test switches uid and must run as root (CI does)"
        );
        let broker = Broker::start(extra);
        let mode = |m| std::fs::Permissions::from_mode(m);
        std::fs::set_permissions(broker.socket.parent().unwrap(), mode(0o755)).unwrap();
        std::fs::set_permissions(&broker.socket, mode(0o666)).unwrap();
        broker
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("broker.log")).unwrap()
    }

    fn status(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap()
    }
}

fn call(s: &mut UnixStream, req: &Request) -> Reply {
    req.write(s).unwrap();
    Reply::read(s).unwrap()
}

fn hello(s: &mut UnixStream) {
    match call(s, &Request::Hello { protocol_version: PROTOCOL_VERSION }) {
        Reply::Hello { simulated, .. } => assert_eq!(simulated.as_deref(), Some("turin-2p")),
        other => panic!("expected Hello, got {other:?}"),
    }
}

fn values<T: std::fmt::Debug>(r: Readings<T>) -> Vec<Result<T, proto::ItemError>> {
    match r {
        Readings::Values(values) => values,
        other => panic!("expected values, got {other:?}"),
    }
}

/// True if the broker closed `s` (EOF on read).
fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0))
}

#[test]
fn full_sample_of_a_simulated_turin_2p() {
    let broker = Broker::start(&[]);
    let mut s = broker.connect();
    hello(&mut s);
    let Reply::Topology(topology) = call(&mut s, &Request::Topology) else { panic!() };
    assert_eq!(topology.sockets, vec![0, 1]);
    assert_eq!(topology.cores.len(), 384);
    // EPYC numbering: thread-0 siblings of both sockets first, so APIC ids are not CPU numbers.
    assert!(topology.cores.iter().any(|c| c.apic_id != c.cpu));

    let Reply::Sample(sample) =
        call(&mut s, &Request::Sample { what: Families::ALL, deadline_ms: 5000 })
    else {
        panic!()
    };
    assert_eq!(sample.hsmp, proto::DeviceStatus::Ready { protocol_version: 7 });
    assert_eq!(sample.energy_source, Some(proto::EnergySource::Hsmp));
    let energy = values(sample.energy);
    let boost = values(sample.boost_limit);
    let prochot = values(sample.prochot);
    assert_eq!(energy.len() + boost.len(), 768);
    assert_eq!(prochot.len(), 2);
    assert!(energy.iter().all(Result::is_ok), "{energy:?}");
    assert!(prochot.iter().all(Result::is_ok), "{prochot:?}");
    assert!(boost.iter().all(|b| matches!(b, Ok(mhz) if (1000..=6000).contains(mhz))));
}

#[test]
fn disabled_families_are_not_read() {
    let broker = Broker::start(&[]);
    let mut s = broker.connect();
    hello(&mut s);
    let what = Families { prochot: true, ..Families::default() };
    let Reply::Sample(sample) = call(&mut s, &Request::Sample { what, deadline_ms: 5000 }) else {
        panic!()
    };
    assert_eq!(sample.energy, Readings::NotRequested);
    assert_eq!(sample.boost_limit, Readings::NotRequested);
    assert_eq!(values(sample.prochot).len(), 2);
}

#[test]
fn bad_frames_close_only_their_connection() {
    let broker = Broker::start(&[]);
    let mut good = broker.connect();
    hello(&mut good);

    let mut garbage = broker.connect();
    garbage.write_all(&[5, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0xff]).unwrap();
    assert!(closed(&mut garbage), "garbage payload must close the connection");

    let mut oversized = broker.connect();
    oversized.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(closed(&mut oversized), "oversized length must close the connection");

    let mut truncated = broker.connect();
    truncated.write_all(&[10, 0, 0, 0, 0]).unwrap();
    truncated.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut truncated), "truncated frame must close the connection");

    let mut trailing = broker.connect();
    trailing.write_all(&[3, 0, 0, 0, 0, 1, 0]).unwrap();
    assert!(closed(&mut trailing), "trailing bytes must close the connection");

    // The first connection and the broker are unharmed.
    assert!(matches!(call(&mut good, &Request::Topology), Reply::Topology(_)));
    let mut fresh = broker.connect();
    hello(&mut fresh);
    assert!(broker.child.id() > 0);
}

#[test]
fn lockdown_is_visible_in_proc_status() {
    let broker = Broker::start(&["--collector.core-energy.msr-fallback"]);
    let status = broker.status();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("{name} missing from /proc/<pid>/status"))
    };
    for cap in ["CapEff:", "CapPrm:", "CapBnd:", "CapInh:", "CapAmb:"] {
        assert_eq!(field(cap), "0000000000000000", "{cap}");
    }
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2");
    // Still serves after the lock-down, MSR fallback included.
    let mut s = broker.connect();
    hello(&mut s);
    assert!(matches!(
        call(&mut s, &Request::Sample { what: Families::ALL, deadline_ms: 5000 }),
        Reply::Sample(_)
    ));
}

/// The `probe` example, copied where an unprivileged user can run it.
fn probe_as(uid: u32, socket: &Path) -> (bool, String) {
    let examples =
        std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let probe = dir.path().join("probe");
    if !examples.join("probe").exists() {
        // `cargo test --test broker` alone does not build examples.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "amd-hsmp-broker", "--example", "probe"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot build examples/probe");
    }
    std::fs::copy(examples.join("probe"), &probe).unwrap();
    let out = Command::new(&probe).arg(socket).uid(uid).gid(uid).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

use std::os::unix::process::CommandExt;

#[test]
fn peers_not_on_the_allow_list_are_refused() {
    let broker = Broker::start_open_to_all(&["--allow-uid", "65533"]);

    let (ok, out) = probe_as(65534, &broker.socket);
    assert!(!ok, "uid 65534 must be refused, got: {out}");
    assert!(out.starts_with("error:") && !out.contains("topology"), "{out}");
    let log = broker.log();
    assert!(log.contains("peer not allowed") && log.contains("\"uid\":65534"), "{log}");

    let (ok, out) = probe_as(65533, &broker.socket);
    assert!(ok, "uid 65533 is allowed: {out}");
    assert!(out.contains("384 cores"), "{out}");
}

#[test]
fn groups_are_allowed_by_name() {
    let broker = Broker::start_open_to_all(&["--allow-group", "nogroup"]);
    // probe_as runs with gid = uid; gid 65534 is nogroup on Debian.
    let (ok, out) = probe_as(65534, &broker.socket);
    assert!(ok, "gid 65534 (nogroup) is allowed: {out}");
    let (ok, out) = probe_as(65533, &broker.socket);
    assert!(!ok, "gid 65533 must be refused, got: {out}");
}

#[test]
fn an_unknown_group_name_stops_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_amd-hsmp-broker"))
        .args(["--simulate", "milan-1p", "--allow-group", "no-such-group-here", "--listen"])
        .arg(dir.path().join("s.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-group \"no-such-group-here\": no such group"), "{err}");
    assert!(!dir.path().join("s.sock").exists(), "no socket may be created");
}

#[test]
fn unknown_flags_are_usage_errors() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_amd-hsmp-broker")).arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}
