//! The broker's family table: for every [`Family`] how one of its items is read, as a
//! [`Value`] of the family's kind. The plan, the boards and the workers go through this table and
//! name no family, and the sample is a table indexed by the family
//! ([`Sample::readings`](amd_hsmp_proto::Sample::readings)), so a family read by one HSMP
//! message per item (per core or per socket) is its arm in [`reading`].

use amd_hsmp_device::{HsmpTransport, messages};
use amd_hsmp_proto::{Energy, Family, ItemError, Value};

/// Reads one item of an HSMP family: the transport, the socket's id and the core's APIC id
/// (0 for a family read per socket).
pub(super) type ReadItem = fn(&dyn HsmpTransport, u32, u32) -> Result<Value, ItemError>;

/// Reads one item of an HSMP RAPL counter family: the transport, the socket's id, the core's
/// APIC id (0 for a family read per socket) and the socket's energy status unit.
pub(super) type ReadCounter = fn(&dyn HsmpTransport, u32, u32, u8) -> Result<Value, ItemError>;

/// How a family's items are read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reading {
    /// One HSMP message per item.
    Message(ReadItem),
    /// One HSMP RAPL counter message per item, in the socket's energy status unit
    /// (`GET_RAPL_UNITS`, asked once per device).
    Counter(ReadCounter),
    /// The core energy counters: HSMP RAPL as a [`Reading::Counter`] ([`CORE_COUNTER`]), or
    /// the MSR fallback.
    Energy,
}

/// How [`Reading::Energy`] reads a core's counter through HSMP.
pub(super) const CORE_COUNTER: ReadCounter = |t, socket, apic_id, esu| {
    messages::rapl_core_counter(t, socket, apic_id)
        .map(|counter| Value::Energy(Energy { counter, esu }))
};

/// How `family`'s items are read; what they belong to (a core or a socket) is
/// [`Family::scope`].
pub(super) fn reading(family: Family) -> Reading {
    match family {
        Family::CoreEnergy => Reading::Energy,
        Family::BoostLimit => Reading::Message(|t, socket, apic_id| {
            messages::boost_limit_mhz(t, socket, apic_id).map(Value::Mhz)
        }),
        Family::Prochot => {
            Reading::Message(|t, socket, _| messages::prochot(t, socket).map(Value::Asserted))
        }
        Family::FrequencyLimit => Reading::Message(|t, socket, _| {
            messages::socket_freq_limit(t, socket).map(|l| Value::FrequencyLimit(l.into()))
        }),
        Family::CoreFrequencyLimit => Reading::Message(|t, socket, apic_id| {
            messages::core_freq_limit_mhz(t, socket, apic_id).map(Value::Mhz)
        }),
        Family::PackageEnergy => Reading::Counter(|t, socket, _, esu| {
            messages::rapl_package_counter(t, socket)
                .map(|counter| Value::Energy(Energy { counter, esu }))
        }),
    }
}
