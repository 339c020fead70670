//! The packaged broker serves devices only: the simulator is `amd-hsmp-sim-broker`'s and the
//! checks are `amd-hsmp-check`'s, and none of either may come back into the privileged binary
//! (the dependency list pins the crates; this pins the binaries Cargo builds for these tests).

use std::process::Command;

const BROKER: &str = env!("CARGO_BIN_EXE_amd-hsmp-broker");
const CHECK: &str = env!("CARGO_BIN_EXE_amd-hsmp-check");

/// Whether the file at `path` holds `needle`.
fn holds(path: &str, needle: &str) -> bool {
    let binary = std::fs::read(path).unwrap();
    binary.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn the_broker_takes_no_simulate_flag() {
    let help = Command::new(BROKER).arg("--help").output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("--hsmp.device"), "{help}");
    assert!(!help.contains("--simulate"), "{help}");

    let refused = Command::new(BROKER).args(["--simulate", "turin-2p"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}

#[test]
fn the_broker_binary_holds_no_simulator_code() {
    let binary = std::fs::read(BROKER).unwrap();
    let holds = |needle: &[u8]| binary.windows(needle.len()).any(|w| w == needle);
    // The simulation's log line, and the crate's name in the symbols of its functions.
    for needle in ["SIMULATION", "amd_hsmp_sim"] {
        assert!(!holds(needle.as_bytes()), "{BROKER} contains {needle:?}");
    }
    // The search itself works: the broker's own crate name is in its symbols.
    assert!(holds(b"amd_hsmp_broker"), "{BROKER} has no symbols to search");
}

/// The daemon, which holds capabilities at start-up, links none of the checks: their text (the
/// verdict, a fix, the deadline's thread name) goes with their code, and is in `amd-hsmp-check`.
#[test]
fn the_broker_binary_holds_no_check_code() {
    for needle in [
        "every check a scrape needs passed",
        "check --path.procfs and --path.sysfs",
        "check-deadline",
    ] {
        assert!(!holds(BROKER, needle), "{BROKER} contains {needle:?}");
        assert!(holds(CHECK, needle), "{CHECK} lacks {needle:?}: the search finds nothing");
    }
}
