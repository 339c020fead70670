//! Reads the requested telemetry families from the HSMP device (and the MSR fallback): one
//! long-lived worker per socket, reads shared by every request they are fresh enough for, each
//! requester answered at its own deadline.
//!
//! Costs: after the one-time probes (`GET_PROTO_VER`, then `GET_RAPL_UNITS` per socket, when the
//! device is opened) a sample sends exactly one mailbox message per item of each family asked
//! for, an item being a core or a socket by [`Family::scope`] (`Families::messages` states the
//! rule, the documents' figures are generated from it, and the tests below count it); a family
//! not asked for, or remembered unsupported, sends none.
//!
//! How a request is served (see [`Sampler::sample`]): every socket has a board
//! (`board.rs`) holding, per item, the latest read (value, when it was read, through which
//! source) and whether some request still wants it read.
//!
//! - **Freshness.** A request takes an item's latest read only if it began no earlier than
//!   `max_age` (`--sample.max-age`) before the request arrived; every other item it asks for
//!   is marked wanted until its deadline. So every value returned was read no earlier than the
//!   bound before the request arrived, however the request came, and the reply says how old
//!   its oldest value is ([`Sample::oldest_read_us`]).
//! - **A busy socket queues.** The socket's worker (one thread per socket) reads wanted items
//!   one message at a time, going round the items in order, and hands each read to every
//!   waiting request it is recent enough for. A request that arrives while the worker is
//!   inside a message only adds its wants: the wanted marks are the socket's one pending
//!   reading, merging every request, read as soon as the worker is free. A wedged socket holds
//!   one message and queues nothing beyond those marks.
//! - **Deadlines.** An item stays wanted until the latest deadline of the requests that want
//!   it and no longer: the worker checks before every message, so nothing is sent after the
//!   deadlines of the requests that asked, and no request's deadline keeps another's items
//!   from being read afresh.
//! - **Cost.** An item is read again only for a request its latest read is too old for, so a
//!   peer that asks as fast as it can causes at most one read of each item per `max_age`;
//!   requests for different families share what they have in common and never wait for each
//!   other's families.
//! - The requester waits until it has every item or its own deadline, whichever is first, and
//!   answers what it has by then.
//!
//! No lock is held across mailbox I/O: a `/dev/hsmp` opened after start-up is probed by the
//! socket workers, under the deadline, so a wedged socket never blocks a healthy one.
//!
//! To add a family, on the broker's side (after its `Family` variant in `proto`, with its
//! scope and kind, and its message in `device`):
//!
//! - `family.rs`, the family table: its arm of `reading` (the message that reads one item and
//!   how its reply becomes a `Value` of the family's kind; per core or per socket is
//!   [`Family::scope`]). The compiler asks for the arm (an exhaustive `match` on `Family`).
//! - `tests.rs`: a test of the family like the PROCHOT ones. Its message
//!   (`MachineSpec::message` in the simulator) is what the cost tests count.
//!
//! The plan (`Shared::plan`), the unsupported flags, the boards (`board.rs`) and the workers
//! (`workers.rs`) hold one entry per family in a `PerFamily` table and name no family; only
//! the core energy counters, read through RAPL with each socket's unit or from the MSRs, have
//! code of their own (`Reading::Energy`).

mod board;
mod family;
mod workers;

#[cfg(test)]
mod tests;

use crate::counters::CoreCounters;
use amd_hsmp_device::errno::means_device_gone;
use amd_hsmp_device::{self as device, HsmpOpener, HsmpTransport, messages};
use amd_hsmp_proto::{
    DeviceStatus, EnergySource, Families, Family, ItemError, Kind, PerFamily, Readings, Sample,
    Topology, Unavailable, Value,
};
use board::{Items, Source, Waiter};
use family::Reading;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use workers::Workers;

/// The default of `--sample.max-age`: how long before a request arrived its values may have
/// been read. Well under any scrape interval, long enough for Prometheus replicas and the
/// landing page to share readings.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(500);

