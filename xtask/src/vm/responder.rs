//! The SMU responder: answers the guest driver's mailbox messages, one thread per socket, from
//! the project's firmware simulator, with the FUSE fake's scenario knobs (protocol version,
//! unsupported families, per-item failures, wedged sockets, latency).
//!
//! The real `amd_hsmp` driver in the guest does what the simulator's driver model does for the
//! FUSE fake (validation, per-socket locking, timeouts, errno mapping); the responder is only
//! the firmware: it turns [`Faults`] into what an SMU would do (no answer, or a status code)
//! and asks [`sim::Machine`]'s firmware for the reply words. A further thread keeps the counter
//! tables of the guest's `power_core` PMU ([`pmu`]) equal to the same firmware's counters.

use super::mailbox::Mailbox;
use super::pmu;
use super::sim::{
    self, Errno, FaultGroup, Faults, FirmwareConfig, FwStatus, Machine, MachineSpec, Message,
};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The mailbox status of a message the firmware completed.
const STATUS_OK: u32 = 0x01;
/// A status the driver knows no name for: it answers `EIO`.
const STATUS_OTHER: u32 = 0x02;
/// How long a socket thread keeps polling fast after its last message.
const ACTIVE_WINDOW: Duration = Duration::from_millis(50);
/// Poll interval while messages are flowing.
const FAST_POLL: Duration = Duration::from_micros(10);
/// Poll interval while idle (the driver waits up to 100 ms, so this only delays the first
/// message of a burst).
const IDLE_POLL: Duration = Duration::from_micros(500);
/// How often the `power_core` counter tables are brought up to date (the test changes a
/// counter, then scrapes more than a second later).
const TABLE_INTERVAL: Duration = Duration::from_millis(2);

/// What the SMU does with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Status and the eight words to write into the argument registers (only read back by the
    /// driver on [`STATUS_OK`]).
    Status(u32, Option<[u32; 8]>),
    /// Never answer: the driver times out (`ETIMEDOUT`).
    Silence,
}

/// The status code an SMU would write to make the driver return `errno`, or `None` for
/// "never answer" (`ETIMEDOUT`); errors the firmware cannot cause are refused.
pub fn status_for_errno(errno: Errno) -> Result<Option<u32>> {
    Ok(Some(match errno {
        libc::ETIMEDOUT => return Ok(None),
        libc::EIO => STATUS_OTHER,
        libc::ENOMSG => FwStatus::InvalidMessage.code(),
        libc::EINVAL => FwStatus::InvalidInput.code(),
        libc::EREMOTEIO => FwStatus::PrereqNotSatisfied.code(),
        libc::EBUSY => FwStatus::Busy.code(),
        other => bail!("no SMU status makes the driver return errno {other}"),
    }))
}

/// The guest's CPU topology as QEMU builds it: `sockets` × `cores` present × 1 thread, in a
/// package QEMU sizes for `apic_cores` cores (`-smp cores=`): APIC id = socket << (bits for
/// `apic_cores`) | core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestTopology {
    /// Sockets (`-smp sockets=`).
    pub sockets: u32,
    /// Cores present per socket, core ids 0 to `cores - 1`.
    pub cores: u32,
    /// Cores per socket QEMU's topology has room for (`-smp cores=`): `cores`, or more when
    /// only some are present (APIC ids above 255 for a second socket).
    pub apic_cores: u32,
}

impl GuestTopology {
    /// The APIC id QEMU gives core `core` of socket `socket`.
    pub fn apic_id(self, socket: u32, core: u32) -> u32 {
        let bits = u32::BITS - self.apic_cores.saturating_sub(1).leading_zeros();
        socket << bits | core
    }

