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

use amd_hsmp_device::msr::MSR_CORE_ENERGY_STAT;
use amd_hsmp_device::perf::DevPerf;
use amd_hsmp_device::{MsrDeviceOpener, MsrOpener, MsrTransport, PerfCounter, PerfOpener};
use anyhow::{Context, Result, bail};
use serde::Serialize;
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
}

/// One path's cost per reading.
#[derive(Debug, Serialize)]
pub struct PerRead {
    /// Median wall time of one round divided by the CPUs read, µs.
    pub wall_us: f64,
    /// CPU time of the reading thread per reading (user + system), µs.
    pub cpu_us: f64,
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
    let (mut perf_wall, mut msr_wall) = (Vec::new(), Vec::new());
    let (mut perf_cpu, mut msr_cpu) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let (wall, cpu) = timed(|| events.iter().all(|e| e.read().is_ok()))?;
        perf_wall.push(wall.as_secs_f64());
        perf_cpu += cpu;
        let (wall, cpu) = timed(|| msrs.iter().all(|m| m.read(register).is_ok()))?;
        msr_wall.push(wall.as_secs_f64());
        msr_cpu += cpu;
    }
    let per_read = |walls: &mut Vec<f64>, cpu: Duration| {
        let reads = (rounds * cpus.len()) as f64;
        PerRead {
            wall_us: median(walls) * 1e6 / cpus.len() as f64,
            cpu_us: cpu.as_secs_f64() * 1e6 / reads,
        }
    };
    let perf = per_read(&mut perf_wall, perf_cpu);
    let msr = per_read(&mut msr_wall, msr_cpu);
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
    })
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
