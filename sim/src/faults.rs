//! Fault injection for the simulator: plain data the test suite fills in to make the simulated
//! driver and firmware fail the way real machines do.

use amd_hsmp_device::Errno;
use amd_hsmp_device::table::id;
use amd_hsmp_proto::Family;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long the kernel driver waits for the firmware (`HSMP_MSG_TIMEOUT`).
pub const DRIVER_TIMEOUT: Duration = Duration::from_millis(100);

/// A group of messages or registers that fail together. Scenario files name them in kebab
/// case: a group that reads a protocol family has the family's name ([`FaultGroup::of_family`]:
/// `core-energy`, `boost-limit`, `prochot`, `frequency-limit`, `core-frequency-limit`,
/// `package-energy`); the others are `test`, `smu-version`, `proto-version`, `msr` and `perf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultGroup {
    /// `HSMP_TEST`.
    Test,
    /// `HSMP_GET_SMU_VER`.
    SmuVersion,
    /// `HSMP_GET_PROTO_VER`.
    ProtoVersion,
    /// `HSMP_GET_BOOST_LIMIT`.
    BoostLimit,
    /// `HSMP_GET_PROC_HOT`.
    Prochot,
    /// `HSMP_GET_RAPL_UNITS`, `HSMP_GET_RAPL_CORE_COUNTER`: without them the package counter,
    /// in the same units, is read as absent too.
    CoreEnergy,
    /// `HSMP_GET_RAPL_PACKAGE_COUNTER` alone, for firmware that has the core counters only.
    PackageEnergy,
    /// `HSMP_GET_SOCKET_FREQ_LIMIT`.
    FrequencyLimit,
    /// `HSMP_GET_CCLK_CORE_LIMIT`.
    CoreFrequencyLimit,
    /// The RAPL MSRs ([`amd_hsmp_device::msr`]).
    Msr,
    /// The kernel's `power_core` PMU ([`amd_hsmp_device::perf`]): unsupported, the kernel has
    /// none; an errno for a CPU, its event's reads fail.
    Perf,
}

impl FaultGroup {
    /// The group of HSMP message `msg_id`, if the simulator implements it.
    pub fn of_message(msg_id: u32) -> Option<FaultGroup> {
        Some(match msg_id {
            id::TEST => FaultGroup::Test,
            id::GET_SMU_VER => FaultGroup::SmuVersion,
            id::GET_PROTO_VER => FaultGroup::ProtoVersion,
            id::GET_BOOST_LIMIT => FaultGroup::BoostLimit,
            id::GET_PROC_HOT => FaultGroup::Prochot,
            id::GET_RAPL_UNITS | id::GET_RAPL_CORE_COUNTER => FaultGroup::CoreEnergy,
            id::GET_RAPL_PACKAGE_COUNTER => FaultGroup::PackageEnergy,
            id::GET_SOCKET_FREQ_LIMIT => FaultGroup::FrequencyLimit,
            id::GET_CCLK_CORE_LIMIT => FaultGroup::CoreFrequencyLimit,
            _ => return None,
        })
    }

    /// The group of the messages the broker reads protocol family `family` with; it has the
    /// family's name ([`Family::name`]).
    pub const fn of_family(family: Family) -> FaultGroup {
        match family {
            Family::CoreEnergy => FaultGroup::CoreEnergy,
            Family::BoostLimit => FaultGroup::BoostLimit,
            Family::Prochot => FaultGroup::Prochot,
            Family::FrequencyLimit => FaultGroup::FrequencyLimit,
            Family::CoreFrequencyLimit => FaultGroup::CoreFrequencyLimit,
            Family::PackageEnergy => FaultGroup::PackageEnergy,
        }
    }

    /// The protocol family this group's messages read, if any: the inverse of
    /// [`FaultGroup::of_family`]. `None` for the groups of no family (the protocol version,
    /// the MSR).
    pub fn family(self) -> Option<Family> {
        Family::ALL.into_iter().find(|&family| FaultGroup::of_family(family) == self)
    }
}

/// What a message or register read is about, to inject a fault for one item only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// A per-core HSMP message (`GET_BOOST_LIMIT`, `GET_RAPL_CORE_COUNTER`,
    /// `GET_CCLK_CORE_LIMIT`) for this APIC id.
    Apic(u32),
    /// Any other HSMP message sent to this socket index.
    Socket(u32),
    /// An MSR read on this Linux CPU.
    Cpu(u32),
}

