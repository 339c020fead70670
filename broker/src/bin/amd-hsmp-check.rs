//! `amd-hsmp-check`: every precondition of a scrape on this machine, one line each with its
//! verdict and fix. It takes the broker's flags, so that it checks the service as configured;
//! the checks are [`amd_hsmp_broker::check`]'s, and the daemon binary links none of them.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use amd_hsmp_broker::check;
use std::process::ExitCode;

fn main() -> ExitCode {
    check::main(check::PROGRAM, check::args(), None)
}
