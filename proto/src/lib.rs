//! The IPC contract between `amd-hsmp-broker` (owns the devices) and `amd-hsmp-exporter`
//! (serves HTTP): typed requests and replies, the protocol version and the framing.
//!
//! **Invariant:** this crate does no I/O policy and knows no device: it only defines what may
//! cross the socket and how it is framed. There is no "raw message" request: a peer can ask for
//! the families below, never for an HSMP message id, an MSR number or a CPU.
//!
//! # Wire format
//!
//! Each frame is a little-endian `u32` payload length followed by the payload, a
//! [postcard](https://postcard.jamesmunns.com/wire-format) encoding of [`Request`] or [`Reply`].
//! Lengths above the type's [`Message::MAX_FRAME`] are rejected before any allocation, and
//! decoding is strict: a payload with trailing bytes is an error. Read and write frames with the
//! [`Message`] methods (`Request::read(&mut stream)`, `reply.write(&mut stream)`, and their
//! `_async` forms with the `tokio` feature), so no call site chooses a bound.
//!
//! # Compatibility
//!
//! Variants are only ever appended; [`Request::Hello`] and [`Reply::Hello`] stay first so their
//! discriminant never moves and a peer of any version can always read the handshake. A change
//! that an older peer cannot decode bumps [`PROTOCOL_VERSION`], except [`Reply::Refused`], which
//! is sent in place of the handshake's answer, before any version is agreed. Each variant says
//! which version introduced it by linking a constant of [`version`].
#![forbid(unsafe_code)]
// Linked into the privileged process: no panics, as the broker.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)
)]

mod frame;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

pub use frame::{FrameError, Message};

/// The protocol versions, named so that a variant's documentation can link the one that
/// introduced it.
pub mod version {
    /// The first protocol: handshake, topology and samples of energy, boost limit and PROCHOT.
    pub const V1: u32 = 1;
    /// Samples say how fresh their values are ([`Sample::max_age_ms`],
    /// [`Sample::oldest_read_us`](crate::Sample::oldest_read_us)); each core lists its threads
    /// ([`Core::threads`](crate::Core::threads)).
    ///
    /// [`Sample::max_age_ms`]: crate::Sample::max_age_ms
    pub const V2: u32 = 2;
    /// Two more families: each socket's frequency limit and the limiters imposing it
    /// ([`Family::FrequencyLimit`](crate::Family::FrequencyLimit)) and each core's frequency
    /// limit ([`Family::CoreFrequencyLimit`](crate::Family::CoreFrequencyLimit)), then fields
    /// of `Sample` of their own, asked for by two more [`Families`](crate::Families) flags.
    pub const V3: u32 = 3;
    /// A third energy source, the kernel's `power_core` PMU
    /// ([`EnergySource::Perf`](crate::EnergySource::Perf)), whose counts are in units of
    /// 2^-32 J ([`Energy::esu`](crate::Energy::esu) up to 63); and one more family, each
    /// socket's package energy counter
    /// ([`Family::PackageEnergy`](crate::Family::PackageEnergy)), asked for by one more
    /// [`Families`](crate::Families) flag.
    pub const V4: u32 = 4;
    /// When each energy value was read, on the machine's `CLOCK_MONOTONIC`
    /// (then `Sample::energy_read_at_us` and `Sample::package_energy_read_at_us`, now
    /// [`Sample::read_at_us`](crate::Sample::read_at_us)), so that
    /// power is energy over the time between two reads, not between two answers.
    pub const V5: u32 = 5;
    /// A sample's families are one table indexed by [`Family`](crate::Family)
    /// ([`Sample::readings`](crate::Sample::readings),
    /// [`Sample::read_at_us`](crate::Sample::read_at_us)) of values of a few kinds
    /// ([`Value`](crate::Value)), in place of one field per family: a new family is a variant
    /// of `Family` and one more entry of each table, not a new field.
    pub const V6: u32 = 6;
}

/// Where the packaged socket unit (`amd-hsmp-broker.socket`) puts the broker's socket: the
/// exporter's default `--broker.socket` and the socket `--check` tries.
pub const DEFAULT_SOCKET: &str = "/run/amd-hsmp/broker.sock";

/// Version of this protocol. Bumped on any change an older peer cannot decode.
pub const PROTOCOL_VERSION: u32 = version::V6;

