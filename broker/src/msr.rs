//! Per-core energy from the MSR driver (`/dev/cpu/<N>/msr`), for parts whose HSMP firmware has
//! no RAPL messages: the 32-bit hardware counter extended to a monotonic 64-bit count by a
//! supervised background poll.
//!
//! **Invariant:** the extended count is never silently short and never gains energy the core
//! could not have drawn. Time is the boot clock ([`BootTime`], `CLOCK_BOOTTIME`), which counts a
//! suspend. A core's counter can wrap at most once in [`wrap_window`] (the wrap period at
//! [`MAX_CORE_WATTS`]); if two successful readings of a core are further apart than that, a wrap
//! may have gone unseen. If the counter moved further than [`MAX_CORE_WATTS`] allows in the time
//! between the readings, plus [`RESTART_TOLERANCE`] (a drop taken as a wrap, or a rise), the
//! hardware counter restarted. In both cases the core's count restarts from 0 (a counter reset,
//! as Prometheus understands it) and the reset is counted ([`MsrEnergy::resets`]) and logged.
//! The residual: a restart that looks like a wrap within that allowance is counted as one, at
//! most [`MAX_CORE_WATTS`] × the time since the core's last reading + [`RESTART_TOLERANCE`] of
//! energy never drawn (3.1 kJ per affected core at the default [`DEFAULT_POLL_INTERVAL`], for
//! the about 5 % of cores whose last value was that close to the wrap).
//!
//! **CPU hotplug:** a read of an offline CPU fails `ENXIO` and the descriptor reads again once
//! the CPU is back (`device/tests/hotplug.rs`). The item is unavailable meanwhile, and since
//! nothing says what the counter did while it could not be read, the first reading after the
//! CPU's return restarts the count from 0, counted like the others.

use crate::counters::{BootTime, Clock, MAX_CORE_WATTS, RESTART_TOLERANCE};
use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT, energy_status_unit};
use amd_hsmp_device::{Errno, MsrOpener, MsrTransport};
use amd_hsmp_proto::{Energy, ItemError, Topology};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Default period of the background poll. At ESU 16 the counter wraps every 65,536 J, over
/// half an hour for a core drawing 30 W, so two wraps can never fit in one period.
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "the flag's default is its text; a test ties the two")
)]
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(30);

/// The shortest time in which a core's 32-bit counter of `2^-esu` J units can wrap:
/// `2^32 × 2^-esu J / MAX_CORE_WATTS` (655 s at ESU 16). Two readings closer together than this
/// are at most one wrap apart.
pub(crate) fn wrap_window(esu: u8) -> Duration {
    let joules = f64::from(u32::MAX) * 0.5f64.powi(i32::from(esu));
    Duration::from_secs_f64(joules / MAX_CORE_WATTS)
}

/// Extends a wrapping 32-bit counter to a monotonic 64-bit count that starts at 0 on the first
/// reading. Correct as long as the counter wraps at most once between two readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WrapCounter {
    last: Option<u32>,
    total: u64,
}

impl WrapCounter {
    /// A counter that has seen no reading yet.
    pub(crate) fn new() -> WrapCounter {
        WrapCounter::default()
    }

    /// Takes a raw reading and returns the extended count.
    pub(crate) fn update(&mut self, raw: u32) -> u64 {
        if let Some(last) = self.last {
            self.total = self.total.wrapping_add(u64::from(raw.wrapping_sub(last)));
        }
        self.last = Some(raw);
        self.total
    }

    /// The units `raw` would add to the count, a drop taken as a wrap; `None` before the first
    /// reading.
    pub(crate) fn step(&self, raw: u32) -> Option<u32> {
        self.last.map(|last| raw.wrapping_sub(last))
    }

    /// The extended count after the last reading.
    #[cfg(test)]
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Starts over at `raw`: the count is 0 from this reading on (a counter reset).
    pub(crate) fn restart(&mut self, raw: u32) -> u64 {
        *self = WrapCounter { last: Some(raw), total: 0 };
        0
    }
}

/// Why no core's MSR device could be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MsrOpenError {
    /// The topology lists no core.
    #[error("no core to read energy from")]
    EmptyTopology,
    /// Not one core's device opened and answered; `errno` is the first core's failure.
    #[error("cannot read the energy MSR of any core{}", hint(*.errno))]
    Unreadable {
        /// The first core's errno.
        errno: Errno,
        /// The same errno as an I/O error, for the message chain.
        #[source]
        source: std::io::Error,
    },
}

impl MsrOpenError {
    fn unreadable(errno: Errno) -> MsrOpenError {
        MsrOpenError::Unreadable { errno, source: std::io::Error::from_raw_os_error(errno) }
    }
}

