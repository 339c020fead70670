//! Reads the requested telemetry families from the HSMP device (and the MSR fallback): one
//! long-lived worker per socket, a shared reading per burst of concurrent requests, each
//! requester answered at its own deadline.
//!
//! Costs: after the one-time probes (`GET_PROTO_VER`, then `GET_RAPL_UNITS` per socket, when the
//! device is opened) a sample of every family sends exactly 2 × cores + sockets mailbox
//! messages; a family not asked for, or remembered unsupported, sends none.
//!
//! How a request is served (see [`Sampler::sample`]):
//!
//! - If a reading of at least the requested families is still running, the request joins it:
//!   the reading's end moves to the later of the two deadlines, and no message is sent twice.
//! - Otherwise a new reading is planned: one decision per family (read from where, or the
//!   reply already decided), then the reading is handed to every socket's worker that is idle.
//!   A worker still inside a mailbox message takes no new work: its socket's items stay
//!   [`ItemError::DeadlineExceeded`], so a wedged socket holds one message at most and never
//!   queues.
//! - Each worker checks the reading's end before every message, so nothing is sent after the
//!   latest deadline of the requests that asked for it.
//! - The requester waits until the reading is complete or its own deadline, whichever is first,
//!   and answers what has been read by then.
//!
//! No lock is held across mailbox I/O: a `/dev/hsmp` opened after start-up is probed by the
//! socket workers, under the deadline, so a wedged socket never blocks a healthy one.

mod reading;
mod workers;

#[cfg(test)]
mod tests;

use crate::msr::MsrEnergy;
use amd_hsmp_device::{self as device, HsmpOpener, HsmpTransport, messages};
use amd_hsmp_proto::{
    DeviceStatus, Energy, EnergySource, Families, ItemError, Readings, Sample, Topology,
    Unavailable,
};
use reading::{Items, Reading};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;
use workers::Workers;

/// A message family that can be remembered unsupported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// `GET_RAPL_UNITS` / `GET_RAPL_CORE_COUNTER`.
    Energy,
    /// `GET_BOOST_LIMIT`.
    BoostLimit,
    /// `GET_PROC_HOT`.
    Prochot,
}

impl Family {
    /// The collector name the frontend uses for the family.
    fn name(self) -> &'static str {
        match self {
            Family::Energy => "core-energy",
            Family::BoostLimit => "boost-limit",
            Family::Prochot => "prochot",
        }
    }
}

/// The families found unsupported (`ENOMSG` on every item), one flag each.
#[derive(Debug, Default)]
struct Unsupported {
    energy: AtomicBool,
    boost_limit: AtomicBool,
    prochot: AtomicBool,
}

impl Unsupported {
    fn flag(&self, family: Family) -> &AtomicBool {
        match family {
            Family::Energy => &self.energy,
            Family::BoostLimit => &self.boost_limit,
            Family::Prochot => &self.prochot,
        }
    }
}

/// An open HSMP device and what its probes found so far.
#[derive(Debug)]
struct OpenDevice {
    transport: Arc<dyn HsmpTransport>,
    /// The protocol version, once a socket has answered `GET_PROTO_VER`.
    version: OnceLock<u32>,
    /// Per socket (aligned with [`Topology::sockets`]): whether its mailbox has answered
    /// `GET_PROTO_VER` (at start-up the first socket's answer stands for all of them).
    confirmed: Vec<AtomicBool>,
    /// Per socket: the RAPL energy status unit, `None` until probed. A failure other than
    /// `Unsupported` is asked again when energy is next read.
    esu: Vec<Mutex<Option<Result<u8, ItemError>>>>,
}

