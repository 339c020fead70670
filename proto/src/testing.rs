//! Examples of the contract for tests (the `testing` feature, which only dev-dependencies
//! enable): a machine and a healthy broker's answer, so that a test states what it changes and
//! takes the rest from here, e.g. `sample.readings[Family::Prochot] = ...` on `Sample::healthy(&topology, what)`.
//! A new family is written here once, not in every test that builds a sample.

use crate::{
    Core, DeviceStatus, Energy, EnergySource, Families, Family, FrequencyLimit, ItemError,
    PerFamily, Readings, Sample, Topology, Value,
};

/// Energy status unit exponent of the examples (RAPL's usual 2^-16 J).
pub const ESU: u8 = 16;

/// The package energy of socket 0 in [`Sample::healthy`], in joules: above the cores' sum
/// of a machine of up to 64 cores, as a package's must be.
pub const PACKAGE_JOULES: u64 = 100_000;

/// When core 0's and each socket's package energy were read in [`Sample::healthy`], µs of
/// `CLOCK_MONOTONIC`: 1 s after boot; core `i` 10 µs × `i` later.
pub const READ_AT_US: u64 = 1_000_000;

/// A Zen 5 machine of `sockets` × `cores_per_socket` cores, one thread each; core ids step by
/// 2 (sparse, as on real parts) and APIC ids differ from CPU numbers.
pub fn topology(sockets: u32, cores_per_socket: u32) -> Topology {
    let mut cores = Vec::new();
    for socket in 0..sockets {
        for i in 0..cores_per_socket {
            let cpu = socket * cores_per_socket + i;
            cores.push(Core {
                socket,
                core: i * 2,
                cpu,
                apic_id: socket * 128 + i * 2,
                threads: vec![cpu],
            });
        }
    }
    Topology { cpu_family: 0x1A, cpu_model: 0x11, sockets: (0..sockets).collect(), cores }
}

impl Sample {
    /// A healthy broker's answer to `what` on `topology`: `/dev/hsmp` ready (protocol 7), every
    /// requested item read and every other family not requested. Core `i` (in topology order)
    /// has used 1000 + `i` J of energy (HSMP RAPL, [`ESU`]) and has a boost limit of 3700 MHz;
    /// PROCHOT is asserted on socket 1 only, so both of its values appear; the frequency limit
    /// is 3700 MHz set by the OPN maximum, except on socket 1, where it is 1500 MHz set by
    /// PROCHOT; each core's frequency limit is 3700 MHz; socket `s` has used
    /// [`PACKAGE_JOULES`] + `s` J of package energy. Every value was read
    /// after the request arrived, within a freshness bound of 500 ms, at [`READ_AT_US`].
    pub fn healthy(topology: &Topology, what: Families) -> Sample {
        let cores = topology.cores.len();
        let readings = PerFamily::from_fn(|family| {
            if !what.contains(family) {
                return Readings::NotRequested;
            }
            let items = family.items(cores, topology.sockets.len());
            Readings::Values((0..items).map(|i| Ok(healthy(family, topology, i))).collect())
        });
        let read_at_us = PerFamily::from_fn(|family| match family {
            // Each core read 10 µs after the one before, from 1 s after boot.
            Family::CoreEnergy if what.contains(family) => {
                (0..cores as u64).map(|i| Some(READ_AT_US + 10 * i)).collect()
            }
            Family::PackageEnergy if what.contains(family) => {
                topology.sockets.iter().map(|_| Some(READ_AT_US)).collect()
            }
            _ => Vec::new(),
        });
        Sample {
            hsmp: DeviceStatus::Ready { protocol_version: 7 },
            energy_source: what.contains(Family::CoreEnergy).then_some(EnergySource::Hsmp),
            readings,
            energy_resets: 0,
            max_age_ms: 500,
            oldest_read_us: 0,
            read_at_us,
        }
    }
}

/// Item `i`'s value of `family` in [`Sample::healthy`].
fn healthy(family: Family, topology: &Topology, i: usize) -> Value {
    let socket = topology.sockets.get(i).copied().unwrap_or_default();
    match family {
        Family::CoreEnergy => Energy { counter: (1000 + i as u64) << ESU, esu: ESU }.into(),
        Family::BoostLimit | Family::CoreFrequencyLimit => Value::Mhz(3700),
        Family::Prochot => Value::Asserted(socket == 1),
        Family::FrequencyLimit => match socket {
            1 => FrequencyLimit { mhz: 1500, reasons: 0x02 },
            _ => FrequencyLimit { mhz: 3700, reasons: 0x10 },
        }
        .into(),
        Family::PackageEnergy => {
            Energy { counter: (PACKAGE_JOULES + u64::from(socket)) << ESU, esu: ESU }.into()
        }
    }
}

impl Sample {
    /// `family`'s readings with each value as `T`, the type of the family's kind, e.g.
    /// `sample.of::<Energy>(Family::CoreEnergy)`: what a test compares. A value of another kind
    /// reads as [`ItemError::Rejected`], so a test that expects values fails on it.
    pub fn of<T: TryFrom<Value>>(&self, family: Family) -> Readings<T> {
        match &self.readings[family] {
            Readings::NotRequested => Readings::NotRequested,
            Readings::Unavailable(why) => Readings::Unavailable(*why),
            Readings::Values(values) => Readings::Values(
                values
                    .iter()
                    .map(|v| v.and_then(|v| T::try_from(v).map_err(|_| ItemError::Rejected)))
                    .collect(),
            ),
        }
    }
}
