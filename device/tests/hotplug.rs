//! What the running kernel does to the broker's descriptors when a CPU goes offline and comes
//! back (CPU hotplug, `/sys/devices/system/cpu/cpuN/online`): the facts the broker's energy
//! sources and the simulator (`sim/`) are built on, pinned on a real kernel.
//!
//! - A per-CPU perf event (`perf_event_open(attr, -1, cpu, -1, ..)`, opened by the broker's own
//!   [`DevPerf`] with its own `perf_event_attr`, `PerfEventAttr::counting`) is detached from its
//!   CPU's context at offline: `kernel/events/core.c`, `perf_event_exit_cpu()` calls
//!   `perf_event_exit_cpu_context()`, which removes every event of the CPU's contexts
//!   (`__perf_event_exit_context()`, `perf_remove_from_context(.., DETACH_GROUP)`). The event
//!   stays readable, its count and its enabled and running times standing still, and nothing
//!   attaches it again at online (`perf_event_init_cpu()` only marks the context online): it
//!   stands still for good. A new event on an offline CPU is refused `ENODEV`
//!   (`perf_event_open()` checks the CPU context's `online`).
//! - A read of `/dev/cpu/N/msr` (`arch/x86/kernel/msr.c`, `msr_read()` →
//!   `rdmsr_safe_on_cpu()`) or `/dev/cpu/N/cpuid` (`arch/x86/kernel/cpuid.c`, `cpuid_read()`)
//!   runs on the CPU through a cross-CPU call (`kernel/smp.c`, `generic_exec_single()`), which
//!   returns `-ENXIO` for an offline CPU. The node itself is destroyed at offline by the
//!   driver's CPU hotplug callback (`msr_device_destroy()`, `cpuid_device_destroy()`, set up
//!   with `cpuhp_setup_state()`): a new open finds no file (`ENOENT`). A descriptor opened
//!   before stays valid and reads again once the CPU is back and its node created again.
//!
//! The test takes the highest-numbered CPU that can go offline (never CPU 0) offline and back,
//! and puts it back online however it ends, a panic included. It needs root; without it, without
//! a CPU that can go offline, or where perf events are refused, it says why on stderr and passes.
//! The cpuid device stands in for the msr device where the `msr` module is missing: the same
//! cross-CPU call and the same hotplug callbacks. Run it with
//! `cargo test -p amd-hsmp-device --test hotplug -- --nocapture`.

use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT};
use amd_hsmp_device::perf::DevPerf;
use amd_hsmp_device::{
    Errno, MsrDeviceOpener, MsrOpener, MsrTransport, OnlineCpus, PerfCounter, PerfOpener,
    PerfReading, SysfsOnline, errno_of,
};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The kernel's CPU directories.
const CPUS: &str = "/sys/devices/system/cpu";

/// The per-CPU device nodes of the `msr` and `cpuid` drivers.
const DEV_CPU: &str = "/dev/cpu";

/// The software PMU (`PERF_TYPE_SOFTWARE`), which every kernel has, and its `cpu-clock` event
/// (`PERF_COUNT_SW_CPU_CLOCK`): a per-CPU event that counts nanoseconds while it is scheduled
/// on its CPU, which a CPU-wide event always is, idle or not.
const CPU_CLOCK: DevPerf = DevPerf { kind: 1, config: 0 };

/// The registers the broker reads, tried in turn.
const ENERGY_MSRS: [u32; 2] = [MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT];

/// How long a frozen reading must stand still, and how long a counting one has to move.
const STILL: Duration = Duration::from_millis(200);

/// Puts its CPU back online when dropped, so a failed assertion leaves the machine whole.
#[derive(Debug)]
struct Online {
    file: PathBuf,
}

impl Online {
    fn set(&self, online: bool) -> std::io::Result<()> {
        let mut file = OpenOptions::new().write(true).open(&self.file)?;
        file.write_all(if online { b"1" } else { b"0" })
    }

    fn is_online(&self) -> bool {
        std::fs::read_to_string(&self.file).is_ok_and(|text| text.trim() == "1")
    }
}