/// The sampler's clock: when a request arrives, when a read begins, whether a deadline has
/// passed. The broker's is [`Monotonic`]; a test injects one it moves by hand, so that
/// deadlines and the freshness bound are gates rather than waits, as the MSR fallback takes
/// its clock (`MsrEnergy::open_with_clock`).
trait Clock: std::fmt::Debug + Send + Sync {
    fn now(&self) -> Instant;
}

/// `Instant::now`: the clock the deadlines of the requests are on.
#[derive(Debug, Clone, Copy, Default)]
struct Monotonic;

impl Clock for Monotonic {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The machine's `CLOCK_MONOTONIC` now, µs: the clock `Instant` reads, as a number that means
/// the same in every process on the machine.
fn monotonic_us() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let seconds = u64::try_from(now.tv_sec).unwrap_or_default();
    let micros = u64::try_from(now.tv_nsec / 1000).unwrap_or_default();
    seconds.saturating_mul(1_000_000).saturating_add(micros)
}

/// `d` in whole µs, saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The families found unsupported (`ENOMSG` on every item), one flag each.
#[derive(Debug, Default)]
struct Unsupported(PerFamily<AtomicBool>);

/// An open HSMP device and what its probes found so far.
#[derive(Debug)]
struct OpenDevice {
    /// Unique among the devices this sampler opened: values read through another descriptor
    /// are never handed out as this one's.
    id: u64,
    transport: Arc<dyn HsmpTransport>,
    /// The protocol version, once a socket has answered `GET_PROTO_VER`.
    version: OnceLock<u32>,
    /// Per socket (aligned with [`Topology::sockets`]), one lock each: no code holds two.
    sockets: Vec<Mutex<SocketState>>,
}

/// What the probes found of one socket, and how its last message ended.
#[derive(Debug, Default)]
struct SocketState {
    /// Its mailbox has answered `GET_PROTO_VER` (at start-up the first socket's answer stands
    /// for all of them).
    confirmed: bool,
    /// The RAPL energy status unit, `None` until probed. A failure other than `Unsupported` is
    /// asked again when energy is next read.
    esu: Option<Result<u8, ItemError>>,
    /// The error of its last `GET_PROTO_VER` probe, until it answers one.
    version_failed: Option<ItemError>,
    heard: Heard,
}

/// How the last message to a socket ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Heard {
    /// No message yet.
    #[default]
    Nothing,
    /// Answered, or failed in a way a working device fails.
    Alive,
    /// Failed as if the device were gone (`ENODEV`, `ENXIO`, `EBADF`, ...).
    Gone(ItemError),
}

impl OpenDevice {
    fn new(transport: Arc<dyn HsmpTransport>, sockets: usize, id: u64) -> OpenDevice {
        OpenDevice {
            id,
            transport,
            version: OnceLock::new(),
            sockets: (0..sockets).map(|_| Mutex::default()).collect(),
        }
    }

    /// Runs `f` on the state of socket `socket` (an index into [`Topology::sockets`]), under
    /// its lock; `None` for a socket the device does not have.
    fn socket<T>(&self, socket: usize, f: impl FnOnce(&mut SocketState) -> T) -> Option<T> {
        self.sockets.get(socket).map(|state| f(&mut lock(state)))
    }

