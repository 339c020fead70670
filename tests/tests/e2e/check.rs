//! The broker's `--check` mode and its permission-denied log lines, on the real binary.

use amd_hsmp_e2e::harness;
use amd_hsmp_e2e::scenario::{self, Rig};
use std::process::Command;

#[test]
fn the_check_prints_one_line_per_precondition_and_fails_without_the_socket() {
    let bins = harness::binaries().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let out = Command::new(&bins.sim_broker)
        .args(["--check", "--simulate", "turin-2p", "--listen"])
        .arg(&socket)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (checks, verdict) = text.trim_end().rsplit_once('\n').unwrap();
    let names: Vec<&str> = checks
        .lines()
        .filter_map(|l| l.get(6..).and_then(|r| r.split_whitespace().next()))
        .collect();
    assert_eq!(
        names,
        ["cpu", "driver", "protocol", "cores", "boost", "energy", "socket"],
        "{text}"
    );
    assert!(text.contains("ok    protocol  HSMP protocol 7 on 2 socket(s)"), "{text}");
    let socket_line =
        text.lines().find(|l| l.get(6..).is_some_and(|r| r.starts_with("socket"))).unwrap();
    assert!(socket_line.starts_with("FAIL  socket"), "{text}");
    assert!(socket_line.contains("fix: systemctl enable --now amd-hsmp-broker.socket"), "{text}");
    assert_eq!(
        verdict, "amd-hsmp-sim-broker --check: a scrape cannot work as it should; see FAIL above",
        "{text}"
    );
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_refused_device_is_logged_with_the_udev_rule_and_the_audit_log() {
    let toml = "description = \"\"\nmachine = \"genoa-2p\"\nhsmp = \"denied\"\n[[scrapes]]\n";
    let mut rig = Rig::start(&scenario::parse(toml).unwrap()).unwrap();
    let response = rig.scrape(&scenario::Scrape::default()).unwrap();
    assert!(response.body.contains("amd_hsmp_up 0"), "{}", response.body);
    let log = rig.broker_log();
    let line = log
        .lines()
        .find(|l| l.contains("HSMP device refused"))
        .unwrap_or_else(|| panic!("{}", rig.logs()));
    assert!(line.contains("ausearch -m avc -c amd-hsmp-broker"), "{line}");
    assert!(line.contains("udevadm trigger"), "{line}");
    assert!(line.contains("amd-hsmp-broker --check"), "{line}");
}
