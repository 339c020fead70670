//! Topology discovery: the physical cores of the machine, their socket, and the CPU number and
//! APIC id through which each one is read, from `/proc/cpuinfo` and `/sys/devices/system/cpu`.
//!
//! HSMP addresses a core by APIC id, the MSR driver by Linux CPU number, and the metrics label it
//! by (`physical_package_id`, `core_id`). These differ on multi-socket SMT machines, so all three
//! are read here once and carried together in [`Core`].

use amd_hsmp_device::{files, messages};
use amd_hsmp_proto::{Core, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead};
use std::num::ParseIntError;
use std::path::{Path, PathBuf};

/// Why the topology could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A file could not be read (other than a per-CPU topology file that vanished).
    #[error("cannot read {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A `/proc/cpuinfo` field this discovery needs holds no decimal number.
    #[error("{}:{line}: malformed `{field}` value {value:?}", .path.display())]
    CpuinfoValue {
        /// The cpuinfo file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Field name (`processor`, `apicid`, `cpu family`, `model`).
        field: &'static str,
        /// The text after the colon.
        value: String,
        /// The cause.
        #[source]
        source: ParseIntError,
    },
    /// A per-processor field appears before any `processor` line.
    #[error("{}:{line}: `{field}` line outside a processor block", .path.display())]
    CpuinfoOrphan {
        /// The cpuinfo file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Field name.
        field: &'static str,
    },
    /// The same processor number has two blocks.
    #[error("{}:{line}: processor {processor} listed twice", .path.display())]
    CpuinfoDuplicate {
        /// The cpuinfo file.
        path: PathBuf,
        /// 1-based line number of the second block.
        line: usize,
        /// The processor number.
        processor: u32,
    },
    /// Two processors claim the same APIC id, which HSMP addresses a core by: reading them
    /// would read one core twice under two labels.
    #[error("{}: processors {first} and {second} both have apicid {apic_id}", .path.display())]
    CpuinfoDuplicateApicId {
        /// The cpuinfo file.
        path: PathBuf,
        /// The shared APIC id.
        apic_id: u32,
        /// The lower-numbered processor.
        first: u32,
        /// The other processor.
        second: u32,
    },
    /// A processor block lacks a field this discovery needs.
    #[error("{}:{line}: processor {processor} has no `{field}` line", .path.display())]
    CpuinfoMissing {
        /// The cpuinfo file.
        path: PathBuf,
        /// 1-based line number of the block's `processor` line.
        line: usize,
        /// The processor number.
        processor: u32,
        /// Field name.
        field: &'static str,
    },
    /// A sysfs topology file holds no decimal number.
    #[error("{}: malformed value {content:?}", .path.display())]
    SysfsValue {
        /// The file.
        path: PathBuf,
        /// Its content, trimmed.
        content: String,
        /// The cause.
        #[source]
        source: ParseIntError,
    },
    /// The `online` CPU list is malformed.
    #[error("{}: malformed CPU list {content:?}", .path.display())]
    CpuList {
        /// The file.
        path: PathBuf,
        /// Its content, trimmed.
        content: String,
        /// The cause.
        #[source]
        source: CpuListError,
    },
    /// No online processor with readable topology files was found.
    #[error("{}: no online processor with a topology", .path.display())]
    NoProcessors {
        /// The cpuinfo file.
        path: PathBuf,
    },
}

/// Why a CPU list such as `0-3,5,7-9` could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    /// An element is not a decimal number.
    #[error("bad CPU number {0:?}")]
    Number(String, #[source] ParseIntError),
    /// A range ends before it starts.
    #[error("range {start}-{end} ends before it starts")]
    Reversed {
        /// First CPU of the range.
        start: u32,
        /// Last CPU of the range.
        end: u32,
    },
}

