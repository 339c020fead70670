//! `amd-hsmp-check`: the troubleshooting table as a program an operator runs on the machine
//! itself, with the package and no build tools. A binary of its own, so that the daemon, which
//! holds capabilities at start-up, links none of it; it takes the broker's flags, to check the
//! service as configured. [`main`] is its entry point (and `amd-hsmp-sim-broker --check`'s).
//!
//! Each precondition of a scrape is one [`Line`]: a verdict, what was found and, where it fails,
//! the fix. `FAIL` means a scrape cannot have that part of its telemetry; `WARN` is worth
//! knowing but costs nothing (a world-readable `/dev/hsmp`, SELinux permissive, no energy source
//! on a part without RAPL messages); `skip` follows from an earlier failure. The exit code is 0
//! only when no line fails.
//!
//! The checks read the same files and devices the broker reads (`--path.procfs`,
//! `--path.sysfs`, `--hsmp.device`, `--msr.device-root`), so they are tested on fixture trees and
//! the simulator; what needs the operating system (accounts, SELinux labels) is passed in.

use crate::counters::{self, MAX_CORE_WATTS};
use crate::hints::{self, MSR_BOOLEAN};
use crate::msr::MsrEnergy;
use crate::topology;
use amd_hsmp_device::{
    self as device, HsmpOpener, HsmpTransport, MsrOpener, PmuLocator, files, messages,
};
use amd_hsmp_proto::{ItemError, Message as _, PROTOCOL_VERSION, Reply, Request, Topology};
use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The group the packaged udev rule gives `/dev/hsmp` (the broker's user's group).
pub(crate) const BROKER_GROUP: &str = "amd-hsmp-broker";
/// The exporter's user, which must reach the broker's socket.
pub(crate) const EXPORTER_USER: &str = "amd-hsmp-exporter";
/// The group the packaged socket unit gives the socket (`SocketGroup=`).
pub(crate) const EXPORTER_GROUP: &str = "amd-hsmp-exporter";
/// How long `--check` waits between its two passes of per-core energy reads (each core's rate
/// is over the time between its two reads: see `energy_over`).
pub(crate) const ENERGY_WINDOW: Duration = Duration::from_secs(2);
/// A mailbox message that takes longer than this is slow: the `cores` line then stops at the
/// first slow socket's first core, instead of one message per core (a firmware answers in
/// about a millisecond, and the driver gives up after 100 to 500 ms, by kernel version).
pub(crate) const SLOW_MESSAGE: Duration = Duration::from_millis(500);
/// Boost limits outside this range (MHz) are not a setting any EPYC part accepts; the upper
/// bound is the part's own `cpuinfo_max_freq` where cpufreq reports it.
const BOOST_FLOOR_MHZ: u32 = 400;
const BOOST_CEILING_MHZ: u32 = 6000;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Holds.
    Pass,
    /// Worth knowing; costs a scrape nothing.
    Warn,
    /// A scrape misses what this check is about.
    Fail,
    /// Not checked: an earlier check failed, or it does not apply.
    Skip,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Verdict::Pass => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "skip",
        })
    }
}

/// One precondition: its name, verdict, what was found, and the fix when it does not hold.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    /// Short name, e.g. `driver`.
    pub name: &'static str,
    /// The outcome.
    pub verdict: Verdict,
    /// What was found.
    pub found: String,
    /// What to do, for `FAIL` and `WARN`.
    pub fix: Option<String>,
}

impl Line {
    fn pass(name: &'static str, found: impl Into<String>) -> Line {
        Line { name, verdict: Verdict::Pass, found: found.into(), fix: None }
    }

    fn fail(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Line {
        Line { name, verdict: Verdict::Fail, found: found.into(), fix: Some(fix.into()) }
    }

    fn warn(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Line {
        Line { name, verdict: Verdict::Warn, found: found.into(), fix: Some(fix.into()) }
    }

    fn skip(name: &'static str, why: impl Into<String>) -> Line {
        Line { name, verdict: Verdict::Skip, found: why.into(), fix: None }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4}  {:<9} {}", self.verdict, self.name, self.found)?;
        if let Some(fix) = &self.fix {
            write!(f, "; fix: {fix}")?;
        }
        Ok(())
    }
}

/// The line `--check` ends with when it has not finished within `timeout`, `after` being the
/// name of the last line it printed.
pub(crate) fn deadline(timeout: Duration, after: Option<&str>) -> Line {
    let step = match after {
        Some(name) => format!("the check after `{name}`"),
        None => "the first check (the CPU topology)".into(),
    };
    Line::fail(
        "deadline",
        format!(
            "the checks did not finish within {} s: {step} is still waiting for a device or a file \
             that does not answer",
            timeout.as_secs()
        ),
        "look at the input that check reads (--path.procfs, --path.sysfs, --hsmp.device, \
         --msr.device-root, the socket) and at dmesg; raise --check.timeout only for a slow \
         machine",
    )
}

/// Whether a scrape can work: no line failed.
pub(crate) fn passed(lines: &[Line]) -> bool {
    lines.iter().all(|l| l.verdict != Verdict::Fail)
}

/// A local account as the checks need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Account {
    /// The uid.
    pub uid: u32,
    /// Every gid the account's processes hold (primary and supplementary).
    pub gids: Vec<u32>,
}

/// The accounts the package creates, as resolved on this machine (`None`: no such account).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Accounts {
    /// The gid of [`BROKER_GROUP`].
    pub broker_gid: Option<u32>,
    /// [`EXPORTER_USER`].
    pub exporter: Option<Account>,
}

/// Owner, group, mode and type of a file, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    /// Whether it is a character device.
    pub char_device: bool,
    /// Whether it is a socket.
    pub socket: bool,
    /// Whether a FUSE filesystem serves it (a user-space stand-in for the driver, such as the
    /// test suite's fake device), whatever type it claims.
    pub fuse: bool,
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

impl Node {
    /// `stat` of `path`, following symlinks; `None` when it does not exist.
    pub(crate) fn of(path: &Path) -> Option<Node> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Node {
            char_device: meta.file_type().is_char_device(),
            socket: meta.file_type().is_socket(),
            fuse: rustix::fs::statfs(path).is_ok_and(|fs| fs.f_type == libc::FUSE_SUPER_MAGIC),
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
        })
    }

    /// The permission bits `account` gets (`rwx` as 4, 2, 1), as the kernel picks them.
    fn bits_for(&self, account: &Account) -> u32 {
        if account.uid == 0 {
            7
        } else if account.uid == self.uid {
            (self.mode >> 6) & 7
        } else if account.gids.contains(&self.gid) {
            (self.mode >> 3) & 7
        } else {
            self.mode & 7
        }
    }
}