impl Drop for Online {
    fn drop(&mut self) {
        if let Err(e) = self.set(true) {
            eprintln!("hotplug: COULD NOT PUT {} BACK TO 1: {e}", self.file.display());
        }
    }
}

/// The highest-numbered CPU but 0 whose `online` file exists and opens for writing.
fn offlinable_cpu() -> Option<(u32, PathBuf)> {
    let mut cpus: Vec<(u32, PathBuf)> = std::fs::read_dir(CPUS)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let cpu: u32 = name.to_str()?.strip_prefix("cpu")?.parse().ok()?;
            Some((cpu, entry.path().join("online")))
        })
        .filter(|(cpu, file)| *cpu != 0 && OpenOptions::new().write(true).open(file).is_ok())
        .collect();
    cpus.sort_unstable_by_key(|(cpu, _)| *cpu);
    cpus.pop()
}

/// Reads `event`, waits [`STILL`] and reads it again.
fn two_readings(event: &dyn PerfCounter) -> (PerfReading, PerfReading) {
    let first = event.read().expect("read the event");
    sleep(STILL);
    let second = event.read().expect("read the event");
    (first, second)
}

fn assert_counts(what: &str, (first, second): (PerfReading, PerfReading)) {
    eprintln!("hotplug: {what}: {first:?} then {second:?}");
    assert!(second.value > first.value, "{what} does not count: {first:?} then {second:?}");
    assert!(second.enabled_ns > first.enabled_ns, "{what}: {first:?} then {second:?}");
    assert!(second.running_ns > first.running_ns, "{what}: {first:?} then {second:?}");
}

fn assert_stands_still(what: &str, (first, second): (PerfReading, PerfReading)) {
    eprintln!("hotplug: {what}: {first:?} then {second:?}");
    assert_eq!(first, second, "{what} moved");
}

/// One `pread` of CPUID leaf 0 (the driver reads multiples of 16 bytes: EAX, EBX, ECX, EDX).
fn cpuid_leaf_0(file: &File) -> Result<[u8; 16], Errno> {
    let mut leaf = [0u8; 16];
    match file.read_at(&mut leaf, 0) {
        Ok(16) => Ok(leaf),
        Ok(n) => panic!("cpuid read {n} bytes of 16"),
        Err(e) => Err(errno_of(&e)),
    }
}

/// The CPU's msr device opened by the broker's own opener and a register it reads, or why not.
fn msr_of(cpu: u32) -> Result<(Box<dyn MsrTransport>, u32, u64), String> {
    let node = Path::new(DEV_CPU).join(cpu.to_string()).join("msr");
    if !node.exists() {
        return Err(format!("{} does not exist (no msr module)", node.display()));
    }
    let opener = MsrDeviceOpener { root: DEV_CPU.into() };
    let msr =
        opener.open(cpu).map_err(|errno| format!("open {}: errno {errno}", node.display()))?;
    for register in ENERGY_MSRS {
        if let Ok(value) = msr.read(register) {
            return Ok((msr, register, value));
        }
    }
    Err(format!("neither RAPL MSR {ENERGY_MSRS:#x?} reads on CPU {cpu} (not an AMD CPU?)"))
}

