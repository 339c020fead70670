//! The kernel's `power_core` PMU over the simulated machine, counting as `rapl.c` does: each
//! read takes the core's 32-bit energy MSR, adds its step (a drop taken as a wrap) shifted to
//! units of 2^-32 J to a 64-bit count that starts at 0 at the open.

use super::Machine;
use super::faults::{FaultGroup, Target};
use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT, energy_status_unit};
use amd_hsmp_device::perf::{DEFAULT_PMU_ROOT, POWER_CORE_PMU, Pmu, PmuError};
use amd_hsmp_device::{Errno, PerfCounter, PerfOpener, PerfReading, PmuLocator};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// The simulated PMU's type number: beyond the kernel's fixed ones, like a dynamic type.
pub const SIM_PMU_TYPE: u32 = 0x5eed;

/// Finds the simulated machine's `power_core` PMU: absent when [`FaultGroup::Perf`] is in
/// [`Faults::unsupported`](crate::Faults::unsupported) (a kernel older than 6.14).
#[derive(Debug, Clone)]
pub struct SimPmu {
    pub(crate) machine: Arc<Machine>,
}

impl PmuLocator for SimPmu {
    fn locate(&self) -> Result<(Pmu, Box<dyn PerfOpener>), PmuError> {
        if self.machine.with_faults(|f| f.unsupported.contains(&FaultGroup::Perf)) {
            return Err(PmuError::Absent(Path::new(DEFAULT_PMU_ROOT).join(POWER_CORE_PMU)));
        }
        let mut cpus: Vec<u32> = self.machine.topology().cores.iter().map(|c| c.cpu).collect();
        cpus.sort_unstable();
        let pmu = Pmu { kind: SIM_PMU_TYPE, config: 1, esu: 32, cpus };
        Ok((pmu, Box::new(SimPerfOpener { machine: Arc::clone(&self.machine) })))
    }
}

/// Opens the simulated `energy-core` event of a CPU.
#[derive(Debug, Clone)]
pub struct SimPerfOpener {
    machine: Arc<Machine>,
}

impl PerfOpener for SimPerfOpener {
    /// The injected [`Faults::perf_open`](crate::Faults::perf_open) errno (`EACCES` without
    /// CAP_PERFMON), `EINVAL` for a CPU the machine does not have, `ENODEV` for one offline
    /// now, from the start or at run time ([`Faults::offline`](crate::Faults::offline)), as
    /// the kernel's `perf_event_open()` refuses a CPU whose perf context is not online (pinned
    /// by `device/tests/hotplug.rs`).
    fn open(&self, cpu: u32) -> Result<Box<dyn PerfCounter>, Errno> {
        let machine = &self.machine;
        let (fault, offline, generation) = machine.with_faults(|f| {
            (f.perf_open, f.offline.contains(&cpu), machine.offline_generation(cpu))
        });
        if let Some(errno) = fault {
            return Err(errno);
        }
        if cpu >= machine.spec.cpu_count() {
            return Err(libc::EINVAL);
        }
        if offline || machine.spec.offline_cpus.contains(&cpu) {
            return Err(libc::ENODEV);
        }
        let esu = energy_status_unit(machine.firmware.read_msr(cpu, MSR_RAPL_PWR_UNIT)?);
        let prev = machine.firmware.read_msr(cpu, MSR_CORE_ENERGY_STAT)? as u32;
        let state = Count { prev, count: 0, running_ns: 0, last: Instant::now() };
        Ok(Box::new(SimPerfEvent {
            machine: Arc::clone(machine),
            cpu,
            generation,
            shift: 32u32.saturating_sub(u32::from(esu)),
            state: Mutex::new(state),
        }))
    }
}

#[derive(Debug)]
struct Count {
    prev: u32,
    count: u64,
    running_ns: u64,
    last: Instant,
}

/// One open event.
#[derive(Debug)]
struct SimPerfEvent {
    machine: Arc<Machine>,
    cpu: u32,
    /// How many times its CPU had gone offline before the open
    /// ([`Machine::offline_generation`]): once that moves, the event is lost.
    generation: u64,
    /// `32 - esu`: the shift from hardware units to 2^-32 J.
    shift: u32,
    state: Mutex<Count>,
}

