//! `amd-hsmp-sim`, the firmware simulator: a simulated EPYC machine (topology, SMU firmware,
//! and the `amd_hsmp` and `msr` drivers in front of it) behind the transport traits of
//! [`amd_hsmp_device`], the same ones the real devices implement.
//!
//! It is not part of what reads a real machine: the packaged broker does not link it.
//! `amd-hsmp-sim-broker --simulate` serves it, and the test suite's fake device and the
//! sampler's tests answer from it.
//!
//! One model serves two transports: in process for `amd-hsmp-sim-broker`, through
//! [`Machine::hsmp_opener`] and [`Machine::msr_opener`], and the test suite's fake device, which
//! forwards the ioctls and `pread`s it receives to [`Machine::open_hsmp`] and
//! [`Machine::open_msr`].
//!
//! ```
//! use amd_hsmp_device::HsmpOpener;
//! use amd_hsmp_device::messages::proto_version;
//! use amd_hsmp_sim::{FirmwareConfig, Machine, Mode, Profile};
//!
//! let machine = Machine::new(Profile::Turin2p.spec(), FirmwareConfig::new(Mode::Static));
//! assert_eq!(machine.topology().cores.len(), 384);
//! let hsmp = machine.hsmp_opener().open().unwrap();
//! assert_eq!(proto_version(hsmp.as_ref(), 1), Ok(7));
//! ```

#![forbid(unsafe_code)]

pub mod driver;
pub mod faults;
pub mod firmware;
pub mod live;
pub mod perf;
pub mod profile;

pub use driver::{AccessMode, Counters, Driver, MailboxState, SimMsr};
pub use faults::{DRIVER_TIMEOUT, FaultGroup, Faults, Target};
pub use firmware::{Firmware, FwStatus, Mode, SimError};
pub use live::{Clock, ManualClock, Scenario, UnknownScenario};
pub use profile::{Cpu, MachineSpec, Profile, UnknownProfile};

use amd_hsmp_device::{Errno, HsmpOpener, HsmpTransport, MsrOpener, MsrTransport, OnlineCpus};
use amd_hsmp_proto::Topology;
use driver::Mailboxes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// How a simulated machine behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwareConfig {
    /// Live or static values.
    pub mode: Mode,
    /// Varies the live load patterns; the same seed gives the same patterns.
    pub seed: u64,
    /// Faults injected from the start; change them later with [`Machine::set_faults`].
    pub faults: Faults,
    /// The events of the live machine on top of its load pattern.
    pub scenario: Scenario,
    /// Where live values read the time: the wall clock for `--simulate`, a [`ManualClock`]
    /// for tests that put the machine at a chosen instant.
    pub clock: Clock,
}

impl FirmwareConfig {
    /// `mode`, seed 0, no faults, the normal scenario on the wall clock from now.
    pub fn new(mode: Mode) -> FirmwareConfig {
        FirmwareConfig {
            mode,
            seed: 0,
            faults: Faults::default(),
            scenario: Scenario::Normal,
            clock: Clock::wall(),
        }
    }

    /// Live values, seed 0, no faults: what `--simulate` serves.
    pub fn live() -> FirmwareConfig {
        FirmwareConfig::new(Mode::Live)
    }

    /// Static values, seed 0, no faults: what the test suite starts from.
    pub fn static_values() -> FirmwareConfig {
        FirmwareConfig::new(Mode::Static)
    }
}

/// A simulated machine: its spec and topology, its firmware, the drivers' shared state
/// (per-socket locks, counters) and the injected faults.
#[derive(Debug)]
pub struct Machine {
    spec: MachineSpec,
    topology: Topology,
    firmware: Firmware,
    faults: RwLock<Faults>,
    /// The driver's per-socket semaphores, shared by every open descriptor.
    socket_locks: Vec<Mutex<()>>,
    mailboxes: Mailboxes,
    counters: Counters,
    /// For each CPU, how many times it has gone offline at run time: a CPU put into
    /// [`Faults::offline`] that was not in it. Changed only under the faults' write lock.
    offline_generations: Vec<AtomicU64>,
}