/// SELinux as selinuxfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selinux {
    /// No selinuxfs: SELinux is not enabled.
    Disabled,
    /// selinuxfs's `enforce` exists but cannot be read as the file it must be (a FIFO, a
    /// directory, too long).
    Unreadable {
        /// The file and why: `<path>: <error>`.
        why: String,
    },
    /// Enabled.
    Enabled {
        /// Enforcing (else permissive).
        enforcing: bool,
        /// The current value of [`MSR_BOOLEAN`], `None` when it does not exist (the
        /// `amd_hsmp` module is not loaded).
        msr_boolean: Option<bool>,
    },
}

impl Selinux {
    /// Reads `sysfs/fs/selinux`, each file without blocking and only as a regular file.
    pub(crate) fn read(sysfs: &Path) -> Selinux {
        let fs = sysfs.join("fs/selinux");
        let path = fs.join("enforce");
        let enforce = match files::read_text(&path, files::TEXT_CAP) {
            Ok(enforce) => enforce,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Selinux::Disabled,
            Err(e) => return Selinux::Unreadable { why: format!("{}: {e}", path.display()) },
        };
        // "1 1": the current value, then the pending one.
        let msr_boolean = files::read_text(&fs.join("booleans").join(MSR_BOOLEAN), files::TEXT_CAP)
            .ok()
            .map(|v| v.split_whitespace().next() == Some("1"));
        Selinux::Enabled { enforcing: enforce.trim() == "1", msr_boolean }
    }
}

/// The SELinux label of `path` (`security.selinux`), if it has one.
pub(crate) fn selinux_label(path: &Path) -> Option<String> {
    let mut buf = [0u8; 256];
    let n = rustix::fs::getxattr(path, "security.selinux", &mut buf).ok()?;
    let label = buf.get(..n)?;
    let label = label.strip_suffix(&[0]).unwrap_or(label);
    Some(String::from_utf8_lossy(label).into_owned())
}

/// The type field of an SELinux context `user:role:type:level`.
fn label_type(label: &str) -> &str {
    label.split(':').nth(2).unwrap_or(label)
}

/// What the checks look at.
#[allow(missing_debug_implementations)] // Holds closures.
pub(crate) struct Inputs<'a> {
    /// `--path.procfs`.
    pub procfs: &'a Path,
    /// `--path.sysfs`.
    pub sysfs: &'a Path,
    /// `--hsmp.device`.
    pub hsmp_device: &'a Path,
    /// Opens the HSMP device (the real node, or the simulator's).
    pub hsmp: &'a dyn HsmpOpener,
    /// With `--collector.core-energy.msr-fallback`: opens the MSR devices.
    pub msr: Option<&'a dyn MsrOpener>,
    /// With `perf` in `--collector.core-energy.sources`: finds the `power_core` PMU.
    pub perf: Option<&'a dyn PmuLocator>,
    /// `--msr.device-root`.
    pub msr_root: &'a Path,
    /// The configuration directory (`/etc`), where the MSR drop-in is installed.
    pub etc: &'a Path,
    /// The broker's socket.
    pub socket: &'a Path,
    /// The package's accounts on this machine.
    pub accounts: &'a Accounts,
    /// SELinux labels of files (`None`: unlabelled or SELinux off).
    pub labels: &'a dyn Fn(&Path) -> Option<String>,
    /// Waits while energy accumulates and returns how long that was.
    pub energy_wait: &'a mut dyn FnMut() -> Duration,
    /// The clock that stamps each energy read ([`Instant::now`]; a test's own clock, so that
    /// its rates do not depend on the machine's speed).
    pub energy_clock: &'a mut dyn FnMut() -> Instant,
    /// With `--simulate`: the simulated machine's topology; its device answers, and there is no
    /// node, driver or label to check.
    pub simulated: Option<Topology>,
}

/// Runs every check in order; later ones are skipped where an earlier failure decides them.
#[cfg(test)]
pub(crate) fn run(inputs: &mut Inputs<'_>) -> Vec<Line> {
    run_streaming(inputs, &mut |_| {})
}

/// The lines so far, each handed to the caller as soon as it is decided.
struct Report<'e> {
    lines: Vec<Line>,
    emit: &'e mut dyn FnMut(&Line),
}

impl Report<'_> {
    fn push(&mut self, line: Line) {
        (self.emit)(&line);
        self.lines.push(line);
    }

    fn any_failed(&self) -> bool {
        self.lines.iter().any(|l| l.verdict == Verdict::Fail)
    }
}

/// [`run`], handing each line to `emit` as soon as it is decided, so that an operator sees the
/// checks done so far even if a later one takes long (a slow mailbox, the energy window).
pub(crate) fn run_streaming(inputs: &mut Inputs<'_>, emit: &mut dyn FnMut(&Line)) -> Vec<Line> {
    let mut report = Report { lines: Vec::new(), emit };
    checks(inputs, &mut report);
    report.lines
}

