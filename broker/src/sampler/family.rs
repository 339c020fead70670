//! The broker's family table: for every [`Family`] how one of its items is read and how its
//! values become its field of the [`Sample`]. The plan, the boards and the workers go through
//! this table and name no family, so a family read by one HSMP message per item (per core or
//! per socket) is a variant of [`Value`], its arm in [`reading`] and its field in [`sample`].

use amd_hsmp_device::{HsmpTransport, messages};
use amd_hsmp_proto::{
    DeviceStatus, Energy, EnergySource, Family, FrequencyLimit, ItemError, PerFamily, Readings,
    Sample,
};

/// One item's value, as its family has it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Value {
    CoreEnergy(Energy),
    /// MHz.
    BoostLimit(u32),
    /// Asserted.
    Prochot(bool),
    /// The socket's limit and its limiters.
    FrequencyLimit(FrequencyLimit),
    /// MHz.
    CoreFrequencyLimit(u32),
    PackageEnergy(Energy),
}

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
        .map(|counter| Value::CoreEnergy(Energy { counter, esu }))
};

/// How `family`'s items are read; what they belong to (a core or a socket) is
/// [`Family::scope`].
pub(super) fn reading(family: Family) -> Reading {
    match family {
        Family::CoreEnergy => Reading::Energy,
        Family::BoostLimit => Reading::Message(|t, socket, apic_id| {
            messages::boost_limit_mhz(t, socket, apic_id).map(Value::BoostLimit)
        }),
        Family::Prochot => {
            Reading::Message(|t, socket, _| messages::prochot(t, socket).map(Value::Prochot))
        }
        Family::FrequencyLimit => Reading::Message(|t, socket, _| {
            messages::socket_freq_limit(t, socket).map(|l| Value::FrequencyLimit(l.into()))
        }),
        Family::CoreFrequencyLimit => Reading::Message(|t, socket, apic_id| {
            messages::core_freq_limit_mhz(t, socket, apic_id).map(Value::CoreFrequencyLimit)
        }),
        Family::PackageEnergy => Reading::Counter(|t, socket, _, esu| {
            messages::rapl_package_counter(t, socket)
                .map(|counter| Value::PackageEnergy(Energy { counter, esu }))
        }),
    }
}

/// The answer to a request from each family's readings.
pub(super) fn sample(
    hsmp: DeviceStatus,
    energy_source: Option<EnergySource>,
    readings: &PerFamily<Readings<Value>>,
    energy_resets: u64,
) -> Sample {
    Sample {
        hsmp,
        energy_source,
        energy: typed(&readings[Family::CoreEnergy], |v| match v {
            Value::CoreEnergy(energy) => Some(energy),
            _ => None,
        }),
        boost_limit: typed(&readings[Family::BoostLimit], |v| match v {
            Value::BoostLimit(mhz) => Some(mhz),
            _ => None,
        }),
        prochot: typed(&readings[Family::Prochot], |v| match v {
            Value::Prochot(asserted) => Some(asserted),
            _ => None,
        }),
        frequency_limit: typed(&readings[Family::FrequencyLimit], |v| match v {
            Value::FrequencyLimit(limit) => Some(limit),
            _ => None,
        }),
        core_frequency_limit: typed(&readings[Family::CoreFrequencyLimit], |v| match v {
            Value::CoreFrequencyLimit(mhz) => Some(mhz),
            _ => None,
        }),
        package_energy: typed(&readings[Family::PackageEnergy], |v| match v {
            Value::PackageEnergy(energy) => Some(energy),
            _ => None,
        }),
        energy_resets,
        max_age_ms: 0,
        oldest_read_us: 0,
        // When each energy value was read: the sampler's to fill in.
        energy_read_at_us: Vec::new(),
        package_energy_read_at_us: Vec::new(),
    }
}

/// `readings` with each value as its family's type. A family's items only ever hold its own
/// values; another family's would read as not read ([`ItemError::DeadlineExceeded`]).
fn typed<T>(readings: &Readings<Value>, value: impl Fn(Value) -> Option<T>) -> Readings<T> {
    match readings {
        Readings::NotRequested => Readings::NotRequested,
        Readings::Unavailable(why) => Readings::Unavailable(*why),
        Readings::Values(values) => Readings::Values(
            values
                .iter()
                .map(|v| v.and_then(|v| value(v).ok_or(ItemError::DeadlineExceeded)))
                .collect(),
        ),
    }
}
