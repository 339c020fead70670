//! Simulated machines: the built-in EPYC profiles, the plain-data [`MachineSpec`] behind them,
//! and a generator for the `/proc` and `/sys` fixture trees that the broker's topology
//! discovery reads (the end-to-end crate checks that it finds what [`MachineSpec::topology`]
//! says).
//!
//! Linux numbers the CPUs of an EPYC system the way its firmware lists them in the ACPI MADT:
//! thread 0 of every core of socket 0, then thread 0 of socket 1, then thread 1 of socket 0,
//! then of socket 1. APIC ids carry the socket in their high bits and the core slot and thread
//! in their low bits, with gaps where a CCD slot or core is disabled, so on a multi-socket SMT
//! machine a core's APIC id is not its CPU number.

use amd_hsmp_device::Message;
use amd_hsmp_proto::{Core, Families, Family, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::io;
use std::path::Path;
use std::str::FromStr;

/// A built-in simulated machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// EPYC 7002 (Rome, family 17h): no HSMP device, energy only from the MSRs.
    Rome1p,
    /// EPYC 7003 (Milan, family 19h model 01h), HSMP protocol 4, no RAPL messages.
    Milan1p,
    /// Two EPYC 9004 (Genoa, family 19h model 11h) with half the cores of each CCD disabled:
    /// sparse core ids. HSMP protocol 5, no RAPL messages.
    Genoa2p,
    /// EPYC 97x4 (Bergamo, family 19h model A0h), HSMP protocol 6, no RAPL messages.
    Bergamo1p,
    /// EPYC 8004 (Siena, family 19h model A0h like Bergamo), HSMP protocol 6, no RAPL messages.
    Siena1p,
    /// Two EPYC 9965 (Turin dense, family 1Ah model 11h), 192 cores each with SMT (768 CPUs),
    /// HSMP protocol 7 with the RAPL messages.
    Turin2p,
    /// Two Venice-like parts (Zen 6, family 1Ah model 50h, a model this release does not know),
    /// 128 cores each with SMT (512 CPUs, socket 1's APIC ids above 255), HSMP protocol 7 with
    /// the RAPL messages, the device described in ACPI and bound by `hsmp_acpi` only.
    Venice2p,
}

/// A profile name that is not one of [`Profile::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown simulator profile {name:?}, expected one of: {}", Profile::names().join(", "))]
pub struct UnknownProfile {
    /// The name given.
    pub name: String,
}

impl Profile {
    /// Every profile, in the order of their names' documentation.
    pub const ALL: [Profile; 7] = [
        Profile::Milan1p,
        Profile::Genoa2p,
        Profile::Bergamo1p,
        Profile::Siena1p,
        Profile::Turin2p,
        Profile::Venice2p,
        Profile::Rome1p,
    ];