impl Message for Request {
    /// Requests are a few bytes.
    const MAX_FRAME: u32 = 1024;
}

impl Message for Reply {
    /// A sample of 4096 cores is about 64 KiB.
    const MAX_FRAME: u32 = 1024 * 1024;
}

/// What the frontend asks of the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Since [`version::V1`]. Must be the first request on a connection; the broker answers
    /// [`Reply::Hello`] or, if the versions differ, [`Reply::Error`] with
    /// [`RequestError::VersionMismatch`].
    Hello {
        /// The client's [`PROTOCOL_VERSION`].
        protocol_version: u32,
    },
    /// Since [`version::V1`]. The discovered machine; answered by [`Reply::Topology`]. It does not
    /// change during the life of one broker instance.
    Topology,
    /// Since [`version::V1`]. Read the requested families once; answered by [`Reply::Sample`].
    Sample {
        /// Which families to read. A family not asked for costs no mailbox message.
        what: Families,
        /// Time budget in milliseconds, counted from the moment the broker has read the
        /// request. Past it the broker sends no new message and answers what it has, with the
        /// rest marked [`ItemError::DeadlineExceeded`].
        deadline_ms: u32,
    },
}

impl Request {
    /// [`Request::Sample`] for `what` within `deadline`, in the wire's whole milliseconds: at
    /// least 1 (a deadline of 0 would read nothing), saturating.
    pub fn sample(what: Families, deadline: Duration) -> Request {
        let deadline_ms = u32::try_from(deadline.as_millis()).unwrap_or(u32::MAX).max(1);
        Request::Sample { what, deadline_ms }
    }

    /// The time budget of a [`Request::Sample`]; `None` for other requests.
    pub fn deadline(&self) -> Option<Duration> {
        match self {
            Request::Sample { deadline_ms, .. } => {
                Some(Duration::from_millis(u64::from(*deadline_ms)))
            }
            Request::Hello { .. } | Request::Topology => None,
        }
    }
}

/// The telemetry families a [`Request::Sample`] can ask for: one flag per [`Family`], in
/// [`Family::ALL`] order on the wire (since [`version::V1`], one flag appended per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Families(PerFamily<bool>);

impl Families {
    /// Every family.
    pub const ALL: Families = Families(PerFamily([true; Family::COUNT]));

    /// The families in `list`.
    #[expect(
        clippy::indexing_slicing,
        reason = "`i` is below `list.len()`, and `Family as usize` below `COUNT` for every variant"
    )]
    pub const fn of(list: &[Family]) -> Families {
        let mut on = [false; Family::COUNT];
        let mut i = 0;
        while i < list.len() {
            on[list[i] as usize] = true;
            i += 1;
        }
        Families(PerFamily(on))
    }

    /// These families and `family`.
    pub fn with(mut self, family: Family) -> Families {
        self.set(family, true);
        self
    }

    /// These families less `family`.
    pub fn without(mut self, family: Family) -> Families {
        self.set(family, false);
        self
    }

    /// Whether `family` is asked for.
    pub fn contains(&self, family: Family) -> bool {
        self.0[family]
    }

    /// Asks for `family`, or not.
    pub fn set(&mut self, family: Family, on: bool) {
        self.0[family] = on;
    }

    /// The families asked for, in [`Family::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = Family> + '_ {
        Family::ALL.into_iter().filter(|&family| self.contains(family))
    }

    /// The families in both `self` and `other`.
    pub fn intersection(&self, other: &Families) -> Families {
        Families(PerFamily::from_fn(|family| self.contains(family) && other.contains(family)))
    }

    /// The mailbox messages a sample of these families sends to a machine of `cores` physical
    /// cores and `sockets` sockets whose device answers every one of them, after the one-time
    /// probes: one message per item ([`Family::items`]). The cost rule of the broker's sampler,
    /// which its tests count; the documents' figures are generated from it.
    pub fn messages(&self, cores: usize, sockets: usize) -> usize {
        self.iter().map(|family| family.items(cores, sockets)).sum()
    }
}