fn checks(inputs: &mut Inputs<'_>, report: &mut Report<'_>) {
    let discovered = match &inputs.simulated {
        Some(topo) => Ok(topo.clone()),
        None => topology::discover(inputs.procfs, inputs.sysfs),
    };
    let topo = match discovered {
        Ok(t) => t,
        Err(e) => {
            report.push(Line::fail(
                "cpu",
                format!("cannot read the CPU topology: {}", amd_hsmp_cli::ErrorChain(&e)),
                "check --path.procfs and --path.sysfs (a container needs the host's /proc and /sys)",
            ));
            return;
        }
    };
    let vendor =
        if inputs.simulated.is_some() { "AuthenticAMD".into() } else { vendor(inputs.procfs) };
    report.push(cpu(&vendor, topo.cpu_family, topo.cpu_model));
    let zen2 = topo.cpu_family == 0x17;
    let node = Node::of(inputs.hsmp_device);
    if inputs.simulated.is_some() {
        report.push(Line::skip("driver", "--simulate: the built-in simulator answers"));
    } else {
        report.push(driver(inputs.sysfs, zen2, node.is_some()));
        report.push(device_node(inputs.hsmp_device, node, inputs.accounts, zen2));
        let selinux = Selinux::read(inputs.sysfs);
        report.push(selinux_state(&selinux, inputs.msr.is_some()));
        report.push(labels(&selinux, inputs));
    }
    let transport = match inputs.hsmp.open() {
        Ok(t) => Some(t),
        Err(errno) => {
            let (found, fix) = open_failure(inputs.hsmp_device, errno);
            let done = report.any_failed();
            report.push(if done && errno != libc::EACCES && errno != libc::EPERM {
                Line::skip("protocol", found)
            } else {
                Line::fail("protocol", found, fix)
            });
            None
        }
    };
    // Why energy is not read through HSMP, when the device answered in part.
    let mut no_hsmp_energy = None;
    let mut rapl = false;
    if let Some(t) = &transport {
        let (line, probe) = protocol(t.as_ref(), &topo);
        report.push(line);
        rapl = probe.rapl;
        match probe.silent_socket {
            None => {
                let (line, limits, slow) = cores(t.as_ref(), &topo);
                report.push(line);
                report.push(boost_range(&limits, max_boost_mhz(inputs.sysfs)));
                if slow {
                    let why = "the mailbox is too slow to read every core (see cores)";
                    report.push(Line::skip("frequency-limit", why));
                    no_hsmp_energy = Some(why.into());
                } else {
                    report.push(frequency_limit(t.as_ref(), &topo));
                }
            }
            Some(socket) => {
                let why = format!("socket {socket} does not answer (see protocol)");
                report.push(Line::skip("cores", why.clone()));
                report.push(Line::skip("boost", why.clone()));
                report.push(Line::skip("frequency-limit", why.clone()));
                no_hsmp_energy = Some(why);
            }
        }
    } else {
        report.push(Line::skip("cores", "no device"));
        report.push(Line::skip("boost", "no device"));
        report.push(Line::skip("frequency-limit", "no device"));
    }
    let perf = match inputs.perf {
        None => None,
        Some(_) if rapl && no_hsmp_energy.is_none() => {
            report.push(Line::skip("perf", "not needed: energy comes from HSMP RAPL"));
            None
        }
        Some(locator) => {
            let etc = inputs.simulated.is_none().then_some(inputs.etc);
            let (line, energy) = perf(locator, &topo, inputs.procfs, etc);
            report.push(line);
            energy
        }
    };
    if let Some(energy) = perf {
        let read = |i| energy.read(i);
        let (wait, clock) = (&mut *inputs.energy_wait, &mut *inputs.energy_clock);
        report.push(energy_over("perf power_core", topo.cores.len(), read, wait, clock));
    } else if let Some(opener) = inputs.msr {
        report.push(msr_setup(inputs.sysfs, inputs.msr_root, inputs.etc));
        report.push(energy_msr(&topo, opener, inputs.energy_wait, inputs.energy_clock));
    } else if let Some(why) = no_hsmp_energy {
        report.push(Line::skip("energy", format!("not read through HSMP: {why}")));
    } else if rapl {
        if let Some(t) = &transport {
            report.push(energy_hsmp(t.as_ref(), &topo, inputs.energy_wait, inputs.energy_clock));
        }
    } else {
        report.push(Line::warn(
            "energy",
            "no source: the firmware does not answer the HSMP RAPL messages (or there is no device), \
             the kernel's perf counter cannot be used (see perf) and no MSR fallback; \
             amd_hsmp_core_energy_joules_total is not exported",
            "for per-core energy on Rome, Milan, Genoa, Bergamo or Siena: the perf counter \
             (Linux 6.14 or later, see perf), else the MSR fallback (operator's guide, \"MSR \
             fallback\") and run the check with --collector.core-energy.msr-fallback",
        ));
    }
    let node = Node::of(inputs.socket);
    report.push(match &inputs.simulated {
        Some(_) => simulated_socket(inputs.socket, node),
        None => socket(inputs.socket, node, inputs.accounts),
    });
}

/// `vendor_id` of the first processor in cpuinfo.
fn vendor(procfs: &Path) -> String {
    files::read_text(&procfs.join("cpuinfo"), files::CPUINFO_CAP)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let (key, value) = l.split_once(':')?;
                (key.trim() == "vendor_id").then(|| value.trim().to_string())
            })
        })
        .unwrap_or_default()
}

/// The EPYC parts this release was tested on, by family and model range, with their names.
const KNOWN_PARTS: [(u32, std::ops::RangeInclusive<u32>, &str); 4] = [
    (0x19, 0x00..=0x0F, "Zen 3: Milan"),
    (0x19, 0x10..=0x1F, "Zen 4: Genoa"),
    (0x19, 0xA0..=0xAF, "Zen 4c: Bergamo, Siena"),
    (0x1A, 0x00..=0x1F, "Zen 5: Turin"),
];

/// What the broker does on a part it does not know: the same probes as on every part.
const TRIES: &str = "the broker gates nothing on family, model or protocol version: it asks \
                     GET_PROTO_VER, then every family, and omits what the firmware answers \
                     ENOMSG for (see protocol)";

/// The CPU. HSMP exists on AMD families 0x19 (Zen 3, Zen 4) and 0x1A (Zen 5); a family or
/// model this release does not know (a newer EPYC) is a warning, never a failure: nothing is
/// gated on it, the later checks probe the device as on any part.
pub(crate) fn cpu(vendor: &str, family: u32, model: u32) -> Line {
    let part = format!("{vendor} family {family:#x} model {model:#x}");
    if vendor != "AuthenticAMD" {
        return Line::fail(
            "cpu",
            format!("{part}: not an AMD CPU, there is no HSMP"),
            "none: amd-hsmp-exporter reads AMD EPYC telemetry only",
        );
    }
    if let Some((_, _, name)) =
        KNOWN_PARTS.iter().find(|(f, models, _)| *f == family && models.contains(&model))
    {
        return Line::pass("cpu", format!("{part} ({name})"));
    }
    match family {
        0x17 => Line::fail(
            "cpu",
            format!(
                "{part} (Zen 2: Rome): the amd_hsmp driver does not support family 0x17, so \
                 /dev/hsmp can never exist here"
            ),
            "none for boost limit and PROCHOT; per-core energy comes from the MSR fallback \
             (--collector.core-energy.msr-fallback, operator's guide \"MSR fallback\")",
        ),
        0x19 | 0x1A => Line::warn(
            "cpu",
            format!("{part}: a model of an HSMP family this release does not know; {TRIES}"),
            "none needed if the lines below pass; else report the part and this output",
        ),
        f if f > 0x1A => Line::warn(
            "cpu",
            format!("{part}: a family newer than this release knows (0x19, 0x1A); {TRIES}"),
            "none needed if the lines below pass; else report the part and this output",
        ),
        _ => Line::fail(
            "cpu",
            format!("{part}: no HSMP on this family (it began with Zen 3, family 0x19)"),
            "none: HSMP exists on EPYC Milan and later",
        ),
    }
}

/// The ACPI id of the HSMP device (`ACPI_HSMP_DEVICE_HID` of the kernel's driver).
pub(crate) const ACPI_HSMP_HID: &str = "AMDI0097";

/// What the kernel's `amd_hsmp` says at load where the firmware describes HSMP in ACPI (its
/// `hsmp_plt_init`): the platform driver then steps aside for `hsmp_acpi`.
pub(crate) const ACPI_KERNEL_HINT: &str = "HSMP is supported through ACPI on this platform, \
                                           please use hsmp_acpi.ko";

/// Whether sysfs lists the ACPI HSMP device (`bus/acpi/devices/AMDI0097:NN`, one per socket).
fn acpi_device(sysfs: &Path) -> bool {
    std::fs::read_dir(sysfs.join("bus/acpi/devices")).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name().to_str().is_some_and(|n| n.starts_with(&format!("{ACPI_HSMP_HID}:")))
        })
    })
}

