//! What one per-core energy reading costs in the kernel, for the two sources the broker keeps
//! itself, through the `device` crate's own transports on this machine's CPUs:
//!
//! - **perf**: one `read(2)` of a system-wide counting event per CPU (`DevPerf`): `power_core`'s
//!   `energy-core` where the machine has it, else the software PMU's `cpu-clock`, standing in
//!   with the same system call and the same cross-CPU read (the perf core asks the event's
//!   CPU), a different counter behind it (a clock, where `rapl.c` does one `rdmsr`);
//! - **msr**: one `pread(2)` of 8 bytes of `/dev/cpu/<N>/msr` per CPU (`DevMsr`): the broker's
//!   `MSR_AMD_CORE_ENERGY_STATUS` where the CPU has it, else `IA32_TSC` (0x10), which every x86
//!   CPU has (the driver's path is the same: `rdmsr_safe_on_cpu`). On a
//!   kernel without the `msr` module, the `cpuid` driver stands in (`/dev/cpu/<N>/cpuid`, a
//!   `pread(2)` of 16 bytes): the same system call and the same `smp_call_function_single` to
//!   the CPU, one `cpuid` where the MSR driver does one `rdmsr`; the report names which.
//!
//! Both are read in the same rounds, interleaved (a busy moment slows both), as root; the
//! figure is the median wall time and the mean CPU time of the reading thread per read, and
//! their ratio perf / msr. A scrape of a machine costs one such read per physical core.
//!
//! **Interrupts sent to the cores.** The reading thread is pinned to one CPU, and the
//! function-call interrupts each CPU took (the `CAL` row of `/proc/interrupts`, counted by
//! `sysvec_call_function_single` in `arch/x86/kernel/smp.c`) are snapshotted before and after
//! each path's batch of every round, then around readings of the reader's own CPU alone, in
//! rounds of their own. Both paths end in `generic_exec_single` of
//! `kernel/smp.c`, which runs the function at once, interrupts off, when the target CPU is the
//! caller's, and otherwise queues it and sends that CPU an IPI:
//!
//! - perf: `perf_event_read` (`kernel/events/core.c`) asks `__perf_event_read_cpu` which CPU
//!   may read the event and calls `__perf_event_read` there through
//!   `smp_call_function_single`. An event of a PMU with a scope (`pmu->scope`, Linux 6.12
//!   and later) gets `PERF_EV_CAP_READ_SCOPE` in `perf_try_init_event`, and is then read on
//!   the caller's CPU when it is in the event CPU's scope (`perf_scope_cpu_topology_cpumask`).
//!   `power_core` registers with `PERF_PMU_SCOPE_CORE` (`init_rapl_pmus` in
//!   `arch/x86/events/rapl.c`), whose mask is `topology_sibling_cpumask`: only a reader on a
//!   thread of the same core reads that core's counter without an IPI; every other core gets
//!   one per reading. The software PMU's `cpu-clock` standing in here has no scope: an IPI to
//!   every CPU but the reader's, as `power_core` read from outside the core.
//! - msr: `msr_read` (`arch/x86/kernel/msr.c`) calls `rdmsr_safe_on_cpu`
//!   (`arch/x86/lib/msr-smp.c`: `smp_call_function_single_async`, then
//!   `wait_for_completion`); the `cpuid` driver standing in (`cpuid_read`,
//!   `arch/x86/kernel/cpuid.c`) does the same with `cpuid`. The reader sleeps for the answer,
//!   and waking a thread on an idle CPU goes through that CPU's wake list
//!   (`ttwu_queue_wakelist` in `kernel/sched/core.c`, `__smp_call_single_queue`): a
//!   function-call interrupt on the reader's CPU too, where perf spins (`csd_lock_wait`).
//!
//! HSMP is not measured here: the driver's mailbox (`__hsmp_send_message` in
//! `drivers/platform/x86/amd/hsmp/hsmp.c`) writes and polls SMU registers through PCI
//! configuration space (`plat.c`, `amd_smn_hsmp_rdwr` → `__amd_smn_rw` in
//! `arch/x86/kernel/amd_node.c`: `pci_write_config_dword`/`pci_read_config_dword`) or MMIO
//! (`acpi.c`, `amd_hsmp_acpi_rdwr`: `ioread32`/`iowrite32`), from the caller's CPU: it runs
//! nothing on the cores, so 0 interrupts, by the source. (The benchmark's HSMP device is a
//! FUSE fake, whose figure would be the fake's.)
//!
//! Noise, interrupts from whatever else the machine does, is counted over windows of the same
//! shape without readings (two snapshots around a wait as long as the rounds' batches) and
//! subtracted at its rate.