/// Waits up to 2 s for `path` to exist again (the driver creates the node in the online path;
/// the wait only guards a slow devtmpfs).
fn wait_for(path: &Path) -> bool {
    let until = Instant::now() + Duration::from_secs(2);
    while !path.exists() {
        if Instant::now() > until {
            return false;
        }
        sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn a_cpu_going_offline_freezes_its_perf_events_for_good_and_fails_its_device_reads_until_it_returns()
 {
    if !rustix::process::geteuid().is_root() {
        eprintln!("hotplug: skipped: only root can take a CPU offline");
        return;
    }
    let Some((cpu, file)) = offlinable_cpu() else {
        eprintln!("hotplug: skipped: no CPU but 0 has a writable {CPUS}/cpuN/online");
        return;
    };
    let guard = Online { file };
    if !guard.is_online() {
        eprintln!("hotplug: CPU {cpu} was offline at the start: putting it online first");
        guard.set(true).expect("put the CPU online");
    }
    eprintln!("hotplug: CPU {cpu} goes offline and back ({})", guard.file.display());

    // Opened online, as the broker opens power_core at start-up.
    let event = match CPU_CLOCK.open(cpu) {
        Ok(event) => event,
        Err(errno @ (libc::EACCES | libc::EPERM)) => {
            eprintln!("hotplug: skipped: perf_event_open refused (errno {errno})");
            return;
        }
        Err(errno) => panic!("perf_event_open(cpu-clock, cpu {cpu}): errno {errno}"),
    };
    assert_counts("the event on the online CPU", two_readings(event.as_ref()));
    let cpuid_node = Path::new(DEV_CPU).join(cpu.to_string()).join("cpuid");
    let cpuid = File::open(&cpuid_node).ok();
    let leaf = match &cpuid {
        Some(file) => Some(cpuid_leaf_0(file).expect("read cpuid leaf 0 online")),
        None => {
            eprintln!("hotplug: no cpuid checks: {} does not open", cpuid_node.display());
            None
        }
    };
    let msr = msr_of(cpu)
        .inspect_err(|why| eprintln!("hotplug: no msr checks: {why}"))
        .ok()
        .inspect(|(_, register, value)| eprintln!("hotplug: MSR {register:#x} = {value:#x}"));
    let online_list = SysfsOnline::open(Path::new("/sys")).expect("open the online list");

    guard.set(false).expect("take the CPU offline");
    assert!(!online_list.online().unwrap().contains(&cpu), "CPU {cpu} is still listed online");
    let frozen = two_readings(event.as_ref());
    assert_stands_still("the event while its CPU is offline", frozen);
    assert_eq!(CPU_CLOCK.open(cpu).map(drop), Err(libc::ENODEV), "a new event, offline");
    if let (Some(file), Some(_)) = (&cpuid, leaf) {
        assert_eq!(cpuid_leaf_0(file), Err(libc::ENXIO), "cpuid read, offline");
        let reopened = File::open(&cpuid_node).map(drop).map_err(|e| errno_of(&e));
        assert_eq!(reopened, Err(libc::ENOENT), "{} opened, offline", cpuid_node.display());
        eprintln!("hotplug: offline: cpuid pread ENXIO, its node gone (ENOENT)");
    }
    if let Some((msr, register, _)) = &msr {
        assert_eq!(msr.read(*register), Err(libc::ENXIO), "MSR read, offline");
        let opener = MsrDeviceOpener { root: DEV_CPU.into() };
        assert_eq!(opener.open(cpu).map(drop), Err(libc::ENOENT), "msr opened, offline");
        eprintln!("hotplug: offline: MSR pread ENXIO, its node gone (ENOENT)");
    }

    guard.set(true).expect("put the CPU back online");
    assert!(online_list.online().unwrap().contains(&cpu), "CPU {cpu} is not listed online");
    let after = two_readings(event.as_ref());
    assert_stands_still("the old event after its CPU is back", after);
    assert_eq!(after.0, frozen.1, "the old event moved across the online");
    let renewed = CPU_CLOCK.open(cpu).expect("open a new event on the CPU back online");
    assert_counts("a new event on the CPU back online", two_readings(renewed.as_ref()));
    if let (Some(file), Some(leaf)) = (&cpuid, leaf) {
        assert_eq!(cpuid_leaf_0(file), Ok(leaf), "cpuid read through the old descriptor");
        assert!(wait_for(&cpuid_node), "{} is not created again", cpuid_node.display());
        eprintln!("hotplug: online again: the old cpuid descriptor reads, the node is back");
    }
    if let Some((msr, register, _)) = &msr {
        assert!(msr.read(*register).is_ok(), "MSR read through the old descriptor");
        eprintln!("hotplug: online again: the old msr descriptor reads");
    }
    drop(guard);
}