    /// `f` of each socket's state, in order, each under its own lock, taken one at a time.
    fn each<'a, T: 'a>(
        &'a self,
        f: impl Fn(&SocketState) -> T + 'a,
    ) -> impl Iterator<Item = T> + 'a {
        self.sockets.iter().map(move |state| f(&lock(state)))
    }

    /// Socket `socket` failed its version probe with `error`.
    fn version_failed(&self, socket: usize, error: ItemError) {
        self.socket(socket, |s| s.version_failed = Some(error));
    }

    /// The error of the version probe if the last one failed on every socket.
    fn version_failure(&self) -> Option<ItemError> {
        let mut errors = self.each(|s| s.version_failed);
        let first = errors.next().flatten()?;
        errors.all(|e| e.is_some()).then_some(first)
    }

    /// Notes how a message to socket `socket` ended.
    fn heard<T>(&self, socket: usize, result: &Result<T, ItemError>) {
        let heard = match result {
            Err(e) if means_device_gone(*e) => Heard::Gone(*e),
            _ => Heard::Alive,
        };
        self.socket(socket, |s| s.heard = heard);
    }

    /// If the last message to every socket failed as if the device were gone, one of those
    /// errors.
    fn device_gone(&self) -> Option<ItemError> {
        let mut gone = self.each(|s| match s.heard {
            Heard::Gone(e) => Some(e),
            Heard::Nothing | Heard::Alive => None,
        });
        let first = gone.next().flatten()?;
        gone.all(|e| e.is_some()).then_some(first)
    }

    fn is_confirmed(&self, socket: usize) -> bool {
        self.socket(socket, |s| s.confirmed).unwrap_or(false)
    }

    fn confirm(&self, socket: usize, version: u32) {
        if self.version.set(version).is_ok() {
            tracing::info!(protocol_version = version, "HSMP device ready");
        }
        self.socket(socket, |s| {
            s.confirmed = true;
            s.version_failed = None;
        });
    }

    fn esu(&self, socket: usize) -> Option<Result<u8, ItemError>> {
        self.socket(socket, |s| s.esu).flatten()
    }

    fn set_esu(&self, socket: usize, esu: Result<u8, ItemError>) {
        self.socket(socket, |s| s.esu = Some(esu));
    }

    /// Every socket answered `GET_RAPL_UNITS` with "unsupported".
    fn rapl_unsupported(&self) -> bool {
        !self.sockets.is_empty()
            && self
                .each(|s| s.esu == Some(Err(ItemError::Unsupported)))
                .all(|unsupported| unsupported)
    }

    /// The energy units a later descriptor of the same machine can take over: the answers, and
    /// "unsupported", not the failures.
    fn lasting_units(&self) -> Vec<Option<Result<u8, ItemError>>> {
        self.each(|s| match s.esu {
            esu @ Some(Ok(_) | Err(ItemError::Unsupported)) => esu,
            _ => None,
        })
        .collect()
    }

    /// Some socket's energy unit has not been asked yet (the device has just opened).
    fn esu_unknown(&self) -> bool {
        self.each(|s| s.esu.is_none()).any(|unknown| unknown)
    }

    fn status(&self) -> Option<DeviceStatus> {
        self.version.get().map(|&protocol_version| DeviceStatus::Ready { protocol_version })
    }
}

#[derive(Debug)]
enum Device {
    /// No usable descriptor; opening is tried again on the next sample.
    Closed(DeviceStatus),
    Open(Arc<OpenDevice>),
}

/// Where one request reads a family from.
#[derive(Debug, Clone)]
enum Reader {
    Hsmp(Arc<OpenDevice>),
    /// Energy only: the counters the broker keeps (perf or MSR).
    Counters(Arc<dyn CoreCounters>),
}

/// What one request reads, decided once per family: how to read it, or (`Err`) the reply
/// already decided without a message.
#[derive(Debug)]
struct Plan {
    /// The device the request talks to, or why there is none.
    device: Result<Arc<OpenDevice>, DeviceStatus>,
    /// Whether the workers ask `GET_RAPL_UNITS` of a socket whose unit is not known yet.
    probe_esu: bool,
    /// Per family: where it is read from, or (`Err`) its reply, decided without a message.
    reads: PerFamily<Result<Reader, Readings<Value>>>,
}

impl Plan {
    /// Where the plan reads `family` from; `None` when it does not read it.
    fn source(&self, family: Family) -> Option<Source> {
        match &self.reads[family] {
            Ok(Reader::Hsmp(d)) => Some(Source::Hsmp(d.id)),
            Ok(Reader::Counters(_)) => Some(Source::Counters),
            Err(_) => None,
        }
    }
}