use amd_hsmp_device::msr::MSR_CORE_ENERGY_STAT;
use amd_hsmp_device::perf::DevPerf;
use amd_hsmp_device::{MsrDeviceOpener, MsrOpener, MsrTransport, PerfCounter, PerfOpener};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `IA32_TSC`: a register every x86 CPU has, read through the MSR driver.
const IA32_TSC: u32 = 0x10;

/// The cost of one reading through each path.
#[derive(Debug, Serialize)]
pub struct Reads {
    /// CPUs read each round.
    pub cpus: usize,
    /// Rounds (each reads every CPU through both paths).
    pub rounds: usize,
    /// `read(2)` of a perf event.
    pub perf: PerRead,
    /// `pread(2)` of the MSR device (or its stand-in).
    pub msr: PerRead,
    /// What was read for the MSR path: `/dev/cpu/N/msr`, or `/dev/cpu/N/cpuid` standing in.
    pub msr_path: String,
    /// The perf event read: `power_core`'s, or `cpu-clock` standing in.
    pub perf_event: String,
    /// perf / msr, wall time (medians).
    pub wall_ratio: f64,
    /// perf / msr, CPU time of the reading thread.
    pub cpu_ratio: f64,
    /// The CPU the reading thread was pinned to.
    pub reader_cpu: usize,
    /// Function-call interrupts over windows without readings, the noise subtracted from each
    /// path's count; absent where `/proc/interrupts` has no `CAL` row.
    pub noise: Option<Noise>,
    /// Function-call interrupts an HSMP reading sends to the cores: 0, from the driver's
    /// source (the mailbox is SMU registers reached through PCI configuration space or MMIO
    /// from the caller's CPU), not measured.
    pub hsmp_interrupts_per_reading: u64,
}

/// One path's cost per reading.
#[derive(Debug, Serialize)]
pub struct PerRead {
    /// Median wall time of one round divided by the CPUs read, µs.
    pub wall_us: f64,
    /// CPU time of the reading thread per reading (user + system), µs.
    pub cpu_us: f64,
    /// Function-call interrupts the readings sent; absent where `/proc/interrupts` has no
    /// `CAL` row.
    pub interrupts: Option<Interrupts>,
}

/// Function-call interrupts (the `CAL` row of `/proc/interrupts`) per reading of one CPU,
/// the noise subtracted.
#[derive(Debug, Serialize)]
pub struct Interrupts {
    /// On the CPU read, per reading of a CPU other than the reader's: the IPI that runs the
    /// read there (absent with one CPU).
    pub other_cpu: Option<f64>,
    /// On the reader's CPU, per reading of another CPU: the wake-up of the reading thread
    /// where the driver sleeps until the answer (`wait_for_completion`), none where the
    /// kernel spins for it (absent with one CPU).
    pub reader_cpu_per_other_reading: Option<f64>,
    /// On every CPU together, per reading of the reader's own CPU, read alone in rounds of
    /// its own: the kernel runs it in place, without an IPI.
    pub own_cpu_reading: f64,
    /// The noise subtracted from `other_cpu` (the rate without readings, over this path's
    /// windows), per reading.
    pub noise_other_cpu: Option<f64>,
}

/// Function-call interrupts over windows without readings.
#[derive(Debug, Serialize)]
pub struct Noise {
    /// Length of all the windows together, ms.
    pub window_ms: f64,
    /// Per second on each CPU other than the reader's (absent with one CPU).
    pub other_cpu_per_s: Option<f64>,
    /// Per second on the reader's CPU.
    pub reader_cpu_per_s: f64,
}

