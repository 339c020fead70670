//! Per-core energy from the kernel's `power_core` PMU (`arch/x86/events/rapl.c`, Linux 6.14 and
//! later): the same hardware counter as the MSR fallback's, counted by the kernel into 64 bits
//! while the event is open, opened with `CAP_PERFMON` instead of `CAP_SYS_RAWIO`.
//!
//! One event per physical core is opened at start-up, on the CPU the PMU's `cpumask` names for
//! the core, before the capabilities are dropped and the seccomp filter (which refuses
//! `perf_event_open`) is installed; a reading is one `read(2)`.
//!
//! **Invariant:** as for the MSR fallback, the count is never silently short and never gains
//! energy the core could not have drawn. The kernel extends the 32-bit counter with its own
//! timer, so there is no wrap window; but it takes any drop of the hardware value for a wrap,
//! so a counter the firmware restarts (across a suspend) would add up to 2^32 hardware units
//! of energy never drawn. A step larger than [`MAX_CORE_WATTS`] allows over the time between
//! the readings plus [`RESTART_TOLERANCE`] is therefore a counted reset (the count restarts from
//! 0), and the time is `CLOCK_MONOTONIC` ([`counters::Running`](crate::counters::Running)),
//! which stops while the machine sleeps: a core draws nothing while suspended, so a suspend adds
//! no allowance. The residual is the MSR source's: a restart whose step fits within the
//! allowance (a counter the firmware restarted close below its wrap) is counted as energy.
//!
//! **CPU hotplug:** when the last online CPU of a core goes offline the kernel detaches the
//! core's event and never adds it back, not even when the CPU returns (`device/tests/hotplug.rs`
//! pins this on a real kernel): its running time stands still, or it answers nothing. Such a
//! core is lost: its reset is counted when the loss is first seen, its item is `ENODEV` from
//! then on, and [`crate::hotplug`] starts the broker afresh once one of its CPUs is online.

use crate::counters::{Clock, CoreCounters, MAX_CORE_WATTS, RESTART_TOLERANCE, Resets, open_cores};
use amd_hsmp_device::perf::{Pmu, PmuError};
use amd_hsmp_device::{Errno, PerfCounter, PerfOpener, PerfReading};
use amd_hsmp_proto::{Core, Energy, EnergySource, ItemError, Topology};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Why the perf source cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PerfOpenError {
    /// The PMU is absent or its description is not `rapl.c`'s.
    #[error(transparent)]
    Pmu(#[from] PmuError),
    /// The topology lists no core.
    #[error("no core to read energy from")]
    EmptyTopology,
    /// Not one core's event opened; `errno` is the first core's failure.
    #[error("cannot open the energy-core event of any core{}", hint(*.errno))]
    Unopened {
        /// The first core's errno.
        errno: Errno,
        /// The same errno as an I/O error, for the message chain.
        #[source]
        source: std::io::Error,
    },
}

/// What an errno from `perf_event_open` on `power_core` usually means.
pub(crate) fn hint(errno: Errno) -> &'static str {
    match errno {
        libc::EACCES | libc::EPERM => {
            " (opening needs CAP_PERFMON, or kernel.perf_event_paranoid at 0 or below; SELinux \
             may refuse perf_event)"
        }
        libc::ENODEV => " (the core's CPUs are offline)",
        libc::ENOENT => " (the kernel has no such PMU)",
        _ => "",
    }
}

/// The last reading of a core's event and the count built from the readings.
#[derive(Debug)]
struct State {
    last: PerfReading,
    /// When the last reading began, on the [`Clock`].
    at: Duration,
    /// Energy since the count last started from 0, in the PMU's units.
    total: u64,
    /// The event was lost (its CPUs went offline): it never counts again.
    lost: bool,
}

/// One core's open event.
#[derive(Debug)]
struct PerfCore {
    event: Box<dyn PerfCounter>,
    state: Mutex<State>,
}

/// Why a core's count restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reset {
    /// The event was lost when its CPUs went offline; a fresh start of the broker counts it
    /// from 0 again.
    Lost,
    /// The count moved further than the core can draw in the time between the readings.
    Restarted,
}

/// Energy counters of every core of the topology, read from the kernel's `power_core` PMU.
#[derive(Debug)]
pub(crate) struct PerfEnergy {
    /// Aligned with [`Topology::cores`]; a core whose event failed to open keeps its error.
    cores: Vec<Result<PerfCore, ItemError>>,
    /// The count is in units of 2^-`esu` J.
    esu: u8,
    clock: Box<dyn Clock>,
    resets: Resets<Reset>,
}