/// Faults the simulator injects. The default injects none and keeps the driver's 100 ms
/// timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults {
    /// Groups the firmware does not implement: HSMP messages get "invalid message"
    /// (`ENOMSG`), MSR reads get `EIO` as a `#GP` would.
    pub unsupported: BTreeSet<FaultGroup>,
    /// An errno returned for one item of one group (e.g. `EIO` for `GET_BOOST_LIMIT` of one
    /// APIC id), after the driver's validation and the socket lock, like a firmware failure.
    pub errno: BTreeMap<(FaultGroup, Target), Errno>,
    /// Time every HSMP message spends in the mailbox, holding its socket's lock. From
    /// `driver_timeout` on, the driver gives up with `ETIMEDOUT` after `driver_timeout`.
    pub latency: Duration,
    /// Sockets whose messages take this long instead of [`latency`](Faults::latency): one slow
    /// socket beside normal ones, as firmware busy on one package gives.
    pub socket_latency: BTreeMap<u32, Duration>,
    /// Sockets whose mailbox never answers: every message times out (`ETIMEDOUT` after
    /// `driver_timeout`).
    pub wedged_sockets: BTreeSet<u32>,
    /// How long the driver waits for an answer; the kernel's is [`DRIVER_TIMEOUT`].
    pub driver_timeout: Duration,
    /// If set, opening the HSMP device fails with this errno (`ENOENT` module not loaded,
    /// `EACCES` no permission).
    pub hsmp_open: Option<Errno>,
    /// If set, opening any MSR device fails with this errno (`EPERM` without
    /// `CAP_SYS_RAWIO`, `ENOENT` module not loaded).
    pub msr_open: Option<Errno>,
    /// If set, opening any `power_core` event fails with this errno (`EACCES` without
    /// `CAP_PERFMON`).
    pub perf_open: Option<Errno>,
    /// CPUs taken offline at run time (CPU hotplug), on top of the machine's
    /// [`offline_cpus`](crate::MachineSpec::offline_cpus), as the kernel's hotplug leaves them
    /// (each pinned on a real kernel by `device/tests/hotplug.rs`,
    /// `a_cpu_going_offline_freezes_its_perf_events_for_good_and_fails_its_device_reads_until_it_returns`):
    ///
    /// - a `power_core` event opened on the CPU is lost for good once the CPU has been offline
    ///   at any moment after its open, even if it is online again at the next read: its reads
    ///   succeed, count and times standing still (`kernel/events/core.c`,
    ///   `perf_event_exit_cpu_context()` detaches it at offline, nothing attaches it again at
    ///   online); an event opened while the CPU is offline is refused `ENODEV`
    ///   (`perf_event_open()`); see [`SimPerfOpener`](crate::perf::SimPerfOpener);
    /// - a read of one of its MSRs fails `ENXIO` (`arch/x86/kernel/msr.c`, `msr_read()`: the
    ///   cross-CPU call refuses an offline CPU), and the same open transport reads again once the
    ///   CPU is back; opening its MSR device fails `ENXIO`, as `msr_open()` answers for an
    ///   offline CPU (the real node is also removed at offline, so an open by path finds none,
    ///   `ENOENT`); see [`Machine::open_msr`](crate::Machine::open_msr);
    /// - it is missing from [`Machine::online_cpus`](crate::Machine::online_cpus).
    ///
    /// Taking a CPU out of the set puts it back online.
    pub offline: BTreeSet<u32>,
}

impl Default for Faults {
    fn default() -> Faults {
        Faults {
            unsupported: BTreeSet::new(),
            errno: BTreeMap::new(),
            latency: Duration::ZERO,
            socket_latency: BTreeMap::new(),
            wedged_sockets: BTreeSet::new(),
            driver_timeout: DRIVER_TIMEOUT,
            hsmp_open: None,
            msr_open: None,
            perf_open: None,
            offline: BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MachineSpec;
    use serde::Deserialize as _;
    use serde::de::IntoDeserializer as _;
    use serde::de::value::Error;

    #[test]
    fn every_protocol_family_has_the_fault_group_of_its_name() {
        for family in Family::ALL {
            let named = FaultGroup::deserialize(family.name().into_deserializer());
            assert_eq!(named, Ok::<_, Error>(FaultGroup::of_family(family)), "{family}");
        }
    }

    #[test]
    fn a_familys_fault_group_is_the_group_of_the_message_it_is_read_with() {
        for family in Family::ALL {
            let message = MachineSpec::message(family);
            let group = FaultGroup::of_message(message.id());
            assert_eq!(group, Some(FaultGroup::of_family(family)), "{family}: {message:?}");
        }
    }

    #[test]
    fn the_groups_without_a_protocol_family_keep_their_names() {
        for (name, group) in [
            ("test", FaultGroup::Test),
            ("smu-version", FaultGroup::SmuVersion),
            ("proto-version", FaultGroup::ProtoVersion),
            ("msr", FaultGroup::Msr),
            ("perf", FaultGroup::Perf),
        ] {
            let named = FaultGroup::deserialize(name.into_deserializer());
            assert_eq!(named, Ok::<_, Error>(group), "{name}");
            assert!(Family::from_name(name).is_none(), "{name}");
        }
    }
}