/// One telemetry family: what a [`Request::Sample`] can ask for ([`Families`]), and on the
/// exporter's side one collector (`--collector.NAME`). The wire ([`Families`],
/// [`Sample::readings`]) and both processes keep what they know of a family in a [`PerFamily`]
/// table indexed by it, so that a new family is one variant here and one row in each table,
/// which the compiler asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Per-core energy counters: HSMP `GET_RAPL_CORE_COUNTER`, or the fallbacks
    /// ([`EnergySource`]).
    CoreEnergy,
    /// Per-core boost limit in MHz (HSMP `GET_BOOST_LIMIT`).
    BoostLimit,
    /// Per-socket PROCHOT status (HSMP `GET_PROC_HOT`).
    Prochot,
    /// Since [`version::V3`]. Per-socket frequency limit and its limiters (HSMP
    /// `GET_SOCKET_FREQ_LIMIT`).
    FrequencyLimit,
    /// Since [`version::V3`]. Per-core frequency limit in MHz (HSMP `GET_CCLK_CORE_LIMIT`).
    CoreFrequencyLimit,
    /// Since [`version::V4`]. Per-socket package energy counter (HSMP
    /// `GET_RAPL_PACKAGE_COUNTER`, in the same units as the core counters): the cores and what
    /// draws beside them in the package (the uncore, memory controllers, I/O die).
    PackageEnergy,
}

/// What one value of a family is: the variants of [`Value`], which a family's items all share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An energy counter ([`Value::Energy`]).
    Energy,
    /// A frequency in MHz ([`Value::Mhz`]).
    Mhz,
    /// A signal, asserted or not ([`Value::Asserted`]).
    Asserted,
    /// A frequency limit and its limiters ([`Value::FrequencyLimit`]).
    FrequencyLimit,
}

/// What one value of a family belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One value per physical core, aligned with [`Topology::cores`].
    Core,
    /// One value per socket, aligned with [`Topology::sockets`].
    Socket,
}

impl Family {
    /// Every family, in the order of their variants.
    pub const ALL: [Family; 6] = [
        Family::CoreEnergy,
        Family::BoostLimit,
        Family::Prochot,
        Family::FrequencyLimit,
        Family::CoreFrequencyLimit,
        Family::PackageEnergy,
    ];

    /// The number of families.
    pub const COUNT: usize = Family::ALL.len();

    /// The collector name: `--collector.NAME`, the `collector` label of the exporter's error
    /// counters, the field of log lines.
    pub const fn name(self) -> &'static str {
        match self {
            Family::CoreEnergy => "core-energy",
            Family::BoostLimit => "boost-limit",
            Family::Prochot => "prochot",
            Family::FrequencyLimit => "frequency-limit",
            Family::CoreFrequencyLimit => "core-frequency-limit",
            Family::PackageEnergy => "package-energy",
        }
    }

    /// What one value belongs to.
    pub const fn scope(self) -> Scope {
        match self {
            Family::CoreEnergy | Family::BoostLimit | Family::CoreFrequencyLimit => Scope::Core,
            Family::Prochot | Family::FrequencyLimit | Family::PackageEnergy => Scope::Socket,
        }
    }

    /// What each of the family's values is.
    pub const fn kind(self) -> Kind {
        match self {
            Family::CoreEnergy | Family::PackageEnergy => Kind::Energy,
            Family::BoostLimit | Family::CoreFrequencyLimit => Kind::Mhz,
            Family::Prochot => Kind::Asserted,
            Family::FrequencyLimit => Kind::FrequencyLimit,
        }
    }

    /// How many values the family has on a machine of `cores` physical cores and `sockets`
    /// sockets: one per core or one per socket ([`Family::scope`]). The broker reads each with
    /// one mailbox message.
    pub const fn items(self, cores: usize, sockets: usize) -> usize {
        match self.scope() {
            Scope::Core => cores,
            Scope::Socket => sockets,
        }
    }

    /// The family named `name` ([`Family::name`]).
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|family| family.name() == name)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One `T` per [`Family`], indexed by it: the table a process keeps its per-family state in, and
/// the wire's per-family fields ([`Families`], [`Sample::readings`]). On the wire, the
/// [`Family::COUNT`] entries in [`Family::ALL`] order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerFamily<T>([T; Family::COUNT]);

impl<T> PerFamily<T> {
    /// The table whose entry for each family is `entry(family)`.
    pub fn from_fn(mut entry: impl FnMut(Family) -> T) -> PerFamily<T> {
        PerFamily(Family::ALL.map(&mut entry))
    }