/// What an errno from opening or reading `/dev/cpu/<N>/msr` usually means.
fn hint(errno: Errno) -> &'static str {
    match errno {
        libc::EPERM | libc::EACCES => " (opening needs CAP_SYS_RAWIO)",
        libc::ENOENT | libc::ENXIO | libc::ENODEV => " (is the msr module loaded?)",
        libc::EIO => " (the CPU has no such MSR)",
        _ => "",
    }
}

/// A core's extended counter and when its last successful reading started, on the [`Clock`].
#[derive(Debug)]
struct CoreCount {
    counter: WrapCounter,
    last_ok: Duration,
    /// The last read failed `ENXIO`: the CPU was offline.
    offline: bool,
}

/// One core's open device, its energy unit and its extended counter.
#[derive(Debug)]
struct MsrCore {
    device: Box<dyn MsrTransport>,
    esu: u8,
    window: Duration,
    count: Mutex<CoreCount>,
}

/// Why a core's count restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reset {
    /// No reading for longer than the wrap window: a wrap may have gone unseen.
    Unread,
    /// The counter moved further than the core can draw in the time between the readings.
    Restarted,
    /// The core's CPU was offline since the last reading.
    Offline,
}

type Resets = crate::counters::Resets<Reset>;

impl MsrCore {
    fn read(&self, index: usize, resets: &Resets, clock: &dyn Clock) -> Result<Energy, ItemError> {
        let io = |errno| ItemError::Io { errno };
        // The register is read while the lock is held: a reading older than the one already
        // taken would look like a wrap of almost 2^32 units.
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let started = clock.now().map_err(io)?;
        let raw = match self.device.read(MSR_CORE_ENERGY_STAT) {
            Ok(raw) => raw,
            Err(libc::ENXIO) => {
                count.offline = true;
                return Err(io(libc::ENXIO));
            }
            Err(errno) => return Err(io(errno)),
        };
        let ended = clock.now().map_err(io)?;
        // A reading that itself took longer than a wrap can take (the process was stopped,
        // frozen or suspended inside it) holds a value from an unknown moment of that span: as
        // a new start it would be a second reset at the next reading. It is not used; the next
        // reading, further than a window from the last good one, restarts the count once.
        if ended.saturating_sub(started) > self.window {
            return Err(ItemError::TimedOut);
        }
        // From the start of the last good reading to the end of this one: the widest span the
        // two register values can be apart.
        let gap = ended.saturating_sub(count.last_ok);
        count.last_ok = started;
        // Only bits 31:0 hold the counter.
        let raw = raw as u32;
        let reset = if std::mem::take(&mut count.offline) {
            Some(Reset::Offline)
        } else if gap > self.window {
            Some(Reset::Unread)
        } else if count.counter.step(raw).is_some_and(|units| units > self.most_units(gap)) {
            Some(Reset::Restarted)
        } else {
            None
        };
        let counter = match reset {
            Some(why) => {
                resets.count(index, why);
                count.counter.restart(raw)
            }
            None => count.counter.update(raw),
        };
        Ok(Energy { counter, esu: self.esu })
    }

    /// The most units the core can add in `gap` at [`MAX_CORE_WATTS`], with the
    /// [`RESTART_TOLERANCE`].
    fn most_units(&self, gap: Duration) -> u32 {
        let time = gap.saturating_add(RESTART_TOLERANCE.min(self.window / 8));
        let units = MAX_CORE_WATTS * time.as_secs_f64() * 2f64.powi(i32::from(self.esu));
        // Saturating: from a window on, any step is possible.
        units as u32
    }
}

/// Energy counters of every core of the topology, read through the MSR driver.
#[derive(Debug)]
pub(crate) struct MsrEnergy {
    /// Aligned with [`Topology::cores`]; a core whose device failed keeps its error.
    cores: Vec<Result<MsrCore, ItemError>>,
    clock: Box<dyn Clock>,
    resets: Resets,
    poller_failures: AtomicU64,
}

impl MsrEnergy {
    /// Opens the device of every core's lowest-numbered thread, reads its ESU and takes the
    /// first counter reading, so counts start at 0 now.
    ///
    /// A core that fails is kept as a per-core error; only if no core works is it an error.
    pub(crate) fn open(
        topology: &Topology,
        opener: &dyn MsrOpener,
    ) -> Result<MsrEnergy, MsrOpenError> {
        MsrEnergy::open_with_clock(topology, opener, Box::new(BootTime))
    }