    /// The name accepted by `--simulate`, e.g. `turin-2p`.
    pub const fn name(self) -> &'static str {
        match self {
            Profile::Rome1p => "rome-1p",
            Profile::Milan1p => "milan-1p",
            Profile::Genoa2p => "genoa-2p",
            Profile::Bergamo1p => "bergamo-1p",
            Profile::Siena1p => "siena-1p",
            Profile::Turin2p => "turin-2p",
            Profile::Venice2p => "venice-2p",
        }
    }

    /// The names of [`Profile::ALL`].
    pub fn names() -> Vec<&'static str> {
        Profile::ALL.iter().map(|p| p.name()).collect()
    }

    /// The machine this profile describes.
    pub fn spec(self) -> MachineSpec {
        match self {
            Profile::Rome1p => MachineSpec {
                cpu_family: 0x17,
                cpu_model: 0x31,
                stepping: 0,
                model_name: "AMD EPYC 7502P 32-Core Processor".into(),
                sockets: 1,
                // 4 CCDs of two 4-core CCXs.
                core_ids: ccd_core_ids(4, 8, 8),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: None,
                rapl_messages: false,
                smu_fw_version: 0x0026_5D00,
                boost_mhz: 3350,
                esu: 16,
                // EPYC 7502P: 180 W default TDP (cTDP 165-200 W).
                tdp_w: 180,
                acpi_hsmp: false,
            },
            Profile::Milan1p => MachineSpec {
                cpu_family: 0x19,
                cpu_model: 0x01,
                stepping: 1,
                model_name: "AMD EPYC 7713P 64-Core Processor".into(),
                sockets: 1,
                core_ids: ccd_core_ids(8, 8, 8),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: Some(4),
                rapl_messages: false,
                smu_fw_version: 0x002D_4C00,
                boost_mhz: 3675,
                esu: 16,
                // EPYC 7713P: 225 W default TDP (cTDP 225-240 W).
                tdp_w: 225,
                acpi_hsmp: false,
            },
            Profile::Genoa2p => MachineSpec {
                cpu_family: 0x19,
                cpu_model: 0x11,
                stepping: 1,
                model_name: "AMD EPYC 9354 32-Core Processor".into(),
                sockets: 2,
                // 8 CCDs with 4 of their 8 cores enabled: core ids 0-3, 8-11, ..., 56-59.
                core_ids: ccd_core_ids(8, 8, 4),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: Some(5),
                rapl_messages: false,
                smu_fw_version: 0x0004_5E2E,
                boost_mhz: 3800,
                esu: 16,
                // EPYC 9354: 280 W default TDP (cTDP 240-300 W).
                tdp_w: 280,
                acpi_hsmp: false,
            },
            Profile::Bergamo1p => MachineSpec {
                cpu_family: 0x19,
                cpu_model: 0xA0,
                stepping: 2,
                model_name: "AMD EPYC 9754 128-Core Processor".into(),
                sockets: 1,
                core_ids: ccd_core_ids(8, 16, 16),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: Some(6),
                rapl_messages: false,
                smu_fw_version: 0x0004_6A1F,
                boost_mhz: 3100,
                esu: 16,
                // EPYC 9754: 360 W default TDP (cTDP 320-400 W).
                tdp_w: 360,
                acpi_hsmp: false,
            },
            Profile::Siena1p => MachineSpec {
                cpu_family: 0x19,
                cpu_model: 0xA0,
                stepping: 2,
                model_name: "AMD EPYC 8534P 64-Core Processor".into(),
                sockets: 1,
                core_ids: ccd_core_ids(4, 16, 16),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: Some(6),
                rapl_messages: false,
                smu_fw_version: 0x0004_6C10,
                boost_mhz: 3100,
                esu: 16,
                // EPYC 8534P: 200 W default TDP (cTDP 155-225 W).
                tdp_w: 200,
                acpi_hsmp: false,
            },
            Profile::Turin2p => MachineSpec {
                cpu_family: 0x1A,
                cpu_model: 0x11,
                stepping: 0,
                model_name: "AMD EPYC 9965 192-Core Processor".into(),
                sockets: 2,
                core_ids: ccd_core_ids(12, 16, 16),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: Some(7),
                rapl_messages: true,
                smu_fw_version: 0x0005_5A2B,
                boost_mhz: 3700,
                esu: 16,
                // EPYC 9965: 500 W default TDP (cTDP 450-500 W).
                tdp_w: 500,
                acpi_hsmp: false,
            },
            Profile::Venice2p => MachineSpec {
                cpu_family: 0x1A,
                cpu_model: 0x50,
                stepping: 0,
                model_name: "AMD EPYC Zen 6 128-Core Processor".into(),
                sockets: 2,
                // 8 CCDs of 16 cores: 256 threads per socket, APIC ids 0-255 on socket 0 and
                // 256-511 on socket 1.
                core_ids: ccd_core_ids(8, 16, 16),
                smt: true,
                offline_cpus: Vec::new(),
                hsmp_protocol: Some(7),
                rapl_messages: true,
                smu_fw_version: 0x0006_0100,
                boost_mhz: 4000,
                esu: 16,
                // A guess within the range of a 128-core part; only the live model uses it.
                tdp_w: 400,
                acpi_hsmp: true,
            },
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Profile, UnknownProfile> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownProfile { name: s.to_owned() })
    }
}

