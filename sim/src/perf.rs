//! The kernel's `power_core` PMU over the simulated machine, counting as `rapl.c` does: each
//! read takes the core's 32-bit energy MSR, adds its step (a drop taken as a wrap) shifted to
//! units of 2^-32 J to a 64-bit count that starts at 0 at the open.

use super::Machine;
use super::faults::{Family, Target};
use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT, energy_status_unit};
use amd_hsmp_device::perf::{DEFAULT_PMU_ROOT, POWER_CORE_PMU, Pmu, PmuError};
use amd_hsmp_device::{Errno, PerfCounter, PerfOpener, PerfReading, PmuLocator};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// The simulated PMU's type number: beyond the kernel's fixed ones, like a dynamic type.
pub const SIM_PMU_TYPE: u32 = 0x5eed;

/// Finds the simulated machine's `power_core` PMU: absent when [`Family::Perf`] is in
/// [`Faults::unsupported`](crate::Faults::unsupported) (a kernel older than 6.14).
#[derive(Debug, Clone)]
pub struct SimPmu {
    pub(crate) machine: Arc<Machine>,
}

impl PmuLocator for SimPmu {
    fn locate(&self) -> Result<(Pmu, Box<dyn PerfOpener>), PmuError> {
        if self.machine.with_faults(|f| f.unsupported.contains(&Family::Perf)) {
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
    /// CAP_PERFMON), `EINVAL` for a CPU the machine does not have, `ENODEV` for an offline one.
    fn open(&self, cpu: u32) -> Result<Box<dyn PerfCounter>, Errno> {
        let machine = &self.machine;
        if let Some(errno) = machine.with_faults(|f| f.perf_open) {
            return Err(errno);
        }
        if cpu >= machine.spec.cpu_count() {
            return Err(libc::EINVAL);
        }
        if machine.spec.offline_cpus.contains(&cpu) {
            return Err(libc::ENODEV);
        }
        let esu = energy_status_unit(machine.firmware.read_msr(cpu, MSR_RAPL_PWR_UNIT)?);
        let prev = machine.firmware.read_msr(cpu, MSR_CORE_ENERGY_STAT)? as u32;
        let state = Count { prev, count: 0, running_ns: 0, last: Instant::now() };
        Ok(Box::new(SimPerfEvent {
            machine: Arc::clone(machine),
            cpu,
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
    /// `32 - esu`: the shift from hardware units to 2^-32 J.
    shift: u32,
    state: Mutex<Count>,
}

impl PerfCounter for SimPerfEvent {
    fn read(&self) -> Result<PerfReading, Errno> {
        let machine = &self.machine;
        machine.counters.perf_reads.fetch_add(1, Ordering::Relaxed);
        let (fault, stopped) = machine.with_faults(|f| {
            (
                f.errno.get(&(Family::Perf, Target::Cpu(self.cpu))).copied(),
                f.perf_stopped.contains(&self.cpu),
            )
        });
        if let Some(errno) = fault {
            return Err(errno);
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !stopped {
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
        faults.perf_stopped.insert(0);
        m.set_faults(faults.clone());
        let event = opener.open(0).unwrap();
        assert_eq!(event.read().unwrap().running_ns, event.read().unwrap().running_ns);
        faults.unsupported.insert(Family::Perf);
        m.set_faults(faults);
        assert!(matches!(m.perf_locator().locate(), Err(PmuError::Absent(_))));
    }
}
