//! The kernel's RAPL perf driver (`arch/x86/events/rapl.c`, Linux 6.14 and later): per-core
//! energy as the `power_core` PMU's `energy-core` event, counted by the kernel into 64 bits.
//!
//! The PMU is described in sysfs, `<root>/power_core/`: `type` (its dynamic type number),
//! `cpumask` (one CPU per physical core: the one its events count on), `events/energy-core`
//! (`event=0x01`), `events/energy-core.scale` (`2.3283064365386962890625e-10`: the count is in
//! units of 2^-32 J), `events/energy-core.unit` (`Joules`) and `format/event` (`config:0-7`).
//! [`Pmu::discover`] reads all of it, bounded and without blocking; [`DevPerf`] opens one
//! system-wide counting event per CPU through `perf_event_open(2)`; a reading is one `read(2)`.

use crate::abi::PerfEventAttr;
use crate::{Errno, PerfCounter, PerfOpener, PerfReading, PmuLocator, files, sys};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the kernel lists its PMUs.
pub const DEFAULT_PMU_ROOT: &str = "/sys/bus/event_source/devices";

/// The PMU of the per-core energy counters (`rapl.c`'s `power_core`).
pub const POWER_CORE_PMU: &str = "power_core";

/// Its per-core energy event.
pub const ENERGY_CORE_EVENT: &str = "energy-core";

/// The most CPUs a `cpumask` may list: beyond any machine the kernel supports (`NR_CPUS` is
/// at most 8192 on x86).
const MAX_CPUS: u32 = 1 << 16;

/// The `power_core` PMU as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pmu {
    /// Its type number, `perf_event_attr.type`.
    pub kind: u32,
    /// The `energy-core` event encoded in `perf_event_attr.config`.
    pub config: u64,
    /// The count is in units of 2^-`esu` J (32 for `rapl.c`).
    pub esu: u8,
    /// The CPUs events count on, one per physical core, ascending.
    pub cpus: Vec<u32>,
}

/// Why the PMU cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PmuError {
    /// The kernel has no such PMU: older than 6.14, no RAPL on this CPU, or `rapl.c` not built.
    #[error("the kernel has no {POWER_CORE_PMU} PMU ({} does not exist)", .0.display())]
    Absent(PathBuf),
    /// A file of its description cannot be read.
    #[error("cannot read {}: {}", .file.display(), std::io::Error::from_raw_os_error(*.errno))]
    Unreadable {
        /// The file.
        file: PathBuf,
        /// Why.
        errno: Errno,
    },
    /// A file of its description says something this exporter does not understand.
    #[error("{}: {why}", .file.display())]
    Malformed {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

impl Pmu {
    /// Reads the description of [`POWER_CORE_PMU`] under `root` (normally
    /// [`DEFAULT_PMU_ROOT`]).
    pub fn discover(root: &Path) -> Result<Pmu, PmuError> {
        let dir = root.join(POWER_CORE_PMU);
        if !dir.is_dir() {
            return Err(PmuError::Absent(dir));
        }
        let read = |name: &str| {
            let file = dir.join(name);
            match files::read_text(&file, files::TEXT_CAP) {
                Ok(text) => Ok((text.trim().to_string(), file)),
                Err(e) => Err(PmuError::Unreadable { errno: crate::errno_of(&e), file }),
            }
        };
        let malformed = |file: PathBuf, why: String| PmuError::Malformed { file, why };

        let (text, file) = read("type")?;
        let kind =
            text.parse().map_err(|_| malformed(file, format!("{text:?} is not a number")))?;
        let (text, file) = read("cpumask")?;
        let cpus = parse_cpulist(&text).map_err(|why| malformed(file, why))?;
        let (text, file) = read(&format!("events/{ENERGY_CORE_EVENT}.unit"))?;
        if text != "Joules" {
            return Err(malformed(file, format!("unit {text:?}, not Joules")));
        }
        let (text, file) = read(&format!("events/{ENERGY_CORE_EVENT}.scale"))?;
        let esu = parse_scale(&text).map_err(|why| malformed(file, why))?;
        let (text, file) = read(&format!("events/{ENERGY_CORE_EVENT}"))?;
        let config = encode_event(&text, &file, |term| read(&format!("format/{term}")))?;
        Ok(Pmu { kind, config, esu, cpus })
    }
}

/// Parses a kernel cpulist (`0-3,8,10-11`), refusing a range backwards or beyond [`MAX_CPUS`].
pub fn parse_cpulist(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.parse::<u32>()
                .ok()
                .filter(|&n| n < MAX_CPUS)
                .ok_or_else(|| format!("{s:?} in the cpu list is not a CPU number"))
        };
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(part)?, number(part)?),
        };
        if last < first {
            return Err(format!("range {part:?} runs backwards"));
        }
        cpus.extend(first..=last);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The exponent of a scale that is an exact negative power of two (`2^-esu`), as `rapl.c`'s