    /// The simulator's machine for this guest: a Turin with this many sockets and cores (no
    /// SMT), speaking HSMP protocol `protocol` (RAPL messages from protocol 7 on, the
    /// frequency limits from protocol 5 on).
    pub fn spec(self, protocol: u32) -> MachineSpec {
        let mut spec = sim::Profile::Turin2p.spec();
        spec.sockets = self.sockets;
        spec.core_ids = (0..self.cores).collect();
        spec.smt = false;
        spec.offline_cpus.clear();
        spec.hsmp_protocol = Some(protocol);
        spec.rapl_messages = protocol >= 7;
        spec
    }
}

#[derive(Debug)]
struct Shared {
    machine: RwLock<Arc<Machine>>,
    topology: GuestTopology,
    /// Guest APIC id → the simulator's APIC id of the same (socket, core).
    apic: HashMap<u32, u32>,
    answered: Vec<AtomicU64>,
    stop: AtomicBool,
    error: Mutex<Option<String>>,
}

/// The running responder; dropping it stops its threads.
#[derive(Debug)]
pub struct Responder {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Responder {
    /// Starts one thread per socket answering the mailboxes in the guest RAM file `ram`, from
    /// a static-mode simulator of `topology` at protocol `protocol`.
    pub fn start(ram: &Path, topology: GuestTopology, protocol: u32) -> Result<Responder> {
        let spec = topology.spec(protocol);
        let mut apic = HashMap::new();
        for socket in 0..topology.sockets {
            for core in 0..topology.cores {
                apic.insert(topology.apic_id(socket, core), spec.apic_id(socket, core, 0));
            }
        }
        let shared = Arc::new(Shared {
            machine: RwLock::new(Machine::new(spec, FirmwareConfig::static_values())),
            topology,
            apic,
            answered: (0..topology.sockets).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let mut threads = Vec::new();
        for socket in 0..topology.sockets {
            let mailbox = Mailbox::open(ram, socket)?;
            threads.push(spawn(&shared, format!("smu{socket}"), move |shared| {
                serve(shared, socket, &mailbox).with_context(|| format!("socket {socket}"))
            })?);
        }
        let tables = std::fs::File::options()
            .read(true)
            .write(true)
            .open(ram)
            .with_context(|| format!("cannot open the guest RAM file {}", ram.display()))?;
        threads.push(spawn(&shared, "pmu".into(), move |shared| {
            keep_tables(shared, &tables).context("power_core tables")
        })?);
        Ok(Responder { shared, threads })
    }

    /// The simulator answering now (replaced by [`Responder::set_protocol`]).
    pub fn machine(&self) -> Arc<Machine> {
        Arc::clone(&self.shared.machine.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The guest topology served.
    pub fn topology(&self) -> GuestTopology {
        self.shared.topology
    }

    /// Messages answered (or left unanswered on purpose) so far, per socket.
    pub fn answered(&self) -> Vec<u64> {
        self.shared.answered.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }

    /// Why a socket thread stopped, if one did.
    pub fn error(&self) -> Option<String> {
        self.shared.error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Restarts the firmware at another protocol version, keeping the faults and every value.
    pub fn set_protocol(&self, protocol: u32) -> Result<()> {
        let old = self.machine();
        let new = Machine::new(
            self.shared.topology.spec(protocol),
            FirmwareConfig { faults: old.faults(), ..FirmwareConfig::static_values() },
        );
        let (of, nf) = (old.firmware(), new.firmware());
        for socket in 0..self.shared.topology.sockets {
            nf.set_prochot(socket, of.prochot(socket)?)?;
            nf.set_freq_limit(socket, of.freq_limit(socket)?)?;
            for core in 0..self.shared.topology.cores {
                nf.set_boost_limit(socket, core, of.boost_limit(socket, core)?)?;
                nf.set_energy_counter(socket, core, of.energy_counter(socket, core)?)?;
            }
        }
        *self.shared.machine.write().unwrap_or_else(PoisonError::into_inner) = new;
        Ok(())
    }

    /// Changes the injected faults.
    pub fn update_faults(&self, change: impl FnOnce(&mut Faults)) {
        self.machine().update_faults(change);
    }

    /// The simulator's APIC id of `core` on `socket`, which per-core faults are keyed by.
    pub fn sim_apic(&self, socket: u32, core: u32) -> u32 {
        let guest = self.shared.topology.apic_id(socket, core);
        self.shared.apic.get(&guest).copied().unwrap_or(guest)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Starts a thread named `name` running `body` until it returns; its error stops the responder.
fn spawn(
    shared: &Arc<Shared>,
    name: String,
    body: impl FnOnce(&Shared) -> Result<()> + Send + 'static,
) -> Result<JoinHandle<()>> {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            if let Err(e) = body(&shared) {
                *shared.error.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(format!("{e:#}"));
            }
        })
        .context("cannot start a responder thread")
}

/// Keeps every socket's `power_core` counter table equal to the simulator's counters until
/// stopped.
fn keep_tables(shared: &Shared, ram: &std::fs::File) -> Result<()> {
    while !shared.stop.load(Ordering::Relaxed) {
        let machine = Arc::clone(&shared.machine.read().unwrap_or_else(PoisonError::into_inner));
        for socket in 0..shared.topology.sockets {
            let counters = (0..shared.topology.cores)
                .map(|core| machine.firmware().energy_counter(socket, core))
                .collect::<Result<Vec<u64>, _>>()?;
            pmu::sync(ram, socket, &pmu::table(&counters, machine.spec().esu))?;
        }
        std::thread::sleep(TABLE_INTERVAL);
    }
    Ok(())
}

/// One socket's loop: wait for a message id, answer it, repeat until stopped.
fn serve(shared: &Shared, socket: u32, mailbox: &Mailbox) -> Result<()> {
    let mut last: Option<Instant> = None;
    // Whether the message in the register was already counted (and left unanswered).
    let mut silenced = false;
    while !shared.stop.load(Ordering::Relaxed) {
        let id = mailbox.message_id()?;
        if id == 0 {
            silenced = false;
            let active = last.is_some_and(|t| t.elapsed() < ACTIVE_WINDOW);
            std::thread::sleep(if active { FAST_POLL } else { IDLE_POLL });
            continue;
        }
        let machine = Arc::clone(&shared.machine.read().unwrap_or_else(PoisonError::into_inner));
        let faults = machine.faults();
        let args = mailbox.args()?;
        if !silenced {
            shared.answered[socket as usize].fetch_add(1, Ordering::Relaxed);
        }
        // Decided again on every poll, so lifting a wedge answers the message in the register.
        match answer(&machine, &faults, &shared.apic, socket, id, args)? {
            Answer::Silence => {
                silenced = true;
                std::thread::sleep(IDLE_POLL);
            }
            Answer::Status(status, words) => {
                if !faults.latency.is_zero() {
                    std::thread::sleep(faults.latency);
                }
                mailbox.reply(status, words.as_ref())?;
                silenced = false;
                last = Some(Instant::now());
            }
        }
    }
    Ok(())
}

/// What the SMU of `socket` answers to message `msg_id` with `args`, given the faults.
/// `apic` maps the guest's APIC ids to the simulator's.
pub fn answer(
    machine: &Machine,
    faults: &Faults,
    apic: &HashMap<u32, u32>,
    socket: u32,
    msg_id: u32,
    mut args: [u32; 8],
) -> Result<Answer> {
    if faults.wedged_sockets.contains(&socket) || faults.latency >= faults.driver_timeout {
        return Ok(Answer::Silence);
    }
    // The messages whose argument 0 names a core by its APIC id (bits 15:0 here: QEMU's and
    // the simulator's ids are small).
    let per_core = matches!(
        Message::from_id(msg_id),
        Some(Message::GetBoostLimit | Message::GetRaplCoreCounter | Message::GetCclkCoreLimit)
    );
    if per_core {
        let guest = args[0] & 0xFFFF;
        args[0] = (args[0] & !0xFFFF) | apic.get(&guest).copied().unwrap_or(guest);
    }
    let group = FaultGroup::of_message(msg_id);
    let target =
        if per_core { sim::Target::Apic(args[0] & 0xFFFF) } else { sim::Target::Socket(socket) };
    if let Some(errno) = group.and_then(|g| faults.errno.get(&(g, target)).copied()) {
        return Ok(match status_for_errno(errno)? {
            None => Answer::Silence,
            Some(status) => Answer::Status(status, None),
        });
    }
    if group.is_some_and(|g| faults.unsupported.contains(&g)) {
        return Ok(Answer::Status(FwStatus::InvalidMessage.code(), None));
    }
    let socket = u16::try_from(socket).context("socket index out of range")?;
    Ok(match machine.firmware().answer(socket, msg_id, &args) {
        Ok(words) => Answer::Status(STATUS_OK, Some(words)),
        Err(status) => Answer::Status(status.code(), None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_device::messages::{LimitReasons, SocketFreqLimit};

    fn two_sockets() -> (Arc<Machine>, HashMap<u32, u32>) {
        let topo = GuestTopology { sockets: 2, cores: 1, apic_cores: 1 };
        let spec = topo.spec(7);
        let apic = (0..2).map(|s| (topo.apic_id(s, 0), spec.apic_id(s, 0, 0))).collect();
        (Machine::new(spec, FirmwareConfig::static_values()), apic)
    }

    #[test]
    fn the_probe_messages_get_what_the_driver_expects() {
        let (m, apic) = two_sockets();
        let f = Faults::default();
        let mut args = [0u32; 8];
        args[0] = 0xDEAD_BEEF;
        let Answer::Status(STATUS_OK, Some(words)) = answer(&m, &f, &apic, 1, 0x01, args).unwrap()
        else {
            panic!("HSMP_TEST not answered");
        };
        assert_eq!(words[0], 0xDEAD_BEF0);
        let Answer::Status(STATUS_OK, Some(words)) =
            answer(&m, &f, &apic, 0, 0x03, [0; 8]).unwrap()
        else {
            panic!("GET_PROTO_VER not answered");
        };
        assert_eq!(words[0], 7);
        // The metric table address is not simulated: "invalid message", the driver binds anyway.
        assert_eq!(answer(&m, &f, &apic, 0, 0x25, [0; 8]).unwrap(), Answer::Status(0xFE, None));
    }

    #[test]
    fn guest_apic_ids_reach_the_simulated_core_of_their_socket() {
        let (m, apic) = two_sockets();
        m.firmware().set_boost_limit(1, 0, 3300).unwrap();
        // QEMU numbers socket 1's only core APIC id 1; the simulator calls it 2.
        let mut args = [0u32; 8];
        args[0] = 1;
        let Answer::Status(STATUS_OK, Some(words)) =
            answer(&m, &Faults::default(), &apic, 1, 0x0A, args).unwrap()
        else {
            panic!("GET_BOOST_LIMIT not answered");
        };
        assert_eq!(words[0], 3300);
    }

    #[test]
    fn faults_become_what_an_smu_would_do() {
        let (m, apic) = two_sockets();
        let mut f = Faults::default();
        f.wedged_sockets.insert(1);
        f.errno.insert((FaultGroup::BoostLimit, sim::Target::Apic(0)), libc::EIO);
        f.unsupported.insert(FaultGroup::CoreEnergy);
        assert_eq!(answer(&m, &f, &apic, 1, 0x0B, [0; 8]).unwrap(), Answer::Silence);
        assert_eq!(
            answer(&m, &f, &apic, 0, 0x0A, [0; 8]).unwrap(),
            Answer::Status(STATUS_OTHER, None)
        );
        assert_eq!(answer(&m, &f, &apic, 0, 0x30, [0; 8]).unwrap(), Answer::Status(0xFE, None));
        assert!(matches!(
            answer(&m, &f, &apic, 0, 0x0B, [0; 8]).unwrap(),
            Answer::Status(STATUS_OK, Some(_))
        ));
    }

    /// The first word of the answer to `msg_id` with argument 0 `arg0`, which must be OK.
    fn word(m: &Machine, apic: &HashMap<u32, u32>, socket: u32, msg_id: u32, arg0: u32) -> u32 {
        let mut args = [0u32; 8];
        args[0] = arg0;
        match answer(m, &Faults::default(), apic, socket, msg_id, args).unwrap() {
            Answer::Status(STATUS_OK, Some(words)) => words[0],
            other => panic!("{msg_id:#04x} answered {other:?}"),
        }
    }

    #[test]
    fn frequency_limits_come_from_the_simulator_for_the_guest_s_cores() {
        let (m, apic) = two_sockets();
        assert_eq!(word(&m, &apic, 1, 0x19, 0), 3700 << 16 | 0x10, "OPN max by default");
        let ppt = SocketFreqLimit { mhz: 2900, reasons: LimitReasons::PPT };
        m.firmware().set_freq_limit(1, ppt).unwrap();
        assert_eq!(word(&m, &apic, 1, 0x19, 0), 2900 << 16 | 0x08);
        assert_eq!(word(&m, &apic, 0, 0x19, 0), 3700 << 16 | 0x10);
        // Guest APIC id 1 is socket 1's only core (2 in the simulator), held by its socket.
        assert_eq!(word(&m, &apic, 1, 0x1A, 1), 2900);
        m.firmware().set_boost_limit(1, 0, 2500).unwrap();
        assert_eq!(word(&m, &apic, 1, 0x1A, 1), 2500);
        let mut f = Faults::default();
        f.errno.insert((FaultGroup::CoreFrequencyLimit, sim::Target::Apic(2)), libc::EBUSY);
        let mut args = [0u32; 8];
        args[0] = 1;
        assert_eq!(answer(&m, &f, &apic, 1, 0x1A, args).unwrap(), Answer::Status(0xFC, None));
    }

    /// Issue 28: the package counter is the socket's (no APIC id), from the simulator: its
    /// cores and the uncore, in the units of `GET_RAPL_UNITS`; firmware of protocol 5 answers
    /// "invalid message" as for the other RAPL messages.
    #[test]
    fn the_package_counter_comes_from_the_simulator_for_the_guest_s_socket() {
        let (m, apic) = two_sockets();
        for socket in 0..2 {
            let words = match answer(&m, &Faults::default(), &apic, socket, 0x32, [0; 8]).unwrap() {
                Answer::Status(STATUS_OK, Some(words)) => words,
                other => panic!("GET_RAPL_PACKAGE_COUNTER answered {other:?}"),
            };
            let counter = u64::from(words[0]) | u64::from(words[1]) << 32;
            assert_eq!(counter, m.firmware().package_energy_counter(socket).unwrap());
        }
        let topo = GuestTopology { sockets: 1, cores: 1, apic_cores: 1 };
        let m5 = Machine::new(topo.spec(5), FirmwareConfig::static_values());
        let apic = HashMap::from([(0, 0)]);
        let answered = answer(&m5, &Faults::default(), &apic, 0, 0x32, [0; 8]).unwrap();
        assert_eq!(answered, Answer::Status(0xFE, None));
    }

    #[test]
    fn protocol_4_has_no_frequency_limit_messages() {
        let topo = GuestTopology { sockets: 1, cores: 1, apic_cores: 1 };
        let m = Machine::new(topo.spec(4), FirmwareConfig::static_values());
        let apic = HashMap::from([(0, 0)]);
        for msg_id in [0x19, 0x1A] {
            assert_eq!(
                answer(&m, &Faults::default(), &apic, 0, msg_id, [0; 8]).unwrap(),
                Answer::Status(0xFE, None),
                "{msg_id:#04x}"
            );
        }
    }

    #[test]
    fn latency_from_the_driver_timeout_on_is_no_answer() {
        let (m, apic) = two_sockets();
        let mut f = Faults::default();
        f.latency = f.driver_timeout;
        assert_eq!(answer(&m, &f, &apic, 0, 0x0B, [0; 8]).unwrap(), Answer::Silence);
        f.latency = f.driver_timeout / 2;
        assert!(matches!(answer(&m, &f, &apic, 0, 0x0B, [0; 8]).unwrap(), Answer::Status(1, _)));
    }

    #[test]
    fn protocol_5_has_no_rapl_messages() {
        let topo = GuestTopology { sockets: 1, cores: 1, apic_cores: 1 };
        let m = Machine::new(topo.spec(5), FirmwareConfig::static_values());
        let apic = HashMap::from([(0, 0)]);
        assert_eq!(
            answer(&m, &Faults::default(), &apic, 0, 0x30, [0; 8]).unwrap(),
            Answer::Status(0xFE, None)
        );
    }

    #[test]
    fn errnos_map_to_the_status_the_driver_turns_back_into_them() {
        assert_eq!(status_for_errno(libc::ETIMEDOUT).unwrap(), None);
        assert_eq!(status_for_errno(libc::EBUSY).unwrap(), Some(0xFC));
        assert!(status_for_errno(libc::EPERM).is_err());
    }

    #[test]
    fn the_responder_keeps_the_power_core_tables_equal_to_the_simulator_s_counters() {
        use crate::vm::mailbox::{WINDOW_BASE, WINDOW_SIZE};
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let ram = dir.path().join("ram");
        std::fs::File::create(&ram).unwrap().set_len(WINDOW_BASE + 2 * WINDOW_SIZE).unwrap();
        let topo = GuestTopology { sockets: 2, cores: 2, apic_cores: 2 };
        let responder = Responder::start(&ram, topo, 5).unwrap();
        let file = std::fs::File::open(&ram).unwrap();
        let raw = |socket: u64, core: u64| {
            let mut b = [0u8; 4];
            let at = WINDOW_BASE + socket * WINDOW_SIZE + pmu::TABLE_OFFSET + 8 + 8 * core;
            file.read_exact_at(&mut b, at).unwrap();
            u32::from_le_bytes(b)
        };
        let wait_for = |socket: u64, core: u64, want: u32| {
            let started = Instant::now();
            while raw(socket, core) != want {
                assert!(started.elapsed() < Duration::from_secs(10), "table never showed {want}");
                std::thread::sleep(TABLE_INTERVAL);
            }
        };
        let fw = responder.machine();
        fw.firmware().set_energy_counter(1, 1, 0x1_0000_0123).unwrap();
        wait_for(1, 1, 0x123);
        // After a protocol change the new firmware's counters, which keep the old values.
        responder.set_protocol(7).unwrap();
        responder.machine().firmware().set_energy_counter(0, 1, 77).unwrap();
        wait_for(0, 1, 77);
        assert_eq!(raw(1, 1), 0x123);
        assert_eq!(responder.error(), None);
    }

    #[test]
    fn qemu_apic_ids_pack_cores_below_the_socket() {
        assert_eq!(GuestTopology { sockets: 2, cores: 1, apic_cores: 1 }.apic_id(1, 0), 1);
        assert_eq!(GuestTopology { sockets: 2, cores: 2, apic_cores: 2 }.apic_id(1, 1), 3);
        assert_eq!(GuestTopology { sockets: 2, cores: 3, apic_cores: 3 }.apic_id(1, 0), 4);
        // A package with room for 384 cores, six present: socket 1 starts at 512.
        assert_eq!(GuestTopology { sockets: 2, cores: 6, apic_cores: 384 }.apic_id(1, 5), 517);
    }
}
