//! Reads the requested telemetry families from the HSMP device (and the MSR fallback), one
//! worker per socket, within a request's deadline.
//!
//! Costs: after the one-time probes (`GET_PROTO_VER`, then `GET_RAPL_UNITS` per socket, on the
//! first successful open) a sample of every family sends exactly 2 × cores + sockets mailbox
//! messages; a family not asked for, or remembered unsupported, sends none.

use crate::msr::MsrEnergy;
use amd_hsmp_device::{self as device, HsmpOpener, HsmpTransport, messages};
use amd_hsmp_proto::{
    DeviceStatus, Energy, EnergySource, Families, ItemError, Readings, Sample, Topology,
    Unavailable,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// A message family that can be remembered unsupported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// `GET_RAPL_UNITS` / `GET_RAPL_CORE_COUNTER`.
    Energy = 0,
    /// `GET_BOOST_LIMIT`.
    BoostLimit = 1,
    /// `GET_PROC_HOT`.
    Prochot = 2,
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

/// The open device and what its probes found.
#[derive(Debug)]
struct Ready {
    transport: Arc<dyn HsmpTransport>,
    protocol_version: u32,
    /// Per socket (aligned with [`Topology::sockets`]): the RAPL energy status unit, or why it
    /// is unknown. A failure other than `Unsupported` is asked again on a later sample.
    esu: Vec<Mutex<Result<u8, ItemError>>>,
}

#[derive(Debug)]
enum Device {
    /// Not usable; opening is tried again on the next sample.
    NotReady(DeviceStatus),
    Ready(Arc<Ready>),
}

/// How one HSMP family is read in this sample.
enum Gate<'a> {
    NotRequested,
    Unavailable(Unavailable),
    Read(&'a Arc<Ready>),
}

/// Where energy comes from in this sample.
#[derive(Clone, Copy)]
enum EnergyGate<'a> {
    NotRequested,
    Unavailable(Unavailable),
    Hsmp(&'a Arc<Ready>),
    Msr(&'a Arc<MsrEnergy>),
}

/// Where a worker reads energy from (owned: workers may outlive the request).
#[derive(Debug, Clone)]
enum EnergyFrom {
    Nowhere,
    Hsmp(Arc<Ready>),
    Msr(Arc<MsrEnergy>),
}

/// What one socket's worker reads. Owned, because a worker still waiting for the mailbox
/// when the deadline passes is left to finish on its own while the sample is answered.
#[derive(Debug, Clone)]
struct Plan {
    energy: EnergyFrom,
    boost_limit: Option<Arc<Ready>>,
    prochot: Option<Arc<Ready>>,
    deadline: Instant,
}

/// One socket's share of the work: its position and id, and its cores as
/// (index into the topology, APIC id).
#[derive(Debug, Clone)]
struct SocketJob {
    index: usize,
    socket: u32,
    cores: Vec<(usize, u32)>,
}

/// Results as the workers deliver them, item by item; `None` is not read yet.
#[derive(Debug)]
struct Partial {
    energy: Vec<Option<Result<Energy, ItemError>>>,
    boost_limit: Vec<Option<Result<u32, ItemError>>>,
    prochot: Vec<Option<Result<bool, ItemError>>>,
    /// Workers still running.
    running: usize,
}

/// What a request answers: every item, read or [`ItemError::DeadlineExceeded`].
#[derive(Debug)]
struct Delivered {
    energy: Vec<Result<Energy, ItemError>>,
    boost_limit: Vec<Result<u32, ItemError>>,
    prochot: Vec<Result<bool, ItemError>>,
}

/// The meeting point of one request's workers and the thread that answers it.
#[derive(Debug)]
struct Results {
    partial: Mutex<Partial>,
    finished: Condvar,
}

impl Results {
    fn store(&self, update: impl FnOnce(&mut Partial)) {
        update(&mut lock(&self.partial));
    }

    fn worker_done(&self) {
        lock(&self.partial).running -= 1;
        self.finished.notify_all();
    }
}

/// Reads telemetry for the requests of every connection; shared by all connection threads.
#[derive(Debug)]
pub struct Sampler {
    topology: Topology,
    opener: Box<dyn HsmpOpener>,
    msr: Option<Arc<MsrEnergy>>,
    /// For each socket of the topology, the indices of its cores.
    socket_cores: Vec<Vec<usize>>,
    device: Mutex<Device>,
    /// Families remembered unsupported, indexed by [`Family`].
    unsupported: [AtomicBool; 3],
    /// Failure classes already logged, so each is logged once and not on every request.
    logged: Mutex<Vec<(&'static str, ItemError)>>,
}

impl Sampler {
    /// A sampler for `topology` that reads HSMP through the device `hsmp` opens and, when RAPL
    /// is not available, energy from `msr`. Opens the device now and logs the outcome.
    pub fn new(
        topology: Topology,
        hsmp: Box<dyn HsmpOpener>,
        msr: Option<Arc<MsrEnergy>>,
    ) -> Sampler {
        let socket_cores = topology
            .sockets
            .iter()
            .map(|&socket| {
                let cores = topology.cores.iter().enumerate();
                cores.filter(|(_, c)| c.socket == socket).map(|(i, _)| i).collect()
            })
            .collect();
        let sampler = Sampler {
            topology,
            opener: hsmp,
            msr,
            socket_cores,
            device: Mutex::new(Device::NotReady(DeviceStatus::Absent)),
            unsupported: Default::default(),
            logged: Mutex::new(Vec::new()),
        };
        let device = sampler.open_device();
        log_device(None, &device, sampler.msr.is_some());
        *lock(&sampler.device) = device;
        sampler
    }

    /// The machine this sampler reads.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Reads the families in `what`; no message is sent once `deadline` has passed, and the
    /// items not read by then are [`ItemError::DeadlineExceeded`].
    pub fn sample(&self, what: Families, deadline: Instant) -> Sample {
        let (status, ready) = self.device(deadline);
        let ready = ready.as_ref();
        let energy = match self.gate(what.core_energy, Family::Energy, ready) {
            Gate::NotRequested => EnergyGate::NotRequested,
            Gate::Read(ready) => EnergyGate::Hsmp(ready),
            Gate::Unavailable(why) => match &self.msr {
                Some(msr) => EnergyGate::Msr(msr),
                None => EnergyGate::Unavailable(why),
            },
        };
        let boost_limit = self.gate(what.boost_limit, Family::BoostLimit, ready);
        let prochot = self.gate(what.prochot, Family::Prochot, ready);
        let plan = Plan {
            energy: match energy {
                EnergyGate::Hsmp(ready) => EnergyFrom::Hsmp(ready.clone()),
                EnergyGate::Msr(msr) => EnergyFrom::Msr(msr.clone()),
                EnergyGate::NotRequested | EnergyGate::Unavailable(_) => EnergyFrom::Nowhere,
            },
            boost_limit: as_read(&boost_limit),
            prochot: as_read(&prochot),
            deadline,
        };

        let Delivered { energy: energy_values, boost_limit: boost_values, prochot: prochot_values } =
            self.run_workers(plan);

        let (energy_source, energy) = match energy {
            EnergyGate::NotRequested => (None, Readings::NotRequested),
            EnergyGate::Unavailable(why) => (None, Readings::Unavailable(why)),
            EnergyGate::Hsmp(_) => match self.finish(Family::Energy, energy_values) {
                values @ Readings::Values(_) => (Some(EnergySource::Hsmp), values),
                other => (None, other),
            },
            EnergyGate::Msr(_) => {
                self.log_failures("core-energy (msr)", &energy_values);
                (Some(EnergySource::Msr), Readings::Values(energy_values))
            }
        };
        Sample {
            hsmp: status,
            energy_source,
            energy,
            boost_limit: self.readings(boost_limit, Family::BoostLimit, boost_values),
            prochot: self.readings(prochot, Family::Prochot, prochot_values),
            energy_resets: self.msr.as_ref().map_or(0, |msr| msr.resets()),
        }
    }

    /// The device state, after one attempt to open it if it was not ready.
    fn device(&self, deadline: Instant) -> (DeviceStatus, Option<Arc<Ready>>) {
        let mut device = lock(&self.device);
        if matches!(*device, Device::NotReady(_)) && Instant::now() < deadline {
            let next = self.open_device();
            log_device(Some(&device), &next, self.msr.is_some());
            *device = next;
        }
        match &*device {
            Device::NotReady(status) => (*status, None),
            Device::Ready(ready) => (
                DeviceStatus::Ready { protocol_version: ready.protocol_version },
                Some(ready.clone()),
            ),
        }
    }

    /// Opens the device and runs the one-time probes.
    fn open_device(&self) -> Device {
        let transport = match self.opener.open() {
            Ok(transport) => transport,
            Err(errno) => return Device::NotReady(open_status(errno)),
        };
        let first_socket = self.topology.sockets.first().copied().unwrap_or(0);
        let protocol_version = match messages::proto_version(transport.as_ref(), first_socket) {
            Ok(version) => version,
            Err(error) => return Device::NotReady(DeviceStatus::Failed(error)),
        };
        let esu: Vec<_> = if self.is_unsupported(Family::Energy) {
            self.topology.sockets.iter().map(|_| Mutex::new(Err(ItemError::Unsupported))).collect()
        } else {
            let probe = |&socket| Mutex::new(messages::rapl_esu(transport.as_ref(), socket));
            self.topology.sockets.iter().map(probe).collect()
        };
        if !esu.is_empty() && esu.iter().all(|e| *lock(e) == Err(ItemError::Unsupported)) {
            self.remember_unsupported(Family::Energy);
        }
        Device::Ready(Arc::new(Ready { transport, protocol_version, esu }))
    }

    fn gate<'a>(&self, asked: bool, family: Family, ready: Option<&'a Arc<Ready>>) -> Gate<'a> {
        match ready {
            _ if !asked => Gate::NotRequested,
            None => Gate::Unavailable(Unavailable::NoDevice),
            Some(_) if self.is_unsupported(family) => Gate::Unavailable(Unavailable::Unsupported),
            Some(ready) => Gate::Read(ready),
        }
    }

    /// Runs one worker per socket, in parallel, and returns what they delivered by the time
    /// all finished or the deadline passed, whichever is first. A worker still waiting for the
    /// mailbox then is not waited for: it finishes its one message and stops, since no message
    /// is sent after the deadline.
    fn run_workers(&self, plan: Plan) -> Delivered {
        let sockets = self.topology.sockets.len();
        let results = Arc::new(Results {
            partial: Mutex::new(Partial {
                energy: vec![None; self.topology.cores.len()],
                boost_limit: vec![None; self.topology.cores.len()],
                prochot: vec![None; sockets],
                running: sockets,
            }),
            finished: Condvar::new(),
        });
        for (index, cores) in self.socket_cores.iter().enumerate() {
            let socket = self.topology.sockets[index];
            let cores = cores.iter().map(|&i| (i, self.topology.cores[i].apic_id)).collect();
            let job = SocketJob { index, socket, cores };
            let (plan, out) = (plan.clone(), results.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("hsmp-socket-{socket}"))
                .spawn(move || read_socket(&job, &plan, &out));
            if let Err(e) = spawned {
                // The closure (and its job) is gone with the failed spawn: that socket is
                // not read this time.
                tracing::warn!(socket, error = %e, "cannot start a socket worker");
                results.worker_done();
            }
        }
        let mut partial = lock(&results.partial);
        while partial.running > 0 {
            let left = plan.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            partial = results
                .finished
                .wait_timeout(partial, left)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Delivered {
            energy: not_read_as_deadline(std::mem::take(&mut partial.energy)),
            boost_limit: not_read_as_deadline(std::mem::take(&mut partial.boost_limit)),
            prochot: not_read_as_deadline(std::mem::take(&mut partial.prochot)),
        }
    }

    fn readings<T>(
        &self,
        gate: Gate<'_>,
        family: Family,
        values: Vec<Result<T, ItemError>>,
    ) -> Readings<T> {
        match gate {
            Gate::NotRequested => Readings::NotRequested,
            Gate::Unavailable(why) => Readings::Unavailable(why),
            Gate::Read(_) => self.finish(family, values),
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
        self.unsupported[family as usize].load(Ordering::Relaxed)
    }

    fn remember_unsupported(&self, family: Family) {
        if !self.unsupported[family as usize].swap(true, Ordering::Relaxed) {
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

/// One socket's messages, back to back: PROCHOT, then energy, then boost limits. Each result
/// is delivered as soon as it is read.
fn read_socket(job: &SocketJob, plan: &Plan, out: &Results) {
    let (s, socket, deadline) = (job.index, job.socket, plan.deadline);
    if let Some(ready) = &plan.prochot {
        let r = in_time(deadline, || messages::prochot(ready.transport.as_ref(), socket));
        out.store(|p| p.prochot[s] = Some(r));
    }
    match &plan.energy {
        EnergyFrom::Hsmp(ready) => {
            let t = ready.transport.as_ref();
            let esu = socket_esu(ready, s, socket, deadline);
            for &(i, apic_id) in &job.cores {
                let r = in_time(deadline, || {
                    let esu = esu?;
                    let counter = messages::rapl_core_counter(t, socket, apic_id)?;
                    Ok(Energy { counter, esu })
                });
                out.store(|p| p.energy[i] = Some(r));
            }
        }
        EnergyFrom::Msr(msr) => {
            for &(i, _) in &job.cores {
                let r = in_time(deadline, || msr.read(i));
                out.store(|p| p.energy[i] = Some(r));
            }
        }
        EnergyFrom::Nowhere => {}
    }
    if let Some(ready) = &plan.boost_limit {
        let t = ready.transport.as_ref();
        for &(i, apic_id) in &job.cores {
            let r = in_time(deadline, || messages::boost_limit_mhz(t, socket, apic_id));
            out.store(|p| p.boost_limit[i] = Some(r));
        }
    }
    out.worker_done();
}

/// The energy unit of socket `s`, asking the firmware again if the probe failed other than
/// with `Unsupported`.
fn socket_esu(ready: &Ready, s: usize, socket: u32, deadline: Instant) -> Result<u8, ItemError> {
    let mut esu = lock(&ready.esu[s]);
    if matches!(*esu, Err(e) if e != ItemError::Unsupported) {
        if Instant::now() >= deadline {
            return Err(ItemError::DeadlineExceeded);
        }
        *esu = messages::rapl_esu(ready.transport.as_ref(), socket);
    }
    *esu
}

impl crate::server::Backend for Sampler {
    fn topology(&self) -> &Topology {
        Sampler::topology(self)
    }

    fn sample(&self, what: Families, deadline: Instant) -> Sample {
        Sampler::sample(self, what, deadline)
    }
}

/// Runs `read` (one message) unless `deadline` has passed.
fn in_time<T>(
    deadline: Instant,
    read: impl FnOnce() -> Result<T, ItemError>,
) -> Result<T, ItemError> {
    if Instant::now() < deadline { read() } else { Err(ItemError::DeadlineExceeded) }
}

/// Items a worker had not delivered by the deadline are not read.
fn not_read_as_deadline<T>(items: Vec<Option<Result<T, ItemError>>>) -> Vec<Result<T, ItemError>> {
    items.into_iter().map(|r| r.unwrap_or(Err(ItemError::DeadlineExceeded))).collect()
}

fn as_read(gate: &Gate<'_>) -> Option<Arc<Ready>> {
    match gate {
        Gate::Read(ready) => Some(Arc::clone(ready)),
        Gate::NotRequested | Gate::Unavailable(_) => None,
    }
}

/// Locks `mutex`; a worker that panicked cannot leave these values half-updated.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Logs the device state when it is first known and whenever it changes.
fn log_device(before: Option<&Device>, now: &Device, msr_fallback: bool) {
    let status = |d: &Device| match d {
        Device::NotReady(status) => *status,
        Device::Ready(ready) => DeviceStatus::Ready { protocol_version: ready.protocol_version },
    };
    let now_status = status(now);
    if before.map(status) == Some(now_status) {
        return;
    }
    match now {
        Device::Ready(ready) => tracing::info!(
            protocol_version = ready.protocol_version,
            rapl = ready.esu.iter().any(|e| lock(e).is_ok()),
            "HSMP device ready",
        ),
        Device::NotReady(status) => tracing::warn!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT};
    use amd_hsmp_device::{Errno, HsmpMessage, Message, MsrOpener, MsrTransport};
    use amd_hsmp_proto::Core;
    use std::sync::atomic::{AtomicU32, AtomicUsize};
    use std::time::Duration;

    /// In-memory firmware: validates messages as the driver does, answers from the message
    /// arguments, and records what it was sent and how many messages ran at once.
    #[derive(Debug, Default)]
    struct Firmware {
        sockets: u16,
        /// Message ids the firmware does not implement (`ENOMSG`).
        missing: Vec<u32>,
        /// (message id, argument 0, errno) answered with an error.
        failing: Vec<(u32, u32, Errno)>,
        /// Time each message takes.
        delay: Duration,
        /// A wedged mailbox: each message takes this many more milliseconds (set at run time).
        wedge_ms: std::sync::atomic::AtomicU64,
        sent: Mutex<Vec<HsmpMessage>>,
        busy: Mutex<Busy>,
    }

    #[derive(Debug, Default)]
    struct Busy {
        now: Vec<u16>,
        max_total: usize,
        max_per_socket: usize,
    }

    impl Firmware {
        fn new(sockets: u16) -> Firmware {
            Firmware { sockets, ..Firmware::default() }
        }

        fn sent(&self) -> Vec<HsmpMessage> {
            self.sent.lock().unwrap().clone()
        }

        fn count(&self) -> usize {
            self.sent.lock().unwrap().len()
        }

        fn count_of(&self, message: Message) -> usize {
            self.sent().iter().filter(|m| m.msg_id == message.id()).count()
        }

        fn reply(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
            let message = Message::from_id(msg.msg_id).ok_or(libc::ENOMSG)?;
            if (msg.num_args, msg.response_sz) != (message.num_args(), message.response_sz()) {
                return Err(libc::EINVAL);
            }
            if msg.sock_ind >= self.sockets {
                return Err(libc::ENODEV);
            }
            if self.missing.contains(&msg.msg_id) {
                return Err(libc::ENOMSG);
            }
            let arg = msg.args[0];
            if let Some(&(.., errno)) =
                self.failing.iter().find(|&&(id, a, _)| id == msg.msg_id && a == arg)
            {
                return Err(errno);
            }
            let [w0, w1, ..] = &mut msg.args;
            match message {
                Message::GetProtoVer => *w0 = 7,
                Message::GetBoostLimit => *w0 = 3_000 + arg,
                Message::GetProcHot => *w0 = u32::from(msg.sock_ind == 1),
                Message::GetRaplUnits => *w0 = 0x000A_1003,
                Message::GetRaplCoreCounter => (*w0, *w1) = (arg * 1_000, arg),
            }
            Ok(())
        }
    }

    impl HsmpTransport for Firmware {
        fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
            self.sent.lock().unwrap().push(*msg);
            {
                let mut busy = self.busy.lock().unwrap();
                busy.now.push(msg.sock_ind);
                busy.max_total = busy.max_total.max(busy.now.len());
                let same = busy.now.iter().filter(|&&s| s == msg.sock_ind).count();
                busy.max_per_socket = busy.max_per_socket.max(same);
            }
            std::thread::sleep(self.delay);
            std::thread::sleep(Duration::from_millis(self.wedge_ms.load(Ordering::SeqCst)));
            let r = self.reply(msg);
            let mut busy = self.busy.lock().unwrap();
            let at = busy.now.iter().position(|&s| s == msg.sock_ind).unwrap();
            busy.now.remove(at);
            r
        }
    }

    /// Opens the firmware, or fails with the errno set in `refuse`; counts the attempts.
    #[derive(Debug, Clone)]
    struct Opener {
        firmware: Arc<Firmware>,
        refuse: Arc<Mutex<Option<Errno>>>,
        opens: Arc<AtomicUsize>,
    }

    impl Opener {
        fn new(firmware: Firmware) -> Opener {
            Opener { firmware: Arc::new(firmware), refuse: Arc::default(), opens: Arc::default() }
        }

        fn refusing(self, errno: Errno) -> Opener {
            *self.refuse.lock().unwrap() = Some(errno);
            self
        }
    }

    impl HsmpOpener for Opener {
        fn open(&self) -> Result<Arc<dyn HsmpTransport>, Errno> {
            self.opens.fetch_add(1, Ordering::SeqCst);
            match *self.refuse.lock().unwrap() {
                Some(errno) => Err(errno),
                None => Ok(self.firmware.clone()),
            }
        }
    }

    /// `sockets` sockets of `cores` cores; CPU numbers, sparse core ids and APIC ids differ.
    fn topology(sockets: u32, cores: u32) -> Topology {
        let core = |s, c| Core {
            socket: s,
            core: 2 * c,
            cpu: s * cores + c,
            apic_id: 0x40 * s + 2 * c + 1,
        };
        Topology {
            cpu_family: 0x1A,
            cpu_model: 0x11,
            sockets: (0..sockets).collect(),
            cores: (0..sockets).flat_map(|s| (0..cores).map(move |c| core(s, c))).collect(),
        }
    }

    fn sampler(opener: &Opener, topology: Topology) -> Sampler {
        Sampler::new(topology, Box::new(opener.clone()), None)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    fn values<T: Clone + std::fmt::Debug>(readings: &Readings<T>) -> Vec<Result<T, ItemError>> {
        match readings {
            Readings::Values(values) => values.clone(),
            other => panic!("expected values, got {other:?}"),
        }
    }

    #[test]
    fn a_full_sample_costs_two_messages_per_core_and_one_per_socket() {
        let opener = Opener::new(Firmware::new(2));
        let topo = topology(2, 3);
        let sampler = sampler(&opener, topo.clone());
        // The one-time probes: GET_PROTO_VER, then GET_RAPL_UNITS on each socket.
        assert_eq!(opener.firmware.count(), 1 + 2);

        for round in 1..=3 {
            let sample = sampler.sample(Families::ALL, soon());
            assert_eq!(opener.firmware.count(), 3 + round * (2 * 6 + 2), "round {round}");
            assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 });
            assert_eq!(values(&sample.prochot), [Ok(false), Ok(true)]);
            assert_eq!(sample.energy_source, Some(EnergySource::Hsmp));
            let energy = values(&sample.energy);
            for (core, e) in topo.cores.iter().zip(energy) {
                let apic = u64::from(core.apic_id);
                assert_eq!(e, Ok(Energy { counter: (apic << 32) | (apic * 1_000), esu: 16 }));
            }
        }
        assert_eq!(opener.opens.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_family_not_asked_for_costs_nothing() {
        let opener = Opener::new(Firmware::new(2));
        let sampler = sampler(&opener, topology(2, 4));
        let before = opener.firmware.count();
        let what = Families { boost_limit: true, ..Families::default() };
        let sample = sampler.sample(what, soon());
        assert_eq!(opener.firmware.count() - before, 8);
        assert_eq!(opener.firmware.count_of(Message::GetBoostLimit), 8);
        assert_eq!(sample.energy, Readings::NotRequested);
        assert_eq!(sample.prochot, Readings::NotRequested);

        sampler.sample(Families::default(), soon());
        assert_eq!(opener.firmware.count() - before, 8);
    }

    #[test]
    fn cores_are_addressed_by_apic_id_on_their_socket() {
        let opener = Opener::new(Firmware::new(2));
        let topo = topology(2, 3);
        let sampler = sampler(&opener, topo.clone());
        let what = Families { boost_limit: true, ..Families::default() };
        let sample = sampler.sample(what, soon());

        let mut sent: Vec<_> = opener
            .firmware
            .sent()
            .iter()
            .filter(|m| m.msg_id == Message::GetBoostLimit.id())
            .map(|m| (u32::from(m.sock_ind), m.args[0]))
            .collect();
        sent.sort();
        let want: Vec<_> = topo.cores.iter().map(|c| (c.socket, c.apic_id)).collect();
        assert_eq!(sent, want);
        assert!(topo.cores.iter().any(|c| c.apic_id != c.cpu));
        let limits: Vec<_> = topo.cores.iter().map(|c| Ok(3_000 + c.apic_id)).collect();
        assert_eq!(values(&sample.boost_limit), limits);
    }

    #[test]
    fn a_family_unsupported_on_every_item_is_remembered() {
        let firmware = Firmware { missing: vec![Message::GetBoostLimit.id()], ..Firmware::new(2) };
        let opener = Opener::new(firmware);
        let sampler = sampler(&opener, topology(2, 3));
        let first = sampler.sample(Families::ALL, soon());
        assert_eq!(first.boost_limit, Readings::Unavailable(Unavailable::Unsupported));
        assert_eq!(opener.firmware.count_of(Message::GetBoostLimit), 6);

        let before = opener.firmware.count();
        let second = sampler.sample(Families::ALL, soon());
        assert_eq!(second.boost_limit, Readings::Unavailable(Unavailable::Unsupported));
        assert_eq!(opener.firmware.count_of(Message::GetBoostLimit), 6, "asked again");
        assert_eq!(opener.firmware.count() - before, 6 + 2);
        assert_eq!(values(&second.prochot), [Ok(false), Ok(true)]);
    }

    #[test]
    fn one_failing_core_fails_only_its_item_and_is_asked_again() {
        let topo = topology(2, 3);
        let bad = topo.cores[4].apic_id;
        let firmware = Firmware {
            failing: vec![(Message::GetBoostLimit.id(), bad, libc::EIO)],
            ..Firmware::new(2)
        };
        let opener = Opener::new(firmware);
        let sampler = sampler(&opener, topo.clone());
        for _ in 0..2 {
            let limits = values(&sampler.sample(Families::ALL, soon()).boost_limit);
            for (i, (core, limit)) in topo.cores.iter().zip(limits).enumerate() {
                let want = if i == 4 {
                    Err(ItemError::Io { errno: libc::EIO })
                } else {
                    Ok(3_000 + core.apic_id)
                };
                assert_eq!(limit, want);
            }
        }
        assert_eq!(opener.firmware.count_of(Message::GetBoostLimit), 12);
    }

    #[test]
    fn past_the_deadline_nothing_is_sent() {
        let opener = Opener::new(Firmware::new(2));
        let sampler = sampler(&opener, topology(2, 3));
        let before = opener.firmware.count();
        let sample = sampler.sample(Families::ALL, Instant::now());
        assert_eq!(opener.firmware.count(), before);
        assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 });
        assert_eq!(values(&sample.energy), vec![Err(ItemError::DeadlineExceeded); 6]);
        assert_eq!(values(&sample.boost_limit), vec![Err(ItemError::DeadlineExceeded); 6]);
        assert_eq!(values(&sample.prochot), vec![Err(ItemError::DeadlineExceeded); 2]);
    }

    #[test]
    fn a_deadline_passing_mid_sample_stops_the_messages() {
        let firmware = Firmware { delay: Duration::from_millis(50), ..Firmware::new(1) };
        let opener = Opener::new(firmware);
        let sampler = sampler(&opener, topology(1, 8));
        let before = opener.firmware.count();
        // 17 messages of 50 ms each cannot all fit in 200 ms.
        let sample = sampler.sample(Families::ALL, Instant::now() + Duration::from_millis(200));
        let sent = opener.firmware.count() - before;
        assert!((1..17).contains(&sent), "{sent} messages sent");
        let boost = values(&sample.boost_limit);
        assert_eq!(boost.last(), Some(&Err(ItemError::DeadlineExceeded)));
        assert_eq!(values(&sample.prochot), [Ok(false)]);
    }

    #[test]
    fn a_device_that_appears_later_is_picked_up() {
        let opener = Opener::new(Firmware::new(1)).refusing(libc::ENOENT);
        let sampler = sampler(&opener, topology(1, 2));
        for _ in 0..3 {
            let sample = sampler.sample(Families::ALL, soon());
            assert_eq!(sample.hsmp, DeviceStatus::Absent);
            assert_eq!(sample.boost_limit, Readings::Unavailable(Unavailable::NoDevice));
            assert_eq!(sample.energy, Readings::Unavailable(Unavailable::NoDevice));
        }
        // Once at start-up, then at most once per sample.
        assert_eq!(opener.opens.load(Ordering::SeqCst), 4);
        assert_eq!(opener.firmware.count(), 0);

        *opener.refuse.lock().unwrap() = None; // modprobe amd_hsmp
        let sample = sampler.sample(Families::ALL, soon());
        assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 });
        assert_eq!(values(&sample.boost_limit), [Ok(3_001), Ok(3_003)]);
        sampler.sample(Families::ALL, soon());
        assert_eq!(opener.opens.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn open_errors_give_the_device_status() {
        let cases = [
            (libc::ENOENT, DeviceStatus::Absent),
            (libc::ENODEV, DeviceStatus::Absent),
            (libc::EACCES, DeviceStatus::PermissionDenied),
            (libc::EPERM, DeviceStatus::PermissionDenied),
            (libc::EIO, DeviceStatus::Failed(ItemError::Io { errno: libc::EIO })),
        ];
        for (errno, want) in cases {
            let opener = Opener::new(Firmware::new(1)).refusing(errno);
            let sample = sampler(&opener, topology(1, 1)).sample(Families::ALL, soon());
            assert_eq!(sample.hsmp, want, "errno {errno}");
        }
    }

    #[test]
    fn a_device_that_does_not_answer_the_version_has_failed() {
        let firmware = Firmware {
            failing: vec![(Message::GetProtoVer.id(), 0, libc::ETIMEDOUT)],
            ..Firmware::new(1)
        };
        let opener = Opener::new(firmware);
        let sample = sampler(&opener, topology(1, 2)).sample(Families::ALL, soon());
        assert_eq!(sample.hsmp, DeviceStatus::Failed(ItemError::TimedOut));
        assert_eq!(sample.prochot, Readings::Unavailable(Unavailable::NoDevice));
        assert_eq!(opener.firmware.count_of(Message::GetProcHot), 0);
    }

    #[test]
    fn sockets_are_read_in_parallel_and_each_socket_serially() {
        let firmware = Firmware { delay: Duration::from_millis(20), ..Firmware::new(2) };
        let opener = Opener::new(firmware);
        let sampler = sampler(&opener, topology(2, 3));
        let before = opener.firmware.count();
        let started = Instant::now();
        sampler.sample(Families::ALL, soon());
        let elapsed = started.elapsed();
        let serial = Duration::from_millis(20) * (opener.firmware.count() - before) as u32;
        assert!(elapsed < serial * 3 / 4, "took {elapsed:?}, serially {serial:?}");
        let busy = opener.firmware.busy.lock().unwrap();
        assert_eq!(busy.max_total, 2);
        assert_eq!(busy.max_per_socket, 1);
    }

    /// Regression: the sample used to wait for the messages still in the mailbox at the
    /// deadline, so a wedged socket made the whole reply late and the frontend dropped it.
    #[test]
    fn the_answer_comes_at_the_deadline_even_with_messages_in_flight() {
        let opener = Opener::new(Firmware::new(2));
        let sampler = sampler(&opener, topology(2, 2));
        opener.firmware.wedge_ms.store(1000, Ordering::SeqCst);
        let started = Instant::now();
        let sample = sampler.sample(Families::ALL, started + Duration::from_millis(100));
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_millis(600), "answered after {elapsed:?}");
        // Each socket's first message (PROCHOT) was in the mailbox at the deadline; nothing
        // else was sent.
        assert_eq!(values(&sample.prochot), [Err(ItemError::DeadlineExceeded); 2]);
        assert!(values(&sample.energy).iter().all(|v| *v == Err(ItemError::DeadlineExceeded)));
        assert!(values(&sample.boost_limit).iter().all(|v| *v == Err(ItemError::DeadlineExceeded)));
        let sent_after_probes = opener.firmware.sent().len() - 3;
        assert_eq!(sent_after_probes, 2);
    }

    /// A CPU whose energy counter the test sets; ESU 16.
    #[derive(Debug, Clone, Default)]
    struct Cpu(Arc<AtomicU32>);

    impl MsrTransport for Cpu {
        fn read(&self, msr: u32) -> Result<u64, Errno> {
            match msr {
                MSR_RAPL_PWR_UNIT => Ok(0x000A_1003),
                MSR_CORE_ENERGY_STAT => Ok(u64::from(self.0.load(Ordering::SeqCst))),
                _ => Err(libc::EIO),
            }
        }
    }

    impl MsrOpener for Cpu {
        fn open(&self, _cpu: u32) -> Result<Box<dyn MsrTransport>, Errno> {
            Ok(Box::new(self.clone()))
        }
    }

    #[test]
    fn energy_falls_back_to_the_msrs_when_rapl_is_unsupported() {
        let missing = vec![Message::GetRaplUnits.id(), Message::GetRaplCoreCounter.id()];
        let opener = Opener::new(Firmware { missing, ..Firmware::new(2) });
        let topo = topology(2, 3);
        let cpu = Cpu::default();
        let msr = Arc::new(MsrEnergy::open(&topo, &cpu).unwrap());
        let sampler = Sampler::new(topo, Box::new(opener.clone()), Some(msr));
        let before = opener.firmware.count();

        cpu.0.store(65_536 * 3, Ordering::SeqCst);
        let sample = sampler.sample(Families::ALL, soon());
        assert_eq!(sample.energy_source, Some(EnergySource::Msr));
        let energy = values(&sample.energy);
        assert_eq!(energy, vec![Ok(Energy { counter: 65_536 * 3, esu: 16 }); 6]);
        assert_eq!(energy[0].unwrap().joules(), 3.0);
        // Only boost limits and PROCHOT went to the mailbox.
        assert_eq!(opener.firmware.count() - before, 6 + 2);
        assert_eq!(opener.firmware.count_of(Message::GetRaplCoreCounter), 0);
    }

    #[test]
    fn energy_comes_from_the_msrs_without_an_hsmp_device() {
        let opener = Opener::new(Firmware::new(1)).refusing(libc::ENOENT);
        let topo = topology(1, 2);
        let msr = Arc::new(MsrEnergy::open(&topo, &Cpu::default()).unwrap());
        let sample = Sampler::new(topo, Box::new(opener), Some(msr)).sample(Families::ALL, soon());
        assert_eq!(sample.hsmp, DeviceStatus::Absent);
        assert_eq!(sample.energy_source, Some(EnergySource::Msr));
        assert_eq!(sample.prochot, Readings::Unavailable(Unavailable::NoDevice));
    }

    #[test]
    fn a_failure_class_is_logged_once_not_per_request() {
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
            type Writer = Capture;
            fn make_writer(&'a self) -> Capture {
                self.clone()
            }
        }

        let capture = Capture::default();
        let subscriber = tracing_subscriber::fmt().with_writer(capture.clone()).with_ansi(false);
        tracing::subscriber::with_default(subscriber.finish(), || {
            let topo = topology(1, 4);
            let failing = topo
                .cores
                .iter()
                .map(|c| (Message::GetBoostLimit.id(), c.apic_id, libc::EREMOTEIO))
                .take(2)
                .collect();
            let opener = Opener::new(Firmware { failing, ..Firmware::new(1) });
            let sampler = sampler(&opener, topo);
            for _ in 0..5 {
                sampler.sample(Families::ALL, soon());
            }
        });
        let log = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        let errno = format!("errno {}", libc::EREMOTEIO);
        assert_eq!(log.lines().filter(|l| l.contains(&errno)).count(), 1, "{log}");
        assert!(log.contains("boost-limit"), "{log}");
    }
}