impl PerfEnergy {
    /// Opens the event of every core on the CPU `pmu`'s cpumask names for it and takes the
    /// first reading, so counts start at 0 now. A core that fails is kept as a per-core error;
    /// only if no core works is it an error.
    pub(crate) fn open(
        topology: &Topology,
        pmu: &Pmu,
        opener: &dyn PerfOpener,
        clock: Box<dyn Clock>,
    ) -> Result<PerfEnergy, PerfOpenError> {
        if topology.cores.is_empty() {
            return Err(PerfOpenError::EmptyTopology);
        }
        let what = "energy-core events cannot be opened";
        let open = |core: &Core| open_core(opener, counting_cpu(core, pmu), clock.as_ref());
        let cores = open_cores(topology, what, open).map_err(|errno| PerfOpenError::Unopened {
            errno,
            source: std::io::Error::from_raw_os_error(errno),
        })?;
        Ok(PerfEnergy { cores, esu: pmu.esu, clock, resets: Resets::default() })
    }

    /// Counter resets since the broker started.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.total()
    }

    /// Reads core `index` (an index into [`Topology::cores`]) and returns its count.
    pub(crate) fn read(&self, index: usize) -> Result<Energy, ItemError> {
        let core = match self.cores.get(index) {
            Some(Ok(core)) => core,
            Some(Err(e)) => return Err(*e),
            None => return Err(ItemError::Io { errno: libc::ENXIO }),
        };
        let io = |errno| ItemError::Io { errno };
        // Read under the lock: an older reading taken after a newer one would look like a
        // jump of almost 2^64 units.
        let mut state = core.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.lost {
            return Err(io(libc::ENODEV));
        }
        let started = self.clock.now().map_err(io)?;
        let reading = core.event.read();
        let ended = self.clock.now().map_err(io)?;
        let reading = match reading {
            Ok(r) if r.running_ns != state.last.running_ns => r,
            // The running time stood still since the last reading, or the kernel answered
            // nothing: the event was detached from its CPU, for good.
            Ok(_) | Err(libc::ENODEV) => {
                state.lost = true;
                self.resets.count(index, Reset::Lost);
                return Err(io(libc::ENODEV));
            }
            Err(errno) => return Err(io(errno)),
        };
        let step = reading.value.wrapping_sub(state.last.value);
        let gap = ended.saturating_sub(state.at);
        let reset = if step > most_units(gap, self.esu) { Some(Reset::Restarted) } else { None };
        state.total = match reset {
            Some(why) => {
                self.resets.count(index, why);
                0
            }
            None => state.total.wrapping_add(step),
        };
        state.last = reading;
        state.at = started;
        Ok(Energy { counter: state.total, esu: self.esu })
    }

    /// Logs the resets not yet logged, as one line for all the cores they touched.
    pub(crate) fn log_resets(&self) {
        self.resets.log(|cores, total| {
            let lost = cores.iter().filter(|(_, why)| *why == Reset::Lost).count();
            tracing::warn!(
                cores = cores.len(),
                first_core_index = cores.first().map(|(i, _)| *i),
                lost_offline = lost,
                hardware_restarts = cores.len() - lost,
                total,
                "energy counters reset: a core's energy event was lost when its CPUs went \
                 offline (the kernel never resumes it; once one of its CPUs is back the broker \
                 starts afresh and counts it from 0), or a count moved more than the core can \
                 draw (the firmware restarted the counter)"
            );
        });
    }
}

impl CoreCounters for PerfEnergy {
    fn read(&self, index: usize) -> Result<Energy, ItemError> {
        PerfEnergy::read(self, index)
    }

    fn resets(&self) -> u64 {
        PerfEnergy::resets(self)
    }

    fn log_resets(&self) {
        PerfEnergy::log_resets(self)
    }

    fn source(&self) -> EnergySource {
        EnergySource::Perf
    }

    fn lost(&self) -> Vec<usize> {
        let lost = |core: &Result<PerfCore, ItemError>| {
            core.as_ref().is_ok_and(|c| c.state.lock().unwrap_or_else(PoisonError::into_inner).lost)
        };
        self.cores.iter().enumerate().filter(|(_, c)| lost(c)).map(|(i, _)| i).collect()
    }
}

/// The most units a core can add in `gap` at [`MAX_CORE_WATTS`], with the
/// [`RESTART_TOLERANCE`], in units of 2^-`esu` J.
fn most_units(gap: Duration, esu: u8) -> u64 {
    let time = gap.saturating_add(RESTART_TOLERANCE);
    // Saturating: a gap of centuries allows any step.
    (MAX_CORE_WATTS * time.as_secs_f64() * 2f64.powi(i32::from(esu))) as u64
}

/// The CPU whose event counts `core`: its thread the PMU's cpumask names, else its first
/// thread (the kernel moves a core-scope event to the cpumask's CPU of the same core).
fn counting_cpu(core: &Core, pmu: &Pmu) -> u32 {
    core.threads.iter().copied().find(|cpu| pmu.cpus.binary_search(cpu).is_ok()).unwrap_or(core.cpu)
}