    /// [`MsrEnergy::open`], measuring the wrap window on `clock`.
    pub(crate) fn open_with_clock(
        topology: &Topology,
        opener: &dyn MsrOpener,
        clock: Box<dyn Clock>,
    ) -> Result<MsrEnergy, MsrOpenError> {
        if topology.cores.is_empty() {
            return Err(MsrOpenError::EmptyTopology);
        }
        let what = "energy MSRs cannot be read";
        let open = |core: &amd_hsmp_proto::Core| open_core(opener, core.cpu, clock.as_ref());
        let cores =
            crate::counters::open_cores(topology, what, open).map_err(MsrOpenError::unreadable)?;
        Ok(MsrEnergy {
            cores,
            clock,
            resets: Resets::default(),
            poller_failures: AtomicU64::new(0),
        })
    }

    /// Counter resets since the broker started, after which a core's count restarted from 0:
    /// readings of a core further apart than its [`wrap_window`], and hardware counters that
    /// moved further than [`MAX_CORE_WATTS`] allows between two readings.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.total()
    }

    /// Times the background poller stopped (a panic or a failed sleep) and was restarted.
    #[cfg(test)]
    pub(crate) fn poller_failures(&self) -> u64 {
        self.poller_failures.load(Ordering::Relaxed)
    }

    /// The shortest [`wrap_window`] of the cores that work.
    pub(crate) fn shortest_wrap(&self) -> Option<Duration> {
        self.cores.iter().filter_map(|c| c.as_ref().ok()).map(|c| c.window).min()
    }

    /// Logs the resets not yet logged, as one line for all the cores they touched.
    fn log_resets(&self) {
        self.resets.log(|cores, total| {
            let of = |kind| cores.iter().filter(|(_, why)| *why == kind).count();
            tracing::warn!(
                cores = cores.len(),
                first_core_index = cores.first().map(|(i, _)| *i),
                unread_for_a_window = of(Reset::Unread),
                hardware_restarts = of(Reset::Restarted),
                back_online = of(Reset::Offline),
                total,
                window = ?self.shortest_wrap(),
                "energy counters restarted from 0: no reading for longer than a wrap can take \
                 (a stop or a suspend), a counter that moved more than the core can draw (the \
                 hardware restarted it), or a core whose CPU was offline"
            );
        });
    }

    /// Reads core `index` (an index into [`Topology::cores`]) and returns its extended count.
    pub(crate) fn read(&self, index: usize) -> Result<Energy, ItemError> {
        match self.cores.get(index) {
            Some(Ok(core)) => core.read(index, &self.resets, self.clock.as_ref()),
            Some(Err(e)) => Err(*e),
            // Like the MSR driver for a CPU it does not know.
            None => Err(ItemError::Io { errno: libc::ENXIO }),
        }
    }

    /// Reads every core once so no wrap goes unseen; failures are left for the next read.
    /// Logs the resets found since the last poll, by this poll or by samples.
    pub(crate) fn poll_all(&self) {
        for (index, core) in self.cores.iter().enumerate() {
            let Ok(core) = core else { continue };
            if let Err(error) = core.read(index, &self.resets, self.clock.as_ref()) {
                tracing::debug!(index, %error, "energy MSR poll failed");
            }
        }
        self.log_resets();
    }

    /// The poll period to use for a requested `interval`: at most a quarter of the shortest
    /// wrap window, so a poll is missed only when the poller or the process is stopped.
    pub(crate) fn poll_interval(&self, interval: Duration) -> Duration {
        let limit = self.shortest_wrap().map_or(interval, |w| w / 4);
        if interval > limit {
            tracing::info!(
                requested = ?interval,
                used = ?limit,
                "MSR poll interval shortened to a quarter of the shortest wrap at maximum power"
            );
        }
        interval.min(limit)
    }
}

impl crate::counters::CoreCounters for MsrEnergy {
    fn read(&self, index: usize) -> Result<Energy, ItemError> {
        MsrEnergy::read(self, index)
    }

    fn resets(&self) -> u64 {
        MsrEnergy::resets(self)
    }

    fn log_resets(&self) {
        MsrEnergy::log_resets(self)
    }

    fn source(&self) -> amd_hsmp_proto::EnergySource {
        amd_hsmp_proto::EnergySource::Msr
    }
}

fn open_core(opener: &dyn MsrOpener, cpu: u32, clock: &dyn Clock) -> Result<MsrCore, ItemError> {
    let io = |errno| ItemError::Io { errno };
    let device = opener.open(cpu).map_err(io)?;
    let esu = energy_status_unit(device.read(MSR_RAPL_PWR_UNIT).map_err(io)?);
    let last_ok = clock.now().map_err(io)?;
    let count = Mutex::new(CoreCount { counter: WrapCounter::new(), last_ok, offline: false });
    let core = MsrCore { device, esu, window: wrap_window(esu), count };
    core.read(0, &Resets::default(), clock)?;
    Ok(core)
}