/// Discovers the machine's physical cores.
///
/// Every file is opened without blocking and must be a regular file (as procfs and sysfs files
/// are): a FIFO or a directory in its place is an error at once, never a hang; cpuinfo is read
/// up to [`files::CPUINFO_CAP`], the sysfs files up to [`files::TEXT_CAP`].
///
/// Reads `<procfs>/cpuinfo` (`processor`, `apicid`, `cpu family`, `model`), the online list
/// `<sysfs>/devices/system/cpu/online` (if missing, every listed processor counts as online) and,
/// per online processor, `<sysfs>/devices/system/cpu/cpuN/topology/{core_id,physical_package_id}`.
/// A processor whose topology files vanish between the two reads (it went offline) is skipped.
/// Each physical core appears once, read through its lowest-numbered online thread, with every
/// online thread that shares its (`physical_package_id`, `core_id`) in [`Core::threads`]; cores
/// are sorted by (socket, core), sockets ascending. The CPU family and model are those of the
/// lowest-numbered processor kept.
pub fn discover(procfs: &Path, sysfs: &Path) -> Result<Topology, TopologyError> {
    let cpuinfo_path = procfs.join("cpuinfo");
    // Streamed line by line: on a 2 × 192-core machine cpuinfo is over a megabyte, which
    // read whole would be most of the broker's peak memory. Opened without blocking, as a
    // regular file only, and read up to a cap.
    let cpuinfo = files::open_regular(&cpuinfo_path)
        .map_err(|source| TopologyError::Read { path: cpuinfo_path.clone(), source })?;
    let cpuinfo = io::BufReader::new(files::capped(cpuinfo, files::CPUINFO_CAP));
    let mut processors = parse_cpuinfo(&cpuinfo_path, cpuinfo)?;
    processors.sort_by_key(|p| p.processor);
    let mut apic_ids: BTreeMap<u32, u32> = BTreeMap::new();
    for p in &processors {
        if let Some(first) = apic_ids.insert(p.apicid, p.processor) {
            return Err(TopologyError::CpuinfoDuplicateApicId {
                path: cpuinfo_path,
                apic_id: p.apicid,
                first,
                second: p.processor,
            });
        }
    }

    let cpu_dir = sysfs.join("devices/system/cpu");
    let online = read_online(&cpu_dir.join("online"))?;

    let mut cores: BTreeMap<(u32, u32), Core> = BTreeMap::new();
    let mut first: Option<&Processor> = None;
    for p in &processors {
        if online.as_ref().is_some_and(|set| !set.contains(&p.processor)) {
            continue;
        }
        let topo = cpu_dir.join(format!("cpu{}/topology", p.processor));
        let Some(core) = read_sysfs_u32(&topo.join("core_id"))? else {
            continue;
        };
        let Some(socket) = read_sysfs_u32(&topo.join("physical_package_id"))? else {
            continue;
        };
        first.get_or_insert(p);
        // Processors are visited in ascending order, so the first thread seen is the lowest
        // and the threads are listed ascending.
        cores
            .entry((socket, core))
            .or_insert_with(|| Core {
                socket,
                core,
                cpu: p.processor,
                apic_id: p.apicid,
                threads: Vec::new(),
            })
            .threads
            .push(p.processor);
    }

    let Some(first) = first else {
        return Err(TopologyError::NoProcessors { path: cpuinfo_path });
    };
    let sockets: BTreeSet<u32> = cores.keys().map(|&(socket, _)| socket).collect();
    Ok(Topology {
        cpu_family: first.family,
        cpu_model: first.model,
        sockets: sockets.into_iter().collect(),
        cores: cores.into_values().collect(),
    })
}

/// The fields of one `/proc/cpuinfo` processor block that discovery needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Processor {
    processor: u32,
    apicid: u32,
    family: u32,
    model: u32,
}

/// A processor block while it is being read; fields are filled as their lines appear.
#[derive(Debug)]
struct PartialProcessor {
    line: usize,
    processor: u32,
    apicid: Option<u32>,
    family: Option<u32>,
    model: Option<u32>,
}

impl PartialProcessor {
    fn finish(self, path: &Path) -> Result<Processor, TopologyError> {
        let missing = |field| TopologyError::CpuinfoMissing {
            path: path.to_path_buf(),
            line: self.line,
            processor: self.processor,
            field,
        };
        Ok(Processor {
            processor: self.processor,
            apicid: self.apicid.ok_or_else(|| missing("apicid"))?,
            family: self.family.ok_or_else(|| missing("cpu family"))?,
            model: self.model.ok_or_else(|| missing("model"))?,
        })
    }
}