/// always is; anything else is refused rather than rounded.
fn parse_scale(text: &str) -> Result<u8, String> {
    let scale: f64 = text.parse().map_err(|_| format!("scale {text:?} is not a number"))?;
    (0u8..=63)
        .find(|&esu| scale == 0.5f64.powi(i32::from(esu)))
        .ok_or_else(|| format!("scale {text:?} is not 2^-N joules"))
}

/// Encodes an event string (`event=0x01`, terms separated by commas, a bare term meaning 1)
/// read from `file` into `config`, placing each term's value in the bits its format file
/// (`config:0-7`), read by `format(term)`, names.
fn encode_event(
    text: &str,
    file: &Path,
    format: impl Fn(&str) -> Result<(String, PathBuf), PmuError>,
) -> Result<u64, PmuError> {
    let malformed = |file: &Path, why: String| PmuError::Malformed { file: file.to_owned(), why };
    let mut config = 0u64;
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (name, value) = term.split_once('=').unwrap_or((term, "1"));
        let value = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .map_err(|_| malformed(file, format!("term {term:?} has no number")))?;
        let (spec, format_file) = format(name)?;
        let bits = spec.strip_prefix("config:").ok_or_else(|| {
            malformed(&format_file, format!("term {name:?} is placed in {spec:?}, not in config"))
        })?;
        let (lo, hi) = bits.split_once('-').unwrap_or((bits, bits));
        let (lo, hi) = match (lo.parse::<u32>(), hi.parse::<u32>()) {
            (Ok(lo), Ok(hi)) if lo <= hi && hi < 64 => (lo, hi),
            _ => return Err(malformed(&format_file, format!("bad bits {bits:?}"))),
        };
        let width = hi - lo + 1;
        if width < 64 && value >> width != 0 {
            return Err(malformed(file, format!("term {term:?} does not fit {width} bits")));
        }
        config |= value << lo;
    }
    Ok(config)
}

/// This machine's `power_core`: described under `root` (normally [`DEFAULT_PMU_ROOT`]), its
/// events opened with `perf_event_open(2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsPmu {
    /// The directory listing the PMUs.
    pub root: PathBuf,
}

impl PmuLocator for SysfsPmu {
    fn locate(&self) -> Result<(Pmu, Box<dyn PerfOpener>), PmuError> {
        let pmu = Pmu::discover(&self.root)?;
        let opener = DevPerf::of(&pmu);
        Ok((pmu, Box::new(opener)))
    }
}

/// Opens the `energy-core` event of a PMU on each CPU asked, through the real
/// `perf_event_open(2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevPerf {
    /// The PMU's type number.
    pub kind: u32,
    /// The event.
    pub config: u64,
}

impl DevPerf {
    /// The opener of `pmu`'s event.
    pub fn of(pmu: &Pmu) -> DevPerf {
        DevPerf { kind: pmu.kind, config: pmu.config }
    }
}

impl PerfOpener for DevPerf {
    fn open(&self, cpu: u32) -> Result<Box<dyn PerfCounter>, Errno> {
        let mut attr = PerfEventAttr::counting(self.kind, self.config);
        Ok(Box::new(DevPerfEvent { file: File::from(sys::perf_event_open(&mut attr, cpu)?) }))
    }
}

/// One open event: each reading is one `read(2)` of its value and its enabled and running
/// times (`PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING`).
#[derive(Debug)]
struct DevPerfEvent {
    file: File,
}