/// Starts the thread that calls [`MsrEnergy::poll_all`] every `interval` (shortened by
/// [`MsrEnergy::poll_interval`]) for the life of the process. The thread supervises itself: a
/// poll that panics or a sleep that fails is counted ([`MsrEnergy::poller_failures`]), logged
/// the first time, and the polling starts again.
pub(crate) fn spawn_poller(
    energy: Arc<MsrEnergy>,
    interval: Duration,
) -> std::io::Result<JoinHandle<()>> {
    let interval = energy.poll_interval(interval);
    std::thread::Builder::new().name("msr-poll".into()).spawn(move || supervise(&energy, interval))
}

fn supervise(energy: &MsrEnergy, interval: Duration) {
    loop {
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_until_failure(energy, interval)
        }));
        let why = match stopped {
            Ok(e) => format!("cannot sleep: {e}"),
            Err(_) => "a poll panicked".to_string(),
        };
        let failures = energy.poller_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures == 1 {
            tracing::error!(%why, "MSR poller stopped; restarting it (later restarts are counted, not logged)");
        } else {
            tracing::debug!(%why, failures, "MSR poller restarted");
        }
        // Not through the sleep that may have just failed: a futex wait instead.
        let (_keep, wait) = std::sync::mpsc::channel::<()>();
        let _ = wait.recv_timeout(interval);
    }
}