/// The core ids of one socket built from `ccds` CCDs of `slots_per_ccd` core slots each, of
/// which the first `enabled_per_ccd` are enabled: CCD `c` holds core ids
/// `c × slots_per_ccd .. c × slots_per_ccd + enabled_per_ccd`.
pub fn ccd_core_ids(ccds: u32, slots_per_ccd: u32, enabled_per_ccd: u32) -> Vec<u32> {
    (0..ccds)
        .flat_map(|c| (0..enabled_per_ccd.min(slots_per_ccd)).map(move |i| c * slots_per_ccd + i))
        .collect()
}

/// The HSMP protocol version from which the firmware answers `GET_SOCKET_FREQ_LIMIT` and
/// `GET_CCLK_CORE_LIMIT` (Genoa's; AMD's E-SMI library lists both from its protocol 5 table
/// on). Older firmware answers them as invalid messages (`ENOMSG`).
pub const FREQ_LIMIT_PROTOCOL: u32 = 5;

/// A simulated machine as plain data, so tests can build special machines (SMT off, a CPU
/// offline, an unusual ESU) from a profile's spec or from scratch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    /// `cpu family` (0x17 Zen 2, 0x19 Zen 3/4, 0x1A Zen 5).
    pub cpu_family: u32,
    /// `model`.
    pub cpu_model: u32,
    /// `stepping`.
    pub stepping: u32,
    /// `model name`.
    pub model_name: String,
    /// Number of sockets; socket ids are `0..sockets`.
    pub sockets: u32,
    /// The sysfs `core_id` of every enabled core of one socket (every socket has the same
    /// ones); gaps are disabled cores or CCDs. The APIC id is derived from it.
    pub core_ids: Vec<u32>,
    /// Two threads per core.
    pub smt: bool,
    /// Linux CPU numbers that are offline: absent from cpuinfo, without topology directory,
    /// not in the `online` list, and without an MSR device.
    pub offline_cpus: Vec<u32>,
    /// HSMP protocol version the firmware reports; `None` means no `/dev/hsmp` at all.
    pub hsmp_protocol: Option<u32>,
    /// Whether the firmware implements `GET_RAPL_UNITS` and `GET_RAPL_CORE_COUNTER`.
    pub rapl_messages: bool,
    /// What `GET_SMU_VER` answers.
    pub smu_fw_version: u32,
    /// The highest boost limit of a core, in MHz.
    pub boost_mhz: u32,
    /// Energy status unit: one counter step is 2^-esu joules.
    pub esu: u8,
    /// Default TDP of one socket's SKU, W; the live model keeps the cores' power within it.
    pub tdp_w: u32,
    /// The firmware describes HSMP as ACPI device `AMDI0097` (one per socket), bound by
    /// `hsmp_acpi`: the fixture tree has `sys/bus/acpi/devices/AMDI0097:NN` and
    /// `sys/module/hsmp_acpi`.
    pub acpi_hsmp: bool,
}

/// One logical CPU of a [`MachineSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    /// Linux CPU number.
    pub cpu: u32,
    /// Socket (`physical_package_id`).
    pub socket: u32,
    /// sysfs `core_id`.
    pub core: u32,
    /// Thread within the core (0 or 1).
    pub thread: u32,
    /// APIC id.
    pub apic_id: u32,
    /// Whether Linux has the CPU online.
    pub online: bool,
}

impl MachineSpec {
    /// Whether the firmware answers the frequency-limit messages (from
    /// [`FREQ_LIMIT_PROTOCOL`] on).
    pub fn freq_limit_messages(&self) -> bool {
        self.hsmp_protocol >= Some(FREQ_LIMIT_PROTOCOL)
    }