/// What the requests share: the machine, the device and what has been learnt about it.
#[derive(Debug)]
struct Shared {
    topology: Topology,
    opener: Box<dyn HsmpOpener>,
    /// Whether energy may be read through HSMP (`hsmp` in `--collector.core-energy.sources`).
    hsmp_energy: bool,
    /// The energy source used where HSMP has no RAPL: perf or MSR, chosen at start-up.
    fallback: Option<Arc<dyn CoreCounters>>,
    /// The freshness bound (`--sample.max-age`): the one place it is kept.
    max_age: Duration,
    clock: Arc<dyn Clock>,
    device: Mutex<Device>,
    /// The energy units of the last device closed, taken over when it is opened again, so a
    /// reopened device reads energy from where it did before without waiting for its probes.
    units: Mutex<Vec<Option<Result<u8, ItemError>>>>,
    unsupported: Unsupported,
    /// Failure classes already logged, so each is logged once and not on every request.
    logged: Mutex<Vec<(&'static str, ItemError)>>,
    /// The id of the next device opened.
    next_device: AtomicU64,
    /// An instant of [`Shared::clock`] and the machine's `CLOCK_MONOTONIC` then, in µs: how a
    /// read's instant becomes the wire's [`Sample::read_at_us`].
    anchor: (Instant, u64),
}

/// Reads telemetry for the requests of every connection; shared by all connection threads.
///
/// Requests share reads within the freshness bound (see the module documentation), so
/// concurrent peers do not multiply the mailbox traffic, a short deadline does not cut a
/// longer one's answer short, and a long one holds nothing for anyone else.
///
/// The socket workers start with the first sample, not in [`Sampler::with_max_age`]: the broker creates
/// the sampler before it drops its capabilities, which must happen while it is single-threaded.
#[derive(Debug)]
pub(crate) struct Sampler {
    shared: Shared,
    workers: Workers,
    /// The online CPUs against those at start-up, looked at after each sample.
    hotplug: Option<crate::hotplug::Hotplug>,
}

impl Sampler {
    /// A sampler for `topology` that reads HSMP through the device `hsmp` opens and, when RAPL
    /// is not available, energy from `fallback`, with the freshness bound `max_age`: every value
    /// a request gets was read no earlier than this before the request arrived. Opens the device
    /// and probes it now, on the calling thread, and logs the outcome. Zero shares only reads that begin
    /// after a request arrived.
    pub(crate) fn with_max_age(
        topology: Topology,
        hsmp: Box<dyn HsmpOpener>,
        fallback: Option<Arc<dyn CoreCounters>>,
        max_age: Duration,
    ) -> Sampler {
        Sampler::with_clock(topology, hsmp, fallback, max_age, Arc::new(Monotonic))
    }

    /// [`Sampler::with_max_age`] on `clock`.
    fn with_clock(
        topology: Topology,
        hsmp: Box<dyn HsmpOpener>,
        fallback: Option<Arc<dyn CoreCounters>>,
        max_age: Duration,
        clock: Arc<dyn Clock>,
    ) -> Sampler {
        let workers = Workers::new(&topology, Arc::clone(&clock));
        let anchor = (clock.now(), monotonic_us());
        let shared = Shared {
            topology,
            opener: hsmp,
            hsmp_energy: true,
            fallback,
            max_age,
            clock,
            device: Mutex::new(Device::Closed(DeviceStatus::Absent)),
            units: Mutex::new(Vec::new()),
            unsupported: Unsupported::default(),
            logged: Mutex::new(Vec::new()),
            next_device: AtomicU64::new(0),
            anchor,
        };
        let device = shared.open_and_probe();
        log_device(None, &device);
        *lock(&shared.device) = device;
        Sampler { shared, workers, hotplug: None }
    }

