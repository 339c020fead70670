//! The HSMP kernel interface: the `hsmp_message` ABI, the messages this exporter sends, and the
//! transport abstraction that lets the same encoding run against `/dev/hsmp` or the simulator.
//!
//! Reference: `arch/x86/include/uapi/asm/amd_hsmp.h` and `drivers/platform/x86/amd/hsmp/hsmp.c`.

pub mod abi;
pub mod device;
pub mod messages;

pub use abi::{HSMP_IOCTL_CMD, HSMP_MAX_MSG_LEN, HsmpMessage, classify};
pub use device::{DEFAULT_HSMP_PATH, DevHsmp, HsmpDeviceOpener};
pub use messages::Message;

/// A positive errno value as returned by the kernel (or reproduced by the simulator).
pub type Errno = i32;

/// Sends HSMP messages, as `ioctl(fd, HSMP_IOCTL_CMD, &msg)` does.
///
/// On success the first `msg.response_sz` words of `msg.args` hold the reply. On failure the
/// errno is the driver's (see [`abi::classify`]).
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

/// Opens the HSMP device. Called at start-up and again while the device is missing, so a
/// `/dev/hsmp` that appears later (a late `modprobe`) is picked up without a restart.
pub trait HsmpOpener: Send + Sync + std::fmt::Debug {
    /// Opens the device read-only; the errno says why not (`ENOENT` absent, `EACCES` denied).
    fn open(&self) -> Result<std::sync::Arc<dyn HsmpTransport>, Errno>;
}

/// Opens the MSR device of one CPU (`/dev/cpu/<cpu>/msr`), read-only.
pub trait MsrOpener: Send + Sync + std::fmt::Debug {
    /// Opens the device of `cpu`; `EPERM` without `CAP_SYS_RAWIO`, `ENOENT` without the module.
    fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno>;
}
