//! The firmware simulator the responder answers from: the one model behind `--simulate` and the
//! FUSE fake. Everything the VM test uses of it is named here, so moving the simulator to its
//! own crate changes only this import.

pub use amd_hsmp_broker::sim::{
    DRIVER_TIMEOUT, Family, Faults, FirmwareConfig, FwStatus, Machine, MachineSpec, Profile, Target,
};

/// A positive errno value.
pub type Errno = amd_hsmp_broker::hsmp::Errno;