    /// Whether the device opened at start-up reads energy: `Err` says why not (no device, or
    /// a socket whose `GET_RAPL_UNITS` did not answer).
    pub(crate) fn hsmp_energy(&self) -> Result<(), String> {
        let device = lock(&self.shared.device);
        let open = match &*device {
            Device::Closed(DeviceStatus::Absent) => return Err("no /dev/hsmp".to_owned()),
            Device::Closed(DeviceStatus::PermissionDenied) => {
                return Err("/dev/hsmp refused (permission denied)".to_owned());
            }
            Device::Closed(status) => return Err(format!("/dev/hsmp not usable ({status:?})")),
            Device::Open(open) => open,
        };
        let mut units = open.each(|s| s.esu);
        match units.find_map(|esu| match esu {
            Some(Ok(_)) => None,
            Some(Err(ItemError::Unsupported)) => {
                Some("the firmware does not answer GET_RAPL_UNITS (ENOMSG)".to_owned())
            }
            Some(Err(error)) => Some(format!("GET_RAPL_UNITS failed: {error}")),
            None => Some("GET_RAPL_UNITS not asked".to_owned()),
        }) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Chooses where energy comes from among `allowed` (see [`crate::energy`]), opening the
    /// fallback it needs through `openers`, now, while the broker holds its capabilities.
    /// Before the first sample only. Returns the MSR counters when they are the choice (they
    /// need their poller).
    pub(crate) fn choose_energy(
        &mut self,
        allowed: &[crate::energy::SourceName],
        openers: &crate::energy::Openers<'_>,
    ) -> Option<Arc<crate::msr::MsrEnergy>> {
        let hsmp = self.hsmp_energy();
        let choice = crate::energy::choose(allowed, hsmp, &self.shared.topology, openers);
        let shared = &mut self.shared;
        shared.hsmp_energy = choice.hsmp_allowed;
        shared.fallback = choice.fallback;
        choice.msr
    }

    /// Looks at the online CPUs through `hotplug` after each sample, so that a core that
    /// cannot come back in place asks for a fresh start ([`crate::hotplug`]).
    pub(crate) fn watch_hotplug(&mut self, hotplug: crate::hotplug::Hotplug) {
        self.hotplug = Some(hotplug);
    }

    /// The machine this sampler reads.
    pub(crate) fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// Reads the families in `what`, answering by `deadline` at the latest with what has been
    /// read by then (the rest [`ItemError::DeadlineExceeded`]). Every value was read no
    /// earlier than the freshness bound before this call; nothing is sent for this request
    /// after `deadline`.
    #[cfg(test)]
    pub(crate) fn sample(&self, what: Families, deadline: Instant) -> Sample {
        self.sample_while(what, deadline, &|| false)
    }

    /// A sample for a requester that may go away: while it waits, `gone` is asked
    /// every 50 ms whether anyone still waits for the answer (the connection's peer has hung
    /// up). Once it says so, the request stops waiting and wants nothing more: the items only
    /// it wanted are not read for it, and it answers at once with what it has.
    pub(crate) fn sample_while(
        &self,
        what: Families,
        deadline: Instant,
        gone: &dyn Fn() -> bool,
    ) -> Sample {
        let shared = &self.shared;
        let arrived = shared.clock.now();
        let plan = Arc::new(shared.plan(what, deadline));
        let topology = &shared.topology;
        let waiter = Arc::new(Waiter::new(what, plan, arrived, shared.max_age, deadline, topology));
        self.workers.register(&waiter);
        let (items, oldest) = waiter.wait(shared.clock.as_ref(), gone);
        self.workers.deregister(&waiter);
        shared.settle(&waiter.plan);
        let mut sample = shared.answer(&waiter.plan, what, items);
        sample.set_freshness(shared.max_age, oldest);
        sample
    }

    /// Waits until every socket's worker is idle.
    #[cfg(test)]
    fn wait_idle(&self) {
        self.workers.wait_idle(std::time::Duration::from_secs(20));
    }
}

impl Shared {
    fn device_id(&self) -> u64 {
        self.next_device.fetch_add(1, Ordering::Relaxed)
    }