/// Measures `rounds` rounds on every online CPU.
pub fn measure(rounds: usize) -> Result<Reads> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    let cpus = amd_hsmp_device::perf::parse_cpulist(online.trim()).map_err(anyhow::Error::msg)?;
    if !std::path::Path::new("/dev/cpu/0/msr").exists() {
        // Absent from some kernels: then the cpuid driver stands in.
        let _ = std::process::Command::new("modprobe").arg("msr").status();
    }
    let msr_driver = std::path::Path::new("/dev/cpu/0/msr").exists();
    // The energy register where the CPU has it (an EPYC), else IA32_TSC.
    let msr_opener = MsrDeviceOpener { root: "/dev/cpu".into() };
    let register = match msr_opener.open(0) {
        Ok(msr) if msr.read(MSR_CORE_ENERGY_STAT).is_ok() => MSR_CORE_ENERGY_STAT,
        _ => IA32_TSC,
    };
    let root = std::path::Path::new(amd_hsmp_device::perf::DEFAULT_PMU_ROOT);
    let (perf_opener, perf_event) = match amd_hsmp_device::perf::Pmu::discover(root) {
        Ok(pmu) => (DevPerf::of(&pmu), "power_core energy-core"),
        Err(_) => {
            let software: u32 = std::fs::read_to_string(root.join("software/type"))
                .context("the software PMU")?
                .trim()
                .parse()?;
            (DevPerf { kind: software, config: 0 }, "cpu-clock (no power_core PMU)")
        }
    };
    let mut events: Vec<Box<dyn PerfCounter>> = Vec::new();
    let mut msrs: Vec<Box<dyn MsrTransport>> = Vec::new();
    for &cpu in &cpus {
        let errno = |what: &str, e: i32| {
            anyhow::anyhow!("{what} on CPU {cpu}: {}", std::io::Error::from_raw_os_error(e))
        };
        events.push(perf_opener.open(cpu).map_err(|e| errno("perf_event_open", e))?);
        let msr: Box<dyn MsrTransport> = if msr_driver {
            msr_opener.open(cpu).map_err(|e| errno("open msr", e))?
        } else {
            let path = format!("/dev/cpu/{cpu}/cpuid");
            Box::new(Cpuid(std::fs::File::open(&path).with_context(|| path.clone())?))
        };
        msr.read(register).map_err(|e| errno("pread", e))?;
        msrs.push(msr);
    }
    // One CPU for the reading thread, so that its own CPU's count is told from the others'.
    let affinity = rustix::thread::sched_getaffinity(None)?;
    let reader_cpu = cpus
        .iter()
        .filter_map(|&c| usize::try_from(c).ok())
        .find(|&c| affinity.is_set(c))
        .context("no CPU to run on")?;
    let mut pinned = rustix::thread::CpuSet::new();
    pinned.set(reader_cpu);
    rustix::thread::sched_setaffinity(None, &pinned)?;
    let own = cpus.iter().position(|&c| usize::try_from(c) == Ok(reader_cpu)).unwrap_or(0);
    let counted = rounds_counted(rounds, &events, &msrs, register, own);
    rustix::thread::sched_setaffinity(None, &affinity)?;
    let (mut perf_batches, mut msr_batches, noise) = counted?;
    let per_read = |path: &mut Batches| {
        let reads = (rounds * cpus.len()) as f64;
        PerRead {
            wall_us: median(&mut path.walls) * 1e6 / cpus.len() as f64,
            cpu_us: path.cpu.as_secs_f64() * 1e6 / reads,
            interrupts: noise
                .as_ref()
                .map(|n| path.interrupts(&n.calls, reader_cpu, cpus.len(), rounds)),
        }
    };
    let perf = per_read(&mut perf_batches);
    let msr = per_read(&mut msr_batches);
    let noise = noise.map(|n| n.calls.noise(reader_cpu));
    let msr_path = match (msr_driver, register) {
        (false, _) => "/dev/cpu/N/cpuid (no msr module)".to_owned(),
        (true, r) => format!("/dev/cpu/N/msr, register {r:#x}"),
    };
    Ok(Reads {
        msr_path,
        perf_event: perf_event.to_owned(),
        cpus: cpus.len(),
        rounds,
        wall_ratio: perf.wall_us / msr.wall_us,
        cpu_ratio: perf.cpu_us / msr.cpu_us,
        perf,
        msr,
        reader_cpu,
        noise,
        hsmp_interrupts_per_reading: 0,
    })
}