impl Machine {
    /// Builds the machine `spec` with firmware behaving as `config` says.
    pub fn new(spec: MachineSpec, config: FirmwareConfig) -> Arc<Machine> {
        let firmware =
            Firmware::with_clock(&spec, config.mode, config.seed, config.scenario, config.clock);
        let spec_cpus = spec.cpu_count();
        Arc::new(Machine {
            topology: spec.topology(),
            socket_locks: (0..spec.sockets).map(|_| Mutex::new(())).collect(),
            spec,
            firmware,
            faults: RwLock::new(config.faults),
            mailboxes: Mailboxes::default(),
            counters: Counters::default(),
            offline_generations: (0..spec_cpus).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// The spec the machine was built from.
    pub fn spec(&self) -> &MachineSpec {
        &self.spec
    }

    /// What topology discovery finds on this machine (same as [`MachineSpec::topology`]).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The firmware, to read the values it would answer and, in static mode, to set them.
    pub fn firmware(&self) -> &Firmware {
        &self.firmware
    }

    /// What the simulated drivers have been asked.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Holds `socket`'s mailbox: the next message to reach it stays inside (holding the
    /// socket's lock, so later ones queue behind it) until [`Machine::release_socket`], as a
    /// firmware that stopped answering would, then it is answered as usual.
    pub fn hold_socket(&self, socket: u32) {
        self.mailboxes.set_held(socket, true);
    }

    /// Lets the messages held in `socket`'s mailbox go on.
    pub fn release_socket(&self, socket: u32) {
        self.mailboxes.set_held(socket, false);
    }

    /// What `socket`'s mailbox is doing now.
    pub fn mailbox(&self, socket: u32) -> MailboxState {
        self.mailboxes.get(socket)
    }

    /// Waits until `until` holds for `socket`'s mailbox, at most `timeout`: a gate for tests,
    /// e.g. "a message is inside the held mailbox". Returns the last state seen, `Err` if
    /// `until` still did not hold.
    pub fn wait_mailbox(
        &self,
        socket: u32,
        timeout: Duration,
        until: impl Fn(&MailboxState) -> bool,
    ) -> Result<MailboxState, MailboxState> {
        match self.mailboxes.wait(socket, timeout, until) {
            (state, true) => Ok(state),
            (state, false) => Err(state),
        }
    }

    /// The faults injected now.
    pub fn faults(&self) -> Faults {
        self.with_faults(Faults::clone)
    }

    /// Replaces the injected faults; they apply from the next message or read. A CPU put into
    /// [`Faults::offline`] goes offline at once: the events opened on it are lost, even if a
    /// later call puts it back before they are read.
    pub fn set_faults(&self, faults: Faults) {
        self.update_faults(|f| *f = faults);
    }

    /// Changes the injected faults in place, as [`Machine::set_faults`] does.
    pub fn update_faults(&self, change: impl FnOnce(&mut Faults)) {
        let mut faults = self.faults.write().unwrap_or_else(PoisonError::into_inner);
        let before = faults.offline.clone();
        change(&mut faults);
        for &cpu in faults.offline.difference(&before) {
            if let Some(generation) = self.offline_generations.get(cpu as usize) {
                generation.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// How many times `cpu` has gone offline at run time. Read it with the faults it goes with
    /// (inside [`Machine::with_faults`]), as both change under the same lock.
    fn offline_generation(&self, cpu: u32) -> u64 {
        self.offline_generations.get(cpu as usize).map_or(0, |g| g.load(Ordering::Relaxed))
    }

    fn with_faults<T>(&self, read: impl FnOnce(&Faults) -> T) -> T {
        // Faults are plain data, valid even if a writer panicked.
        read(&self.faults.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// `open("/dev/hsmp", access)`: `ENOENT` if the machine has no HSMP (Rome), the injected
    /// [`Faults::hsmp_open`] errno if any.
    pub fn open_hsmp(self: &Arc<Self>, access: AccessMode) -> Result<Driver, Errno> {
        if !self.firmware.has_hsmp() {
            return Err(libc::ENOENT);
        }
        if let Some(errno) = self.with_faults(|f| f.hsmp_open) {
            return Err(errno);
        }
        Ok(Driver::new(Arc::clone(self), access))
    }

    /// `open("/dev/cpu/<cpu>/msr", O_RDONLY)`: `ENOENT` for a CPU the machine does not have,
    /// `ENXIO` for one offline now, from the start or at run time ([`Faults::offline`]), as
    /// `msr_open()` answers (`arch/x86/kernel/msr.c`; the kernel also removes the node of an
    /// offline CPU, which an open by path finds missing, `ENOENT`, as `device/tests/hotplug.rs`
    /// pins), the injected [`Faults::msr_open`] errno if any.
    pub fn open_msr(self: &Arc<Self>, cpu: u32) -> Result<SimMsr, Errno> {
        let (fault, offline) = self.with_faults(|f| (f.msr_open, f.offline.contains(&cpu)));
        if let Some(errno) = fault {
            return Err(errno);
        }
        if cpu >= self.spec.cpu_count() {
            return Err(libc::ENOENT);
        }
        if offline || self.spec.offline_cpus.contains(&cpu) {
            return Err(libc::ENXIO);
        }
        Ok(SimMsr::new(Arc::clone(self), cpu))
    }

    /// The [`HsmpOpener`] for this machine (read-only descriptors).
    pub fn hsmp_opener(self: &Arc<Self>) -> SimHsmpOpener {
        SimHsmpOpener { machine: Arc::clone(self) }
    }

    /// The [`MsrOpener`] for this machine.
    pub fn msr_opener(self: &Arc<Self>) -> SimMsrOpener {
        SimMsrOpener { machine: Arc::clone(self) }
    }

    /// The `power_core` PMU of this machine, as the kernel would offer it.
    pub fn perf_locator(self: &Arc<Self>) -> perf::SimPmu {
        perf::SimPmu { machine: Arc::clone(self) }
    }

    /// The CPUs online now, as the kernel's `/sys/devices/system/cpu/online` lists them.
    pub fn online_cpus(self: &Arc<Self>) -> SimOnline {
        SimOnline { machine: Arc::clone(self) }
    }
}

/// The simulated machine's online CPUs, read afresh on each call: all its CPUs but those
/// offline from the start ([`MachineSpec::offline_cpus`]) and those taken offline at run time
/// ([`Faults::offline`]).
#[derive(Debug, Clone)]
pub struct SimOnline {
    machine: Arc<Machine>,
}

impl OnlineCpus for SimOnline {
    fn online(&self) -> Result<Vec<u32>, Errno> {
        let machine = &self.machine;
        Ok(machine.with_faults(|f| {
            (0..machine.spec.cpu_count())
                .filter(|cpu| !f.offline.contains(cpu) && !machine.spec.offline_cpus.contains(cpu))
                .collect()
        }))
    }
}

/// Opens the simulated `/dev/hsmp` read-only, as the broker does.
#[derive(Debug, Clone)]
pub struct SimHsmpOpener {
    machine: Arc<Machine>,
}

impl HsmpOpener for SimHsmpOpener {
    fn open(&self) -> Result<Arc<dyn HsmpTransport>, Errno> {
        let driver = self.machine.open_hsmp(AccessMode::ReadOnly)?;
        Ok(Arc::new(driver))
    }
}

/// Opens the simulated `/dev/cpu/<cpu>/msr`.
#[derive(Debug, Clone)]
pub struct SimMsrOpener {
    machine: Arc<Machine>,
}

impl MsrOpener for SimMsrOpener {
    fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno> {
        let msr = self.machine.open_msr(cpu)?;
        Ok(Box::new(msr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_online_cpus_are_the_machine_s_but_those_offline_from_the_start_or_at_run_time() {
        let mut spec = profile::Profile::Milan1p.spec();
        spec.offline_cpus = vec![3];
        let m = Machine::new(spec, FirmwareConfig::static_values());
        let online = m.online_cpus();
        let all_but = |gone: &[u32]| (0..128).filter(|cpu| !gone.contains(cpu)).collect();
        assert_eq!(online.online(), Ok(all_but(&[3])));
        m.update_faults(|f| f.offline.extend([5, 127, 4096]));
        assert_eq!(online.online(), Ok(all_but(&[3, 5, 127])));
        m.update_faults(|f| {
            f.offline.remove(&5);
        });
        assert_eq!(online.online(), Ok(all_but(&[3, 127])));
    }

    #[test]
    fn a_simulator_started_after_another_continues_its_energy_counters_at_every_hour() {
        let spec = profile::Profile::Turin2p.spec();
        let at =
            |epoch_s| FirmwareConfig { clock: Clock::from_unix(epoch_s), ..FirmwareConfig::live() };
        // Every hour of a day, and a restart a minute later on the simulated clock (longer
        // than the first simulator can run here however slow the machine).
        for hour in 0..24u32 {
            let started = live::DAY_2026_01_01 + f64::from(hour) * 3600.0;
            let first = Machine::new(spec.clone(), at(started));
            let before = first.firmware().energy_counter(1, 0).unwrap();
            drop(first);
            let second = Machine::new(spec.clone(), at(started + 60.0));
            let after = second.firmware().energy_counter(1, 0).unwrap();
            // At least the idle 0.29 W of a Turin core over the minute: 17 J.
            assert!(
                after >= before + (17 << 16),
                "{hour}:00: the counter went from {before} to {after} over the restart"
            );
        }
    }
}