impl PerfCounter for SimPerfEvent {
    /// The count and times, or the injected errno of [`FaultGroup::Perf`] for the CPU.
    ///
    /// An event whose CPU is offline now, or has been offline at any moment since the open
    /// ([`Faults::offline`](crate::Faults::offline)), is lost for good: it reads as it last
    /// did, its count and times standing still, even once the CPU is back. The kernel detaches
    /// a CPU's events when it goes offline (`kernel/events/core.c`,
    /// `perf_event_exit_cpu_context()`) and attaches none again when it comes back; pinned by
    /// `device/tests/hotplug.rs`. The simulator counts at reads, so the frozen count is the one
    /// of the last read before the offline, where the kernel's is the one at the offline.
    fn read(&self) -> Result<PerfReading, Errno> {
        let machine = &self.machine;
        machine.counters.perf_reads.fetch_add(1, Ordering::Relaxed);
        let (fault, lost) = machine.with_faults(|f| {
            (
                f.errno.get(&(FaultGroup::Perf, Target::Cpu(self.cpu))).copied(),
                f.offline.contains(&self.cpu)
                    || machine.offline_generation(self.cpu) != self.generation,
            )
        });
        if let Some(errno) = fault {
            return Err(errno);
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !lost {
            let raw = machine.firmware.read_msr(self.cpu, MSR_CORE_ENERGY_STAT)? as u32;
            let step = u64::from(raw.wrapping_sub(state.prev)) << self.shift;
            state.count = state.count.wrapping_add(step);
            state.prev = raw;
            let now = Instant::now();
            let ran = u64::try_from(now.duration_since(state.last).as_nanos()).unwrap_or(u64::MAX);
            state.running_ns = state.running_ns.saturating_add(ran.max(1));
            state.last = now;
        }
        Ok(PerfReading {
            value: state.count,
            enabled_ns: state.running_ns,
            running_ns: state.running_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firmware::Mode;
    use crate::profile::Profile;
    use crate::{Faults, FirmwareConfig};
    use std::time::Duration;

    #[test]
    fn the_count_is_the_msr_s_steps_in_two_to_the_minus_32_joules() {
        let m = Machine::new(Profile::Genoa2p.spec(), FirmwareConfig::new(Mode::Static));
        let (pmu, opener) = m.perf_locator().locate().unwrap();
        assert_eq!((pmu.esu, pmu.cpus.len()), (32, m.topology().cores.len()));
        let event = opener.open(pmu.cpus[0]).unwrap();
        let first = event.read().unwrap();
        assert_eq!(first.value, 0, "counts from the open");
        let second = event.read().unwrap();
        assert!(second.running_ns > first.running_ns);
        assert_eq!(m.counters().perf_reads(), 2);
    }

    #[test]
    fn faults_make_the_pmu_absent_the_open_refused_and_an_event_stop() {
        let m = Machine::new(Profile::Genoa2p.spec(), FirmwareConfig::new(Mode::Static));
        let mut faults = Faults { perf_open: Some(libc::EACCES), ..Faults::default() };
        m.set_faults(faults.clone());
        let (_, opener) = m.perf_locator().locate().unwrap();
        assert_eq!(opener.open(0).map(|_| ()), Err(libc::EACCES));
        faults.perf_open = None;
        m.set_faults(faults.clone());
        let event = opener.open(0).unwrap();
        event.read().unwrap();
        // CPU 0 goes offline: the event reads, standing still; a new one is refused.
        faults.offline.insert(0);
        m.set_faults(faults.clone());
        let frozen = event.read().unwrap();
        assert_eq!(event.read().unwrap(), frozen);
        assert_eq!(opener.open(0).map(|_| ()), Err(libc::ENODEV));
        // Back online: the old event never resumes; a new one counts.
        faults.offline.remove(&0);
        m.set_faults(faults.clone());
        assert_eq!(event.read().unwrap(), frozen, "the event resumed after the online");
        assert_eq!(event.read().unwrap(), frozen, "the event resumed after the online");
        let renewed = opener.open(0).unwrap();
        let first = renewed.read().unwrap();
        assert!(renewed.read().unwrap().running_ns > first.running_ns, "the new event counts");
        faults.unsupported.insert(FaultGroup::Perf);
        m.set_faults(faults);
        assert!(matches!(m.perf_locator().locate(), Err(PmuError::Absent(_))));
    }

    #[test]
    fn an_event_whose_cpu_went_offline_and_back_between_two_reads_is_lost_all_the_same() {
        let m = Machine::new(Profile::Genoa2p.spec(), FirmwareConfig::new(Mode::Static));
        let (_, opener) = m.perf_locator().locate().unwrap();
        let (lost, other) = (opener.open(2).unwrap(), opener.open(3).unwrap());
        let frozen = lost.read().unwrap();
        let before = other.read().unwrap();
        // Offline and online again before either event is read.
        m.update_faults(|f| {
            f.offline.insert(2);
        });
        m.update_faults(|f| {
            f.offline.remove(&2);
        });
        assert_eq!(lost.read().unwrap(), frozen);
        assert!(other.read().unwrap().running_ns > before.running_ns, "CPU 3's event stopped");
        // Faults set again without the CPU going offline once more lose nothing new.
        let renewed = opener.open(2).unwrap();
        let first = renewed.read().unwrap();
        m.set_faults(Faults { latency: Duration::from_millis(1), ..Faults::default() });
        assert!(renewed.read().unwrap().running_ns > first.running_ns, "the new event stopped");
        assert_eq!(lost.read().unwrap(), frozen);
    }

    #[test]
    fn an_event_on_a_cpu_offline_from_the_start_is_refused_enodev_and_a_missing_cpu_einval() {
        let mut spec = Profile::Genoa2p.spec();
        spec.offline_cpus = vec![5];
        let m = Machine::new(spec, FirmwareConfig::new(Mode::Static));
        let (_, opener) = m.perf_locator().locate().unwrap();
        assert_eq!(opener.open(5).map(|_| ()), Err(libc::ENODEV));
        assert_eq!(opener.open(m.spec().cpu_count()).map(|_| ()), Err(libc::EINVAL));
    }
}