/// Parses the processor blocks of `/proc/cpuinfo` as they are read, one line in memory at a
/// time. Fields other than the four needed are ignored, so the format of unrelated lines
/// (flags, bugs, power management) does not matter.
fn parse_cpuinfo(path: &Path, mut reader: impl BufRead) -> Result<Vec<Processor>, TopologyError> {
    let mut done: Vec<Processor> = Vec::new();
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    let mut current: Option<PartialProcessor> = None;
    let mut raw = String::new();
    for line in 1.. {
        raw.clear();
        let n = reader
            .read_line(&mut raw)
            .map_err(|source| TopologyError::Read { path: path.to_path_buf(), source })?;
        if n == 0 {
            break;
        }
        let Some((key, value)) = raw.split_once(':') else {
            continue;
        };
        let field: &'static str = match key.trim() {
            "processor" => "processor",
            "apicid" => "apicid",
            "cpu family" => "cpu family",
            "model" => "model",
            _ => continue,
        };
        let value = value.trim();
        let number = value.parse::<u32>().map_err(|source| TopologyError::CpuinfoValue {
            path: path.to_path_buf(),
            line,
            field,
            value: value.to_owned(),
            source,
        })?;
        if field == "processor" {
            if let Some(block) = current.take() {
                done.push(block.finish(path)?);
            }
            if !seen.insert(number) {
                return Err(TopologyError::CpuinfoDuplicate {
                    path: path.to_path_buf(),
                    line,
                    processor: number,
                });
            }
            current = Some(PartialProcessor {
                line,
                processor: number,
                apicid: None,
                family: None,
                model: None,
            });
            continue;
        }
        let Some(block) = current.as_mut() else {
            return Err(TopologyError::CpuinfoOrphan { path: path.to_path_buf(), line, field });
        };
        match field {
            "apicid" => block.apicid = Some(number),
            "cpu family" => block.family = Some(number),
            _ => block.model = Some(number),
        }
    }
    if let Some(block) = current {
        done.push(block.finish(path)?);
    }
    Ok(done)
}

/// Reads a small sysfs or procfs file; `None` if it (or its directory) does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match files::read_text(path, files::TEXT_CAP) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Read { path: path.to_path_buf(), source }),
    }
}

/// Reads the online CPU list; `None` if the file does not exist.
fn read_online(path: &Path) -> Result<Option<BTreeSet<u32>>, TopologyError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let content = text.trim();
    parse_cpu_list(content).map(|cpus| Some(cpus.into_iter().collect())).map_err(|source| {
        TopologyError::CpuList { path: path.to_path_buf(), content: content.to_owned(), source }
    })
}

/// Reads one decimal number from a sysfs file; `None` if the file (or its directory) is gone.
fn read_sysfs_u32(path: &Path) -> Result<Option<u32>, TopologyError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let content = text.trim();
    content.parse::<u32>().map(Some).map_err(|source| TopologyError::SysfsValue {
        path: path.to_path_buf(),
        content: content.to_owned(),
        source,
    })
}

/// Parses a kernel CPU list (`0-3,5,7-9`) into ascending CPU numbers. The empty list is empty.
pub(crate) fn parse_cpu_list(text: &str) -> Result<Vec<u32>, CpuListError> {
    let number =
        |s: &str| s.trim().parse::<u32>().map_err(|e| CpuListError::Number(s.trim().to_owned(), e));
    let mut cpus = BTreeSet::new();
    for element in text.trim().split(',').filter(|e| !e.trim().is_empty()) {
        match element.split_once('-') {
            Some((start, end)) => {
                let (start, end) = (number(start)?, number(end)?);
                if end < start {
                    return Err(CpuListError::Reversed { start, end });
                }
                cpus.extend(start..=end);
            }
            None => {
                cpus.insert(number(element)?);
            }
        }
    }
    Ok(cpus.into_iter().collect())
}