impl OpenDevice {
    fn new(transport: Arc<dyn HsmpTransport>, sockets: usize) -> OpenDevice {
        OpenDevice {
            transport,
            version: OnceLock::new(),
            confirmed: (0..sockets).map(|_| AtomicBool::new(false)).collect(),
            esu: (0..sockets).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn is_confirmed(&self, socket: usize) -> bool {
        self.confirmed.get(socket).is_some_and(|c| c.load(Ordering::Acquire))
    }

    fn confirm(&self, socket: usize, version: u32) {
        if self.version.set(version).is_ok() {
            tracing::info!(protocol_version = version, "HSMP device ready");
        }
        if let Some(c) = self.confirmed.get(socket) {
            c.store(true, Ordering::Release);
        }
    }

    fn esu(&self, socket: usize) -> Option<Result<u8, ItemError>> {
        self.esu.get(socket).and_then(|e| *lock(e))
    }

    fn set_esu(&self, socket: usize, esu: Result<u8, ItemError>) {
        if let Some(slot) = self.esu.get(socket) {
            *lock(slot) = Some(esu);
        }
    }

    /// Every socket answered `GET_RAPL_UNITS` with "unsupported".
    fn rapl_unsupported(&self) -> bool {
        !self.esu.is_empty()
            && self.esu.iter().all(|e| *lock(e) == Some(Err(ItemError::Unsupported)))
    }

    /// The energy units a later descriptor of the same machine can take over: the answers, and
    /// "unsupported", not the failures.
    fn lasting_units(&self) -> Vec<Option<Result<u8, ItemError>>> {
        let lasting = |e: &Mutex<_>| match *lock(e) {
            esu @ Some(Ok(_) | Err(ItemError::Unsupported)) => esu,
            _ => None,
        };
        self.esu.iter().map(lasting).collect()
    }

    /// Some socket's energy unit has not been asked yet (the device has just opened).
    fn esu_unknown(&self) -> bool {
        self.esu.iter().any(|e| lock(e).is_none())
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

/// Where energy is read from in one reading.
#[derive(Debug, Clone)]
enum EnergyReader {
    Hsmp(Arc<OpenDevice>),
    Msr(Arc<MsrEnergy>),
}

/// What one reading reads, decided once per family: how to read it, or (`Err`) the reply
/// already decided without a message.
#[derive(Debug)]
struct Plan {
    /// The device the reading talks to, or why there is none.
    device: Result<Arc<OpenDevice>, DeviceStatus>,
    /// Whether the workers ask `GET_RAPL_UNITS` of a socket whose unit is not known yet.
    probe_esu: bool,
    prochot: Result<Arc<OpenDevice>, Readings<bool>>,
    energy: Result<EnergyReader, Readings<Energy>>,
    boost_limit: Result<Arc<OpenDevice>, Readings<u32>>,
}

/// What the requests share: the machine, the device and what has been learnt about it.
#[derive(Debug)]
struct Shared {
    topology: Topology,
    opener: Box<dyn HsmpOpener>,
    msr: Option<Arc<MsrEnergy>>,
    device: Mutex<Device>,
    /// The energy units of the last device closed, taken over when it is opened again, so a
    /// reopened device reads energy from where it did before without waiting for its probes.
    units: Mutex<Vec<Option<Result<u8, ItemError>>>>,
    unsupported: Unsupported,
    /// Failure classes already logged, so each is logged once and not on every request.
    logged: Mutex<Vec<(&'static str, ItemError)>>,
}

/// Reads telemetry for the requests of every connection; shared by all connection threads.
///
/// Requests that overlap share one reading (see the module documentation), so concurrent
/// peers do not multiply the mailbox traffic and a short deadline does not cut a longer one's
/// answer short.
///
/// The socket workers start with the first sample, not in [`Sampler::new`]: the broker creates
/// the sampler before it drops its capabilities, which must happen while it is single-threaded.
#[derive(Debug)]
pub struct Sampler {
    shared: Shared,
    workers: Workers,
    /// The latest reading: requests that come while it runs join it.
    current: Mutex<Option<Arc<Reading>>>,
}

impl Sampler {
    /// A sampler for `topology` that reads HSMP through the device `hsmp` opens and, when RAPL
    /// is not available, energy from `msr`. Opens the device and probes it now, on the calling
    /// thread, and logs the outcome.
    pub fn new(
        topology: Topology,
        hsmp: Box<dyn HsmpOpener>,
        msr: Option<Arc<MsrEnergy>>,
    ) -> Sampler {
        let workers = Workers::new(&topology);
        let shared = Shared {
            topology,
            opener: hsmp,
            msr,
            device: Mutex::new(Device::Closed(DeviceStatus::Absent)),
            units: Mutex::new(Vec::new()),
            unsupported: Unsupported::default(),
            logged: Mutex::new(Vec::new()),
        };
        let device = shared.open_and_probe();
        log_device(None, &device, shared.msr.is_some());
        *lock(&shared.device) = device;
        Sampler { shared, workers, current: Mutex::new(None) }
    }

    /// The machine this sampler reads.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// Reads the families in `what`, answering by `deadline` at the latest with what has been
    /// read by then (the rest [`ItemError::DeadlineExceeded`]). No message is sent once the
    /// latest deadline of the requests sharing the reading has passed.
    pub fn sample(&self, what: Families, deadline: Instant) -> Sample {
        let reading = self.reading_for(what, deadline);
        let items = reading.wait(deadline);
        self.shared.settle(&reading);
        self.shared.answer(&reading, what, items)
    }

    /// Waits until every socket's worker is idle.
    #[cfg(test)]
    fn wait_idle(&self) {
        self.workers.wait_idle(std::time::Duration::from_secs(20));
    }

    /// The running reading `what` can join, or a new one handed to the idle workers.
    fn reading_for(&self, what: Families, deadline: Instant) -> Arc<Reading> {
        let mut current = lock(&self.current);
        if let Some(running) = current.as_ref() {
            if running.join(what, deadline) {
                return Arc::clone(running);
            }
            self.shared.settle(running);
        }
        let plan = self.shared.plan(what, deadline);
        let reading = Arc::new(Reading::new(what, plan, deadline, &self.shared.topology));
        if Instant::now() < deadline {
            for index in 0..self.shared.topology.sockets.len() {
                self.workers.dispatch(index, &reading);
            }
        }
        *current = Some(Arc::clone(&reading));
        reading
    }
}

impl Shared {
    /// Opens the device and runs the probes on this thread: `GET_PROTO_VER` on the first
    /// socket, then `GET_RAPL_UNITS` on each. Only used before the workers exist.
    fn open_and_probe(&self) -> Device {
        let transport = match self.opener.open() {
            Ok(transport) => transport,
            Err(errno) => return Device::Closed(open_status(errno)),
        };
        let t = transport.as_ref();
        let device = OpenDevice::new(Arc::clone(&transport), self.topology.sockets.len());
        let first_socket = self.topology.sockets.first().copied().unwrap_or(0);
        match messages::proto_version(t, first_socket) {
            Ok(version) => {
                let _ = device.version.set(version);
                for c in &device.confirmed {
                    c.store(true, Ordering::Release);
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
        if matches!(*device, Device::Closed(_)) && Instant::now() < deadline {
            let next = match self.opener.open() {
                Ok(transport) => {
                    let open = OpenDevice::new(transport, self.topology.sockets.len());
                    for (socket, esu) in lock(&self.units).iter().enumerate() {
                        if let Some(esu) = *esu {
                            open.set_esu(socket, esu);
                        }
                    }
                    Device::Open(Arc::new(open))
                }
                Err(errno) => Device::Closed(open_status(errno)),
            };
            log_device(Some(&device), &next, self.msr.is_some());
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
        Plan {
            probe_esu: !self.is_unsupported(Family::Energy),
            prochot: self.decide(what.prochot, Family::Prochot, open),
            energy: self.energy_reader(what.core_energy, open),
            boost_limit: self.decide(what.boost_limit, Family::BoostLimit, open),
            device,
        }
    }

    /// How an HSMP family is read, or its reply when it is not.
    fn decide<T>(
        &self,
        asked: bool,
        family: Family,
        device: Option<&Arc<OpenDevice>>,
    ) -> Result<Arc<OpenDevice>, Readings<T>> {
        match device {
            _ if !asked => Err(Readings::NotRequested),
            None => Err(Readings::Unavailable(Unavailable::NoDevice)),
            Some(_) if self.is_unsupported(family) => {
                Err(Readings::Unavailable(Unavailable::Unsupported))
            }
            Some(device) => Ok(Arc::clone(device)),
        }
    }

    /// Energy from HSMP RAPL when the firmware has it, else from the MSRs when enabled. While a
    /// just-opened device has not said whether it has RAPL, the MSRs are read if enabled.
    fn energy_reader(
        &self,
        asked: bool,
        device: Option<&Arc<OpenDevice>>,
    ) -> Result<EnergyReader, Readings<Energy>> {
        if device.is_some_and(|d| d.rapl_unsupported()) {
            self.remember_unsupported(Family::Energy);
        }
        let hsmp = self.decide(asked, Family::Energy, device);
        match (hsmp, &self.msr) {
            (Err(Readings::NotRequested), _) => Err(Readings::NotRequested),
            (Ok(device), None) => Ok(EnergyReader::Hsmp(device)),
            (Ok(device), Some(_)) if !device.esu_unknown() => Ok(EnergyReader::Hsmp(device)),
            (_, Some(msr)) => Ok(EnergyReader::Msr(Arc::clone(msr))),
            (Err(why), None) => Err(why),
        }
    }

    /// Acts on what a reading found about its device: a device whose every socket failed the
    /// version probe, or answered every message as a device that is gone (`ENODEV`, `ENXIO`,
    /// `EBADF`, ...), is closed, and opened again on the next sample.
    fn settle(&self, reading: &Reading) {
        let Ok(open) = &reading.plan.device else { return };
        let why = match (reading.version_failure(), reading.device_gone()) {
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

    /// The reply to one requester: its families, from what the reading had by its deadline.
    fn answer(&self, reading: &Reading, what: Families, items: Items) -> Sample {
        let plan = &reading.plan;
        let hsmp = match &plan.device {
            Err(status) => *status,
            Ok(open) => open.status().unwrap_or_else(|| {
                DeviceStatus::Failed(
                    reading.version_failure().unwrap_or(ItemError::DeadlineExceeded),
                )
            }),
        };
        // A device that failed its probes on every socket answers nothing.
        let failed = matches!(hsmp, DeviceStatus::Failed(e) if e != ItemError::DeadlineExceeded);
        let (energy_source, energy) = match (&plan.energy, what.core_energy) {
            (_, false) => (None, Readings::NotRequested),
            (Err(why), true) => (None, why.clone()),
            (Ok(EnergyReader::Hsmp(_)), true) if failed => (None, no_device()),
            (Ok(EnergyReader::Hsmp(_)), true) => match self.finish(Family::Energy, items.energy) {
                values @ Readings::Values(_) => (Some(EnergySource::Hsmp), values),
                other => (None, other),
            },
            (Ok(EnergyReader::Msr(_)), true) => {
                self.log_failures("core-energy (msr)", &items.energy);
                (Some(EnergySource::Msr), Readings::Values(items.energy))
            }
        };
        Sample {
            hsmp,
            energy_source,
            energy,
            boost_limit: self.readings(
                what.boost_limit,
                &plan.boost_limit,
                failed,
                Family::BoostLimit,
                items.boost_limit,
            ),
            prochot: self.readings(
                what.prochot,
                &plan.prochot,
                failed,
                Family::Prochot,
                items.prochot,
            ),
            energy_resets: self.msr.as_ref().map_or(0, |msr| msr.resets()),
        }
    }

    fn readings<T: Clone>(
        &self,
        asked: bool,
        decided: &Result<Arc<OpenDevice>, Readings<T>>,
        failed: bool,
        family: Family,
        values: Vec<Result<T, ItemError>>,
    ) -> Readings<T> {
        match decided {
            _ if !asked => Readings::NotRequested,
            Err(why) => why.clone(),
            Ok(_) if failed => no_device(),
            Ok(_) => self.finish(family, values),
        }
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
        self.unsupported.flag(family).load(Ordering::Relaxed)
    }

    fn remember_unsupported(&self, family: Family) {
        if !self.unsupported.flag(family).swap(true, Ordering::Relaxed) {
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

    fn sample(&self, what: Families, deadline: Instant) -> Sample {
        Sampler::sample(self, what, deadline)
    }
}

/// Locks `mutex`; the values behind the sampler's locks are plain data, valid even if a
/// holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Logs the device state when it is first known and whenever it changes.
fn log_device(before: Option<&Device>, now: &Device, msr_fallback: bool) {
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
                rapl = open.esu.iter().any(|e| matches!(*lock(e), Some(Ok(_)))),
                "HSMP device ready",
            ),
            None => tracing::info!("HSMP device opened; the socket workers probe it"),
        },
        Device::Closed(DeviceStatus::PermissionDenied) => tracing::warn!(
            msr_fallback,
            next_step = crate::check::denied_hint(),
            "HSMP device refused (permission denied: the udev rule or SELinux); opening it is retried on each sample",
        ),
        Device::Closed(status) => tracing::warn!(
            status = ?status,
            msr_fallback,
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