    /// Opens the device and runs the probes on this thread: `GET_PROTO_VER` on the first
    /// socket, then `GET_RAPL_UNITS` on each. Only used before the workers exist.
    fn open_and_probe(&self) -> Device {
        let transport = match self.opener.open() {
            Ok(transport) => transport,
            Err(errno) => return Device::Closed(open_status(errno)),
        };
        let t = transport.as_ref();
        let device =
            OpenDevice::new(Arc::clone(&transport), self.topology.sockets.len(), self.device_id());
        let first_socket = self.topology.sockets.first().copied().unwrap_or(0);
        match messages::proto_version(t, first_socket) {
            Ok(version) => {
                let _ = device.version.set(version);
                for socket in 0..device.sockets.len() {
                    device.socket(socket, |s| s.confirmed = true);
                }
            }
            Err(error) => return Device::Closed(DeviceStatus::Failed(error)),
        }
        for (index, &socket) in self.topology.sockets.iter().enumerate() {
            device.set_esu(index, messages::rapl_esu(t, socket));
        }
        Device::Open(Arc::new(device))
    }

    /// The open device, after one attempt to open it (without probing: the workers probe) if
    /// it was closed and `deadline` has not passed.
    fn device(&self, deadline: Instant) -> Result<Arc<OpenDevice>, DeviceStatus> {
        let mut device = lock(&self.device);
        if matches!(*device, Device::Closed(_)) && self.clock.now() < deadline {
            let next = match self.opener.open() {
                Ok(transport) => {
                    let open =
                        OpenDevice::new(transport, self.topology.sockets.len(), self.device_id());
                    for (socket, esu) in lock(&self.units).iter().enumerate() {
                        if let Some(esu) = *esu {
                            open.set_esu(socket, esu);
                        }
                    }
                    Device::Open(Arc::new(open))
                }
                Err(errno) => Device::Closed(open_status(errno)),
            };
            log_device(Some(&device), &next);
            *device = next;
        }
        match &*device {
            Device::Closed(status) => Err(*status),
            Device::Open(open) => Ok(Arc::clone(open)),
        }
    }

    fn plan(&self, what: Families, deadline: Instant) -> Plan {
        let device = self.device(deadline);
        let open = device.as_ref().ok();
        let reads = PerFamily::from_fn(|family| {
            let asked = what.contains(family);
            match family::reading(family) {
                Reading::Message(_) | Reading::Counter(_) => {
                    self.decide(asked, family, open).map(Reader::Hsmp)
                }
                Reading::Energy => self.energy_reader(asked, open),
            }
        });
        Plan { probe_esu: !self.is_unsupported(Family::CoreEnergy), reads, device }
    }

    /// How an HSMP family is read, or its reply when it is not.
    fn decide(
        &self,
        asked: bool,
        family: Family,
        device: Option<&Arc<OpenDevice>>,
    ) -> Result<Arc<OpenDevice>, Readings<Value>> {
        match device {
            _ if !asked => Err(Readings::NotRequested),
            None => Err(Readings::Unavailable(Unavailable::NoDevice)),
            Some(_) if self.is_unsupported(family) => {
                Err(Readings::Unavailable(Unavailable::Unsupported))
            }
            Some(device) => Ok(Arc::clone(device)),
        }
    }

    /// Energy from HSMP RAPL when the firmware has it (and the sources allow it), else from
    /// the fallback chosen at start-up (perf or MSR). While a just-opened device has not said
    /// whether it has RAPL, the fallback is read.
    fn energy_reader(
        &self,
        asked: bool,
        device: Option<&Arc<OpenDevice>>,
    ) -> Result<Reader, Readings<Value>> {
        if device.is_some_and(|d| d.rapl_unsupported()) {
            self.remember_unsupported(Family::CoreEnergy);
        }
        let hsmp = match self.decide(asked, Family::CoreEnergy, device) {
            Ok(_) if !self.hsmp_energy => Err(Readings::Unavailable(Unavailable::Unsupported)),
            decided => decided,
        };
        match (hsmp, &self.fallback) {
            (Err(Readings::NotRequested), _) => Err(Readings::NotRequested),
            (Ok(device), None) => Ok(Reader::Hsmp(device)),
            (Ok(device), Some(_)) if !device.esu_unknown() => Ok(Reader::Hsmp(device)),
            (_, Some(counters)) => Ok(Reader::Counters(Arc::clone(counters))),
            (Err(why), None) => Err(why),
        }
    }

