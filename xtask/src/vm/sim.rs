//! The firmware simulator the responder answers from: the one model behind `--simulate` and the
//! FUSE fake. Everything the VM test uses of it is named here.

pub use amd_hsmp_device::{Errno, Message};
pub use amd_hsmp_sim::{
    DRIVER_TIMEOUT, FaultGroup, Faults, FirmwareConfig, FwStatus, Machine, MachineSpec, Profile,
    Target,
};
