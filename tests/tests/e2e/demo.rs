//! The demo as a newcomer meets it: a simulating broker started by an ordinary user serves
//! that user, and the landing page, rendered by a real headless Chromium against the simulated
//! Turin 2P, shows a heatmap cell per core, PROCHOT and the simulation, for the cost of one
//! sample per view.
//!
//! `UPDATE_SCREENSHOT=1` makes the Chromium test also write `docs/landing-page.png`.

use amd_hsmp_e2e::fake::{FakeConfig, FakeDevice, NodeState};
use amd_hsmp_e2e::fixtures;
use amd_hsmp_e2e::harness::{self, Exposition, Proc};
use amd_hsmp_exporter::collectors::Collectors;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(20);
/// `nobody` on Debian and EL alike; the tests run as root and switch to it.
const NOBODY: u32 = 65534;
/// Another unprivileged uid, with no passwd entry needed.
const STRANGER: u32 = 65533;

/// `program args` as `uid` (and gid `uid`, no supplementary groups), through util-linux
/// `setpriv`.
fn as_user(uid: u32, program: &Path, args: &[&str]) -> (PathBuf, Vec<String>) {
    let mut line = vec![
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
        "--".into(),
        program.display().to_string(),
    ];
    line.extend(args.iter().map(|a| a.to_string()));
    (PathBuf::from("setpriv"), line)
}

/// A directory anyone may write, for the sockets and logs of processes of other users.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn spawn_as(uid: u32, name: &'static str, program: &Path, args: &[&str], log: PathBuf) -> Proc {
    let (setpriv, line) = as_user(uid, program, args);
    let setpriv = harness::which(&setpriv).expect("setpriv (util-linux)");
    Proc::spawn(name, &setpriv, &line, log).unwrap()
}

/// An exporter as `uid` for `socket` on a free port, waited for until it serves.
fn exporter_as(uid: u32, socket: &Path, dir: &Path, log: &str) -> (Proc, SocketAddr) {
    let addr: SocketAddr = ([127, 0, 0, 1], harness::free_port().unwrap()).into();
    let exe = &harness::binaries().unwrap().exporter;
    let (listen, socket) = (addr.to_string(), socket.display().to_string());
    let args = ["--web.listen-address", &listen, "--broker.socket", &socket];
    let mut proc = spawn_as(uid, "amd-hsmp-exporter", exe, &args, dir.join(log));
    harness::wait_until(&mut proc, "exporter", || {
        harness::http_get(addr, "/metrics", &[], Duration::from_secs(2)).is_ok()
    })
    .unwrap();
    (proc, addr)
}

fn metrics(addr: SocketAddr) -> Exposition {
    let response = harness::http_get(addr, "/metrics", &[], TIMEOUT).unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    Exposition::parse(&response.body).unwrap()
}

#[test]
#[ignore = "needs root (runs the daemons as other uids): cargo xtask test runs it"]
fn broker_started_as_a_non_root_user_with_simulate_serves_its_own_uid() {
    let dir = shared_dir();
    let socket = dir.path().join("broker.sock");
    let broker_exe = &harness::binaries().unwrap().sim_broker;
    let sock = socket.display().to_string();
    // 0666 so that the stranger reaches the allow-list instead of failing at connect().
    let args = ["--simulate", "turin-2p", "--listen", &sock, "--listen.mode", "0666"];
    let mut broker =
        spawn_as(NOBODY, "amd-hsmp-sim-broker", broker_exe, &args, dir.path().join("broker.log"));
    harness::wait_listening(&mut broker, &socket).unwrap();
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), NOBODY);

    let (mut own, own_addr) = exporter_as(NOBODY, &socket, dir.path(), "exporter-nobody.log");
    let m = metrics(own_addr);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}\n{}", own.log(), broker.log());
    assert_eq!(m.value("amd_hsmp_up"), Some(1.0));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);

    // Only its own uid: another ordinary user is still refused.
    let (_stranger, stranger_addr) =
        exporter_as(STRANGER, &socket, dir.path(), "exporter-stranger.log");
    let m = metrics(stranger_addr);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0), "{}", broker.log());
    assert!(broker.log().contains(&STRANGER.to_string()), "{}", broker.log());
    own.check_running().unwrap();
}