    /// Each family with its entry, in [`Family::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Family, &T)> {
        Family::ALL.into_iter().zip(self.0.iter())
    }
}

impl<T> std::ops::Index<Family> for PerFamily<T> {
    type Output = T;
    #[expect(
        clippy::indexing_slicing,
        reason = "`Family as usize` is below `COUNT` for every variant"
    )]
    fn index(&self, family: Family) -> &T {
        &self.0[family as usize]
    }
}

impl<T> std::ops::IndexMut<Family> for PerFamily<T> {
    #[expect(
        clippy::indexing_slicing,
        reason = "`Family as usize` is below `COUNT` for every variant"
    )]
    fn index_mut(&mut self, family: Family) -> &mut T {
        &mut self.0[family as usize]
    }
}

/// What the broker answers.
#[expect(
    clippy::large_enum_variant,
    reason = "one reply a request, encoded once: a few hundred bytes moved, not worth a Box"
)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Since [`version::V1`]. Answer to [`Request::Hello`].
    Hello {
        /// The broker's [`PROTOCOL_VERSION`].
        protocol_version: u32,
        /// The broker's package version, e.g. `0.1.0`.
        broker_version: String,
        /// Random per broker start; a new value means counters restarted.
        instance: u64,
        /// `Some(profile)` when the broker serves the built-in simulator instead of the
        /// machine's devices.
        simulated: Option<String>,
    },
    /// Since [`version::V1`]. Answer to [`Request::Topology`].
    Topology(Topology),
    /// Since [`version::V1`]. Answer to [`Request::Sample`].
    Sample(Sample),
    /// Since [`version::V1`]. The request was refused; the connection stays usable unless the error
    /// says otherwise.
    Error(RequestError),
    /// Since [`version::V2`]. The broker turned the connection away before any request: the
    /// peer is allowed, but holds its share of connections or no slot is free. Sent once, in
    /// place of the answer to [`Request::Hello`], then the connection is closed. A peer that is
    /// not allowed is closed with nothing said.
    ///
    /// Added within [`version::V2`] without a bump: it comes before the handshake, where no
    /// version has been agreed, and a peer that cannot decode it is no worse off than with the
    /// bare close it had before. Appended, so no other variant's encoding moves.
    Refused {
        /// Why the connection was turned away.
        reason: Refusal,
    },
}

/// Why the broker turned an allowed peer's connection away ([`Reply::Refused`]). Both are
/// temporary: the peer may connect again once one of its connections (or someone's) ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// Since [`version::V2`]. The peer's uid already holds `limit` connections
    /// (`--connections.per-uid`); root has the limit too.
    #[error("this uid already holds its {limit} connections (--connections.per-uid)")]
    PerUidLimit {
        /// The broker's per-uid limit.
        limit: u32,
    },
    /// Since [`version::V2`]. Every slot this peer may take (its reserve and the shared pool,
    /// `--connections.shared`) is held by other connections.
    #[error("no connection slot is free (--connections.shared)")]
    NoSlot,
}

/// Why the broker refused a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RequestError {
    /// Since [`version::V1`]. The peer's protocol version is not the broker's. The broker closes
    /// the connection.
    #[error("protocol version mismatch: broker speaks {broker}, peer {peer}")]
    VersionMismatch {
        /// The broker's version.
        broker: u32,
        /// The version the peer announced.
        peer: u32,
    },
    /// Since [`version::V1`]. A request other than `Hello` arrived before the handshake.
    #[error("handshake required before any other request")]
    HelloRequired,
}

/// The machine as the broker discovered it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Topology {
    /// `cpu family` from `/proc/cpuinfo` (0x17 Zen 2, 0x19 Zen 3/4, 0x1A Zen 5).
    pub cpu_family: u32,
    /// `model` from `/proc/cpuinfo`.
    pub cpu_model: u32,
    /// Socket ids (`physical_package_id`), ascending. The readings of a family of
    /// [`Scope::Socket`] are aligned with it.
    pub sockets: Vec<u32>,
    /// One entry per physical core, sorted by (socket, core). The readings of a family of
    /// [`Scope::Core`] are aligned with it.
    pub cores: Vec<Core>,
}