/// The driver: `amd_hsmp` (platform device) or `hsmp_acpi` (ACPI-described) loaded.
///
/// The kernel's own hint is quoted, not read: where the firmware has the ACPI device and
/// `hsmp_acpi` is not bound, `amd_hsmp` logs [`ACPI_KERNEL_HINT`] and creates no node. The
/// check states it from the ACPI device in sysfs rather than reading the kernel log, which
/// needs `/dev/kmsg` or the journal (inputs outside `--path.*`, and a ring that may have
/// wrapped since boot).
pub(crate) fn driver(sysfs: &Path, zen2: bool, node_exists: bool) -> Line {
    if zen2 {
        return Line::skip("driver", "no HSMP driver for family 0x17");
    }
    let loaded: Vec<&str> = ["amd_hsmp", "hsmp_acpi"]
        .into_iter()
        .filter(|m| sysfs.join("module").join(m).is_dir())
        .collect();
    let acpi = acpi_device(sysfs);
    if acpi && !node_exists && !loaded.contains(&"hsmp_acpi") {
        let have = if loaded.is_empty() {
            "no HSMP driver is loaded".to_string()
        } else {
            format!("only {} is loaded", loaded.join(", "))
        };
        return Line::fail(
            "driver",
            format!(
                "the firmware describes HSMP as ACPI device {ACPI_HSMP_HID}, {have} and there is \
                 no /dev/hsmp; the kernel's hint (dmesg): \"{ACPI_KERNEL_HINT}\""
            ),
            "modprobe hsmp_acpi (a kernel built without CONFIG_AMD_HSMP_ACPI has none: use one \
             with it), then systemctl restart amd-hsmp-broker.service",
        );
    }
    let through = if acpi { format!(" (ACPI device {ACPI_HSMP_HID})") } else { String::new() };
    match (loaded.is_empty(), node_exists) {
        (false, _) => Line::pass("driver", format!("{} loaded{through}", loaded.join(", "))),
        (true, true) => {
            Line::pass("driver", format!("built into the kernel (/dev/hsmp exists){through}"))
        }
        (true, false) => Line::fail(
            "driver",
            "neither amd_hsmp nor hsmp_acpi is loaded",
            "modprobe amd_hsmp (hsmp_acpi where the firmware describes HSMP in ACPI), then \
             systemctl restart amd-hsmp-broker.service; at boot it is loaded by \
             /usr/lib/modules-load.d/amd-hsmp.conf",
        ),
    }
}

/// `/dev/hsmp`: a character device the broker's group may read (the packaged udev rule makes it
/// `root:amd-hsmp-broker 0640`).
pub(crate) fn device_node(
    path: &Path,
    node: Option<Node>,
    accounts: &Accounts,
    zen2: bool,
) -> Line {
    let p = path.display();
    let Some(node) = node else {
        if zen2 {
            return Line::skip("device", format!("no {p} on family 0x17"));
        }
        return Line::fail(
            "device",
            format!("{p} does not exist"),
            "if the driver is loaded: enable HSMP in the BIOS (often under NBIO / SMU common \
             options); else modprobe amd_hsmp",
        );
    };
    if !node.char_device && !node.fuse {
        return Line::fail(
            "device",
            format!("{p} is not a character device"),
            "remove it and reload the driver (modprobe -r amd_hsmp; modprobe amd_hsmp)",
        );
    }
    let Some(gid) = accounts.broker_gid else {
        return Line::fail(
            "device",
            format!("no group {BROKER_GROUP}"),
            "systemd-sysusers (the package's /usr/lib/sysusers.d/amd-hsmp-exporter.conf)",
        );
    };
    let found = format!("{p} uid {} gid {} mode {:04o}", node.uid, node.gid, node.mode);
    let trigger = "udevadm trigger --action=change --subsystem-match=misc \
                   --sysname-match=hsmp_cdev (the packaged rule \
                   /usr/lib/udev/rules.d/60-amd-hsmp.rules makes it root:amd-hsmp-broker 0640)";
    if node.gid == gid && node.mode & 0o040 != 0 && node.mode & 0o007 == 0 {
        if node.fuse && !node.char_device {
            // The broker's ioctl works on it (the test suite's fake device is one), but it is
            // not the driver's node: said, never passed as one.
            return Line::warn(
                "device",
                format!(
                    "{found}: readable by group {BROKER_GROUP} only, but a file served by a FUSE \
                     filesystem, not the driver's character device"
                ),
                "none for a stand-in on purpose (a test's fake device); else unmount it and load \
                 the driver (modprobe amd_hsmp)",
            );
        }
        Line::pass("device", format!("{found}: readable by group {BROKER_GROUP} only"))
    } else if node.mode & 0o004 != 0 {
        Line::warn(
            "device",
            format!("{found}: readable by every user, the udev rule is not applied"),
            trigger,
        )
    } else {
        Line::fail("device", format!("{found}: group {BROKER_GROUP} cannot read it"), trigger)
    }
}

/// SELinux mode, the policy module and the MSR boolean.
pub(crate) fn selinux_state(selinux: &Selinux, msr_fallback: bool) -> Line {
    let (enforcing, msr_boolean) = match selinux {
        Selinux::Disabled => return Line::pass("selinux", "disabled: nothing to check"),
        Selinux::Unreadable { why } => {
            return Line::fail(
                "selinux",
                format!("cannot read the SELinux mode: {why}"),
                "check --path.sysfs: selinuxfs (sys/fs/selinux) must be the kernel's",
            );
        }
        Selinux::Enabled { enforcing, msr_boolean } => (enforcing, msr_boolean),
    };
    let mode = if *enforcing { "enforcing" } else { "permissive" };
    let Some(boolean) = msr_boolean else {
        let found = format!("{mode}, the amd_hsmp policy module is not loaded");
        let fix = "install amd-hsmp-exporter-selinux (dnf install amd-hsmp-exporter-selinux), or \
                   build and load selinux/amd_hsmp.te (operator's guide, \"SELinux\")";
        // Without the module both binaries run in an unconfined domain: nothing is refused.
        return Line::warn("selinux", found, fix);
    };
    let state = if *boolean { "on" } else { "off" };
    let found = format!("{mode}, module amd_hsmp loaded, {MSR_BOOLEAN} {state}");
    if msr_fallback && !boolean {
        Line::fail(
            "selinux",
            format!("{found}: the MSR fallback needs it on"),
            format!("setsebool -P {MSR_BOOLEAN} on"),
        )
    } else if !enforcing {
        Line::warn("selinux", format!("{found}: denials are logged, not enforced"), "setenforce 1")
    } else {
        Line::pass("selinux", found)
    }
}