/// What one path's batches (or the noise windows) gave over the rounds.
#[derive(Debug, Default)]
struct Batches {
    /// Wall time of each round's batch, s.
    walls: Vec<f64>,
    /// CPU time of the reading thread over the batches.
    cpu: Duration,
    /// Function-call interrupts over the batches' windows.
    calls: Calls,
    /// Function-call interrupts over rounds of their own reading the reader's CPU alone.
    own: Calls,
}

/// Function-call interrupts taken by each CPU over windows, and the windows' length.
#[derive(Debug, Default)]
struct Calls {
    /// Interrupts by CPU number, summed over the windows.
    by_cpu: BTreeMap<usize, u64>,
    /// The windows' length, from before the first snapshot to after the second.
    window: Duration,
    /// Whether `/proc/interrupts` had a `CAL` row to count.
    counted: bool,
}

impl Calls {
    /// Adds the window from `started` with `before` and `after` snapshots of the `CAL` row.
    fn add(
        &mut self,
        started: Instant,
        before: &Option<BTreeMap<usize, u64>>,
        after: &Option<BTreeMap<usize, u64>>,
    ) {
        self.window += started.elapsed();
        if let (Some(before), Some(after)) = (before, after) {
            self.counted = true;
            for (cpu, n) in after {
                let was = before.get(cpu).copied().unwrap_or(*n);
                *self.by_cpu.entry(*cpu).or_default() += n.saturating_sub(was);
            }
        }
    }

    /// Interrupts on the CPUs `on` selects.
    fn on(&self, on: impl Fn(usize) -> bool) -> u64 {
        self.by_cpu.iter().filter(|(cpu, _)| on(**cpu)).map(|(_, n)| n).sum()
    }

    /// Interrupts on the CPUs `on` selects per reading, over `readings` readings, with the
    /// count `noise` had there (windows without readings) subtracted at its rate over these
    /// windows; and that noise per reading.
    fn per_reading(&self, noise: &Calls, on: impl Fn(usize) -> bool, readings: f64) -> (f64, f64) {
        let noise_secs = noise.window.as_secs_f64().max(f64::MIN_POSITIVE);
        let expected = noise.on(&on) as f64 * self.window.as_secs_f64() / noise_secs;
        let readings = readings.max(1.0);
        ((self.on(&on) as f64 - expected) / readings, expected / readings)
    }

    /// The rate per second of each CPU of these windows (taken without readings).
    fn noise(&self, reader: usize) -> Noise {
        let others = self.by_cpu.keys().filter(|&&cpu| cpu != reader).count();
        let secs = self.window.as_secs_f64().max(f64::MIN_POSITIVE);
        Noise {
            window_ms: self.window.as_secs_f64() * 1e3,
            other_cpu_per_s: (others > 0)
                .then(|| self.on(|cpu| cpu != reader) as f64 / others as f64 / secs),
            reader_cpu_per_s: self.on(|cpu| cpu == reader) as f64 / secs,
        }
    }
}

impl Batches {
    /// The interrupts per reading of `rounds` rounds of `cpus` CPUs (each read once a round)
    /// with the reader on `reader`, the noise subtracted.
    fn interrupts(&self, noise: &Calls, reader: usize, cpus: usize, rounds: usize) -> Interrupts {
        let remote = (rounds * cpus.saturating_sub(1)) as f64;
        let (other, noise_other) = self.calls.per_reading(noise, |cpu| cpu != reader, remote);
        let (wakeups, _) = self.calls.per_reading(noise, |cpu| cpu == reader, remote);
        let (own, _) = self.own.per_reading(noise, |_| true, rounds as f64);
        let others = cpus > 1;
        Interrupts {
            other_cpu: others.then_some(other),
            reader_cpu_per_other_reading: others.then_some(wakeups),
            own_cpu_reading: own,
            noise_other_cpu: others.then_some(noise_other),
        }
    }
}