    /// Acts on what the workers found about the device a request used: a device whose every
    /// socket failed its last version probe, or answered its last message as a device that is
    /// gone (`ENODEV`, `ENXIO`, `EBADF`, ...), is closed, and opened again on the next sample.
    fn settle(&self, plan: &Plan) {
        let Ok(open) = &plan.device else { return };
        let why = match (open.version_failure(), open.device_gone()) {
            (Some(error), _) => error,
            (None, Some(error)) => error,
            (None, None) => return,
        };
        let mut device = lock(&self.device);
        if matches!(&*device, Device::Open(d) if Arc::ptr_eq(d, open)) {
            tracing::warn!(error = %why, "HSMP device stopped answering; it is reopened on the next sample");
            *lock(&self.units) = open.lasting_units();
            *device = Device::Closed(DeviceStatus::Failed(why));
        }
    }

    /// The reply to one requester: its families, from what it had by its deadline.
    fn answer(&self, plan: &Plan, what: Families, mut items: Items) -> Sample {
        let hsmp = match &plan.device {
            Err(status) => *status,
            Ok(open) => open.status().unwrap_or_else(|| {
                DeviceStatus::Failed(open.version_failure().unwrap_or(ItemError::DeadlineExceeded))
            }),
        };
        // A device that failed its probes on every socket answers nothing.
        let failed = matches!(hsmp, DeviceStatus::Failed(e) if e != ItemError::DeadlineExceeded);
        let readings = PerFamily::from_fn(|family| {
            let values = std::mem::take(&mut items.values[family]);
            match &plan.reads[family] {
                _ if !what.contains(family) => Readings::NotRequested,
                Err(why) => why.clone(),
                Ok(Reader::Hsmp(_)) if failed => no_device(),
                Ok(Reader::Hsmp(_)) => self.finish(family, values),
                Ok(Reader::Counters(counters)) => {
                    counters.log_resets();
                    let collector = match counters.source() {
                        EnergySource::Perf => "core-energy (perf)",
                        _ => "core-energy (msr)",
                    };
                    self.log_failures(collector, &values);
                    Readings::Values(values)
                }
            }
        });
        let energy = Family::CoreEnergy;
        let energy_source = match (&plan.reads[energy], &readings[energy]) {
            (Ok(Reader::Hsmp(_)), Readings::Values(_)) => Some(EnergySource::Hsmp),
            (Ok(Reader::Counters(c)), Readings::Values(_)) => Some(c.source()),
            _ => None,
        };
        let resets = self.fallback.as_ref().map_or(0, |counters| counters.resets());
        let read_at_us = PerFamily::from_fn(|family| match family.kind() {
            Kind::Energy => self.read_at_us(&readings[family], &items.at[family]),
            Kind::Mhz | Kind::Asserted | Kind::FrequencyLimit => Vec::new(),
        });
        Sample {
            hsmp,
            energy_source,
            readings,
            energy_resets: resets,
            // The freshness is the requester's to set, from when its request arrived.
            max_age_ms: 0,
            oldest_read_us: 0,
            read_at_us,
        }
    }

    /// When each item with a value in `readings` was read, in µs of `CLOCK_MONOTONIC`; empty
    /// when the family has no values.
    fn read_at_us<T>(&self, readings: &Readings<T>, at: &[Option<Instant>]) -> Vec<Option<u64>> {
        let Readings::Values(values) = readings else { return Vec::new() };
        let (instant, us) = self.anchor;
        let of = |at: Instant| match at.checked_duration_since(instant) {
            Some(after) => us.saturating_add(micros(after)),
            None => us.saturating_sub(micros(instant.saturating_duration_since(at))),
        };
        values
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_ref().ok().and(at.get(i).copied().flatten()).map(of))
            .collect()
    }