    /// Whether the firmware answers `family`'s message: boost limit and PROCHOT wherever there
    /// is HSMP, the frequency limits from [`FREQ_LIMIT_PROTOCOL`] on, the energy counters where
    /// the firmware has the RAPL messages. As [`crate::Firmware::answer`] answers them.
    pub fn answers(&self, family: Family) -> bool {
        self.hsmp_protocol.is_some()
            && match family {
                Family::BoostLimit | Family::Prochot => true,
                Family::FrequencyLimit | Family::CoreFrequencyLimit => self.freq_limit_messages(),
                Family::CoreEnergy | Family::PackageEnergy => self.rapl_messages,
            }
    }

    /// The message that reads one item of `family`.
    pub fn message(family: Family) -> Message {
        match family {
            Family::CoreEnergy => Message::GetRaplCoreCounter,
            Family::BoostLimit => Message::GetBoostLimit,
            Family::Prochot => Message::GetProcHot,
            Family::FrequencyLimit => Message::GetSocketFreqLimit,
            Family::CoreFrequencyLimit => Message::GetCclkCoreLimit,
            Family::PackageEnergy => Message::GetRaplPackageCounter,
        }
    }

    /// The mailbox messages a steady sample of `asked` sends to this machine: one per item of
    /// each family its firmware answers ([`Families::messages`]). A family it does not answer
    /// costs one refused message per socket at the first sample and none after (the broker
    /// remembers), and core energy without the RAPL messages comes from perf or the MSRs.
    pub fn messages_per_sample(&self, asked: Families) -> usize {
        let topology = self.topology();
        asked.intersection(&self.answered()).messages(topology.cores.len(), topology.sockets.len())
    }

    /// The families whose messages the firmware answers ([`MachineSpec::answers`]).
    pub fn answered(&self) -> Families {
        Families::of(&Family::ALL.into_iter().filter(|&f| self.answers(f)).collect::<Vec<_>>())
    }

    /// Threads per core.
    pub fn threads_per_core(&self) -> u32 {
        if self.smt { 2 } else { 1 }
    }

    /// Number of logical CPUs, online or not.
    pub fn cpu_count(&self) -> u32 {
        self.sockets * self.core_ids.len() as u32 * self.threads_per_core()
    }

    /// The bit at which the socket starts in an APIC id: wide enough for every core slot and
    /// thread of one socket, so the APIC ids of two sockets never collide.
    pub fn apic_socket_shift(&self) -> u32 {
        let max_local = self.core_ids.iter().max().copied().unwrap_or(0) * self.threads_per_core()
            + (self.threads_per_core() - 1);
        (u32::BITS - max_local.leading_zeros()).max(1)
    }

    /// APIC id of `thread` of core `core` on `socket`.
    pub fn apic_id(&self, socket: u32, core: u32, thread: u32) -> u32 {
        let local = if self.smt { core << 1 | thread } else { core };
        socket << self.apic_socket_shift() | local
    }

    /// Every logical CPU in Linux CPU-number order: thread 0 of socket 0's cores, thread 0 of
    /// socket 1's cores, ..., then thread 1 in the same order.
    pub fn cpus(&self) -> Vec<Cpu> {
        let offline: BTreeSet<u32> = self.offline_cpus.iter().copied().collect();
        let mut cpus = Vec::with_capacity(self.cpu_count() as usize);
        for thread in 0..self.threads_per_core() {
            for socket in 0..self.sockets {
                for &core in &self.core_ids {
                    let cpu = cpus.len() as u32;
                    cpus.push(Cpu {
                        cpu,
                        socket,
                        core,
                        thread,
                        apic_id: self.apic_id(socket, core, thread),
                        online: !offline.contains(&cpu),
                    });
                }
            }
        }
        cpus
    }