fn open_core(opener: &dyn PerfOpener, cpu: u32, clock: &dyn Clock) -> Result<PerfCore, ItemError> {
    let io = |errno| ItemError::Io { errno };
    let event = opener.open(cpu).map_err(io)?;
    let at = clock.now().map_err(io)?;
    let last = event.read().map_err(io)?;
    let state = Mutex::new(State { last, at, total: 0, lost: false });
    Ok(PerfCore { event, state })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::FakeClock;
    use std::sync::Arc;

    /// What one fake event answers, set by hand; the running time moves with each read
    /// unless the event is stopped (detached from its offline CPU).
    #[derive(Debug, Default)]
    struct EventState {
        value: u64,
        running_ns: u64,
        stopped: bool,
        /// The kernel's answer for an event in error state: nothing.
        empty: bool,
        reads: usize,
    }

    #[derive(Debug, Clone, Default)]
    struct FakeEvent(Arc<Mutex<EventState>>);

    impl FakeEvent {
        fn add_joules(&self, joules: u64) {
            let mut e = self.0.lock().unwrap();
            e.value = e.value.wrapping_add(joules << 32);
        }
        fn set(&self, f: impl FnOnce(&mut EventState)) {
            f(&mut self.0.lock().unwrap());
        }
    }

    impl PerfCounter for FakeEvent {
        fn read(&self) -> Result<PerfReading, Errno> {
            let mut e = self.0.lock().unwrap();
            e.reads += 1;
            if e.empty {
                return Err(libc::ENODEV);
            }
            if !e.stopped {
                e.running_ns += 1_000;
            }
            Ok(PerfReading { value: e.value, enabled_ns: e.running_ns, running_ns: e.running_ns })
        }
    }

    /// Opens the fake event of each CPU; a CPU without one is `EACCES`, as an open without
    /// CAP_PERFMON is. Records the CPUs asked.
    #[derive(Debug, Default)]
    struct FakeOpener {
        events: std::collections::HashMap<u32, FakeEvent>,
        asked: Mutex<Vec<u32>>,
    }

    impl PerfOpener for FakeOpener {
        fn open(&self, cpu: u32) -> Result<Box<dyn PerfCounter>, Errno> {
            self.asked.lock().unwrap().push(cpu);
            match self.events.get(&cpu) {
                Some(e) => Ok(Box::new(e.clone())),
                None => Err(libc::EACCES),
            }
        }
    }

    /// Two cores of two threads each: CPUs 0 and 2 are core 0, 1 and 3 core 1.
    fn topology() -> Topology {
        let core = |core: u32, threads: Vec<u32>| Core {
            socket: 0,
            core,
            cpu: threads[0],
            apic_id: core * 2,
            threads,
        };
        Topology {
            sockets: vec![0],
            cores: vec![core(0, vec![0, 2]), core(1, vec![1, 3])],
            ..Topology::default()
        }
    }

    fn pmu(cpus: Vec<u32>) -> Pmu {
        Pmu { kind: 12, config: 1, esu: 32, cpus }
    }

    /// Opens the energy of [`topology`] with an event on CPUs 2 and 1 (the cpumask's).
    fn open() -> (PerfEnergy, FakeEvent, FakeEvent, FakeClock) {
        let (a, b) = (FakeEvent::default(), FakeEvent::default());
        a.add_joules(1_000);
        let opener = FakeOpener {
            events: [(2, a.clone()), (1, b.clone())].into_iter().collect(),
            ..FakeOpener::default()
        };
        let clock = FakeClock::default();
        let energy =
            PerfEnergy::open(&topology(), &pmu(vec![1, 2]), &opener, Box::new(clock.clone()))
                .unwrap();
        (energy, a, b, clock)
    }

    #[test]
    fn each_core_is_counted_on_the_cpu_the_cpumask_names_from_zero_at_the_open() {
        let (energy, a, b, clock) = open();
        clock.advance(Duration::from_secs(10));
        a.add_joules(50);
        b.add_joules(7);
        assert_eq!(energy.read(0).unwrap().joules(), 50.0);
        assert_eq!(energy.read(1).unwrap().joules(), 7.0);
        assert_eq!(energy.read(0).unwrap(), Energy { counter: 50 << 32, esu: 32 });
        assert_eq!(energy.resets(), 0);
    }

    #[test]
    fn a_core_without_a_thread_in_the_cpumask_is_opened_on_its_first_thread() {
        let opener = FakeOpener {
            events: [(0, FakeEvent::default()), (1, FakeEvent::default())].into_iter().collect(),
            ..FakeOpener::default()
        };
        PerfEnergy::open(&topology(), &pmu(vec![1]), &opener, Box::new(FakeClock::default()))
            .unwrap();
        assert_eq!(*opener.asked.lock().unwrap(), [0, 1]);
    }

    #[test]
    fn no_core_opened_is_an_error_naming_the_capability() {
        let opener = FakeOpener::default();
        let error = PerfEnergy::open(
            &topology(),
            &pmu(vec![1, 2]),
            &opener,
            Box::new(FakeClock::default()),
        )
        .unwrap_err();
        assert!(matches!(error, PerfOpenError::Unopened { errno: libc::EACCES, .. }));
        assert!(error.to_string().contains("CAP_PERFMON"), "{error}");
    }

    #[test]
    fn one_core_that_cannot_open_keeps_its_error_and_the_others_count() {
        let b = FakeEvent::default();
        let opener =
            FakeOpener { events: [(1, b.clone())].into_iter().collect(), ..Default::default() };
        let clock = FakeClock::default();
        let energy =
            PerfEnergy::open(&topology(), &pmu(vec![1, 2]), &opener, Box::new(clock.clone()))
                .unwrap();
        clock.advance(Duration::from_secs(1));
        b.add_joules(3);
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::EACCES }));
        assert_eq!(energy.read(1).unwrap().joules(), 3.0);
        assert_eq!(energy.read(2), Err(ItemError::Io { errno: libc::ENXIO }));
    }

    #[test]
    fn a_counter_the_firmware_restarted_is_a_counted_reset_not_phantom_energy() {
        let (energy, a, _, clock) = open();
        clock.advance(Duration::from_secs(15));
        a.add_joules(300);
        assert_eq!(energy.read(0).unwrap().joules(), 300.0);
        // Resumed from a suspend the monotonic clock did not see: the kernel took the
        // restarted 32-bit counter for a wrap, 65,536 J at ESU 16, in one 15 s scrape.
        clock.advance(Duration::from_secs(15));
        a.add_joules(65_536);
        assert_eq!(energy.read(0).unwrap().counter, 0);
        assert_eq!(energy.resets(), 1);
        clock.advance(Duration::from_secs(15));
        a.add_joules(200);
        assert_eq!(energy.read(0).unwrap().joules(), 200.0);
        assert_eq!(energy.resets(), 1);
    }

    #[test]
    fn a_core_drawing_its_most_is_not_a_reset() {
        let (energy, a, _, clock) = open();
        clock.advance(Duration::from_secs(10));
        // 100 W for 10 s, plus the tolerance's second.
        a.add_joules(1_100);
        assert_eq!(energy.read(0).unwrap().joules(), 1_100.0);
        assert_eq!(energy.resets(), 0);
    }

    #[test]
    fn a_core_whose_cpus_went_offline_is_lost_for_good_with_one_counted_reset() {
        let (energy, a, b, clock) = open();
        clock.advance(Duration::from_secs(1));
        a.add_joules(5);
        assert_eq!(energy.read(0).unwrap().joules(), 5.0);
        assert_eq!(CoreCounters::lost(&energy), Vec::<usize>::new());
        // Its CPUs go offline: the kernel detaches the event, its running time stands still
        // (device/tests/hotplug.rs).
        a.set(|e| e.stopped = true);
        clock.advance(Duration::from_secs(1));
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::ENODEV }));
        assert_eq!(energy.resets(), 1, "the loss is counted once, when it is seen");
        assert_eq!(CoreCounters::lost(&energy), [0]);
        // Back online, the kernel still never counts it: nor does the broker, which no longer
        // reads the event at all.
        let reads = a.0.lock().unwrap().reads;
        a.set(|e| {
            e.stopped = false;
            e.value += 9 << 32;
        });
        clock.advance(Duration::from_secs(1));
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::ENODEV }));
        assert_eq!(a.0.lock().unwrap().reads, reads);
        assert_eq!(energy.resets(), 1);
        // The other core counts on.
        b.add_joules(2);
        assert_eq!(energy.read(1).unwrap().joules(), 2.0);
    }

    #[test]
    fn an_event_that_answers_nothing_is_lost_too() {
        let (energy, a, _, clock) = open();
        a.set(|e| e.empty = true);
        clock.advance(Duration::from_secs(1));
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::ENODEV }));
        assert_eq!((energy.resets(), CoreCounters::lost(&energy)), (1, vec![0]));
    }

    #[test]
    fn the_kernel_s_64_bit_count_wrapping_is_followed() {
        let (energy, a, _, clock) = open();
        a.set(|e| e.value = u64::MAX - (1 << 32) + 1);
        clock.advance(Duration::from_secs(1));
        // The jump to near 2^64 is itself a reset (far beyond 100 W for a second).
        energy.read(0).unwrap();
        assert_eq!(energy.resets(), 1);
        clock.advance(Duration::from_secs(1));
        a.add_joules(4);
        assert_eq!(energy.read(0).unwrap().joules(), 4.0);
    }
}
