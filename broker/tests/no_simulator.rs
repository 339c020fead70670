//! The packaged broker serves devices only: the simulator is `amd-hsmp-sim-broker`'s, and none of
//! it may come back into the privileged binary (the dependency list pins the crate; this pins
//! the binary Cargo builds for these tests).

use std::process::Command;

const BROKER: &str = env!("CARGO_BIN_EXE_amd-hsmp-broker");

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