/// Reads every CPU through both paths `rounds` times, the function-call interrupts counted
/// around each path's batch; then the reader's own CPU alone (`events[own]`, `msrs[own]`)
/// as many times through each path, counted alike; then as many windows without readings,
/// each as long as the mean of the batches, for the noise. Returns the perf path, the MSR path
/// and the noise, that last `None` where `/proc/interrupts` has no `CAL` row.
fn rounds_counted(
    rounds: usize,
    events: &[Box<dyn PerfCounter>],
    msrs: &[Box<dyn MsrTransport>],
    register: u32,
    own: usize,
) -> Result<(Batches, Batches, Option<Batches>)> {
    let (mut perf, mut msr) = (Batches::default(), Batches::default());
    let batch = |path: &mut Batches, round: &dyn Fn() -> bool| -> Result<()> {
        let started = Instant::now();
        let before = function_calls();
        let (wall, cpu) = timed(round)?;
        path.calls.add(started, &before, &function_calls());
        path.walls.push(wall.as_secs_f64());
        path.cpu += cpu;
        Ok(())
    };
    for _ in 0..rounds {
        batch(&mut perf, &|| events.iter().all(|e| e.read().is_ok()))?;
        batch(&mut msr, &|| msrs.iter().all(|m| m.read(register).is_ok()))?;
    }
    // Counted only: the timings above are of whole rounds.
    for _ in 0..rounds {
        for (calls, read) in [
            (&mut perf.own, &(|| events[own].read().is_ok()) as &dyn Fn() -> bool),
            (&mut msr.own, &|| msrs[own].read(register).is_ok()),
        ] {
            let started = Instant::now();
            let before = function_calls();
            if !read() {
                bail!("a reading failed");
            }
            calls.add(started, &before, &function_calls());
        }
    }
    let walls = perf.walls.iter().chain(&msr.walls);
    let mean = walls.sum::<f64>() / (2 * rounds.max(1)) as f64;
    let wait = Duration::from_secs_f64(mean);
    let mut noise = Batches::default();
    for _ in 0..rounds {
        let started = Instant::now();
        let before = function_calls();
        // Busy, as the reading thread is, rather than asleep.
        while started.elapsed() < wait {
            std::hint::spin_loop();
        }
        noise.calls.add(started, &before, &function_calls());
    }
    let counted = noise.calls.counted;
    Ok((perf, msr, counted.then_some(noise)))
}

/// The `CAL` row of `/proc/interrupts` now: `None` where it cannot be read or has none (not
/// x86).
fn function_calls() -> Option<BTreeMap<usize, u64>> {
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    parse_cal(&text)
}

/// The function-call interrupts of each online CPU from the text of `/proc/interrupts`: its
/// header names the CPU of each column (`CPU0 CPU1 …`, online CPUs only), and the `CAL:` row
/// has one count per column, then the description ("Function call interrupts").
fn parse_cal(text: &str) -> Option<BTreeMap<usize, u64>> {
    let mut lines = text.lines();
    let cpus: Vec<usize> = lines
        .next()?
        .split_whitespace()
        .map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect::<Option<_>>()?;
    let row = lines.find_map(|l| l.trim_start().strip_prefix("CAL:"))?;
    let counts = row.split_whitespace().take(cpus.len()).map(|n| n.parse::<u64>().ok());
    let counts: Vec<u64> = counts.collect::<Option<_>>()?;
    (counts.len() == cpus.len()).then(|| cpus.into_iter().zip(counts).collect())
}

/// The median of `values` (sorted in place); 0 for none.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Runs `round` (which must succeed) and returns its wall time and the thread's CPU time
/// (`CLOCK_THREAD_CPUTIME_ID`, which brings the thread's run time up to date when read, where
/// `schedstat` moves at scheduler events only).
fn timed(round: impl FnOnce() -> bool) -> Result<(Duration, Duration)> {
    let cpu_now = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::try_from(t).unwrap_or_default()
    };
    let cpu0 = cpu_now();
    let started = Instant::now();
    if !round() {
        bail!("a reading failed");
    }
    let wall = started.elapsed();
    Ok((wall, cpu_now().saturating_sub(cpu0)))
}