/// One physical core.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// `physical_package_id`.
    pub socket: u32,
    /// sysfs `core_id` (unique within a socket, possibly sparse).
    pub core: u32,
    /// Linux CPU number of the lowest-numbered online thread of the core.
    pub cpu: u32,
    /// APIC id of that thread; HSMP addresses cores by it.
    pub apic_id: u32,
    /// Since [`version::V2`]. Linux CPU numbers of the core's online hardware threads,
    /// ascending, [`Core::cpu`] first: the CPUs a cgroup's cpuset must hold for the whole core
    /// to be in it.
    pub threads: Vec<u32>,
}

/// One reading of the requested families.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// State of `/dev/hsmp` at the time of the sample.
    pub hsmp: DeviceStatus,
    /// Where [`Family::CoreEnergy`]'s values come from; `None` when energy is not read.
    pub energy_source: Option<EnergySource>,
    /// Since [`version::V6`]. Each family's readings, one value per item aligned with
    /// [`Topology::cores`] or [`Topology::sockets`] ([`Family::scope`]), each of the family's
    /// kind ([`Family::kind`]). A family not asked for is [`Readings::NotRequested`].
    pub readings: PerFamily<Readings<Value>>,
    /// Since [`version::V1`]. Energy counter resets since this broker instance started: each
    /// time a core's count restarted from 0 because a wrap of its 32-bit MSR counter may have
    /// gone unseen. Cumulative, so a lost reply loses no reset; 0 without the MSR fallback.
    pub energy_resets: u64,
    /// Since [`version::V2`]. The broker's freshness bound (`--sample.max-age`), in
    /// milliseconds: no value in this reply was read more than this long before the broker
    /// received the request. Requests within it share readings.
    pub max_age_ms: u32,
    /// Since [`version::V2`]. How long before the broker received the request the oldest value
    /// in this reply was read, in microseconds rounded up; 0 when every value was read after it
    /// (or nothing was read). Never above `max_age_ms` × 1000. A client that hands this reply
    /// to a request which arrived later can tell whether it is still within the bound.
    pub oldest_read_us: u32,
    /// Since [`version::V6`] (since [`version::V5`] for the two energy families, as fields of
    /// their own). For each family of energy counters ([`Kind::Energy`]), when each of its
    /// values in [`Sample::readings`] was read (the read's start), in microseconds of the
    /// machine's `CLOCK_MONOTONIC`, aligned with its items; `None` where an item has no value.
    /// Empty for the other families. The same clock for every broker process on the machine,
    /// so two samples' readings are comparable across a restart; the difference between two is
    /// the time the counter advanced over.
    pub read_at_us: PerFamily<Vec<Option<u64>>>,
}

impl Sample {
    /// The broker's freshness bound ([`Sample::max_age_ms`]).
    pub fn max_age(&self) -> Duration {
        Duration::from_millis(u64::from(self.max_age_ms))
    }

    /// How long before the broker received the request the oldest value was read
    /// ([`Sample::oldest_read_us`]).
    pub fn oldest_read(&self) -> Duration {
        Duration::from_micros(u64::from(self.oldest_read_us))
    }

    /// Sets [`Sample::max_age_ms`] and [`Sample::oldest_read_us`] in the wire's units: the
    /// bound rounded down to whole milliseconds, the age rounded up to whole microseconds (so
    /// that it never reads younger than it is), both saturating.
    pub fn set_freshness(&mut self, max_age: Duration, oldest_read: Duration) {
        self.max_age_ms = u32::try_from(max_age.as_millis()).unwrap_or(u32::MAX);
        self.oldest_read_us =
            u32::try_from(oldest_read.as_nanos().div_ceil(1000)).unwrap_or(u32::MAX);
    }
}

/// State of the HSMP device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceStatus {
    /// Since [`version::V1`]. Opened and answered `GET_PROTO_VER`.
    Ready {
        /// HSMP protocol version reported by the firmware.
        protocol_version: u32,
    },
    /// Since [`version::V1`]. The device node does not exist (module not loaded, HSMP disabled, not
    /// an EPYC).
    Absent,
    /// Since [`version::V1`]. Opening the device was refused (`EACCES`/`EPERM`).
    PermissionDenied,
    /// Since [`version::V1`]. The device opened but did not answer `GET_PROTO_VER`, or opening
    /// failed otherwise.
    Failed(ItemError),
}