    /// What the broker's topology discovery returns for the tree
    /// [`MachineSpec::write_fixture`] writes: one entry per core with an online thread, read through its lowest-numbered
    /// online thread, sorted by (socket, core).
    pub fn topology(&self) -> Topology {
        let mut cores: BTreeMap<(u32, u32), Core> = BTreeMap::new();
        for c in self.cpus().into_iter().filter(|c| c.online) {
            cores
                .entry((c.socket, c.core))
                .or_insert_with(|| Core {
                    socket: c.socket,
                    core: c.core,
                    cpu: c.cpu,
                    apic_id: c.apic_id,
                    threads: Vec::new(),
                })
                .threads
                .push(c.cpu);
        }
        let sockets: BTreeSet<u32> = cores.keys().map(|&(s, _)| s).collect();
        Topology {
            cpu_family: self.cpu_family,
            cpu_model: self.cpu_model,
            sockets: sockets.into_iter().collect(),
            cores: cores.into_values().collect(),
        }
    }

    /// Writes `root/proc/cpuinfo` and `root/sys/devices/system/cpu/...` (`online`, `possible`,
    /// `present`, `cpuN/online`, `cpuN/topology/{core_id,physical_package_id,
    /// thread_siblings_list,core_siblings_list}`) as Linux shows this machine. Offline CPUs are
    /// absent from cpuinfo and the `online` list and have no topology directory.
    pub fn write_fixture(&self, root: &Path) -> io::Result<()> {
        let cpus = self.cpus();
        let online: Vec<&Cpu> = cpus.iter().filter(|c| c.online).collect();

        let proc_dir = root.join("proc");
        std::fs::create_dir_all(&proc_dir)?;
        std::fs::write(proc_dir.join("cpuinfo"), self.cpuinfo(&cpus))?;

        let cpu_dir = root.join("sys/devices/system/cpu");
        std::fs::create_dir_all(&cpu_dir)?;
        let all: Vec<u32> = cpus.iter().map(|c| c.cpu).collect();
        let online_numbers: Vec<u32> = online.iter().map(|c| c.cpu).collect();
        std::fs::write(cpu_dir.join("possible"), format!("{}\n", cpu_list(&all)))?;
        std::fs::write(cpu_dir.join("present"), format!("{}\n", cpu_list(&all)))?;
        std::fs::write(cpu_dir.join("online"), format!("{}\n", cpu_list(&online_numbers)))?;

        for c in &cpus {
            let dir = cpu_dir.join(format!("cpu{}", c.cpu));
            std::fs::create_dir_all(&dir)?;
            // The boot CPU cannot be taken offline and has no `online` file.
            if c.cpu != 0 {
                std::fs::write(dir.join("online"), if c.online { "1\n" } else { "0\n" })?;
            }
            if !c.online {
                continue;
            }
            let thread_siblings: Vec<u32> = online
                .iter()
                .filter(|o| o.socket == c.socket && o.core == c.core)
                .map(|o| o.cpu)
                .collect();
            let core_siblings: Vec<u32> =
                online.iter().filter(|o| o.socket == c.socket).map(|o| o.cpu).collect();
            let topo = dir.join("topology");
            std::fs::create_dir_all(&topo)?;
            std::fs::write(topo.join("core_id"), format!("{}\n", c.core))?;
            std::fs::write(topo.join("physical_package_id"), format!("{}\n", c.socket))?;
            std::fs::write(
                topo.join("thread_siblings_list"),
                format!("{}\n", cpu_list(&thread_siblings)),
            )?;
            std::fs::write(
                topo.join("core_siblings_list"),
                format!("{}\n", cpu_list(&core_siblings)),
            )?;
        }
        if self.acpi_hsmp {
            for socket in 0..self.sockets {
                let dev = root.join(format!("sys/bus/acpi/devices/AMDI0097:{socket:02}"));
                std::fs::create_dir_all(&dev)?;
                std::fs::write(dev.join("hid"), "AMDI0097\n")?;
                std::fs::write(dev.join("status"), "15\n")?;
            }
            std::fs::create_dir_all(root.join("sys/module/hsmp_acpi"))?;
            std::fs::write(root.join("sys/module/hsmp_acpi/initstate"), "live\n")?;
        }
        Ok(())
    }