/// The cores whose APIC id is wider than `GET_RAPL_CORE_COUNTER` carries (16 bits): their
/// HSMP energy is refused per item ([`ItemError::Rejected`](amd_hsmp_proto::ItemError)), never
/// read through a truncated id, and the broker names them once at start-up.
pub(crate) fn beyond_rapl_apic_ids(topo: &Topology) -> Vec<&Core> {
    topo.cores.iter().filter(|c| c.apic_id > messages::RAPL_APIC_ID_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::Duration;

    /// One logical CPU of a hand-written fixture.
    struct Cpu {
        cpu: u32,
        apic: u32,
        socket: u32,
        core: u32,
    }

    fn cpu(cpu: u32, apic: u32, socket: u32, core: u32) -> Cpu {
        Cpu { cpu, apic, socket, core }
    }

    fn block(c: &Cpu) -> String {
        format!(
            "processor\t: {}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
             model name\t: AMD EPYC 9354 32-Core Processor\nphysical id\t: {}\ncore id\t\t: {}\n\
             apicid\t\t: {}\ninitial apicid\t: {}\nflags\t\t: fpu vme de pse tsc msr\n\
             power management: ts ttp tm hwpstate\n\n",
            c.cpu, c.socket, c.core, c.apic, c.apic
        )
    }

    /// Writes cpuinfo from `cpus` and topology files for every CPU in `cpus`.
    fn tree(cpus: &[Cpu]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let text: String = cpus.iter().map(block).collect();
        write_cpuinfo(&dir, &text);
        for c in cpus {
            let topo = dir.path().join(format!("sys/devices/system/cpu/cpu{}/topology", c.cpu));
            fs::create_dir_all(&topo).unwrap();
            fs::write(topo.join("core_id"), format!("{}\n", c.core)).unwrap();
            fs::write(topo.join("physical_package_id"), format!("{}\n", c.socket)).unwrap();
        }
        dir
    }

    fn write_cpuinfo(dir: &tempfile::TempDir, text: &str) {
        fs::create_dir_all(dir.path().join("proc")).unwrap();
        fs::write(dir.path().join("proc/cpuinfo"), text).unwrap();
    }

    fn write_online(dir: &tempfile::TempDir, list: &str) {
        let cpu_dir = dir.path().join("sys/devices/system/cpu");
        fs::create_dir_all(&cpu_dir).unwrap();
        fs::write(cpu_dir.join("online"), format!("{list}\n")).unwrap();
    }

    fn run(dir: &tempfile::TempDir) -> Result<Topology, TopologyError> {
        discover(&dir.path().join("proc"), &dir.path().join("sys"))
    }

    fn core(socket: u32, core: u32, cpu: u32, apic_id: u32, threads: &[u32]) -> Core {
        Core { socket, core, cpu, apic_id, threads: threads.to_vec() }
    }

    /// Two sockets, two cores each, SMT: CPUs 0-3 are thread 0 of both sockets, 4-7 thread 1;
    /// APIC ids put the socket in bit 4 and the thread in bit 0.
    fn two_socket_smt() -> Vec<Cpu> {
        vec![
            cpu(0, 0x00, 0, 0),
            cpu(1, 0x02, 0, 1),
            cpu(2, 0x10, 1, 0),
            cpu(3, 0x12, 1, 1),
            cpu(4, 0x01, 0, 0),
            cpu(5, 0x03, 0, 1),
            cpu(6, 0x11, 1, 0),
            cpu(7, 0x13, 1, 1),
        ]
    }

    #[test]
    fn two_socket_smt_reads_each_core_once_through_its_first_thread_and_lists_both() {
        let dir = tree(&two_socket_smt());
        write_online(&dir, "0-7");
        let topo = run(&dir).unwrap();
        assert_eq!(topo.cpu_family, 25);
        assert_eq!(topo.cpu_model, 17);
        assert_eq!(topo.sockets, vec![0, 1]);
        assert_eq!(
            topo.cores,
            vec![
                core(0, 0, 0, 0x00, &[0, 4]),
                core(0, 1, 1, 0x02, &[1, 5]),
                core(1, 0, 2, 0x10, &[2, 6]),
                core(1, 1, 3, 0x12, &[3, 7]),
            ]
        );
    }

    #[test]
    fn cpuinfo_order_does_not_matter() {
        let mut cpus = two_socket_smt();
        cpus.reverse();
        let dir = tree(&cpus);
        let topo = run(&dir).unwrap();
        assert_eq!(topo.cores[0], core(0, 0, 0, 0x00, &[0, 4]));
        assert_eq!(topo.cores[3], core(1, 1, 3, 0x12, &[3, 7]));
    }

    #[test]
    fn missing_online_file_counts_every_processor_as_online() {
        let dir = tree(&two_socket_smt());
        assert_eq!(run(&dir).unwrap().cores.len(), 4);
    }

    #[test]
    fn offline_first_thread_moves_the_core_to_its_sibling_and_leaves_its_threads() {
        let dir = tree(&two_socket_smt());
        // CPU 1 (socket 0, core 1, thread 0) is offline; its sibling CPU 5 reads the core.
        write_online(&dir, "0,2-7");
        let topo = run(&dir).unwrap();
        assert_eq!(topo.cores[1], core(0, 1, 5, 0x03, &[5]));
        assert_eq!(topo.cores.len(), 4);
    }

    #[test]
    fn offline_core_is_absent() {
        let dir = tree(&two_socket_smt());
        // Both threads of socket 1 core 1 offline.
        write_online(&dir, "0-2,4-6");
        let topo = run(&dir).unwrap();
        assert_eq!(
            topo.cores.iter().map(|c| (c.socket, c.core)).collect::<Vec<_>>(),
            vec![(0, 0), (0, 1), (1, 0)]
        );
    }

    #[test]
    fn vanished_topology_dir_skips_the_cpu() {
        let dir = tree(&two_socket_smt());
        write_online(&dir, "0-7");
        fs::remove_dir_all(dir.path().join("sys/devices/system/cpu/cpu3/topology")).unwrap();
        fs::remove_file(dir.path().join("sys/devices/system/cpu/cpu0/topology/core_id")).unwrap();
        let topo = run(&dir).unwrap();
        assert_eq!(
            topo.cores,
            vec![
                core(0, 0, 4, 0x01, &[4]),
                core(0, 1, 1, 0x02, &[1, 5]),
                core(1, 0, 2, 0x10, &[2, 6]),
                core(1, 1, 7, 0x13, &[7]),
            ]
        );
    }

    /// On every fixture machine (real numbering: EPYC SMT siblings are `n` and `n + cores`),
    /// a core's threads are the kernel's `thread_siblings_list` of its first thread.
    #[test]
    fn threads_of_each_core_are_the_kernels_thread_siblings_on_every_fixture() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let mut machines = 0;
        let mut smt_cores = 0;
        for machine in fs::read_dir(&fixtures).unwrap() {
            let root = machine.unwrap().path();
            let topo = discover(&root.join("proc"), &root.join("sys")).unwrap();
            let cpu_dir = root.join("sys/devices/system/cpu");
            let online = read_online(&cpu_dir.join("online")).unwrap();
            for c in &topo.cores {
                let file = cpu_dir.join(format!("cpu{}/topology/thread_siblings_list", c.cpu));
                let siblings = parse_cpu_list(&fs::read_to_string(&file).unwrap()).unwrap();
                let expected: Vec<u32> = siblings
                    .into_iter()
                    .filter(|n| online.as_ref().is_none_or(|set| set.contains(n)))
                    .collect();
                assert_eq!(c.threads, expected, "{}: {c:?}", root.display());
                assert_eq!(c.threads.first(), Some(&c.cpu));
                smt_cores += usize::from(c.threads.len() == 2);
            }
            machines += 1;
        }
        assert!(machines >= 8, "fixtures not found under {}", fixtures.display());
        assert!(smt_cores > 0, "no fixture with SMT");
    }

    #[test]
    fn sparse_core_ids_are_kept_and_sorted() {
        let cpus =
            vec![cpu(0, 0x00, 0, 0), cpu(1, 0x02, 0, 1), cpu(2, 0x10, 0, 8), cpu(3, 0x12, 0, 9)];
        let dir = tree(&cpus);
        let topo = run(&dir).unwrap();
        assert_eq!(topo.cores.iter().map(|c| c.core).collect::<Vec<_>>(), vec![0, 1, 8, 9]);
        assert_eq!(topo.cores[2].apic_id, 0x10);
        assert_eq!(topo.sockets, vec![0]);
    }

    #[test]
    fn malformed_apicid_names_file_and_line() {
        let dir = tree(&two_socket_smt());
        let path = dir.path().join("proc/cpuinfo");
        let text = fs::read_to_string(&path).unwrap();
        // The second block's apicid line.
        let broken = text.replacen("apicid\t\t: 2\n", "apicid\t\t: 0x2\n", 1);
        assert_ne!(broken, text);
        fs::write(&path, &broken).unwrap();
        let line =
            broken.lines().position(|l| l.starts_with("apicid") && l.ends_with("0x2")).unwrap() + 1;
        let err = run(&dir).unwrap_err();
        match &err {
            TopologyError::CpuinfoValue { line: l, field, value, .. } => {
                assert_eq!((*l, *field, value.as_str()), (line, "apicid", "0x2"));
            }
            other => panic!("unexpected error {other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains(&format!("cpuinfo:{line}")), "{message}");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn missing_apicid_is_an_error() {
        let dir = tree(&two_socket_smt());
        let path = dir.path().join("proc/cpuinfo");
        let text = fs::read_to_string(&path).unwrap();
        let broken: String = text
            .lines()
            .filter(|l| !(l.starts_with("apicid") && l.ends_with(": 17")))
            .map(|l| format!("{l}\n"))
            .collect();
        fs::write(&path, broken).unwrap();
        let err = run(&dir).unwrap_err();
        assert!(
            matches!(err, TopologyError::CpuinfoMissing { processor: 6, field: "apicid", .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("processor 6 has no `apicid`"));
    }

    #[test]
    fn model_name_is_not_mistaken_for_model() {
        let dir = tempfile::tempdir().unwrap();
        write_cpuinfo(
            &dir,
            "processor\t: 0\ncpu family\t: 26\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9965\napicid\t\t: 0\n",
        );
        let topo = dir.path().join("sys/devices/system/cpu/cpu0/topology");
        fs::create_dir_all(&topo).unwrap();
        fs::write(topo.join("core_id"), "0\n").unwrap();
        fs::write(topo.join("physical_package_id"), "0\n").unwrap();
        let topo = run(&dir).unwrap();
        assert_eq!((topo.cpu_family, topo.cpu_model), (26, 17));
    }

    /// cpuinfo is parsed as it is read, not read whole first: a malformed line early in a file
    /// longer than the cap is reported as such, before the read reaches the cap. Read whole,
    /// cpuinfo would be the broker's largest allocation (over a megabyte on 2 × 192 cores).
    #[test]
    fn cpuinfo_is_parsed_as_it_streams_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut text =
            String::from("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 17\napicid\t\t: 0\n");
        text.push_str("processor\t: 1\napicid\t\t: one\n");
        let flags = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov\n";
        while (text.len() as u64) <= files::CPUINFO_CAP {
            text.push_str(flags);
        }
        write_cpuinfo(&dir, &text);
        let err = run(&dir).unwrap_err();
        assert!(
            matches!(err, TopologyError::CpuinfoValue { line: 6, field: "apicid", .. }),
            "{err:?}"
        );
    }

    /// A cpuinfo beyond the cap is refused, naming the file and the cap.
    #[test]
    fn an_oversized_cpuinfo_is_refused_naming_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        let flags = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov\n";
        while (text.len() as u64) <= files::CPUINFO_CAP {
            text.push_str(flags);
        }
        write_cpuinfo(&dir, &text);
        let err = run(&dir).unwrap_err();
        let chain = amd_hsmp_cli::ErrorChain(&err).to_string();
        assert!(chain.ends_with("proc/cpuinfo: larger than the 16 MiB limit"), "{chain}");
    }

    /// Regression (P6): a FIFO in place of cpuinfo or of a sysfs topology file held the open (or
    /// the read) for ever. Now it is refused at once, naming the file and what it is.
    #[test]
    fn a_fifo_as_cpuinfo_or_as_core_id_is_refused_at_once() {
        let fifo = |path: &Path| {
            let _ = fs::remove_file(path);
            let mode = rustix::fs::Mode::from_raw_mode(0o600);
            rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::Fifo, mode, 0)
                .unwrap();
        };
        let discover_soon = |dir: &tempfile::TempDir| {
            let (procfs, sysfs) = (dir.path().join("proc"), dir.path().join("sys"));
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(discover(&procfs, &sysfs)).unwrap());
            rx.recv_timeout(Duration::from_secs(20)).expect("discovery blocked").unwrap_err()
        };
        let dir = tree(&two_socket_smt());
        fifo(&dir.path().join("proc/cpuinfo"));
        let chain = amd_hsmp_cli::ErrorChain(&discover_soon(&dir)).to_string();
        assert!(chain.ends_with("proc/cpuinfo: not a regular file but a FIFO"), "{chain}");
        let dir = tree(&two_socket_smt());
        fifo(&dir.path().join("sys/devices/system/cpu/cpu0/topology/core_id"));
        let chain = amd_hsmp_cli::ErrorChain(&discover_soon(&dir)).to_string();
        assert!(chain.ends_with("cpu0/topology/core_id: not a regular file but a FIFO"), "{chain}");
    }

    #[test]
    fn field_before_any_processor_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_cpuinfo(&dir, "apicid\t: 0\nprocessor\t: 0\n");
        let err = run(&dir).unwrap_err();
        assert!(matches!(err, TopologyError::CpuinfoOrphan { line: 1, .. }), "{err:?}");
    }

    #[test]
    fn duplicate_processor_is_an_error() {
        let mut cpus = two_socket_smt();
        cpus.push(cpu(3, 0x12, 1, 1));
        let dir = tree(&cpus);
        let err = run(&dir).unwrap_err();
        assert!(matches!(err, TopologyError::CpuinfoDuplicate { processor: 3, .. }), "{err:?}");
    }

    #[test]
    fn two_processors_with_one_apic_id_are_an_error() {
        // Found with the topology fuzz property "APIC ids are unique": processors sharing an
        // APIC id were accepted, so two cores could be read as one under two labels.
        let mut cpus = two_socket_smt();
        cpus[5].apic = 0x02;
        let dir = tree(&cpus);
        let err = run(&dir).unwrap_err();
        assert!(
            matches!(
                err,
                TopologyError::CpuinfoDuplicateApicId { apic_id: 0x02, first: 1, second: 5, .. }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn malformed_core_id_names_the_file() {
        let dir = tree(&two_socket_smt());
        let file = dir.path().join("sys/devices/system/cpu/cpu2/topology/core_id");
        fs::write(&file, "two\n").unwrap();
        let err = run(&dir).unwrap_err();
        assert!(matches!(err, TopologyError::SysfsValue { .. }), "{err:?}");
        assert!(err.to_string().contains(&file.display().to_string()));
    }

    #[test]
    fn malformed_online_list_is_an_error() {
        let dir = tree(&two_socket_smt());
        write_online(&dir, "0-3,x");
        let err = run(&dir).unwrap_err();
        assert!(matches!(err, TopologyError::CpuList { .. }), "{err:?}");
        assert!(err.to_string().contains("online"));
    }

    #[test]
    fn missing_cpuinfo_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = run(&dir).unwrap_err();
        assert!(matches!(err, TopologyError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("cpuinfo"));
    }

    #[test]
    fn no_processor_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_cpuinfo(&dir, "");
        assert!(matches!(run(&dir).unwrap_err(), TopologyError::NoProcessors { .. }));
        // Processors listed, but none online.
        let dir = tree(&two_socket_smt());
        write_online(&dir, "8-9");
        assert!(matches!(run(&dir).unwrap_err(), TopologyError::NoProcessors { .. }));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,5,7-9\n").unwrap(), vec![0, 1, 2, 3, 5, 7, 8, 9]);
        assert_eq!(parse_cpu_list("4").unwrap(), vec![4]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("5-3").unwrap_err(), CpuListError::Reversed { start: 5, end: 3 });
        assert!(matches!(parse_cpu_list("1-"), Err(CpuListError::Number(..))));
        assert!(matches!(parse_cpu_list("a"), Err(CpuListError::Number(..))));
    }

    #[test]
    fn cores_beyond_sixteen_bit_apic_ids_are_named_and_wide_ones_within_are_not() {
        let core = |apic_id| Core { socket: 0, core: 0, cpu: 0, apic_id, threads: vec![0] };
        let topo = Topology {
            cpu_family: 0x1A,
            cpu_model: 0x50,
            sockets: vec![0],
            cores: vec![core(0x1FE), core(0xFFFF), core(0x1_0000)],
        };
        let named: Vec<u32> = beyond_rapl_apic_ids(&topo).iter().map(|c| c.apic_id).collect();
        assert_eq!(named, [0x1_0000]);
    }
}
