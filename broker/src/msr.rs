//! Per-core energy from the MSR driver (`/dev/cpu/<N>/msr`), for parts whose HSMP firmware has
//! no RAPL messages: the 32-bit hardware counter extended to a monotonic 64-bit count by a
//! background poll.

use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT, energy_status_unit};
use amd_hsmp_device::{Errno, MsrOpener, MsrTransport};
use amd_hsmp_proto::{Energy, ItemError, Topology};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Default period of the background poll. At ESU 16 the counter wraps every 65,536 J, over
/// half an hour for a core drawing 30 W, so two wraps can never fit in one period.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(30);

/// Extends a wrapping 32-bit counter to a monotonic 64-bit count that starts at 0 on the first
/// reading. Correct as long as the counter wraps at most once between two readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WrapCounter {
    last: Option<u32>,
    total: u64,
}

impl WrapCounter {
    /// A counter that has seen no reading yet.
    pub fn new() -> WrapCounter {
        WrapCounter::default()
    }

    /// Takes a raw reading and returns the extended count.
    pub fn update(&mut self, raw: u32) -> u64 {
        if let Some(last) = self.last {
            self.total = self.total.wrapping_add(u64::from(raw.wrapping_sub(last)));
        }
        self.last = Some(raw);
        self.total
    }

    /// The extended count after the last reading.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Why no core's MSR device could be used.
#[derive(Debug, thiserror::Error)]
pub enum MsrOpenError {
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

/// One core's open device, its energy unit and its extended counter.
#[derive(Debug)]
struct MsrCore {
    device: Box<dyn MsrTransport>,
    esu: u8,
    counter: Mutex<WrapCounter>,
}

impl MsrCore {
    fn read(&self) -> Result<Energy, ItemError> {
        // The register is read while the lock is held: a reading older than the one already
        // taken would look like a wrap of almost 2^32 units.
        let mut counter = self.counter.lock().unwrap_or_else(PoisonError::into_inner);
        let raw =
            self.device.read(MSR_CORE_ENERGY_STAT).map_err(|errno| ItemError::Io { errno })?;
        // Only bits 31:0 hold the counter.
        let counter = counter.update(raw as u32);
        Ok(Energy { counter, esu: self.esu })
    }
}

/// Energy counters of every core of the topology, read through the MSR driver.
#[derive(Debug)]
pub struct MsrEnergy {
    /// Aligned with [`Topology::cores`]; a core whose device failed keeps its error.
    cores: Vec<Result<MsrCore, ItemError>>,
}

impl MsrEnergy {
    /// Opens the device of every core's lowest-numbered thread, reads its ESU and takes the
    /// first counter reading, so counts start at 0 now.
    ///
    /// A core that fails is kept as a per-core error; only if no core works is it an error.
    pub fn open(topology: &Topology, opener: &dyn MsrOpener) -> Result<MsrEnergy, MsrOpenError> {
        let cores: Vec<_> = topology.cores.iter().map(|core| open_core(opener, core.cpu)).collect();
        let failed: Vec<_> = topology
            .cores
            .iter()
            .zip(&cores)
            .filter_map(|(core, r)| r.as_ref().err().map(|e| (core.cpu, *e)))
            .collect();
        if let Some(&(cpu, error)) = failed.first() {
            if failed.len() == cores.len() {
                let errno = match error {
                    ItemError::Io { errno } => errno,
                    _ => libc::EIO,
                };
                return Err(MsrOpenError::unreadable(errno));
            }
            tracing::warn!(
                failed = failed.len(),
                cores = cores.len(),
                first_cpu = cpu,
                %error,
                "some cores' energy MSRs cannot be read; their energy will be missing",
            );
        }
        if cores.is_empty() {
            return Err(MsrOpenError::EmptyTopology);
        }
        Ok(MsrEnergy { cores })
    }

    /// Number of cores, as in the topology.
    pub fn len(&self) -> usize {
        self.cores.len()
    }