impl PerfCounter for DevPerfEvent {
    fn read(&self) -> Result<PerfReading, Errno> {
        let mut buf = [[0u8; 8]; 3];
        match (&self.file).read(buf.as_flattened_mut()) {
            Ok(24) => {
                let [value, enabled_ns, running_ns] = buf.map(u64::from_ne_bytes);
                Ok(PerfReading { value, enabled_ns, running_ns })
            }
            // The kernel returns nothing for an event in error state: it no longer counts (its
            // CPU went away).
            Ok(_) => Err(libc::ENODEV),
            Err(e) => Err(crate::errno_of(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A sysfs description of `power_core` as `rapl.c` writes it, under a temporary root.
    fn sysfs(cpumask: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let pmu = root.path().join(POWER_CORE_PMU);
        fs::create_dir_all(pmu.join("events")).unwrap();
        fs::create_dir_all(pmu.join("format")).unwrap();
        fs::write(pmu.join("type"), "12\n").unwrap();
        fs::write(pmu.join("cpumask"), format!("{cpumask}\n")).unwrap();
        fs::write(pmu.join("events/energy-core"), "event=0x01\n").unwrap();
        fs::write(pmu.join("events/energy-core.scale"), "2.3283064365386962890625e-10\n").unwrap();
        fs::write(pmu.join("events/energy-core.unit"), "Joules\n").unwrap();
        fs::write(pmu.join("format/event"), "config:0-7\n").unwrap();
        root
    }

    #[test]
    fn the_pmu_is_read_as_rapl_c_describes_it() {
        let root = sysfs("0-3,8,10-11");
        let pmu = Pmu::discover(root.path()).unwrap();
        assert_eq!(pmu, Pmu { kind: 12, config: 1, esu: 32, cpus: vec![0, 1, 2, 3, 8, 10, 11] });
    }

    #[test]
    fn a_kernel_without_the_pmu_says_so() {
        let root = tempfile::tempdir().unwrap();
        let error = Pmu::discover(root.path()).unwrap_err();
        assert!(matches!(error, PmuError::Absent(_)));
        assert!(error.to_string().contains("has no power_core PMU"), "{error}");
    }

    #[test]
    fn a_description_that_is_not_rapl_c_s_is_refused_with_the_file_named() {
        for (file, text, says) in [
            ("type", "twelve", "is not a number"),
            ("cpumask", "3-1", "runs backwards"),
            ("cpumask", "0-70000", "not a CPU number"),
            ("events/energy-core.unit", "Watts", "not Joules"),
            ("events/energy-core.scale", "1e-10", "not 2^-N joules"),
            ("events/energy-core", "event=zz", "has no number"),
            ("events/energy-core", "event=0x100", "does not fit 8 bits"),
            ("format/event", "config1:0-7", "not in config"),
        ] {
            let root = sysfs("0-1");
            fs::write(root.path().join(POWER_CORE_PMU).join(file), text).unwrap();
            let error = Pmu::discover(root.path()).unwrap_err().to_string();
            assert!(error.contains(file) && error.contains(says), "{file}: {error}");
        }
    }

    #[test]
    fn a_missing_or_oversized_file_is_unreadable_not_a_hang() {
        let root = sysfs("0-1");
        let pmu = root.path().join(POWER_CORE_PMU);
        fs::remove_file(pmu.join("format/event")).unwrap();
        assert!(matches!(
            Pmu::discover(root.path()),
            Err(PmuError::Unreadable { errno: libc::ENOENT, .. })
        ));
        let root = sysfs("0-1");
        let big = "0,".repeat(files::TEXT_CAP as usize);
        fs::write(root.path().join(POWER_CORE_PMU).join("cpumask"), big).unwrap();
        assert!(matches!(Pmu::discover(root.path()), Err(PmuError::Unreadable { .. })));
        // A FIFO in place of a file is refused without blocking.
        let root = sysfs("0-1");
        let fifo = root.path().join(POWER_CORE_PMU).join("type");
        fs::remove_file(&fifo).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(matches!(Pmu::discover(root.path()), Err(PmuError::Unreadable { .. })));
    }

    #[test]
    fn event_terms_land_in_their_format_bits() {
        let formats = |term: &str| {
            Ok((if term == "umask" { "config:8-15" } else { "config:0-7" }.into(), PathBuf::new()))
        };
        let file = Path::new("events/e");
        assert_eq!(encode_event("event=0x01", file, formats), Ok(1));
        assert_eq!(encode_event("event=0x3c,umask=2", file, formats), Ok(0x23c));
        assert_eq!(encode_event("umask", file, formats), Ok(0x100));
    }

    #[test]
    #[ignore = "needs root (a system-wide event): cargo xtask test runs it"]
    fn a_system_wide_event_is_read_through_the_real_syscalls() {
        // The software PMU (type 1) and its cpu-clock event (0), which every kernel has,
        // stand in for power_core: the same open and read path, counting nanoseconds.
        let opener = DevPerf { kind: 1, config: 0 };
        let event = opener.open(0).unwrap();
        let first = event.read().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = event.read().unwrap();
        assert!(second.value > first.value, "{first:?} {second:?}");
        assert!(second.enabled_ns > first.enabled_ns, "{first:?} {second:?}");
    }
}
