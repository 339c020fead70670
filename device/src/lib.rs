//! `amd-hsmp-device`: the kernel interfaces the exporter uses, as data and thin calls.
//!
//! - [`abi`]: `struct hsmp_message` and `HSMP_IOCTL_CMD`, laid out as the kernel's uapi header;
//! - [`table`]: the HSMP message ids and the driver's descriptor table (word counts, GET/SET);
//! - [`messages`]: the messages the broker sends, with typed calls over a transport;
//! - [`errno`]: what the driver's errno values mean;
//! - [`msr`]: the RAPL model-specific registers;
//! - [`perf`]: the kernel's `power_core` PMU (per-core energy counted by the kernel), found in
//!   sysfs and opened with `perf_event_open`;
//! - [`cpus`]: which CPUs are online now, read again through a descriptor opened once;
//! - [`files`]: the broker's inputs opened without blocking, as the kind of file each must be,
//!   and read up to a size cap;
//! - the transport traits ([`HsmpTransport`], [`MsrTransport`], [`PerfCounter`] and their
//!   openers) that let the same code talk to the kernel ([`DevHsmp`], [`DevMsr`],
//!   [`perf::DevPerf`]) or to a simulator;
//! - `sys`: the only `unsafe` code of the project, the `ioctl` and `perf_event_open` calls.
//!
//! Every such fact (a message id, a word count, an MSR number) is written here once.
//!
//! Reference: `arch/x86/include/uapi/asm/amd_hsmp.h`, `drivers/platform/x86/amd/hsmp/hsmp.c`
//! and `arch/x86/kernel/msr.c` in the kernel source.
#![deny(unsafe_code)]
// Linked into the privileged process: no panics, as the broker.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)
)]

pub mod abi;
pub mod cpus;
mod dev;
pub mod errno;
pub mod files;
pub mod messages;
pub mod msr;
pub mod perf;
#[allow(unsafe_code)] // The one place the kernel interface needs it; see its SAFETY comment.
mod sys;
pub mod table;

pub use abi::{HSMP_IOCTL_CMD, HSMP_MAX_MSG_LEN, HsmpMessage};
pub use cpus::{OnlineCpus, SysfsOnline};
pub use dev::{
    DEFAULT_HSMP_PATH, DEFAULT_MSR_ROOT, DevHsmp, DevMsr, HsmpDeviceOpener, MsrDeviceOpener,
    errno_of,
};
pub use errno::{Errno, classify};
pub use messages::Message;

/// Sends HSMP messages, as `ioctl(fd, HSMP_IOCTL_CMD, &msg)` does.
///
/// On success the first `msg.response_sz` words of `msg.args` hold the reply. On failure the
/// errno is the driver's (see [`errno::classify`]).
pub trait HsmpTransport: Send + Sync + std::fmt::Debug {
    /// Sends one message and waits for the firmware's answer.
    fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno>;
}

/// Reads model-specific registers of one CPU, as `pread(fd, buf, 8, msr)` on
/// `/dev/cpu/<N>/msr` does.
pub trait MsrTransport: Send + Sync + std::fmt::Debug {
    /// Reads the 64-bit register `msr`.
    fn read(&self, msr: u32) -> Result<u64, Errno>;
}

/// Opens the HSMP device. Called at start-up and again while the device is missing or has
/// gone stale, so a `/dev/hsmp` that appears later (a late `modprobe`) or is replaced (a
/// rebind) is picked up without a restart.
pub trait HsmpOpener: Send + Sync + std::fmt::Debug {
    /// Opens the device read-only; the errno says why not (`ENOENT` absent, `EACCES` denied).
    fn open(&self) -> Result<std::sync::Arc<dyn HsmpTransport>, Errno>;
}

/// Opens the MSR device of one CPU (`/dev/cpu/<cpu>/msr`), read-only.
pub trait MsrOpener: Send + Sync + std::fmt::Debug {
    /// Opens the device of `cpu`; `EPERM` without `CAP_SYS_RAWIO`, `ENOENT` without the module.
    fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno>;
}

/// One reading of a perf event opened with its enabled and running times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerfReading {
    /// The event's count (for `energy-core`, units of 2^-32 J since the open).
    pub value: u64,
    /// Nanoseconds the event has been enabled.
    pub enabled_ns: u64,
    /// Nanoseconds the event has been counting; it stops moving while the event's CPU is
    /// offline.
    pub running_ns: u64,
}

/// One open perf event, read as `read(fd, buf, 24)` does.
pub trait PerfCounter: Send + Sync + std::fmt::Debug {
    /// Reads the count and the times; `ENODEV` when the event no longer counts.
    fn read(&self) -> Result<PerfReading, Errno>;
}

/// Opens the per-core energy event on one CPU, as `perf_event_open(attr, -1, cpu, -1, ..)`.
pub trait PerfOpener: Send + Sync + std::fmt::Debug {
    /// Opens the event on `cpu`; `EACCES` without `CAP_PERFMON` (or a low enough
    /// `perf_event_paranoid`), `ENOENT` for a PMU the kernel does not have.
    fn open(&self, cpu: u32) -> Result<Box<dyn PerfCounter>, Errno>;
}

/// Finds the per-core energy PMU and opens its events: this machine's sysfs and
/// `perf_event_open` ([`perf::SysfsPmu`]), or a simulator.
pub trait PmuLocator: Send + Sync + std::fmt::Debug {
    /// The PMU's description and the opener of its `energy-core` event.
    fn locate(&self) -> Result<(perf::Pmu, Box<dyn PerfOpener>), perf::PmuError>;
}