/// The labels the policy relies on: the device, the broker's executable and the socket.
fn labels(selinux: &Selinux, inputs: &Inputs<'_>) -> Line {
    let Selinux::Enabled { msr_boolean: Some(_), .. } = selinux else {
        return Line::skip("labels", "the amd_hsmp policy module is not loaded");
    };
    let mut wanted = vec![
        (inputs.hsmp_device.to_path_buf(), "amd_hsmp_device_t"),
        (broker_executable(inputs.procfs), "amd_hsmp_broker_exec_t"),
    ];
    if let Some(dir) = inputs.socket.parent() {
        wanted.push((dir.to_path_buf(), "amd_hsmp_runtime_t"));
    }
    wanted.push((inputs.socket.to_path_buf(), "amd_hsmp_runtime_t"));
    label_line(&wanted, inputs.labels)
}

/// The broker's executable: `amd-hsmp-broker` beside this program (`/proc/self/exe`), which the
/// packages install in one directory. Not this program, which the policy does not label.
fn broker_executable(procfs: &Path) -> PathBuf {
    let exe = std::fs::read_link(procfs.join("self/exe")).unwrap_or_default();
    exe.with_file_name(crate::cli::BROKER_PROGRAM)
}

/// `labels` over `(path, wanted type)`; paths that do not exist are left to the other checks.
pub(crate) fn label_line(
    wanted: &[(PathBuf, &'static str)],
    labels: &dyn Fn(&Path) -> Option<String>,
) -> Line {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (path, want) in wanted {
        if !path.exists() {
            continue;
        }
        match labels(path) {
            Some(label) if label_type(&label) == *want => {
                good.push(format!("{} {want}", path.display()));
            }
            other => bad.push((path, want, other.unwrap_or_else(|| "no label".into()))),
        }
    }
    if bad.is_empty() {
        return Line::pass("labels", good.join(", "));
    }
    let found: Vec<String> =
        bad.iter().map(|(p, want, got)| format!("{} is {got}, not {want}", p.display())).collect();
    let paths: Vec<String> = bad.iter().map(|(p, _, _)| p.display().to_string()).collect();
    Line::fail("labels", found.join("; "), format!("restorecon -RFv {}", paths.join(" ")))
}

/// Why opening the device failed, and the fix.
pub(crate) fn open_failure(path: &Path, errno: device::Errno) -> (String, String) {
    let p = path.display();
    match errno {
        libc::ENOENT | libc::ENODEV | libc::ENXIO => (
            format!("cannot open {p}: no device"),
            "modprobe amd_hsmp, or enable HSMP in the BIOS".into(),
        ),
        libc::EACCES | libc::EPERM => (
            format!("cannot open {p}: {}", std::io::Error::from_raw_os_error(errno)),
            hints::DEVICE_DENIED.into(),
        ),
        other => (
            format!("cannot open {p}: {}", std::io::Error::from_raw_os_error(other)),
            "reload the driver (modprobe -r amd_hsmp; modprobe amd_hsmp) and look at dmesg".into(),
        ),
    }
}

/// What the protocol check found out for the checks after it.
#[derive(Debug, Clone, Copy, Default)]
struct Probe {
    /// The RAPL messages answer on the first socket.
    rapl: bool,
    /// The first socket that did not answer `GET_PROTO_VER` (or the topology has none).
    silent_socket: Option<u32>,
}

/// `GET_PROTO_VER` on every socket, and which families answer on the first one.
fn protocol(t: &dyn HsmpTransport, topo: &Topology) -> (Line, Probe) {
    let mut versions = Vec::new();
    for &socket in &topo.sockets {
        match messages::proto_version(t, socket) {
            Ok(v) => versions.push(v),
            Err(e) => {
                return (
                    Line::fail(
                        "protocol",
                        format!("socket {socket} does not answer GET_PROTO_VER: {e}"),
                        "reload the driver and look at dmesg; if it persists, update the BIOS \
                         (SMU firmware)",
                    ),
                    Probe { rapl: false, silent_socket: Some(socket) },
                );
            }
        }
    }
    let Some(&version) = versions.first() else {
        let line = Line::fail("protocol", "no socket in the topology", "report it");
        return (line, Probe { rapl: false, silent_socket: Some(0) });
    };
    let first = topo.sockets.first().copied().unwrap_or(0);
    let apic = topo.cores.first().map_or(0, |c| c.apic_id);
    let mut families = Vec::new();
    let mut missing = Vec::new();
    let mut note = |name: &'static str, answered: Result<(), ItemError>| match answered {
        Ok(()) => families.push(name),
        Err(e) => missing.push(format!("{name} ({e})")),
    };
    note("boost limit", messages::boost_limit_mhz(t, first, apic).map(drop));
    note("PROCHOT", messages::prochot(t, first).map(drop));
    let rapl = messages::rapl_esu(t, first).map(drop);
    let has_rapl = rapl.is_ok();
    note("RAPL energy", rapl);
    note("package energy", messages::rapl_package_counter(t, first).map(drop));
    let mut found = format!(
        "HSMP protocol {version} on {} socket(s); answering: {}",
        versions.len(),
        families.join(", ")
    );
    if !missing.is_empty() {
        found.push_str(&format!("; not answering: {}", missing.join(", ")));
    }
    if versions.iter().any(|&v| v != version) {
        return (
            Line::warn(
                "protocol",
                format!("{found}; sockets differ: {versions:?}"),
                "update the BIOS so both sockets run the same SMU firmware",
            ),
            Probe { rapl: has_rapl, silent_socket: None },
        );
    }
    (Line::pass("protocol", found), Probe { rapl: has_rapl, silent_socket: None })
}

/// Whether every socket answers `GET_SOCKET_FREQ_LIMIT`, and what holds each one down: a probe
/// of the message, not of the protocol version, since the firmware says which messages it has.
fn frequency_limit(t: &dyn HsmpTransport, topo: &Topology) -> Line {
    let mut found = Vec::new();
    for &socket in &topo.sockets {
        match messages::socket_freq_limit(t, socket) {
            Ok(limit) => {
                let limit = amd_hsmp_proto::FrequencyLimit::from(limit);
                let by: Vec<&str> = limit.limiters().map(|r| r.name()).collect();
                let by = if by.is_empty() { "no limiter".to_owned() } else { by.join(", ") };
                found.push(format!("socket {socket} {} MHz ({by})", limit.mhz));
            }
            Err(ItemError::Unsupported) => {
                return Line::warn(
                    "frequency-limit",
                    "GET_SOCKET_FREQ_LIMIT is not answered (firmware without the message, as \
                     before HSMP protocol 5); amd_hsmp_socket_frequency_limit_* are not exported",
                    "nothing to do unless a BIOS update for this platform adds the message",
                );
            }
            Err(e) => {
                return Line::fail(
                    "frequency-limit",
                    format!("socket {socket} does not answer GET_SOCKET_FREQ_LIMIT: {e}"),
                    "reload the driver and look at dmesg",
                );
            }
        }
    }
    Line::pass("frequency-limit", format!("GET_SOCKET_FREQ_LIMIT answered: {}", found.join("; ")))
}

/// `GET_BOOST_LIMIT` of every core by its APIC id on its socket. Returns the line, the limits
/// read (MHz), and whether the mailbox is too slow to be asked once per core: if the first
/// message to any socket takes longer than [`SLOW_MESSAGE`], no other core is asked (one
/// bounded probe a socket, not one slow message per core) and the line names that socket.
fn cores(t: &dyn HsmpTransport, topo: &Topology) -> (Line, Vec<(usize, u32)>, bool) {
    let mut limits = Vec::new();
    let mut failed = Vec::new();
    let mut timed: Vec<u32> = Vec::with_capacity(topo.sockets.len());
    let total = topo.cores.len();
    for (index, core) in topo.cores.iter().enumerate() {
        let started = Instant::now();
        match messages::boost_limit_mhz(t, core.socket, core.apic_id) {
            Ok(mhz) => limits.push((index, mhz)),
            Err(e) => failed.push(format!(
                "socket {} core {} (APIC id {}): {e}",
                core.socket, core.core, core.apic_id
            )),
        }
        let took = started.elapsed();
        if timed.contains(&core.socket) {
            continue;
        }
        timed.push(core.socket);
        let untouched = total - index - 1;
        if untouched > 0 && took > SLOW_MESSAGE {
            let line = Line::fail(
                "cores",
                format!(
                    "socket {}'s first GET_BOOST_LIMIT (core {}) took {:.1} s, over the {} ms a \
                     message may take: the other {untouched} cores were not asked (a scrape of \
                     this machine would need {:.0} s)",
                    core.socket,
                    core.core,
                    took.as_secs_f64(),
                    SLOW_MESSAGE.as_millis(),
                    took.as_secs_f64() * (2 * total + topo.sockets.len()) as f64
                        / topo.sockets.len().max(1) as f64,
                ),
                "the SMU mailbox answers slowly: look at dmesg, reload the driver (modprobe -r \
                 amd_hsmp; modprobe amd_hsmp); if it persists, update the BIOS (SMU firmware)",
            );
            return (line, limits, true);
        }
    }
    if failed.is_empty() {
        return (
            Line::pass(
                "cores",
                format!(
                    "all {total} cores answer by APIC id on their socket ({} socket(s))",
                    topo.sockets.len()
                ),
            ),
            limits,
            false,
        );
    }
    let shown: Vec<&str> = failed.iter().take(4).map(String::as_str).collect();
    let more =
        if failed.len() > 4 { format!(" and {} more", failed.len() - 4) } else { String::new() };
    (
        Line::fail(
            "cores",
            format!("{} of {total} cores do not answer: {}{more}", failed.len(), shown.join("; ")),
            "their series are missing from every scrape; check that every core is online and \
             that the BIOS's APIC layout matches /proc/cpuinfo, then update the BIOS",
        ),
        limits,
        false,
    )
}

/// The part's highest frequency from cpufreq (`cpuinfo_max_freq`, kHz), in MHz.
fn max_boost_mhz(sysfs: &Path) -> Option<u32> {
    let path = sysfs.join("devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    let text = files::read_text(&path, files::TEXT_CAP).ok()?;
    text.trim().parse::<u32>().ok().map(|khz| khz / 1000).filter(|&m| m > 0)
}

/// Every boost limit within [`BOOST_FLOOR_MHZ`] and the part's maximum.
pub(crate) fn boost_range(limits: &[(usize, u32)], part_max_mhz: Option<u32>) -> Line {
    if limits.is_empty() {
        return Line::skip("boost", "no core answered");
    }
    let (ceiling, whose) = match part_max_mhz {
        Some(max) => (max, "the part's cpuinfo_max_freq"),
        None => (BOOST_CEILING_MHZ, "no cpufreq: any EPYC's"),
    };
    let lo = limits.iter().map(|l| l.1).min().unwrap_or(0);
    let hi = limits.iter().map(|l| l.1).max().unwrap_or(0);
    let outside: Vec<String> = limits
        .iter()
        .filter(|(_, mhz)| *mhz < BOOST_FLOOR_MHZ || *mhz > ceiling)
        .map(|(i, mhz)| format!("core index {i}: {mhz} MHz"))
        .collect();
    let found = format!(
        "boost limits {lo} to {hi} MHz, range {BOOST_FLOOR_MHZ} to {ceiling} MHz ({whose})"
    );
    if outside.is_empty() {
        Line::pass("boost", found)
    } else {
        Line::fail(
            "boost",
            format!("{found}; outside it: {}", outside.join(", ")),
            "a limit was set out of range (HSMP SET_BOOST_LIMIT, e.g. by a tuning tool): set it \
             back, e.g. with the BIOS defaults",
        )
    }
}

/// Judges per-core energy over `intervals`, the time between each core's two reads: every
/// core must advance, at no more than the most a core can draw ([`MAX_CORE_WATTS`], the bound
/// the restart rules of the perf and MSR sources use too).
pub(crate) fn energy_rates(
    source: &str,
    before: &[Result<f64, ItemError>],
    after: &[Result<f64, ItemError>],
    intervals: &[Duration],
) -> Line {
    if intervals.is_empty() || intervals.iter().any(Duration::is_zero) {
        return Line::skip("energy", "no time passed");
    }
    // The line names the mean interval.
    let seconds = intervals.iter().map(Duration::as_secs_f64).sum::<f64>() / intervals.len() as f64;
    let mut watts = Vec::new();
    let mut unread = Vec::new();
    let mut stuck = Vec::new();
    let mut implausible = Vec::new();
    for (index, ((b, a), interval)) in before.iter().zip(after).zip(intervals).enumerate() {
        match (b, a) {
            (Ok(b), Ok(a)) => {
                let w = (a - b) / interval.as_secs_f64();
                if w <= 0.0 {
                    stuck.push(index);
                } else if w > MAX_CORE_WATTS {
                    implausible.push(format!("core index {index}: {w:.1} W"));
                } else {
                    watts.push(w);
                }
            }
            (Err(e), _) | (_, Err(e)) => unread.push(format!("core index {index}: {e}")),
        }
    }
    let total: f64 = watts.iter().sum();
    let found = format!(
        "{source}: {} of {} cores advancing over {seconds:.1} s, {total:.1} W in total",
        watts.len(),
        before.len()
    );
    if !unread.is_empty() {
        let shown: Vec<&str> = unread.iter().take(4).map(String::as_str).collect();
        return Line::fail(
            "energy",
            format!("{found}; unreadable: {}", shown.join("; ")),
            "their energy series are missing; reload the driver, look at dmesg",
        );
    }
    if !stuck.is_empty() || !implausible.is_empty() {
        return Line::fail(
            "energy",
            format!(
                "{found}; not advancing: core indexes {stuck:?}; implausible: {}",
                implausible.join(", ")
            ),
            "the counters do not measure energy on this firmware: update the BIOS, report it",
        );
    }
    let per_core = if watts.is_empty() { 0.0 } else { total / watts.len() as f64 };
    Line::pass("energy", format!("{found} ({per_core:.2} W per core on average)"))
}

/// Per-core energy through HSMP RAPL.
fn energy_hsmp(
    t: &dyn HsmpTransport,
    topo: &Topology,
    wait: &mut dyn FnMut() -> Duration,
    clock: &mut dyn FnMut() -> Instant,
) -> Line {
    let esu: Vec<Result<u8, ItemError>> =
        topo.sockets.iter().map(|&s| messages::rapl_esu(t, s)).collect();
    let read = |index: usize| {
        let core = topo.cores.get(index).ok_or(ItemError::Rejected)?;
        let socket = topo.sockets.iter().position(|&s| s == core.socket);
        let esu = socket.and_then(|i| esu.get(i)).copied().unwrap_or(Err(ItemError::Rejected))?;
        let counter = messages::rapl_core_counter(t, core.socket, core.apic_id)?;
        Ok(amd_hsmp_proto::Energy { counter, esu })
    };
    energy_over("HSMP RAPL", topo.cores.len(), read, wait, clock)
}

/// Every core's energy read by `read` (by index into the topology's cores) before and after
/// `wait`, as rates over the time between each core's two reads: the `energy` line of each
/// source. `clock` stamps the start of each read and the end of each pass.
fn energy_over(
    source: &str,
    cores: usize,
    read: impl Fn(usize) -> Result<amd_hsmp_proto::Energy, ItemError>,
    wait: &mut dyn FnMut() -> Duration,
    clock: &mut dyn FnMut() -> Instant,
) -> Line {
    // One pass: each core's joules and when its read started, then when the pass ended.
    let mut pass = || {
        let mut started = Vec::with_capacity(cores);
        let joules: Vec<Result<f64, ItemError>> = (0..cores)
            .map(|i| {
                started.push(clock());
                read(i).map(amd_hsmp_proto::Energy::joules)
            })
            .collect();
        (joules, started, clock())
    };
    let (before, first, first_end) = pass();
    let waited = wait();
    let (after, second, second_end) = pass();
    // A pass reads one core after another (one mailbox message each on HSMP: 384 on a Turin
    // 2P), so it takes time of its own, more under load, and not always as long in both
    // passes. A core's two reads are the rest of the first pass after its read, the wait, and
    // the second pass up to its read apart: the wait alone would overstate every rate by
    // about a pass over the wait, and one pass's length would miss where the passes differ.
    // The wait says how long it took (in production a sleep timed on the same clock), the
    // clock the passes.
    let second_start = second.first().copied().unwrap_or(second_end);
    let intervals: Vec<Duration> = first
        .iter()
        .zip(&second)
        .map(|(read_before, read_after)| {
            first_end
                .saturating_duration_since(*read_before)
                .saturating_add(waited)
                .saturating_add(read_after.saturating_duration_since(second_start))
        })
        .collect();
    energy_rates(source, &before, &after, &intervals)
}

/// Per-core energy through the MSR devices, opened as the broker opens them.
fn energy_msr(
    topo: &Topology,
    opener: &dyn MsrOpener,
    wait: &mut dyn FnMut() -> Duration,
    clock: &mut dyn FnMut() -> Instant,
) -> Line {
    let energy = match MsrEnergy::open(topo, opener) {
        Ok(e) => e,
        Err(e) => {
            return Line::fail("energy", format!("MSR fallback: {e}"), hints::MSR_UNOPENED);
        }
    };
    energy_over("MSR", topo.cores.len(), |i| energy.read(i), wait, clock)
}

/// The kernel's `power_core` PMU: whether it exists, the kernel release and
/// `perf_event_paranoid`, whether this process can open its events and, where the broker runs
/// under its packaged systemd unit (found under `etc` or the `usr/lib` beside it; `None` when
/// simulated), whether the unit grants `CAP_PERFMON` (the perf drop-in). Elsewhere (a
/// container) the check runs with the broker's own capabilities, so its own open is the
/// answer. The opened counters come back for the energy line.
fn perf(
    locator: &dyn PmuLocator,
    topo: &Topology,
    procfs: &Path,
    etc: Option<&Path>,
) -> (Line, Option<crate::perf::PerfEnergy>) {
    let read = |name: &str| {
        files::read_text(&procfs.join("sys/kernel").join(name), files::TEXT_CAP)
            .map(|t| t.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned())
    };
    let (kernel, paranoid) = (read("osrelease"), read("perf_event_paranoid"));
    let facts = format!("kernel {kernel}, perf_event_paranoid {paranoid}");
    let (pmu, opener) = match locator.locate() {
        Ok(found) => found,
        Err(e @ device::perf::PmuError::Absent(_)) => {
            return (
                Line::warn(
                    "perf",
                    format!("{e}; {facts}: rapl.c offers per-core energy from Linux 6.14 on Zen"),
                    "per-core energy on this kernel: the MSR fallback (operator's guide, \"MSR \
                     fallback\"), or a kernel of 6.14 or later",
                ),
                None,
            );
        }
        Err(e) => {
            let why = format!("{e}; {facts}");
            return (Line::fail("perf", why, "report this output: the PMU is not rapl.c's"), None);
        }
    };
    let clock = Box::new(counters::Running);
    let energy = match crate::perf::PerfEnergy::open(topo, &pmu, opener.as_ref(), clock) {
        Ok(energy) => energy,
        Err(e) => {
            let found =
                format!("power_core PMU present; {facts}; this process cannot open it: {e}");
            let fix = if hints::paranoid_beyond_perfmon(&paranoid) {
                hints::PERF_PARANOID
            } else {
                hints::PERF_DENIED
            };
            return (Line::fail("perf", found, fix), None);
        }
    };
    let found = format!(
        "power_core PMU present (type {}, {} counting CPUs); {facts}; opened on every core",
        pmu.kind,
        pmu.cpus.len()
    );
    let unit = "amd-hsmp-broker.service";
    let root = etc.and_then(Path::parent).unwrap_or(Path::new("/"));
    let units = etc.map(|etc| {
        [
            etc.join("systemd/system"),
            root.join("usr/lib/systemd/system"),
            root.join("lib/systemd/system"),
        ]
    });
    let Some(units) = units.filter(|dirs| dirs.iter().any(|d| d.join(unit).is_file())) else {
        let how = if etc.is_none() { "simulated" } else { "no packaged unit: as this process" };
        return (Line::pass("perf", format!("{found} ({how})")), Some(energy));
    };
    let drop_in = units[0].join(format!("{unit}.d/perf-energy.conf"));
    let open_to_all = paranoid.parse::<i32>().is_ok_and(|p| p <= 0);
    if drop_in.is_file() && hints::paranoid_beyond_perfmon(&paranoid) {
        // Root opens the events with CAP_SYS_ADMIN; the broker holds CAP_PERFMON alone.
        let found = format!(
            "{found} as root, but the broker holds CAP_PERFMON alone, which a kernel with \
             Debian's patch refuses at this perf_event_paranoid: the broker will not have this \
             source there"
        );
        return (Line::fail("perf", found, hints::PERF_PARANOID), None);
    }
    if drop_in.is_file() || open_to_all {
        let grant =
            if drop_in.is_file() { "the perf drop-in grants CAP_PERFMON" } else { "open to all" };
        (Line::pass("perf", format!("{found}; {grant}")), Some(energy))
    } else {
        let found = format!(
            "{found} as this user, but the broker's unit does not grant CAP_PERFMON ({} is \
             missing): the broker will not have this source",
            drop_in.display()
        );
        (Line::fail("perf", found, hints::PERF_DENIED), None)
    }
}

/// The MSR fallback's setup: the `msr` driver, kernel lockdown, the systemd drop-in.
pub(crate) fn msr_setup(sysfs: &Path, msr_root: &Path, etc: &Path) -> Line {
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    let loaded = sysfs.join("module/msr").is_dir() || msr_root.join("0/msr").exists();
    if !loaded {
        problems.push("the msr driver is not loaded".to_string());
        fixes.push("modprobe msr (at boot: msr in /etc/modules-load.d/amd-hsmp.conf)");
    }
    // "[none] integrity confidentiality": the bracketed one is active. Lockdown blocks MSR
    // writes only; reads, all the broker does, stay allowed.
    let path = sysfs.join("kernel/security/lockdown");
    let lockdown = match files::read_text(&path, files::TEXT_CAP) {
        Ok(t) => {
            let active = t.find('[').and_then(|start| {
                let end = t.get(start..)?.find(']')?;
                t.get(start + 1..start + end).map(str::to_string)
            });
            active.unwrap_or_else(|| "not available".into())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "not available".into(),
        Err(e) => format!("unknown ({}: {e})", path.display()),
    };
    let drop_in = etc.join("systemd/system/amd-hsmp-broker.service.d/msr-fallback.conf");
    if !drop_in.is_file() {
        problems.push(format!("no {}", drop_in.display()));
        fixes.push(
            "install -D -m 0644 /usr/share/amd-hsmp-exporter/msr-fallback.conf \
             /etc/systemd/system/amd-hsmp-broker.service.d/msr-fallback.conf && systemctl \
             daemon-reload && systemctl restart amd-hsmp-broker.service (it grants \
             CAP_SYS_RAWIO)",
        );
    }
    let found = format!(
        "msr driver {}, lockdown {lockdown} (reads allowed), drop-in {}",
        if loaded { "loaded" } else { "missing" },
        if drop_in.is_file() { "installed" } else { "missing" }
    );
    if problems.is_empty() {
        Line::pass("msr", found)
    } else {
        Line::fail("msr", format!("{found}: {}", problems.join("; ")), fixes.join("; "))
    }
}

/// The broker's socket: the exporter's user may connect, and the broker answers.
pub(crate) fn socket(path: &Path, node: Option<Node>, accounts: &Accounts) -> Line {
    let p = path.display();
    let Some(node) = node.filter(|n| n.socket) else {
        return Line::fail(
            "socket",
            format!("{p} is not a listening socket"),
            "systemctl enable --now amd-hsmp-broker.socket",
        );
    };
    let Some(exporter) = &accounts.exporter else {
        return Line::fail(
            "socket",
            format!("no user {EXPORTER_USER}"),
            "systemd-sysusers (the package's /usr/lib/sysusers.d/amd-hsmp-exporter.conf)",
        );
    };
    let found = format!("{p} uid {} gid {} mode {:04o}", node.uid, node.gid, node.mode);
    let blocked_dir = path
        .ancestors()
        .skip(1)
        .find(|dir| Node::of(dir).is_some_and(|d| d.bits_for(exporter) & 1 == 0));
    if let Some(dir) = blocked_dir {
        return Line::fail(
            "socket",
            format!("{found}: {EXPORTER_USER} cannot enter {}", dir.display()),
            "systemctl restart amd-hsmp-broker.socket (systemd creates /run/amd-hsmp 0755)",
        );
    }
    if node.bits_for(exporter) & 2 == 0 {
        return Line::fail(
            "socket",
            format!(
                "{found}: {EXPORTER_USER} may not connect (it needs write permission, through \
                 group {EXPORTER_GROUP})"
            ),
            format!(
                "systemctl restart amd-hsmp-broker.socket (the unit sets SocketGroup={EXPORTER_GROUP} \
                 and SocketMode=0660), or chgrp {EXPORTER_GROUP} {p} && chmod 0660 {p}"
            ),
        );
    }
    match hello(path) {
        Ok(answer) => {
            Line::pass("socket", format!("{found}: {EXPORTER_USER} may connect; {answer}"))
        }
        Err(e) => Line::fail(
            "socket",
            format!("{found}: the broker does not answer: {e}"),
            "systemctl status amd-hsmp-broker.socket amd-hsmp-broker.service; journalctl -u \
             amd-hsmp-broker",
        ),
    }
}

/// The socket of a simulating broker: it serves whoever started it (no unit, no exporter
/// group), so the fix is to start it, never a systemd unit.
pub(crate) fn simulated_socket(path: &Path, node: Option<Node>) -> Line {
    let p = path.display();
    let start =
        format!("start the simulator on it: amd-hsmp-sim-broker --simulate PROFILE --listen {p}");
    if !node.is_some_and(|n| n.socket) {
        return Line::fail("socket", format!("{p} is not a listening socket"), start);
    }
    match hello(path) {
        Ok(answer) => Line::pass("socket", format!("{p}: {answer}")),
        Err(e) => Line::fail("socket", format!("{p}: the broker does not answer: {e}"), start),
    }
}

/// Connects (as whoever runs the check), shakes hands and reads the topology.
fn hello(path: &Path) -> Result<String, String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("connect: {e}"))?;
    let timeout = Some(Duration::from_secs(10));
    s.set_read_timeout(timeout).map_err(|e| e.to_string())?;
    s.set_write_timeout(timeout).map_err(|e| e.to_string())?;
    let mut call = |req: &Request| -> Result<Reply, String> {
        req.write(&mut s).map_err(|e| format!("send: {e}"))?;
        Reply::read(&mut s).map_err(|e| format!("receive: {e}"))
    };
    let version = match call(&Request::Hello { protocol_version: PROTOCOL_VERSION })? {
        Reply::Hello { broker_version, .. } => broker_version,
        other => return Err(format!("unexpected answer to Hello: {other:?}")),
    };
    let cores = match call(&Request::Topology)? {
        Reply::Topology(t) => t.cores.len(),
        other => return Err(format!("unexpected answer to Topology: {other:?}")),
    };
    Ok(format!("broker {version} answers, {cores} cores"))
}

mod command;

pub use crate::cli::{CHECK_PROGRAM as PROGRAM, check_args as args, check_command as command};
pub use command::main;

#[cfg(test)]
mod tests;