/// Where core energy comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnergySource {
    /// Since [`version::V1`]. HSMP `GET_RAPL_CORE_COUNTER` (protocol 7 and later): the firmware's
    /// 64-bit counter.
    Hsmp,
    /// Since [`version::V1`]. MSR `0xC001029A` read through `/dev/cpu/N/msr`, extended by the
    /// broker from 32 to 64 bits; it counts from 0 at broker start.
    Msr,
    /// Since [`version::V4`]. The same register counted by the kernel's `power_core` PMU
    /// (`perf_event_open`, Linux 6.14 and later) into 64 bits of 2^-32 J; it counts from 0 at
    /// broker start.
    Perf,
}

/// Result of reading one family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Readings<T> {
    /// Since [`version::V1`]. The request did not ask for this family.
    NotRequested,
    /// Since [`version::V1`]. The family cannot be read on this machine.
    Unavailable(Unavailable),
    /// Since [`version::V1`]. One result per item (core or socket), aligned with the topology.
    Values(Vec<Result<T, ItemError>>),
}

/// Why a whole family is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unavailable {
    /// Since [`version::V1`]. No usable HSMP device (see [`Sample::hsmp`]) and no fallback.
    NoDevice,
    /// Since [`version::V1`]. The firmware does not implement the message (`ENOMSG`); remembered,
    /// not asked again.
    Unsupported,
}

/// One item's value (a core's or a socket's), of its family's [`Kind`]. Since [`version::V6`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Value {
    /// An energy counter reading.
    Energy(Energy),
    /// A frequency in MHz.
    Mhz(u32),
    /// Whether a signal is asserted (PROCHOT).
    Asserted(bool),
    /// A frequency limit and the limiters imposing it.
    FrequencyLimit(FrequencyLimit),
}

impl Value {
    /// What the value is.
    pub const fn kind(self) -> Kind {
        match self {
            Value::Energy(_) => Kind::Energy,
            Value::Mhz(_) => Kind::Mhz,
            Value::Asserted(_) => Kind::Asserted,
            Value::FrequencyLimit(_) => Kind::FrequencyLimit,
        }
    }
}

/// The value of a [`Value`] of one kind: `T::try_from(value)` is `Ok` when `value` is of `T`'s
/// kind, and gives `value` back otherwise.
macro_rules! value_of_kind {
    ($($variant:ident($type:ty)),*) => {$(
        impl From<$type> for Value {
            fn from(value: $type) -> Value {
                Value::$variant(value)
            }
        }

        impl TryFrom<Value> for $type {
            type Error = Value;
            fn try_from(value: Value) -> Result<$type, Value> {
                match value {
                    Value::$variant(inner) => Ok(inner),
                    other => Err(other),
                }
            }
        }
    )*};
}

value_of_kind!(Energy(Energy), Mhz(u32), Asserted(bool), FrequencyLimit(FrequencyLimit));

/// One energy counter reading: joules = `counter` × 2^-`esu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Energy {
    /// Raw 64-bit count of energy status units.
    pub counter: u64,
    /// Energy status unit exponent: RAPL power unit bits 12:8 (0 to 31) for HSMP and the MSR,
    /// 32 for the kernel's perf counter (since [`version::V4`]); at most 63.
    pub esu: u8,
}

impl Energy {
    /// The counter in joules.
    pub fn joules(self) -> f64 {
        // A power of two is exact in f64; the product is exact for counters below 2^53 units
        // and beyond that rounds far below a joule.
        self.counter as f64 * 0.5f64.powi(i32::from(self.esu.min(63)))
    }
}

/// A socket's frequency limit and the limiters imposing it, as HSMP `GET_SOCKET_FREQ_LIMIT`
/// reports them. Since [`version::V3`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrequencyLimit {
    /// The limit in MHz (the reply's bits 31:16).
    pub mhz: u16,
    /// One bit per limiter imposing it (the reply's bits 15:0); see [`LimitReason`].
    pub reasons: u16,
}

impl FrequencyLimit {
    /// The limit in hertz.
    pub fn hertz(self) -> f64 {
        f64::from(self.mhz) * 1e6
    }