    /// Whether the topology had no core (never true for an opened `MsrEnergy`).
    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// Reads core `index` (an index into [`Topology::cores`]) and returns its extended count.
    pub fn read(&self, index: usize) -> Result<Energy, ItemError> {
        match self.cores.get(index) {
            Some(Ok(core)) => core.read(),
            Some(Err(e)) => Err(*e),
            // Like the MSR driver for a CPU it does not know.
            None => Err(ItemError::Io { errno: libc::ENXIO }),
        }
    }

    /// Reads every core once so no wrap goes unseen; failures are left for the next read.
    pub fn poll_all(&self) {
        for (index, core) in self.cores.iter().enumerate() {
            let Ok(core) = core else { continue };
            if let Err(error) = core.read() {
                tracing::debug!(index, %error, "energy MSR poll failed");
            }
        }
    }
}

fn open_core(opener: &dyn MsrOpener, cpu: u32) -> Result<MsrCore, ItemError> {
    let io = |errno| ItemError::Io { errno };
    let device = opener.open(cpu).map_err(io)?;
    let esu = energy_status_unit(device.read(MSR_RAPL_PWR_UNIT).map_err(io)?);
    let core = MsrCore { device, esu, counter: Mutex::new(WrapCounter::new()) };
    core.read()?;
    Ok(core)
}

/// Starts the thread that calls [`MsrEnergy::poll_all`] every `interval`, for the life of the
/// process.
pub fn spawn_poller(energy: Arc<MsrEnergy>, interval: Duration) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("msr-poll".into()).spawn(move || {
        loop {
            std::thread::sleep(interval);
            energy.poll_all();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_device::MsrDeviceOpener;
    use amd_hsmp_proto::Core;
    use std::collections::HashMap;
    use std::fs::File;
    use std::os::unix::fs::FileExt;
    use std::time::Instant;

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

        fn energy_reads(&self) -> usize {
            self.0.lock().unwrap().energy_reads
        }
    }

    impl MsrTransport for FakeCpu {
        fn read(&self, msr: u32) -> Result<u64, Errno> {
            let mut regs = self.0.lock().unwrap();
            if msr == MSR_CORE_ENERGY_STAT {
                regs.energy_reads += 1;
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
                .map(|(i, &cpu)| Core { socket: 0, core: i as u32, cpu, apic_id: cpu * 2 })
                .collect(),
        }
    }

    fn open(cpus: &[(u32, FakeCpu)], topo: &[u32]) -> Result<MsrEnergy, MsrOpenError> {
        let opener = FakeOpener { cpus: cpus.iter().cloned().collect(), errno: libc::EPERM };
        MsrEnergy::open(&topology(topo), &opener)
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
    fn only_the_low_32_bits_are_the_counter() {
        let cpu = FakeCpu::new(16, 0xABCD_0000_0000_0010);
        let energy = open(&[(0, cpu.clone())], &[0]).unwrap();
        cpu.set(MSR_CORE_ENERGY_STAT, 0x1234_0000_0000_0020);
        assert_eq!(energy.read(0).unwrap().counter, 0x10);
    }

    #[test]
    fn a_wrap_between_two_polls_is_counted_exactly() {
        let cpu = FakeCpu::new(16, 0xFFFF_0000);
        let energy = open(&[(0, cpu.clone())], &[0]).unwrap();
        cpu.advance(0x8000_0000);
        energy.poll_all();
        cpu.advance(0x8000_0000 + 0x1_8000); // passes 0xFFFF_FFFF
        energy.poll_all();
        let e = energy.read(0).unwrap();
        assert_eq!(e.counter, 0x1_0001_8000);
        assert_eq!(e.joules(), 65_537.5);
    }

    #[test]
    fn the_poller_sees_every_wrap_while_nobody_reads() {
        let cpu = FakeCpu::new(16, 7);
        let energy = Arc::new(open(&[(3, cpu.clone())], &[3]).unwrap());
        spawn_poller(Arc::clone(&energy), Duration::from_millis(1)).unwrap();
        let step = 3_000_000_000u32; // 4 steps wrap the 32-bit counter almost 3 times
        for _ in 0..4 {
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