#[test]
fn simulate_scenario_without_simulate_and_a_bad_socket_mode_exit_2() {
    let broker = &harness::binaries().unwrap().sim_broker;
    for args in [
        &["--simulate.scenario", "thermal-event", "--listen", "/nonexistent/s"][..],
        &["--simulate", "turin-2p", "--simulate.scenario", "meltdown"][..],
        &["--simulate", "turin-2p", "--listen", "/nonexistent/s", "--listen.mode", "0777"][..],
    ] {
        let out = Command::new(broker).args(args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `chromium --headless` with the flags that keep it off the network and out of the profile.
fn chromium(what: &[String], url: &str) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .args(["120", "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic"])
        .args(["--no-first-run", "--disable-background-networking", "--disable-component-update"])
        .args(["--disable-sync", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(what)
        .arg(url)
        .output()
        .expect("chromium (Debian's chromium package; cargo xtask deps installs it)");
    assert!(out.status.success(), "chromium: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// The `data-value` of every `<rect class="cell KIND"` of socket `socket`'s heatmap.
fn cells(dom: &str, kind: &str, socket: u32) -> Vec<String> {
    let start = format!("<svg class=\"heatmap {kind}\" data-socket=\"{socket}\"");
    let Some(at) = dom.find(&start) else { return Vec::new() };
    let svg = &dom[at..at + dom[at..].find("</svg>").unwrap_or(0)];
    svg.split(&format!("<rect class=\"cell {kind}\""))
        .skip(1)
        .map(|rect| {
            let v = rect.split("data-value=\"").nth(1).unwrap_or_default();
            v[..v.find('"').unwrap_or(0)].to_owned()
        })
        .collect()
}

#[test]
#[ignore = "needs chromium (cargo xtask deps installs it): cargo xtask test runs it"]
fn landing_page_renders_in_chromium_with_a_cell_per_core_prochot_and_the_simulation() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let _broker =
        harness::start_simulated_broker("turin-2p", &socket, &[], dir.path().join("broker.log"))
            .unwrap();
    let (exporter, addr) = harness::start_exporter(&socket, &[], None, dir.path()).unwrap();
    // No scrape before: the first view takes the two samples power needs itself.
    let url = format!("http://{addr}/");
    let dom = String::from_utf8(chromium(&["--dump-dom".into()], &url).stdout).unwrap();

    assert!(dom.contains("id=\"simulated\""), "{dom}");
    assert!(dom.contains("profile <b>turin-2p</b>"));
    assert!(dom.contains("<title>AMD HSMP Exporter: simulated turin-2p</title>"));
    // A Turin 9965 core gets at most 75 % of 500 W / 192 (1.953125 W), as the cell writes it.
    let spec = amd_hsmp_sim::Profile::Turin2p.spec();
    let cap =
        amd_hsmp_sim::live::CORE_SHARE_OF_TDP * f64::from(spec.tdp_w) / spec.core_ids.len() as f64;
    let cap = (cap * 1000.0).round() / 1000.0;
    for socket in [0, 1] {
        let power = cells(&dom, "power", socket);
        assert_eq!(power.len(), 192, "socket {socket}\n{}", exporter.log());
        for w in &power {
            let w: f64 = w.parse().unwrap_or_else(|_| panic!("power cell {w:?}"));
            assert!((0.0..=cap).contains(&w), "socket {socket}: {w} W above {cap} W");
        }
        let boost = cells(&dom, "boost", socket);
        assert_eq!(boost.len(), 192);
        assert!(boost.iter().all(|mhz| mhz.parse::<u32>().is_ok_and(|m| m <= 3700)), "{boost:?}");
        let prochot = format!("data-socket=\"{socket}\" data-asserted=\"false\">clear");
        assert!(dom.contains(&prochot), "socket {socket}");
    }
    assert!(dom.contains("<td id=\"broker\"><span class=\"ok\">answering"));
    assert!(dom.contains("HSMP protocol 7"));

    let png = dir.path().join("landing.png");
    let what = [format!("--screenshot={}", png.display()), "--window-size=960,620".into()];
    chromium(&what, &url);
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "{}", bytes.len());
    if std::env::var_os("UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/landing-page.png");
        std::fs::copy(&png, docs).unwrap();
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_page_view_costs_one_sample_as_a_scrape_does() {
    let spec = fixtures::machine("turin-2p").unwrap();
    let cpus: Vec<u32> = spec.cpus().iter().filter(|c| c.online).map(|c| c.cpu).collect();
    // What a scrape with the default collectors costs, by the rule the documents state.
    let one_sample = spec.messages_per_sample(Collectors::default().families()) as u64;
    let machine = amd_hsmp_sim::Machine::new(spec, amd_hsmp_sim::FirmwareConfig::static_values());
    let device = FakeDevice::mount(FakeConfig {
        hsmp: Arc::new(Arc::clone(&machine)),
        msr: Arc::new(machine.msr_opener()),
        cpus,
        hsmp_state: NodeState::Present,
        msr_state: NodeState::Present,
    })
    .expect("mount the fake device (needs /dev/fuse and fusermount3 from fuse3)");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let tree = fixtures::tree(&fixtures::fixtures_dir(), "turin-2p");
    let mut args = device.broker_args(&tree);
    args.extend(["--listen".into(), socket.display().to_string()]);
    // Each request reads afresh, so that each costs what it costs alone: with the freshness
    // bound, requests within it would share one reading.
    args.extend(["--sample.max-age".into(), "0".into()]);
    let broker_exe = &harness::binaries().unwrap().broker;
    let mut broker =
        Proc::spawn("amd-hsmp-broker", broker_exe, &args, dir.path().join("b.log")).unwrap();
    harness::wait_listening(&mut broker, &socket).unwrap();
    let (_exporter, addr) = harness::start_exporter(&socket, &[], None, dir.path()).unwrap();

    // The first view after start has no earlier answer to take power from, so it takes a
    // second sample (`MIN_POWER_INTERVAL` after the first); every later view takes one.
    for (path, samples) in [("/", 2), ("/metrics", 1), ("/", 1), ("/", 1)] {
        machine.counters().reset();
        let response = harness::http_get(addr, path, &[], TIMEOUT).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(machine.counters().mailbox_total(), samples * one_sample, "GET {path}");
    }
    drop(broker);
}