    /// Whether `reason` is among the limiters imposing the limit.
    pub fn is_limited_by(self, reason: LimitReason) -> bool {
        self.reasons & reason.mask() != 0
    }

    /// The limiters imposing the limit, in [`LimitReason::ALL`] order.
    pub fn limiters(self) -> impl Iterator<Item = LimitReason> {
        LimitReason::ALL.into_iter().filter(move |&reason| self.is_limited_by(reason))
    }
}

/// One limiter of a socket's frequency ([`FrequencyLimit::reasons`]): bits 0 to 7 as the
/// kernel's descriptor table and AMD's E-SMI library name them, and bits 15:8 together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitReason {
    /// Bit 0, cHTC-Active: the socket's thermal control.
    Chtc,
    /// Bit 1: the PROCHOT_L pin is asserted.
    Prochot,
    /// Bit 2: the thermal design current limit of a voltage rail.
    Tdc,
    /// Bit 3: the package power tracking limit (the socket's power cap).
    Ppt,
    /// Bit 4: the part's own maximum frequency.
    OpnMax,
    /// Bit 5: the reliability limit.
    Reliability,
    /// Bit 6: a cap set by an APML agent (the BMC).
    Apml,
    /// Bit 7: a cap set by an HSMP agent (software on the host).
    Hsmp,
    /// Any of bits 15:8, which the specification does not name.
    Other,
}

impl LimitReason {
    /// Every reason, in bit order.
    pub const ALL: [LimitReason; 9] = [
        LimitReason::Chtc,
        LimitReason::Prochot,
        LimitReason::Tdc,
        LimitReason::Ppt,
        LimitReason::OpnMax,
        LimitReason::Reliability,
        LimitReason::Apml,
        LimitReason::Hsmp,
        LimitReason::Other,
    ];

    /// The bits of [`FrequencyLimit::reasons`] that mean this reason.
    pub const fn mask(self) -> u16 {
        match self {
            LimitReason::Chtc => 0x01,
            LimitReason::Prochot => 0x02,
            LimitReason::Tdc => 0x04,
            LimitReason::Ppt => 0x08,
            LimitReason::OpnMax => 0x10,
            LimitReason::Reliability => 0x20,
            LimitReason::Apml => 0x40,
            LimitReason::Hsmp => 0x80,
            LimitReason::Other => 0xFF00,
        }
    }

    /// The `reason` label's value, e.g. `opn_max`.
    pub const fn name(self) -> &'static str {
        match self {
            LimitReason::Chtc => "chtc",
            LimitReason::Prochot => "prochot",
            LimitReason::Tdc => "tdc",
            LimitReason::Ppt => "ppt",
            LimitReason::OpnMax => "opn_max",
            LimitReason::Reliability => "reliability",
            LimitReason::Apml => "apml",
            LimitReason::Hsmp => "hsmp",
            LimitReason::Other => "other",
        }
    }
}

impl fmt::Display for LimitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why one item (a core or a socket) has no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ItemError {
    /// Since [`version::V1`]. Firmware or driver does not implement the message (`ENOMSG`).
    #[error("not supported by the firmware")]
    Unsupported,
    /// Since [`version::V1`]. Driver or firmware rejected the message or its arguments (`EINVAL`,
    /// `EPERM`).
    #[error("rejected by the driver or firmware")]
    Rejected,
    /// Since [`version::V1`]. The mailbox did not answer in time (`ETIMEDOUT`, `ETIME`).
    #[error("mailbox timed out")]
    TimedOut,
    /// Since [`version::V1`]. The firmware was busy (`EBUSY`).
    #[error("firmware busy")]
    Busy,
    /// Since [`version::V1`]. The socket index is not known to the driver (`ENODEV`).
    #[error("no such socket")]
    NoSuchSocket,
    /// Since [`version::V1`]. Any other errno.
    #[error("I/O error (errno {errno})")]
    Io {
        /// The raw errno value.
        errno: i32,
    },
    /// Since [`version::V1`]. Not read: the request's deadline had passed.
    #[error("deadline exceeded before the read")]
    DeadlineExceeded,
}

impl fmt::Display for EnergySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnergySource::Hsmp => "hsmp",
            EnergySource::Msr => "msr",
            EnergySource::Perf => "perf",
        })
    }
}

#[cfg(test)]
mod tests;