fn poll_until_failure(energy: &MsrEnergy, interval: Duration) -> std::io::Error {
    loop {
        if let Err(e) = crate::sleep::sleep(interval) {
            return e;
        }
        energy.poll_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::FakeClock;
    use amd_hsmp_device::MsrDeviceOpener;
    use amd_hsmp_proto::Core;
    use std::collections::HashMap;
    use std::fs::File;
    use std::os::unix::fs::FileExt;
    use std::time::Instant;

    /// Units of `2^-16` J (ESU 16, every EPYC's) in `joules`.
    fn esu16(joules: f64) -> u64 {
        (joules * 65_536.0) as u64
    }

    #[test]
    fn wrap_counter_starts_at_zero_and_follows_a_wrap() {
        let mut c = WrapCounter::new();
        assert_eq!(c.update(4_000_000_000), 0);
        assert_eq!(c.update(4_000_000_100), 100);
        assert_eq!(c.update(u32::MAX), 294_967_295);
        // 0xFFFF_FFFF -> 5 is 6 units, not a jump backwards.
        assert_eq!(c.update(5), 294_967_301);
        assert_eq!(c.total(), 294_967_301);
    }

    /// A CPU's registers, set by hand from the test; counts the energy reads.
    #[derive(Debug, Default)]
    struct Regs {
        values: HashMap<u32, u64>,
        energy_reads: usize,
        /// The next energy read panics, as a bug in a poll would.
        panic_next: bool,
        /// The next energy read moves the clock this far, as one the process was stopped inside
        /// would.
        stall_next: Option<(FakeClock, Duration)>,
        /// The CPU is offline: every read fails `ENXIO`, as the MSR driver's cross-CPU call
        /// does (`device/tests/hotplug.rs`).
        offline: bool,
    }

    #[derive(Debug, Clone, Default)]
    struct FakeCpu(Arc<Mutex<Regs>>);

    impl FakeCpu {
        fn new(esu: u8, energy: u64) -> FakeCpu {
            let cpu = FakeCpu::default();
            cpu.set(MSR_RAPL_PWR_UNIT, u64::from(esu) << 8 | 0x3);
            cpu.set(MSR_CORE_ENERGY_STAT, energy);
            cpu
        }

        fn set(&self, msr: u32, value: u64) {
            self.0.lock().unwrap().values.insert(msr, value);
        }

        /// Adds `units` to the 32-bit energy counter, wrapping as the hardware does; returns
        /// the number of energy reads so far.
        fn advance(&self, units: u32) -> usize {
            let mut regs = self.0.lock().unwrap();
            let raw = regs.values[&MSR_CORE_ENERGY_STAT] as u32;
            regs.values.insert(MSR_CORE_ENERGY_STAT, u64::from(raw.wrapping_add(units)));
            regs.energy_reads
        }

        /// Adds `units` to the 32-bit energy counter, any number of wraps.
        fn advance_units(&self, mut units: u64) {
            while units > 0 {
                let step = units.min(1 << 31);
                self.advance(step as u32);
                units -= step;
            }
        }

        /// The counter's raw value now.
        fn raw(&self) -> u32 {
            self.0.lock().unwrap().values[&MSR_CORE_ENERGY_STAT] as u32
        }

        fn energy_reads(&self) -> usize {
            self.0.lock().unwrap().energy_reads
        }
    }

    impl MsrTransport for FakeCpu {
        fn read(&self, msr: u32) -> Result<u64, Errno> {
            let mut regs = self.0.lock().unwrap();
            if regs.offline {
                return Err(libc::ENXIO);
            }
            if msr == MSR_CORE_ENERGY_STAT {
                regs.energy_reads += 1;
                if std::mem::take(&mut regs.panic_next) {
                    drop(regs);
                    panic!("injected poll panic");
                }
                if let Some((clock, stall)) = regs.stall_next.take() {
                    clock.advance(stall);
                }
            }
            regs.values.get(&msr).copied().ok_or(libc::EIO)
        }
    }

    /// CPUs by number; a missing CPU fails to open with `errno`.
    #[derive(Debug)]
    struct FakeOpener {
        cpus: HashMap<u32, FakeCpu>,
        errno: Errno,
    }

    impl MsrOpener for FakeOpener {
        fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno> {
            self.cpus.get(&cpu).map(|c| Box::new(c.clone()) as _).ok_or(self.errno)
        }
    }

    fn topology(cpus: &[u32]) -> Topology {
        Topology {
            cpu_family: 0x19,
            cpu_model: 0x01,
            sockets: vec![0],
            cores: cpus
                .iter()
                .enumerate()
                .map(|(i, &cpu)| Core {
                    socket: 0,
                    core: i as u32,
                    cpu,
                    apic_id: cpu * 2,
                    threads: vec![cpu],
                })
                .collect(),
        }
    }

    fn open(cpus: &[(u32, FakeCpu)], topo: &[u32]) -> Result<MsrEnergy, MsrOpenError> {
        open_on(&FakeClock::default(), cpus, topo)
    }

    /// Opens the cores with `clock` as the wrap window's clock.
    fn open_on(
        clock: &FakeClock,
        cpus: &[(u32, FakeCpu)],
        topo: &[u32],
    ) -> Result<MsrEnergy, MsrOpenError> {
        let opener = FakeOpener { cpus: cpus.iter().cloned().collect(), errno: libc::EPERM };
        MsrEnergy::open_with_clock(&topology(topo), &opener, Box::new(clock.clone()))
    }

    #[test]
    fn counts_start_at_zero_with_the_cores_esu() {
        let (a, b) = (FakeCpu::new(16, 123_456), FakeCpu::new(14, 0xFFFF_FFF0));
        let energy = open(&[(0, a.clone()), (8, b.clone())], &[0, 8]).unwrap();
        assert_eq!(energy.read(0), Ok(Energy { counter: 0, esu: 16 }));
        assert_eq!(energy.read(1), Ok(Energy { counter: 0, esu: 14 }));
        a.advance(65_536);
        assert_eq!(energy.read(0).unwrap().joules(), 1.0);
    }

    #[test]
    fn a_core_whose_cpu_was_offline_is_unavailable_then_back_from_zero_with_one_counted_reset() {
        let clock = FakeClock::default();
        let (a, b) = (FakeCpu::new(16, 1_000), FakeCpu::new(16, 0));
        let energy = open_on(&clock, &[(0, a.clone()), (1, b.clone())], &[0, 1]).unwrap();
        clock.advance(Duration::from_secs(1));
        a.advance(65_536);
        assert_eq!(energy.read(0).unwrap().joules(), 1.0);
        a.0.lock().unwrap().offline = true;
        clock.advance(Duration::from_secs(1));
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::ENXIO }));
        energy.poll_all();
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::ENXIO }));
        assert_eq!(energy.resets(), 0, "nothing is reset while the CPU is away");
        // Back online, the same descriptor reads again; what the counter did meanwhile is
        // unknown, so the count restarts from 0, counted once.
        a.0.lock().unwrap().offline = false;
        a.advance(3 * 65_536);
        clock.advance(Duration::from_secs(1));
        assert_eq!(energy.read(0).unwrap().counter, 0);
        assert_eq!(energy.resets(), 1);
        a.advance(2 * 65_536);
        clock.advance(Duration::from_secs(1));
        assert_eq!(energy.read(0).unwrap().joules(), 2.0);
        assert_eq!(energy.resets(), 1);
        b.advance(65_536);
        assert_eq!(energy.read(1).unwrap().joules(), 1.0);
    }

    #[test]
    fn only_the_low_32_bits_are_the_counter() {
        let cpu = FakeCpu::new(16, 0xABCD_0000_0000_0010);
        let energy = open(&[(0, cpu.clone())], &[0]).unwrap();
        cpu.set(MSR_CORE_ENERGY_STAT, 0x1234_0000_0000_0020);
        assert_eq!(energy.read(0).unwrap().counter, 0x10);
    }

    #[test]
    fn a_wrap_between_two_polls_is_counted_exactly() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 0xFFFF_0000);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        // 32,768 J each, in 400 s: 82 W, within the 655 s window.
        clock.advance(Duration::from_secs(400));
        cpu.advance(0x8000_0000);
        energy.poll_all();
        clock.advance(Duration::from_secs(400));
        cpu.advance(0x8000_0000 + 0x1_8000); // passes 0xFFFF_FFFF
        energy.poll_all();
        let e = energy.read(0).unwrap();
        assert_eq!(e.counter, 0x1_0001_8000);
        assert_eq!(e.joules(), 65_537.5);
    }

    #[test]
    fn the_poller_sees_every_wrap_while_nobody_reads() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 7);
        let energy = Arc::new(open_on(&clock, &[(3, cpu.clone())], &[3]).unwrap());
        spawn_poller(Arc::clone(&energy), Duration::from_millis(1)).unwrap();
        let step = 3_000_000_000u32; // 4 steps wrap the 32-bit counter almost 3 times
        for _ in 0..4 {
            // 45,776 J in 500 s: 92 W, within the 655 s window; the clock first, so a reading
            // never sees the energy before the time it took.
            clock.advance(Duration::from_secs(500));
            let reads_before = cpu.advance(step);
            // The count was taken under the same lock as the change: any later read saw it.
            let until = Instant::now() + Duration::from_secs(10);
            while cpu.energy_reads() <= reads_before {
                assert!(Instant::now() < until, "the poller stopped polling");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let e = energy.read(0).unwrap();
        assert_eq!(e.counter, 4 * u64::from(step));
        assert_eq!(e.joules(), 4.0 * 3e9 / 65_536.0);
    }

    #[test]
    fn the_wrap_window_is_the_wrap_period_at_maximum_core_power() {
        assert_eq!(wrap_window(16).as_secs(), 655);
        assert!(wrap_window(31) < Duration::from_millis(25));
    }

    #[test]
    fn a_core_unread_for_longer_than_a_wrap_can_take_restarts_from_zero_and_is_counted() {
        // ESU 27: 2^32 units are 32 J, 320 ms at MAX_CORE_WATTS.
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(27, 0);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        cpu.advance(1000);
        assert_eq!(energy.read(0).unwrap().counter, 1000);
        clock.advance(wrap_window(27) + Duration::from_millis(10));
        cpu.advance(500);
        assert_eq!(energy.read(0).unwrap().counter, 0, "a new start, not 1500 nor a guess");
        assert_eq!(energy.resets(), 1);
        energy.poll_all();
        assert_eq!(energy.resets.unlogged.lock().unwrap().len(), 0, "logged by the poll");
    }

    /// Regression: a stop that came while the poller was inside a read restarted that core's
    /// count twice, at the read in flight (its start was before the stop) and at the next one.
    #[test]
    fn a_reading_stopped_inside_for_longer_than_a_wrap_is_not_used_and_resets_the_count_once() {
        // ESU 27: 2^32 units are 32 J, 320 ms at MAX_CORE_WATTS.
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(27, 0);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        cpu.advance(1000);
        assert_eq!(energy.read(0).unwrap().counter, 1000);
        let stall = wrap_window(27) + Duration::from_millis(10);
        cpu.0.lock().unwrap().stall_next = Some((clock.clone(), stall));
        assert_eq!(energy.read(0), Err(ItemError::TimedOut), "a value from an unknown moment");
        assert_eq!(energy.resets(), 0);
        cpu.advance(500);
        assert_eq!(energy.read(0).unwrap().counter, 0, "a new start");
        cpu.advance(250);
        assert_eq!(energy.read(0).unwrap().counter, 250, "and the count goes on from it");
        assert_eq!(energy.resets(), 1, "one reset for one stop");
    }

    /// Regression (N9): the window was measured on `CLOCK_MONOTONIC`, which stops during a
    /// suspend, so a core that kept counting through many wraps while the machine slept (s2idle:
    /// cores idle but powered) lost them silently. The boot clock counts the suspend.
    #[test]
    fn a_suspend_longer_than_the_wrap_window_is_a_counted_reset() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 12_345);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        clock.advance(Duration::from_secs(10));
        cpu.advance_units(esu16(300.0));
        assert_eq!(energy.read(0).unwrap().joules(), 300.0);
        // Two hours asleep at 30 W: 216,000 J, three wraps and more, while the process (and its
        // monotonic clock) saw nothing of it.
        let monotonic = Instant::now();
        clock.advance(Duration::from_secs(7200));
        cpu.advance_units(esu16(216_000.0));
        assert_eq!(energy.read(0).unwrap().counter, 0, "a new start, not 300 J plus a guess");
        assert!(monotonic.elapsed() < wrap_window(16), "the monotonic clock barely moved");
        assert_eq!(energy.resets(), 1);
        assert_eq!(*energy.resets.unlogged.lock().unwrap(), [(0, Reset::Unread)]);
        clock.advance(Duration::from_secs(10));
        cpu.advance_units(esu16(300.0));
        assert_eq!(energy.read(0).unwrap().joules(), 300.0, "and the count goes on from it");
        assert_eq!(energy.resets(), 1);
    }

    #[test]
    fn a_suspend_shorter_than_the_wrap_window_continues_the_count_exactly() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 0xFFFF_FC00);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        // Ten minutes asleep at 30 W: 18,000 J, across the counter's wrap, within the window.
        clock.advance(Duration::from_secs(600));
        cpu.advance_units(esu16(18_000.0));
        assert_eq!(energy.read(0).unwrap().joules(), 18_000.0);
        assert_eq!(energy.resets(), 0);
    }

    /// Regression (N9): a counter the hardware restarted (S3 powers the cores off) dropped, and
    /// the drop was taken as a wrap: up to 65,536 J a core that were never drawn.
    #[test]
    fn a_hardware_counter_restart_is_a_counted_reset_not_a_phantom_wrap() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 1 << 30);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        clock.advance(Duration::from_secs(10));
        cpu.advance_units(esu16(300.0));
        assert_eq!(energy.read(0).unwrap().joules(), 300.0);
        // A minute later the counter reads 0x100: as a wrap, 49,000 J in 60 s, 816 W.
        clock.advance(Duration::from_secs(60));
        cpu.set(MSR_CORE_ENERGY_STAT, 0x100);
        assert_eq!(energy.read(0).unwrap().counter, 0, "a new start, not a phantom wrap");
        assert_eq!(energy.resets(), 1);
        assert_eq!(*energy.resets.unlogged.lock().unwrap(), [(0, Reset::Restarted)]);
        clock.advance(Duration::from_secs(10));
        cpu.advance_units(esu16(300.0));
        assert_eq!(energy.read(0).unwrap().joules(), 300.0, "and the count goes on from it");
        assert_eq!(energy.resets(), 1, "one reset for one restart");
        energy.poll_all();
        assert!(energy.resets.unlogged.lock().unwrap().is_empty(), "logged by the poll");
    }

    #[test]
    fn a_counter_rising_faster_than_a_core_can_draw_is_a_counted_reset() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 0);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        // 5,000 J in 10 s is 500 W (a counter restarted at a higher value), beyond the 100 W a
        // core and the 1 s tolerance (1,100 J).
        clock.advance(Duration::from_secs(10));
        cpu.advance_units(esu16(5_000.0));
        assert_eq!(energy.read(0).unwrap().counter, 0);
        assert_eq!(energy.resets(), 1);
        assert_eq!(*energy.resets.unlogged.lock().unwrap(), [(0, Reset::Restarted)]);
    }

    /// The restart rule must never fire on energy a core can draw: up to [`MAX_CORE_WATTS`] for
    /// the time between the readings, across a wrap, and steps of a counter read twice within
    /// microseconds.
    #[test]
    fn a_core_at_maximum_power_is_never_taken_for_a_restart() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 0xFFFF_FFFA);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        let mut joules = 0.0;
        for secs in [1, 10, 300, 600] {
            clock.advance(Duration::from_secs(secs));
            cpu.advance_units(esu16(MAX_CORE_WATTS * secs as f64));
            joules += MAX_CORE_WATTS * secs as f64;
            assert_eq!(energy.read(0).unwrap().joules(), joules, "{secs} s at 100 W");
        }
        // No time at all: a step of the counter between two readings, or a simulated machine
        // adding a few joules at once, within the 100 J tolerance.
        cpu.advance_units(esu16(99.0));
        assert_eq!(energy.read(0).unwrap().joules(), joules + 99.0);
        assert_eq!(energy.resets(), 0);
        // Just past it, and past 100 W, is a restart.
        clock.advance(Duration::from_secs(1));
        let raw = cpu.raw();
        cpu.advance_units(esu16(200.0) + 1);
        assert_eq!(energy.read(0).unwrap().counter, 0);
        assert_eq!(energy.resets(), 1);
        // A drop of 200 J taken as a wrap is 65,336 J, beyond 100 W for 10 s: a restart too.
        clock.advance(Duration::from_secs(10));
        cpu.set(MSR_CORE_ENERGY_STAT, u64::from(raw));
        assert_eq!(energy.read(0).unwrap().counter, 0);
        assert_eq!(energy.resets(), 2);
    }

    #[test]
    fn readings_within_the_wrap_window_continue_the_count() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 0);
        let energy = open_on(&clock, &[(0, cpu.clone())], &[0]).unwrap();
        clock.advance(Duration::from_millis(20));
        cpu.advance(0xFFFF_FFF0);
        cpu.advance(0x20);
        energy.poll_all();
        assert_eq!(energy.read(0).unwrap().counter, 0x10, "one wrap, seen as one");
        assert_eq!(energy.resets(), 0);
    }

    #[test]
    fn a_poller_that_panics_is_restarted_and_its_failure_counted() {
        let clock = FakeClock::default();
        let cpu = FakeCpu::new(16, 7);
        let energy = Arc::new(open_on(&clock, &[(3, cpu.clone())], &[3]).unwrap());
        cpu.0.lock().unwrap().panic_next = true;
        spawn_poller(Arc::clone(&energy), Duration::from_millis(1)).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while energy.poller_failures() == 0 {
            assert!(Instant::now() < until, "the poll never panicked");
            std::thread::sleep(Duration::from_millis(1));
        }
        // 45,776 J in 500 s: 92 W.
        clock.advance(Duration::from_secs(500));
        let reads = cpu.advance(3_000_000_000);
        while cpu.energy_reads() <= reads + 1 {
            assert!(Instant::now() < until, "the poller was not restarted");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(energy.read(0).unwrap().counter, 3_000_000_000);
        assert_eq!(energy.poller_failures(), 1);
    }

    #[test]
    fn the_poll_interval_is_at_most_a_quarter_of_the_shortest_wrap() {
        let energy = open(&[(0, FakeCpu::new(16, 0)), (1, FakeCpu::new(31, 0))], &[0, 1]).unwrap();
        assert_eq!(energy.poll_interval(Duration::from_secs(30)), wrap_window(31) / 4);
        let slow = open(&[(0, FakeCpu::new(16, 0))], &[0]).unwrap();
        assert_eq!(slow.poll_interval(Duration::from_secs(30)), Duration::from_secs(30));
        assert_eq!(slow.poll_interval(Duration::from_secs(600)), wrap_window(16) / 4);
    }

    #[test]
    fn a_core_that_fails_to_open_is_an_item_error_not_a_failure() {
        let a = FakeCpu::new(16, 0);
        let energy = open(&[(0, a)], &[0, 2]).unwrap();
        assert!(energy.read(0).is_ok());
        assert_eq!(energy.read(1), Err(ItemError::Io { errno: libc::EPERM }));
        assert_eq!(energy.read(2), Err(ItemError::Io { errno: libc::ENXIO }));
    }

    #[test]
    fn a_failing_read_is_reported_for_that_core() {
        let a = FakeCpu::new(16, 0);
        let energy = open(&[(0, a.clone())], &[0]).unwrap();
        a.0.lock().unwrap().values.remove(&MSR_CORE_ENERGY_STAT);
        assert_eq!(energy.read(0), Err(ItemError::Io { errno: libc::EIO }));
    }

    #[test]
    fn no_core_opening_is_an_error_naming_the_capability() {
        let err = open(&[], &[0, 2]).unwrap_err();
        assert!(matches!(err, MsrOpenError::Unreadable { errno: libc::EPERM, .. }), "{err:?}");
        assert!(err.to_string().contains("CAP_SYS_RAWIO"), "{err}");
        assert!(matches!(open(&[], &[]), Err(MsrOpenError::EmptyTopology)));
    }

    #[test]
    fn the_real_device_is_read_at_the_msr_offset_little_endian() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("5")).unwrap();
        // A regular file stands in for the node. The two registers are adjacent offsets, so
        // their 8-byte windows overlap: the energy counter is bytes 1..9 from the power unit.
        let file = File::create(root.path().join("5/msr")).unwrap();
        let unit = u64::from(MSR_RAPL_PWR_UNIT);
        file.write_all_at(&[0x03, 0x10, 0x0A, 0, 0, 0, 0, 0], unit).unwrap();
        let opener = MsrDeviceOpener { root: root.path().to_owned() };
        let dev = opener.open(5).unwrap();
        assert_eq!(dev.read(MSR_RAPL_PWR_UNIT), Ok(0x000A_1003));
        // Only 7 bytes exist at the energy offset: a short read is an error, not a value.
        assert_eq!(dev.read(MSR_CORE_ENERGY_STAT), Err(libc::EIO));
        let err = MsrEnergy::open(&topology(&[5]), &opener).unwrap_err();
        assert!(matches!(err, MsrOpenError::Unreadable { errno: libc::EIO, .. }), "{err:?}");
        assert_eq!(opener.open(6).unwrap_err(), libc::ENOENT);

        file.write_all_at(&[0], unit + 8).unwrap();
        assert_eq!(dev.read(MSR_CORE_ENERGY_STAT), Ok(0x0A10));
        let energy = MsrEnergy::open(&topology(&[5]), &opener).unwrap();
        assert_eq!(energy.read(0), Ok(Energy { counter: 0, esu: 16 }));
        file.write_all_at(&[0x10, 0x0B], unit + 1).unwrap();
        assert_eq!(energy.read(0), Ok(Energy { counter: 0x100, esu: 16 }));
    }
}