/// `/dev/cpu/<N>/cpuid`, read as the MSR driver is: one `pread(2)` that runs one instruction
/// on CPU N (here `cpuid` leaf 0, 16 bytes).
#[derive(Debug)]
struct Cpuid(std::fs::File);

impl MsrTransport for Cpuid {
    fn read(&self, _msr: u32) -> Result<u64, amd_hsmp_device::Errno> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 16];
        match self.0.read_at(&mut buf, 0) {
            Ok(16) => Ok(u64::from(buf[0])),
            Ok(_) => Err(libc::EIO),
            Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERRUPTS: &str = "           CPU0       CPU1       CPU3       \n\
  24:          3          0          7  IO-APIC   5-edge      ACPI:Ged\n\
 NMI:          0          0          0   Non-maskable interrupts\n\
 CAL:    4220876    4754600         12   Function call interrupts\n\
 TLB:      10331      11437          5   TLB shootdowns\n";

    #[test]
    fn the_cal_row_is_read_by_the_cpu_of_each_column() {
        let cal = parse_cal(INTERRUPTS).unwrap();
        assert_eq!(cal, BTreeMap::from([(0, 4_220_876), (1, 4_754_600), (3, 12)]));
    }

    #[test]
    fn no_cal_row_or_a_short_one_is_no_count() {
        assert_eq!(parse_cal("   CPU0  CPU1\n NMI:  0  0  Non-maskable interrupts\n"), None);
        assert_eq!(parse_cal("   CPU0  CPU1\n CAL:  5  Function call interrupts\n"), None);
        assert_eq!(parse_cal(""), None);
    }

    fn window(ms: u64, counts: &[(usize, u64)]) -> Calls {
        Calls {
            by_cpu: counts.iter().copied().collect(),
            window: Duration::from_millis(ms),
            counted: true,
        }
    }

    #[test]
    fn interrupts_per_reading_subtract_the_noise_at_its_rate() {
        // 100 rounds over 2 CPUs, reader on CPU 0: 103 on CPU 1 and 51 on CPU 0 in 100 ms,
        // against a noise of 30 and 10 per second; reading CPU 0 alone, 1 on CPU 0 in 100 ms.
        let batches = Batches {
            calls: window(100, &[(0, 51), (1, 103)]),
            own: window(100, &[(0, 1), (1, 3)]),
            ..Batches::default()
        };
        let noise = window(200, &[(0, 2), (1, 6)]);
        let n = batches.interrupts(&noise, 0, 2, 100);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9;
        assert!(close(n.other_cpu, 1.0), "{n:?}");
        assert!(close(n.reader_cpu_per_other_reading, 0.5), "{n:?}");
        assert!(close(Some(n.own_cpu_reading), 0.0), "{n:?}");
        assert!(close(n.noise_other_cpu, 0.03), "{n:?}");
    }

    #[test]
    fn one_cpu_has_no_other_cpu_figure() {
        let batches = Batches {
            calls: window(1000, &[(0, 4)]),
            own: window(1000, &[(0, 4)]),
            ..Batches::default()
        };
        let n = batches.interrupts(&window(1000, &[(0, 4)]), 0, 1, 4);
        assert_eq!(n.other_cpu, None);
        assert_eq!(n.reader_cpu_per_other_reading, None);
        assert_eq!(n.own_cpu_reading, 0.0);
    }

    #[test]
    fn the_noise_is_a_rate_per_cpu() {
        let n = window(500, &[(0, 1), (1, 4), (2, 6)]).noise(0);
        assert_eq!(n.window_ms, 500.0);
        assert_eq!(n.other_cpu_per_s, Some(10.0));
        assert_eq!(n.reader_cpu_per_s, 2.0);
    }

    #[test]
    fn a_window_counts_the_difference_of_its_snapshots() {
        let mut calls = Calls::default();
        let before = Some(BTreeMap::from([(0, 10), (1, 20)]));
        let after = Some(BTreeMap::from([(0, 10), (1, 23)]));
        calls.add(Instant::now(), &before, &after);
        calls.add(Instant::now(), &before, &None);
        assert!(calls.counted);
        assert_eq!(calls.by_cpu, BTreeMap::from([(0, 0), (1, 3)]));
    }
}
