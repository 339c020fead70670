//! `amd-hsmp-broker`: the privileged half of amd-hsmp-exporter.
//!
//! It discovers the topology, opens `/dev/hsmp` (and, where HSMP has no RAPL, the kernel's
//! `power_core` perf events or, opt-in, the MSR devices) once at start-up, drops every
//! capability, and answers the typed requests of [`amd_hsmp_proto`] on a Unix socket.
//!
//! The kernel interfaces it reads are [`amd_hsmp_device`]. The simulator is not linked here:
//! `amd-hsmp-sim-broker` (crate `amd-hsmp-sim-broker`) serves it through [`daemon::Simulation`].
//!
//! **Invariant:** the broker never listens on an IP socket and never parses text from a peer.
//! **Invariant:** no `unsafe` here; the system calls that need it live in `amd_hsmp_device`.
#![forbid(unsafe_code)]
// Its entry points only: `daemon` and `check` (the two programs) and the re-exports below are
// `pub`; everything else is `pub(crate)` in private modules.
#![warn(unreachable_pub)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// An index out of bounds is a panic the lints above cannot see: use `get` and iterators.
#![deny(clippy::indexing_slicing)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)
)]

pub mod check;
mod cli;
mod counters;
pub mod daemon;
mod energy;
mod hints;
mod hotplug;
mod lockdown;
mod msr;
mod perf;
mod sampler;
mod server;
mod sleep;
mod topology;

// What the other programs of the workspace take from the broker besides `daemon`: its command
// line (flattened into the simulator's broker, rendered into man pages), the topology's discovery
// (fuzzed), the freshness bound (the VM test's exporter check) and the seccomp filter (the
// example that watches it act).
pub use cli::{Args, Cli, command, parse, serving_rules};
pub use lockdown::{SocketFile, install_seccomp};
pub use sampler::DEFAULT_MAX_AGE;
pub use topology::discover as discover_topology;
