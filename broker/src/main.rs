//! `amd-hsmp-broker`: the privileged half, on this machine's devices. The start-up sequence and
//! the exit codes are [`amd_hsmp_broker::daemon`]'s; the simulator is another binary
//! (`amd-hsmp-sim-broker`), so none of it is linked here.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::process::ExitCode;

fn main() -> ExitCode {
    amd_hsmp_broker::daemon::main("amd-hsmp-broker", amd_hsmp_broker::parse(), None)
}