    /// `/proc/cpuinfo` for the online CPUs of `cpus`.
    fn cpuinfo(&self, cpus: &[Cpu]) -> String {
        let online: Vec<&Cpu> = cpus.iter().filter(|c| c.online).collect();
        let mut text = String::new();
        for c in &online {
            let siblings = online.iter().filter(|o| o.socket == c.socket).count();
            let cores = online
                .iter()
                .filter(|o| o.socket == c.socket)
                .map(|o| o.core)
                .collect::<BTreeSet<u32>>()
                .len();
            let mhz = f64::from(self.boost_mhz) * 0.6;
            // `write!` to a String cannot fail.
            let _ = write!(
                text,
                "processor\t: {cpu}\n\
                 vendor_id\t: AuthenticAMD\n\
                 cpu family\t: {family}\n\
                 model\t\t: {model}\n\
                 model name\t: {name}\n\
                 stepping\t: {stepping}\n\
                 microcode\t: 0x{family:02x}{model:02x}{stepping:02x}21\n\
                 cpu MHz\t\t: {mhz:.3}\n\
                 cache size\t: 1024 KB\n\
                 physical id\t: {socket}\n\
                 siblings\t: {siblings}\n\
                 core id\t\t: {core}\n\
                 cpu cores\t: {cores}\n\
                 apicid\t\t: {apic}\n\
                 initial apicid\t: {apic}\n\
                 fpu\t\t: yes\n\
                 fpu_exception\t: yes\n\
                 cpuid level\t: 16\n\
                 wp\t\t: yes\n\
                 flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat \
                 pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm \
                 constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid aperfmperf rapl pni \
                 monitor ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c \
                 rdrand lahf_lm cmp_legacy svm extapic cr8_legacy abm sse4a misalignsse \
                 topoext perfctr_core perfctr_nb cpb hw_pstate ssbd ibrs ibpb stibp vmmcall \
                 fsgsbase bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt \
                 xsavec xgetbv1 clzero irperf xsaveerptr rdpru wbnoinvd amd_ppin arat npt \
                 nrip_save umip rdpid overflow_recov succor smca\n\
                 bugs\t\t: sysret_ss_attrs spectre_v1 spectre_v2 spec_store_bypass\n\
                 bogomips\t: {bogomips:.2}\n\
                 TLB size\t: 3584 4K pages\n\
                 clflush size\t: 64\n\
                 cache_alignment\t: 64\n\
                 address sizes\t: 52 bits physical, 57 bits virtual\n\
                 power management: ts ttp tm hwpstate cpb eff_freq_ro [13] [14]\n\n",
                cpu = c.cpu,
                family = self.cpu_family,
                model = self.cpu_model,
                name = self.model_name,
                stepping = self.stepping,
                socket = c.socket,
                core = c.core,
                apic = c.apic_id,
                bogomips = mhz * 2.0,
            );
        }
        text
    }
}

