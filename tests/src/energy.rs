//! A fast-wrapping energy model for the fake's MSR nodes: every core draws a constant power at
//! a coarse energy unit, so its 32-bit counter wraps every few seconds, and the exact energy of
//! every reading is recorded, so a test can check a broker's extended count to the unit.
//!
//! Only the two registers the broker reads exist: the RAPL power unit (the ESU in bits 12:8)
//! and the core energy status (bits 31:0 of the count). Time is the test's monotonic clock
//! until [`WrappingEnergy::freeze`], after which every reading returns the frozen count.
//! [`WrappingEnergy::restart`] sets every counter back, as hardware that restarts its counters
//! (a part powered off in S3) would.

use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT};
use amd_hsmp_device::{Errno, MsrOpener, MsrTransport};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Energy units in one wrap of the 32-bit counter.
pub const UNITS_PER_WRAP: u64 = 1 << 32;

/// The model: constant power per CPU from a common start, frozen on request, restarted on
/// request.
#[derive(Debug, Clone)]
pub struct WrappingEnergy(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    esu: u8,
    base_watts: f64,
    /// When the counters last started, and the count they started from.
    start: Mutex<(Instant, u64)>,
    frozen: Mutex<Option<Instant>>,
    /// The full (unwrapped) count at every energy reading, by CPU.
    readings: Mutex<BTreeMap<u32, Vec<u64>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WrappingEnergy {
    /// Counters of `2^-esu` J units; CPU `n` draws `base_watts × (1 + (n mod 4) / 16)`, so
    /// from `base_watts` to 19/16 of it.
    pub fn new(esu: u8, base_watts: f64) -> WrappingEnergy {
        WrappingEnergy(Arc::new(Inner {
            esu,
            base_watts,
            start: Mutex::new((Instant::now(), 0)),
            frozen: Mutex::new(None),
            readings: Mutex::new(BTreeMap::new()),
        }))
    }

    /// The power CPU `cpu` draws, in watts.
    pub fn watts(&self, cpu: u32) -> f64 {
        self.0.base_watts * (1.0 + f64::from(cpu % 4) / 16.0)
    }

    /// The time one wrap of CPU `cpu`'s counter takes.
    pub fn wrap_period(&self, cpu: u32) -> Duration {
        let joules = UNITS_PER_WRAP as f64 * 0.5f64.powi(i32::from(self.0.esu));
        Duration::from_secs_f64(joules / self.watts(cpu))
    }

    /// The full count of CPU `cpu` now (or when frozen), in units.
    pub fn units(&self, cpu: u32) -> u64 {
        let now = lock(&self.0.frozen).unwrap_or_else(Instant::now);
        let (start, from) = *lock(&self.0.start);
        let secs = now.saturating_duration_since(start).as_secs_f64();
        from + (secs * self.watts(cpu) * 2f64.powi(i32::from(self.0.esu))) as u64
    }

    /// Restarts every counter at `units` now, as hardware that restarts its counters would;
    /// returns, by CPU, the number of readings before the restart (every later reading is of
    /// the restarted counter).
    pub fn restart(&self, units: u64) -> BTreeMap<u32, usize> {
        let readings = lock(&self.0.readings);
        *lock(&self.0.start) = (Instant::now(), units);
        readings.iter().map(|(&cpu, r)| (cpu, r.len())).collect()
    }

    /// Stops every counter where it is now; readings from now on all return the same count.
    pub fn freeze(&self) {
        lock(&self.0.frozen).get_or_insert_with(Instant::now);
    }

    /// The full count at each energy reading of CPU `cpu` so far, in order.
    pub fn readings(&self, cpu: u32) -> Vec<u64> {
        lock(&self.0.readings).get(&cpu).cloned().unwrap_or_default()
    }
}

impl MsrOpener for WrappingEnergy {
    fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno> {
        Ok(Box::new(CpuEnergy { model: self.clone(), cpu }))
    }
}

/// One CPU's registers.
#[derive(Debug)]
struct CpuEnergy {
    model: WrappingEnergy,
    cpu: u32,
}

impl MsrTransport for CpuEnergy {
    fn read(&self, msr: u32) -> Result<u64, Errno> {
        match msr {
            // Power unit 3, time unit 10 as on real parts, and the model's ESU.
            MSR_RAPL_PWR_UNIT => Ok(0xA_0003 | u64::from(self.model.0.esu) << 8),
            MSR_CORE_ENERGY_STAT => {
                let mut readings = lock(&self.model.0.readings);
                let units = self.model.units(self.cpu);
                readings.entry(self.cpu).or_default().push(units);
                Ok(units % UNITS_PER_WRAP)
            }
            _ => Err(libc::EIO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_wrap_at_32_bits_and_record_the_full_count() {
        // ESU 30: 4 J a wrap, under 0.1 s at 40 W.
        let model = WrappingEnergy::new(30, 40.0);
        let cpu = model.open(1).unwrap();
        assert_eq!(cpu.read(MSR_RAPL_PWR_UNIT).unwrap() >> 8 & 0x1f, 30);
        std::thread::sleep(model.wrap_period(1) + Duration::from_millis(20));
        let raw = cpu.read(MSR_CORE_ENERGY_STAT).unwrap();
        let full = model.readings(1)[0];
        assert!(full > UNITS_PER_WRAP, "{full}");
        assert_eq!(raw, full % UNITS_PER_WRAP);
        model.freeze();
        let frozen = model.units(1);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(cpu.read(MSR_CORE_ENERGY_STAT).unwrap(), frozen % UNITS_PER_WRAP);
        assert_eq!(model.readings(1), [full, frozen]);
        assert_eq!(cpu.read(0x10), Err(libc::EIO));
    }

    #[test]
    fn a_restart_sets_every_counter_back_and_counts_on_from_there() {
        // ESU 20: 4096 J a wrap; at 40 W no counter wraps in this test.
        let model = WrappingEnergy::new(20, 40.0);
        let (a, b) = (model.open(0).unwrap(), model.open(3).unwrap());
        assert!(model.restart(1 << 30).is_empty(), "no reading yet");
        let before = [a.read(MSR_CORE_ENERGY_STAT).unwrap(), b.read(MSR_CORE_ENERGY_STAT).unwrap()];
        assert!(before.iter().all(|&r| r >= 1 << 30), "{before:?}");
        let seen = model.restart(0x100);
        assert_eq!(seen, BTreeMap::from([(0, 1), (3, 1)]));
        let after = a.read(MSR_CORE_ENERGY_STAT).unwrap();
        assert!(after >= 0x100 && after < before[0], "{after:#x} after {:#x}", before[0]);
        assert_eq!(model.readings(0)[1], after, "the full count restarted too");
        assert_eq!(model.watts(3), 40.0 * 19.0 / 16.0);
    }
}