    /// Turns one HSMP family's results into its readings: a family every item of which
    /// answered `ENOMSG` is remembered unsupported and reported as such.
    fn finish<T>(&self, family: Family, values: Vec<Result<T, ItemError>>) -> Readings<T> {
        let unsupported = |v: &Result<T, ItemError>| matches!(v, Err(ItemError::Unsupported));
        if !values.is_empty() && values.iter().all(unsupported) {
            self.remember_unsupported(family);
            return Readings::Unavailable(Unavailable::Unsupported);
        }
        self.log_failures(family.name(), &values);
        Readings::Values(values)
    }

    fn is_unsupported(&self, family: Family) -> bool {
        self.unsupported.0[family].load(Ordering::Relaxed)
    }

    fn remember_unsupported(&self, family: Family) {
        if !self.unsupported.0[family].swap(true, Ordering::Relaxed) {
            tracing::info!(
                collector = family.name(),
                "the firmware does not implement these messages; they will not be sent again",
            );
        }
    }

    /// Logs each kind of failure of a family once for the life of the broker.
    fn log_failures<T>(&self, collector: &'static str, values: &[Result<T, ItemError>]) {
        let mut logged = lock(&self.logged);
        for error in values.iter().filter_map(|v| v.as_ref().err()) {
            if logged.contains(&(collector, *error)) {
                continue;
            }
            logged.push((collector, *error));
            let count = values.iter().filter(|v| v.as_ref().err() == Some(error)).count();
            tracing::warn!(
                collector,
                %error,
                items = count,
                "reads failed; later failures of this kind are not logged",
            );
        }
    }
}

fn no_device<T>() -> Readings<T> {
    Readings::Unavailable(Unavailable::NoDevice)
}

impl crate::server::Backend for Sampler {
    fn topology(&self) -> &Topology {
        Sampler::topology(self)
    }

    fn sample(&self, what: Families, deadline: Instant, gone: &dyn Fn() -> bool) -> Sample {
        let sample = Sampler::sample_while(self, what, deadline, gone);
        if let Some(hotplug) = &self.hotplug {
            let lost = || self.shared.fallback.as_ref().map(|c| c.lost()).unwrap_or_default();
            hotplug.check(lost, std::time::Instant::now());
        }
        sample
    }

    fn fresh_start(&self) -> Option<crate::hotplug::Return> {
        self.hotplug.as_ref().and_then(crate::hotplug::Hotplug::wanted)
    }
}

/// Locks `mutex`; the values behind the sampler's locks are plain data, valid even if a
/// holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Logs the device state when it is first known and whenever it changes.
fn log_device(before: Option<&Device>, now: &Device) {
    let status = |d: &Device| match d {
        Device::Closed(status) => Some(*status),
        Device::Open(open) => open.status(),
    };
    if before.map(status) == Some(status(now)) {
        return;
    }
    match now {
        Device::Open(open) => match open.version.get() {
            Some(version) => tracing::info!(
                protocol_version = version,
                rapl = open.each(|s| matches!(s.esu, Some(Ok(_)))).any(|rapl| rapl),
                "HSMP device ready",
            ),
            None => tracing::info!("HSMP device opened; the socket workers probe it"),
        },
        Device::Closed(DeviceStatus::PermissionDenied) => tracing::warn!(
            next_step = crate::hints::DEVICE_DENIED,
            "HSMP device refused (permission denied: the udev rule or SELinux); opening it is retried on each sample",
        ),
        Device::Closed(status) => tracing::warn!(
            status = ?status,
            "HSMP device not usable; opening it is retried on each sample",
        ),
    }
}

/// The device status after opening it failed with `errno`.
fn open_status(errno: device::Errno) -> DeviceStatus {
    match errno {
        // No node, or a node without its driver.
        libc::ENOENT | libc::ENODEV | libc::ENXIO => DeviceStatus::Absent,
        libc::EACCES | libc::EPERM => DeviceStatus::PermissionDenied,
        errno => DeviceStatus::Failed(device::classify(errno)),
    }
}