/// Formats CPU numbers as the kernel does (`0-3,5,7-9`). `cpus` must be ascending.
fn cpu_list(cpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            end += 1;
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turin_has_384_cores_on_2_sockets_and_768_cpus() {
        let spec = Profile::Turin2p.spec();
        assert_eq!(spec.cpu_count(), 768);
        let topo = spec.topology();
        assert_eq!(topo.cores.len(), 384);
        assert_eq!(topo.sockets, vec![0, 1]);
        assert_eq!((topo.cpu_family, topo.cpu_model), (0x1A, 0x11));
    }

    #[test]
    fn apic_ids_differ_from_cpu_numbers_on_multi_socket_smt() {
        for profile in [Profile::Genoa2p, Profile::Turin2p] {
            let topo = profile.spec().topology();
            let differing = topo.cores.iter().filter(|c| c.apic_id != c.cpu).count();
            assert!(differing > topo.cores.len() / 2, "{profile}");
            let apics: BTreeSet<u32> = topo.cores.iter().map(|c| c.apic_id).collect();
            assert_eq!(apics.len(), topo.cores.len(), "{profile}: APIC ids collide");
        }
    }

    #[test]
    fn cpus_are_numbered_the_epyc_way() {
        let spec = Profile::Genoa2p.spec();
        let cpus = spec.cpus();
        // 32 cores per socket: CPUs 0-31 are socket 0 thread 0, 32-63 socket 1 thread 0,
        // 64-95 socket 0 thread 1.
        assert_eq!((cpus[0].socket, cpus[0].thread), (0, 0));
        assert_eq!((cpus[32].socket, cpus[32].core, cpus[32].thread), (1, 0, 0));
        assert_eq!((cpus[64].socket, cpus[64].core, cpus[64].thread), (0, 0, 1));
        // Core 8 is the first core of the second CCD; its APIC id keeps the CCD gap.
        assert_eq!((cpus[4].core, cpus[4].apic_id), (8, 16));
        assert_eq!(cpus[32].apic_id, 1 << spec.apic_socket_shift());
        assert_eq!(cpus[64].apic_id, 1);
    }

    #[test]
    fn genoa_core_ids_are_sparse() {
        let topo = Profile::Genoa2p.spec().topology();
        let socket0: Vec<u32> =
            topo.cores.iter().filter(|c| c.socket == 0).map(|c| c.core).take(6).collect();
        assert_eq!(socket0, vec![0, 1, 2, 3, 8, 9]);
    }

    #[test]
    fn profile_names_round_trip_and_unknown_names_list_the_valid_ones() {
        for profile in Profile::ALL {
            assert_eq!(profile.to_string().parse::<Profile>(), Ok(profile));
        }
        let err = "naples-1p".parse::<Profile>().unwrap_err();
        let message = err.to_string();
        assert!(message.contains("naples-1p"), "{message}");
        for name in ["milan-1p", "genoa-2p", "bergamo-1p", "siena-1p", "turin-2p", "rome-1p"] {
            assert!(message.contains(name), "{message}");
        }
    }

    #[test]
    fn only_zen_5_and_later_have_rapl_messages_and_only_rome_lacks_hsmp() {
        for profile in Profile::ALL {
            let spec = profile.spec();
            assert_eq!(spec.rapl_messages, spec.cpu_family >= 0x1A, "{profile}");
            assert_eq!(spec.hsmp_protocol.is_none(), profile == Profile::Rome1p, "{profile}");
            assert_eq!(spec.acpi_hsmp, profile == Profile::Venice2p, "{profile}");
        }
    }

    #[test]
    fn the_venice_like_profile_has_apic_ids_above_255_and_binds_through_acpi() {
        let spec = Profile::Venice2p.spec();
        assert_eq!((spec.cpu_family, spec.sockets, spec.cpu_count()), (0x1A, 2, 512));
        assert!((0x50..=0x5F).contains(&spec.cpu_model));
        let max = spec.cpus().iter().map(|c| c.apic_id).max().unwrap();
        assert_eq!(max, 511);
        assert!(spec.acpi_hsmp);
    }

    #[test]
    fn frequency_limits_are_answered_from_genoa_on() {
        let answering: Vec<Profile> =
            Profile::ALL.into_iter().filter(|p| p.spec().freq_limit_messages()).collect();
        assert_eq!(
            answering,
            [
                Profile::Genoa2p,
                Profile::Bergamo1p,
                Profile::Siena1p,
                Profile::Turin2p,
                Profile::Venice2p
            ]
        );
    }

    #[test]
    fn every_profile_has_its_sku_s_tdp() {
        let tdp: Vec<(Profile, u32)> = Profile::ALL.iter().map(|&p| (p, p.spec().tdp_w)).collect();
        assert_eq!(
            tdp,
            vec![
                (Profile::Milan1p, 225),
                (Profile::Genoa2p, 280),
                (Profile::Bergamo1p, 360),
                (Profile::Siena1p, 200),
                (Profile::Turin2p, 500),
                (Profile::Venice2p, 400),
                (Profile::Rome1p, 180),
            ]
        );
    }

    #[test]
    fn cpu_list_formatting() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 5, 7, 8, 9]), "0-3,5,7-9");
        assert_eq!(cpu_list(&[4]), "4");
        assert_eq!(cpu_list(&[]), "");
    }
}
