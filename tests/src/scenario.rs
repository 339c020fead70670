//! Scenarios: `tests/scenarios/<name>.toml` files that say which fixture machine to serve, which
//! faults the firmware and device nodes have, how the broker and exporter are started and what
//! happens before each scrape; and [`Rig`], which runs one: fake device, broker, exporter.
//!
//! Values are static (the simulator's [`Mode::Static`]), so every scrape of a scenario is
//! deterministic and can be compared with its golden file.

use crate::cgroups::{self, Layout};
use crate::fake::{FakeConfig, FakeDevice, MsrRead, NodeState, OpenRecord, WireMessage};
use crate::fixtures;
use crate::harness::{self, Proc, Response};
use amd_hsmp_device::Message;
use amd_hsmp_device::messages::{LimitReasons, SocketFreqLimit};
use amd_hsmp_proto::{Family, Scope, Topology};
use amd_hsmp_sim::{FaultGroup, Faults, FirmwareConfig, Machine, MachineSpec, Mode, Target};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The `Accept` header Prometheus 2 sends by default.
pub use amd_hsmp_exporter::http::PROMETHEUS_2_ACCEPT as PROMETHEUS_ACCEPT;

/// What Prometheus sends as `X-Prometheus-Scrape-Timeout-Seconds` by default.
pub const DEFAULT_SCRAPE_TIMEOUT: &str = "10";

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Scenario {
    /// What the scenario shows, for the reader.
    pub description: String,
    /// The fixture machine (a name from [`fixtures::machines`]).
    pub machine: String,
    /// Whether the broker runs at all.
    #[serde(default = "yes")]
    pub broker: bool,
    /// Flags added to the broker's command line (after the device and tree paths).
    #[serde(default)]
    pub broker_flags: Vec<String>,
    /// Flags added to the exporter's command line.
    #[serde(default)]
    pub exporter_flags: Vec<String>,
    /// The `hsmp` node when the broker starts. A machine without HSMP never has one.
    #[serde(default)]
    pub hsmp: NodeState,
    /// The protocol version the firmware reports in place of the machine's; it answers the same
    /// messages (firmware at protocol 5 may have the RAPL ones: a version gates nothing).
    pub hsmp_protocol: Option<u32>,
    /// The `cpu/<N>/msr` nodes when the broker starts.
    #[serde(default)]
    pub msr: NodeState,
    /// Faults of the firmware and drivers.
    #[serde(default)]
    pub faults: FaultSpec,
    /// Changes made before the broker starts.
    #[serde(default)]
    pub setup: Actions,
    /// A cgroup hierarchy generated for the machine (see [`cgroups::Layout`]); the exporter is
    /// given `--path.cgroupfs` pointing at it (the scenario's flags turn the collector on).
    pub cgroups: Option<Layout>,
    /// Whether the per-scrape message counts are compared with `<name>.wire`; off only where
    /// they depend on timing.
    #[serde(default = "yes")]
    pub wire_golden: bool,
    /// The scrapes, in order; each one's output is compared with its golden file.
    pub scrapes: Vec<Scrape>,
}

fn yes() -> bool {
    true
}

/// Faults injected into the simulated firmware and drivers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FaultSpec {
    /// Fault groups the firmware does not implement (`ENOMSG`; `EIO` for `msr`).
    #[serde(default)]
    pub unsupported: Vec<FaultGroup>,
    /// Per-item errors.
    #[serde(default)]
    pub errors: Vec<ItemFault>,
    /// Sockets whose mailbox never answers: every message waits the driver's timeout and fails
    /// with `ETIMEDOUT`.
    #[serde(default)]
    pub wedged_sockets: Vec<u32>,
    /// Time every message spends in the mailbox, ms.
    #[serde(default)]
    pub latency_ms: u64,
    /// The driver's timeout, ms (the kernel's is 100).
    pub driver_timeout_ms: Option<u64>,
}

/// One failing item: the core (or socket) is named by its labels; the fault is injected for
/// the APIC id (HSMP) or CPU number (MSR) the topology gives it, so a broker that addressed
/// the core any other way would not see it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ItemFault {
    /// The fault group ([`FaultGroup`], in kebab case).
    pub family: FaultGroup,
    /// `socket` label.
    pub socket: u32,
    /// `core` label; required for per-core groups, absent for per-socket ones.
    pub core: Option<u32>,
    /// The errno name, e.g. `EIO`, `ETIMEDOUT`.
    pub errno: String,
}

/// An amount of energy for one core.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CoreJoules {
    /// `socket` label.
    pub socket: u32,
    /// `core` label.
    pub core: u32,
    /// Joules.
    pub joules: f64,
}

/// Changes to the machine, made before the broker starts or before a scrape.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Actions {
    /// Sets the `hsmp` node's state (e.g. `present` for a device that appears late).
    pub hsmp: Option<NodeState>,
    /// Sets the MSR nodes' state.
    pub msr: Option<NodeState>,
    /// Adds this many joules to every core.
    pub advance_all_energy_j: Option<f64>,
    /// Adds joules to single cores.
    #[serde(default)]
    pub advance_energy: Vec<CoreJoules>,
    /// Sets a core's counter so that its 32-bit MSR value is this many joules below the wrap.
    #[serde(default)]
    pub below_msr_wrap: Vec<CoreJoules>,
    /// Asserts PROCHOT on these sockets.
    #[serde(default)]
    pub prochot: Vec<u32>,
    /// Sets single cores' boost limits.
    #[serde(default)]
    pub boost_limit: Vec<CoreMhz>,
    /// Sets sockets' frequency limits and the limiters imposing them; refused on a machine
    /// whose firmware predates the message (protocol 5), which answers it `ENOMSG`.
    #[serde(default)]
    pub frequency_limit: Vec<SocketLimit>,
    /// Replaces the scenario's cgroup hierarchy by this one (before a scrape only).
    pub cgroups: Option<Layout>,
}

/// A boost limit for one core.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CoreMhz {
    /// `socket` label.
    pub socket: u32,
    /// `core` label.
    pub core: u32,
    /// MHz.
    pub mhz: u32,
}

/// A frequency limit for one socket, as `GET_SOCKET_FREQ_LIMIT` answers it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SocketLimit {
    /// `socket` label.
    pub socket: u32,
    /// The limit, MHz.
    pub mhz: u16,
    /// The limiter bits (reply bits 15:0): 0x01 cHTC, 0x02 PROCHOT, 0x04 TDC, 0x08 PPT,
    /// 0x10 OPN max, 0x20 reliability, 0x40 APML, 0x80 HSMP; bits 15:8 are unnamed.
    pub reasons: u16,
}

/// One scrape.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Scrape {
    /// Changes made before the scrape.
    #[serde(default)]
    pub before: Actions,
    /// `X-Prometheus-Scrape-Timeout-Seconds`; default 10, as Prometheus sends.
    pub timeout_header: Option<String>,
    /// `Accept`; default Prometheus 2's header (OpenMetrics preferred).
    pub accept: Option<String>,
    /// The response must be complete within this many milliseconds.
    pub max_ms: Option<u64>,
    /// Lines that must appear in the output, exactly.
    #[serde(default)]
    pub expect: Vec<String>,
    /// Prefixes no line may start with: metric names (HELP and TYPE lines start with `#`, so
    /// an empty family passes), or series such as `name{core="5",socket="0"}`.
    #[serde(default)]
    pub absent: Vec<String>,
    /// `GET /` (the landing page) instead of `/metrics`; its golden file is `.html`, masked
    /// by [`golden::mask_page`](crate::golden::mask_page).
    #[serde(default)]
    pub page: bool,
}

impl Scrape {
    /// The path requested.
    pub fn path(&self) -> &'static str {
        if self.page { "/" } else { "/metrics" }
    }
}

/// `tests/scenarios` in the source tree.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// The names of every scenario file, sorted.
pub fn names() -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(scenarios_dir()).context("cannot list tests/scenarios")? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "toml")
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            names.push(stem.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Reads scenario `name`.
pub fn load(name: &str) -> Result<Scenario> {
    let path = scenarios_dir().join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).with_context(|| format!("in {}", path.display()))
}

/// Parses a scenario from TOML text.
pub fn parse(text: &str) -> Result<Scenario> {
    let scenario: Scenario = toml::from_str(text)?;
    if fixtures::machine(&scenario.machine).is_none() {
        bail!("unknown machine {:?}", scenario.machine);
    }
    if scenario.scrapes.is_empty() {
        bail!("a scenario needs at least one [[scrapes]]");
    }
    if scenario.setup.cgroups.is_some() {
        bail!("the cgroup hierarchy is the scenario's `cgroups`, not a setup action");
    }
    if scenario.cgroups.is_none() && scenario.scrapes.iter().any(|s| s.before.cgroups.is_some()) {
        bail!("a scrape replaces the cgroup hierarchy of a scenario without `cgroups`");
    }
    Ok(scenario)
}

/// The errno named `name`.
pub fn errno_by_name(name: &str) -> Option<i32> {
    ERRNOS.iter().find(|(n, _)| *n == name).map(|(_, e)| *e)
}

/// The name of `errno`, or its number.
pub fn errno_name(errno: i32) -> String {
    ERRNOS
        .iter()
        .find(|(_, e)| *e == errno)
        .map_or_else(|| format!("errno {errno}"), |(n, _)| (*n).to_owned())
}

const ERRNOS: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("EIO", libc::EIO),
    ("ENXIO", libc::ENXIO),
    ("EACCES", libc::EACCES),
    ("EBUSY", libc::EBUSY),
    ("ENODEV", libc::ENODEV),
    ("EINVAL", libc::EINVAL),
    ("ENOTTY", libc::ENOTTY),
    ("ENOMSG", libc::ENOMSG),
    ("ETIME", libc::ETIME),
    ("ETIMEDOUT", libc::ETIMEDOUT),
    ("EREMOTEIO", libc::EREMOTEIO),
];

fn core_of(topology: &Topology, socket: u32, core: u32) -> Result<amd_hsmp_proto::Core> {
    topology
        .cores
        .iter()
        .find(|c| c.socket == socket && c.core == core)
        .cloned()
        .with_context(|| format!("the machine has no core {core} on socket {socket}"))
}

impl FaultSpec {
    /// The simulator's faults, with cores resolved through `topology`.
    pub fn resolve(&self, topology: &Topology) -> Result<Faults> {
        let mut faults = Faults::default();
        faults.unsupported.extend(self.unsupported.iter().copied());
        faults.wedged_sockets.extend(&self.wedged_sockets);
        faults.latency = Duration::from_millis(self.latency_ms);
        if let Some(ms) = self.driver_timeout_ms {
            faults.driver_timeout = Duration::from_millis(ms);
        }
        for e in &self.errors {
            let errno =
                errno_by_name(&e.errno).with_context(|| format!("unknown errno {}", e.errno))?;
            // A family's messages go to a core or to a socket as its scope says.
            let scope = e.family.family().map(Family::scope);
            let target = match (e.family, scope, e.core) {
                (FaultGroup::Msr, _, Some(core)) => {
                    Target::Cpu(core_of(topology, e.socket, core)?.cpu)
                }
                (_, Some(Scope::Core), Some(core)) => {
                    Target::Apic(core_of(topology, e.socket, core)?.apic_id)
                }
                (FaultGroup::ProtoVersion, _, None) | (_, Some(Scope::Socket), None) => {
                    Target::Socket(e.socket)
                }
                (family, _, core) => bail!("{family:?} fault with core {core:?} makes no sense"),
            };
            faults.errno.insert((e.family, target), errno);
        }
        Ok(faults)
    }
}

impl Actions {
    /// Applies the changes to the machine and, if mounted, the device nodes.
    pub fn apply(&self, machine: &Machine, device: Option<&FakeDevice>) -> Result<()> {
        let fw = machine.firmware();
        if let Some(j) = self.advance_all_energy_j {
            fw.advance_all_energy(j)?;
        }
        for c in &self.advance_energy {
            fw.advance_energy(c.socket, c.core, c.joules)?;
        }
        for c in &self.below_msr_wrap {
            let units = (c.joules * f64::from(1u32 << machine.spec().esu)).round() as u64;
            fw.set_energy_counter(c.socket, c.core, (1u64 << 32) - units)?;
        }
        for &socket in &self.prochot {
            fw.set_prochot(socket, true)?;
        }
        for c in &self.boost_limit {
            fw.set_boost_limit(c.socket, c.core, c.mhz)?;
        }
        if !self.frequency_limit.is_empty() && !machine.spec().freq_limit_messages() {
            bail!(
                "a frequency limit on a machine whose firmware (protocol {:?}) has no \
                 GET_SOCKET_FREQ_LIMIT",
                machine.spec().hsmp_protocol
            );
        }
        for l in &self.frequency_limit {
            let limit = SocketFreqLimit { mhz: l.mhz, reasons: LimitReasons(l.reasons) };
            fw.set_freq_limit(l.socket, limit)?;
        }
        if let Some(device) = device {
            if let Some(state) = self.hsmp {
                device.set_hsmp_state(state);
            }
            if let Some(state) = self.msr {
                device.set_msr_state(state);
            }
        }
        Ok(())
    }
}

/// What the fake device recorded during one phase (start-up or one scrape).
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    /// Opens of device nodes.
    pub opens: Vec<OpenRecord>,
    /// HSMP messages.
    pub messages: Vec<WireMessage>,
    /// MSR reads.
    pub msr_reads: Vec<MsrRead>,
}

impl Traffic {
    /// Number of messages with id `msg_id`.
    pub fn count(&self, msg_id: u32) -> usize {
        self.messages.iter().filter(|m| m.msg_id == msg_id).count()
    }

    /// One line per (message or register, result) with its count, sorted: the `.wire` golden
    /// format.
    pub fn summary(&self) -> String {
        let result = |r: &Result<(), i32>| match r {
            Ok(()) => "ok".to_owned(),
            Err(e) => errno_name(*e),
        };
        let mut lines: BTreeMap<String, usize> = BTreeMap::new();
        for o in &self.opens {
            let node = match o.node {
                crate::fake::Node::Hsmp => "hsmp",
                crate::fake::Node::Msr(_) => "msr",
            };
            let mode = match o.flags & libc::O_ACCMODE {
                libc::O_RDONLY => "O_RDONLY",
                libc::O_WRONLY => "O_WRONLY",
                _ => "O_RDWR",
            };
            *lines.entry(format!("open {node} {mode} {}", result(&o.result))).or_default() += 1;
        }
        for m in &self.messages {
            let name = Message::from_id(m.msg_id)
                .map_or_else(|| format!("msg {:#04x}", m.msg_id), |m| m.name().to_owned());
            let key = format!("hsmp {:#04x} {name} {}", m.msg_id, result(&m.result));
            *lines.entry(key).or_default() += 1;
        }
        for r in &self.msr_reads {
            *lines.entry(format!("msr {:#x} {}", r.msr, result(&r.result))).or_default() += 1;
        }
        let mut out = String::new();
        for (line, n) in lines {
            let _ = writeln!(out, "{line} x{n}");
        }
        out
    }
}

/// Where each scrape's records start, so a phase's traffic can be cut out.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    opens: usize,
    messages: usize,
    msr_reads: usize,
}

/// A running scenario: the fake device (unless the broker is absent, it is always mounted),
/// the broker and the exporter. Dropping it stops the processes, then unmounts.
#[derive(Debug)]
pub struct Rig {
    // Field order is drop order: processes before the mount they hold open.
    exporter: Proc,
    broker: Option<Proc>,
    device: FakeDevice,
    machine: Arc<Machine>,
    addr: SocketAddr,
    marks: Marks,
    /// The exporter's flags besides its address and socket, for a restart.
    exporter_flags: Vec<String>,
    dir: tempfile::TempDir,
}

impl Rig {
    /// Mounts the fake device for `scenario`'s machine and faults, then starts the broker (if
    /// the scenario has one) and the exporter, and waits until both serve.
    pub fn start(scenario: &Scenario) -> Result<Rig> {
        let mut spec: MachineSpec = fixtures::machine(&scenario.machine)
            .with_context(|| format!("unknown machine {}", scenario.machine))?;
        if let (Some(version), Some(_)) = (scenario.hsmp_protocol, spec.hsmp_protocol) {
            spec.hsmp_protocol = Some(version);
        }
        let topology = spec.topology();
        let cpus: Vec<u32> = spec.cpus().iter().filter(|c| c.online).map(|c| c.cpu).collect();
        let faults = scenario.faults.resolve(&topology)?;
        let machine =
            Machine::new(spec, FirmwareConfig { faults, ..FirmwareConfig::new(Mode::Static) });
        let hsmp_state =
            if machine.firmware().has_hsmp() { scenario.hsmp } else { NodeState::Absent };
        let device = FakeDevice::mount(FakeConfig {
            hsmp: Arc::new(Arc::clone(&machine)),
            msr: Arc::new(machine.msr_opener()),
            cpus,
            hsmp_state,
            msr_state: scenario.msr,
        })
        .context("cannot mount the fake device (needs /dev/fuse and fusermount3 from fuse3)")?;
        scenario.setup.apply(&machine, Some(&device))?;

        let bins = harness::binaries()?;
        let dir = tempfile::Builder::new().prefix("amd-hsmp-e2e-").tempdir()?;
        let socket = dir.path().join("broker.sock");
        let tree = fixtures::tree(&fixtures::fixtures_dir(), &scenario.machine);
        let mut exporter_flags = scenario.exporter_flags.clone();
        if let Some(layout) = scenario.cgroups {
            let root = dir.path().join("cgroup");
            cgroups::write_layout(layout, &topology, &root)?;
            exporter_flags.extend(["--path.cgroupfs".into(), path(&root)]);
            let proc = dir.path().join("proc");
            if cgroups::write_processes(layout, &root, &proc)? {
                exporter_flags.extend(["--path.procfs".into(), path(&proc)]);
            }
            // As for the broker's reads below: a scrape that follows another within the walk's
            // freshness would be answered from the same walk, and a scenario replaces the
            // hierarchy between scrapes. The freshness itself is pinned by the exporter's tests.
            if !exporter_flags.iter().any(|f| f.starts_with("--collector.core-owner.max-age")) {
                exporter_flags.extend(["--collector.core-owner.max-age".into(), "0".into()]);
            }
        }
        let broker = if scenario.broker {
            let mut args: Vec<String> = vec!["--listen".into(), path(&socket)];
            args.extend(device.broker_args(&tree));
            args.extend(["--log.level".into(), "debug".into()]);
            // A scenario checks what each scrape reads; with a freshness allowance a scrape
            // that follows another within it would be answered from the same reads. The
            // allowance itself is pinned by `tests/tests/e2e/sampler_faults.rs`.
            if !scenario.broker_flags.iter().any(|f| f.starts_with("--sample.max-age")) {
                args.extend(["--sample.max-age".into(), "0".into()]);
            }
            args.extend(scenario.broker_flags.iter().cloned());
            let mut broker =
                Proc::spawn("amd-hsmp-broker", &bins.broker, &args, dir.path().join("broker.log"))?;
            // The socket is bound after start-up (opens, probes, lock-down): its listening
            // means start-up traffic is complete and a connection is queued, not refused.
            harness::wait_listening(&mut broker, &socket)?;
            Some(broker)
        } else {
            None
        };

        let (exporter, addr) = harness::start_exporter(&socket, &exporter_flags, None, dir.path())?;
        let marks = Marks::default();
        Ok(Rig { exporter, broker, device, machine, addr, marks, exporter_flags, dir })
    }

    /// The fake device.
    pub fn device(&self) -> &FakeDevice {
        &self.device
    }

    /// The simulated machine behind the device.
    pub fn machine(&self) -> &Arc<Machine> {
        &self.machine
    }

    /// The broker's process id, if it runs.
    pub fn broker_pid(&self) -> Option<u32> {
        self.broker.as_ref().map(Proc::pid)
    }

    /// The exporter's process id.
    pub fn exporter_pid(&self) -> u32 {
        self.exporter.pid()
    }

    /// The exporter's process.
    pub fn exporter(&mut self) -> &mut Proc {
        &mut self.exporter
    }

    /// Ends the exporter with `signal` (waiting up to 30 s for it to exit) and starts it again
    /// at once with the same flags, as `systemctl restart` or a crash and a restart would; its
    /// address may change.
    pub fn restart_exporter(&mut self, signal: i32) -> Result<()> {
        self.exporter.signal(signal)?;
        self.exporter.wait_exit(Duration::from_secs(30))?;
        let socket = self.broker_socket();
        let (exporter, addr) =
            harness::start_exporter(&socket, &self.exporter_flags, None, self.dir.path())?;
        self.exporter = exporter;
        self.addr = addr;
        Ok(())
    }

    /// The mount point of the fake device.
    pub fn mount_point(&self) -> &Path {
        self.device.root()
    }

    /// The exporter's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The broker's socket, for tests that speak to the broker directly.
    pub fn broker_socket(&self) -> PathBuf {
        self.dir.path().join("broker.sock")
    }

    /// What the broker has written to its stderr so far.
    pub fn broker_log(&self) -> String {
        self.broker.as_ref().map_or_else(String::new, Proc::log)
    }

    /// Both processes' logs, for a failure message.
    pub fn logs(&self) -> String {
        let broker = self.broker.as_ref().map_or_else(|| "(not started)".into(), Proc::log);
        format!(
            "--- broker log ---\n{broker}--- exporter log ---\n{}--- work dir {} ---",
            self.exporter.log(),
            self.dir.path().display()
        )
    }

    /// Traffic since the previous call (the first call returns start-up traffic).
    pub fn take_traffic(&mut self) -> Traffic {
        let (opens, messages, reads) =
            (self.device.opens(), self.device.messages(), self.device.msr_reads());
        let t = Traffic {
            opens: opens[self.marks.opens..].to_vec(),
            messages: messages[self.marks.messages..].to_vec(),
            msr_reads: reads[self.marks.msr_reads..].to_vec(),
        };
        self.marks = Marks { opens: opens.len(), messages: messages.len(), msr_reads: reads.len() };
        t
    }

    /// `GET /metrics` as Prometheus would (or `GET /` for a page view), with `scrape`'s
    /// headers.
    pub fn scrape(&mut self, scrape: &Scrape) -> Result<Response> {
        let timeout = scrape.timeout_header.as_deref().unwrap_or(DEFAULT_SCRAPE_TIMEOUT);
        let accept = scrape.accept.as_deref().unwrap_or(PROMETHEUS_ACCEPT);
        let headers =
            [("Accept", accept), (amd_hsmp_exporter::http::SCRAPE_TIMEOUT_HEADER, timeout)];
        let response =
            harness::http_get(self.addr, scrape.path(), &headers, Duration::from_secs(30))?;
        self.exporter.check_running()?;
        if let Some(broker) = self.broker.as_mut() {
            broker.check_running()?;
        }
        Ok(response)
    }

    /// Kills both processes now (dropping the rig does too).
    pub fn stop(&mut self) {
        self.exporter.kill();
        if let Some(broker) = self.broker.as_mut() {
            broker.kill();
        }
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The golden file names of a scenario's scrapes: `.html` for a page view, `.metrics` else.
pub fn golden_names(name: &str, scrapes: &[Scrape]) -> Vec<String> {
    let ext = |s: &Scrape| if s.page { "html" } else { "metrics" };
    match scrapes {
        [one] => vec![format!("{name}.{}", ext(one))],
        _ => scrapes
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{name}.{}.{}", i + 1, ext(s)))
            .collect(),
    }
}

/// What one scenario run produced.
#[derive(Debug)]
pub struct Outcome {
    /// The topology the machine has.
    pub topology: Topology,
    /// The broker's pid, if it ran.
    pub broker_pid: Option<u32>,
    /// The exporter's pid.
    pub exporter_pid: u32,
    /// Start-up traffic.
    pub start: Traffic,
    /// Each scrape's response and traffic.
    pub scrapes: Vec<(Response, Traffic)>,
    /// Whether the scenario compares its message counts with `<name>.wire`
    /// ([`Scenario::wire_golden`]).
    pub wire_golden: bool,
}

impl Outcome {
    /// The `.wire` golden text: start-up and per-scrape traffic summaries.
    pub fn wire(&self) -> String {
        let mut out = format!("# start-up\n{}", self.start.summary());
        for (i, (_, traffic)) in self.scrapes.iter().enumerate() {
            let _ = write!(out, "# scrape {}\n{}", i + 1, traffic.summary());
        }
        out
    }
}

/// Runs scenario `name`: starts the rig, applies each scrape's actions, scrapes, and checks
/// everything that does not need a golden file (status, timing, expected and absent lines,
/// the wire invariants). Golden files are checked by the caller.
pub fn run(name: &str) -> Result<Outcome> {
    let scenario = load(name)?;
    let mut rig = Rig::start(&scenario)?;
    let result = drive(&scenario, &mut rig);
    result.with_context(|| rig.logs())
}

fn drive(scenario: &Scenario, rig: &mut Rig) -> Result<Outcome> {
    let topology = rig.machine().topology().clone();
    let start = rig.take_traffic();
    let mut scrapes = Vec::new();
    for (i, scrape) in scenario.scrapes.iter().enumerate() {
        let n = i + 1;
        scrape.before.apply(rig.machine(), Some(rig.device()))?;
        if let Some(layout) = scrape.before.cgroups {
            let root = rig.dir.path().join("cgroup");
            cgroups::replace_layout(layout, &topology, &root)?;
        }
        // A scrape bounded in wall-clock time runs alone among the timed tests, as they do.
        let alone = scrape.max_ms.map(|_| harness::one_at_a_time());
        let response = rig.scrape(scrape).with_context(|| format!("scrape {n}"))?;
        drop(alone);
        if response.status != 200 {
            bail!("scrape {n}: status {}:\n{}", response.status, response.body);
        }
        if let Some(max) = scrape.max_ms
            && response.elapsed > Duration::from_millis(max)
        {
            bail!("scrape {n} took {:?}, more than {max} ms", response.elapsed);
        }
        for line in &scrape.expect {
            if !response.body.lines().any(|l| l == line) {
                bail!("scrape {n}: expected line {line:?} missing:\n{}", response.body);
            }
        }
        for prefix in &scrape.absent {
            if let Some(l) = response.body.lines().find(|l| l.starts_with(prefix.as_str())) {
                bail!("scrape {n}: {prefix} must be absent, found {l:?}");
            }
        }
        scrapes.push((response, rig.take_traffic()));
    }
    let outcome = Outcome {
        topology,
        broker_pid: rig.broker_pid(),
        exporter_pid: rig.exporter_pid(),
        start,
        scrapes,
        wire_golden: scenario.wire_golden,
    };
    check_wire_invariants(&outcome)?;
    Ok(outcome)
}

/// What must hold on the wire in every scenario: each node is opened read-only and only by
/// the broker, and every per-core message carries the APIC id of a core of the socket it is
/// sent to.
pub fn check_wire_invariants(outcome: &Outcome) -> Result<()> {
    let phases = std::iter::once(&outcome.start).chain(outcome.scrapes.iter().map(|(_, t)| t));
    for traffic in phases {
        for open in &traffic.opens {
            if !open.read_only() {
                bail!("{:?} opened with flags {:#o}, not read-only", open.node, open.flags);
            }
            if Some(open.pid) != outcome.broker_pid {
                bail!(
                    "{:?} opened by pid {} (broker {:?}, exporter {})",
                    open.node,
                    open.pid,
                    outcome.broker_pid,
                    outcome.exporter_pid
                );
            }
        }
        for m in &traffic.messages {
            let per_core = [
                Message::GetBoostLimit.id(),
                Message::GetRaplCoreCounter.id(),
                Message::GetCclkCoreLimit.id(),
            ];
            if !per_core.contains(&m.msg_id) {
                continue;
            }
            let known = outcome
                .topology
                .cores
                .iter()
                .any(|c| c.socket == u32::from(m.sock_ind) && c.apic_id == m.arg0);
            if !known {
                bail!(
                    "message {:#04x} to socket {} carries {:#x}, not the APIC id of one of its \
                     cores",
                    m.msg_id,
                    m.sock_ind,
                    m.arg0
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_file_parses_and_names_a_fixture_machine() {
        let names = names().unwrap();
        assert!(!names.is_empty());
        for name in names {
            let scenario = load(&name).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let topology = fixtures::machine(&scenario.machine).unwrap().topology();
            scenario.faults.resolve(&topology).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
    }

    #[test]
    fn the_example_in_the_readme_parses_and_resolves() {
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
                .unwrap();
        let start = readme.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let end = start + readme[start..].find("```").unwrap();
        let scenario = parse(&readme[start..end]).unwrap();
        let topology = fixtures::machine(&scenario.machine).unwrap().topology();
        let faults = scenario.faults.resolve(&topology).unwrap();
        assert_eq!(faults.errno.len(), 2);
        assert_eq!(scenario.scrapes[0].before.advance_energy.len(), 1);
        assert_eq!(scenario.cgroups, Some(Layout::Slurm));
        assert_eq!(scenario.scrapes[0].before.cgroups, Some(Layout::SlurmOneJobEnded));
    }

    #[test]
    fn faults_are_injected_for_the_apic_id_or_cpu_of_the_named_core() {
        let topology = fixtures::machine("genoa-2p").unwrap().topology();
        let spec: FaultSpec = toml::from_str(
            r#"
            unsupported = ["core-energy"]
            wedged-sockets = [1]
            errors = [
                { family = "boost-limit", socket = 1, core = 8, errno = "EIO" },
                { family = "msr", socket = 1, core = 8, errno = "EIO" },
                { family = "prochot", socket = 0, errno = "EBUSY" },
            ]
            "#,
        )
        .unwrap();
        let faults = spec.resolve(&topology).unwrap();
        let core = core_of(&topology, 1, 8).unwrap();
        assert_ne!(core.apic_id, core.cpu);
        assert_eq!(faults.errno[&(FaultGroup::BoostLimit, Target::Apic(core.apic_id))], libc::EIO);
        assert_eq!(faults.errno[&(FaultGroup::Msr, Target::Cpu(core.cpu))], libc::EIO);
        assert_eq!(faults.errno[&(FaultGroup::Prochot, Target::Socket(0))], libc::EBUSY);
        assert!(faults.unsupported.contains(&FaultGroup::CoreEnergy));
        assert!(faults.wedged_sockets.contains(&1));
    }

    #[test]
    fn frequency_limit_faults_target_the_socket_or_the_core_s_apic_id() {
        let topology = fixtures::machine("turin-2p").unwrap().topology();
        let spec: FaultSpec = toml::from_str(
            r#"
            unsupported = ["core-frequency-limit"]
            errors = [
                { family = "frequency-limit", socket = 1, errno = "EIO" },
                { family = "core-frequency-limit", socket = 1, core = 8, errno = "EBUSY" },
            ]
            "#,
        )
        .unwrap();
        let faults = spec.resolve(&topology).unwrap();
        let core = core_of(&topology, 1, 8).unwrap();
        assert_eq!(faults.errno[&(FaultGroup::FrequencyLimit, Target::Socket(1))], libc::EIO);
        let per_core = (FaultGroup::CoreFrequencyLimit, Target::Apic(core.apic_id));
        assert_eq!(faults.errno[&per_core], libc::EBUSY);
        assert!(faults.unsupported.contains(&FaultGroup::CoreFrequencyLimit));
        let wrong: FaultSpec = toml::from_str(
            r#"errors = [{ family = "frequency-limit", socket = 0, core = 1, errno = "EIO" }]"#,
        )
        .unwrap();
        assert!(wrong.resolve(&topology).is_err(), "a per-socket family with a core");
    }

    /// The fake device in front of fixture machine `name` with static values, and a
    /// descriptor of its `hsmp` node opened the broker's way.
    fn fake_hsmp(name: &str) -> (Arc<Machine>, FakeDevice, amd_hsmp_device::DevHsmp) {
        let (machine, dev) = crate::fake::mount_static(fixtures::machine(name).unwrap()).unwrap();
        let hsmp = amd_hsmp_device::DevHsmp::open(&dev.hsmp_path()).unwrap();
        (machine, dev, hsmp)
    }

    /// `before` actions from TOML.
    fn actions(text: &str) -> Actions {
        toml::from_str(text).unwrap()
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn frequency_limit_knobs_reach_the_device_crate_through_the_fake() {
        use amd_hsmp_device::messages::{core_freq_limit_mhz, socket_freq_limit};
        let (machine, dev, hsmp) = fake_hsmp("genoa-2p");
        let core = core_of(machine.topology(), 1, 8).unwrap();
        let opn = SocketFreqLimit { mhz: 3_800, reasons: LimitReasons::OPN_MAX };
        assert_eq!(socket_freq_limit(&hsmp, 1), Ok(opn));
        actions(
            "frequency-limit = [{ socket = 1, mhz = 2400, reasons = 0x0A }, \
             { socket = 0, mhz = 3000, reasons = 0x0100 }]",
        )
        .apply(&machine, Some(&dev))
        .unwrap();
        let held = socket_freq_limit(&hsmp, 1).unwrap();
        assert_eq!(held.mhz, 2_400);
        assert_eq!(held.reasons, LimitReasons::PPT | LimitReasons::PROCHOT);
        let other = socket_freq_limit(&hsmp, 0).unwrap();
        assert_eq!((other.mhz, other.reasons.bits()), (3_000, 0x0100));
        assert!(other.reasons.intersects(LimitReasons::OTHER_MASK));
        assert_eq!(core_freq_limit_mhz(&hsmp, 1, core.apic_id), Ok(2_400));
        let ids: Vec<u32> = dev.messages().iter().map(|m| m.msg_id).collect();
        assert_eq!(ids, [0x19, 0x19, 0x19, 0x1A]);
        assert_eq!(dev.messages()[3].arg0, core.apic_id);
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn frequency_limits_are_unsupported_through_the_fake_before_protocol_5() {
        use amd_hsmp_device::messages::{core_freq_limit_mhz, socket_freq_limit};
        use amd_hsmp_proto::ItemError;
        let (machine, dev, hsmp) = fake_hsmp("milan-1p");
        let apic = machine.topology().cores[0].apic_id;
        assert_eq!(socket_freq_limit(&hsmp, 0), Err(ItemError::Unsupported));
        assert_eq!(core_freq_limit_mhz(&hsmp, 0, apic), Err(ItemError::Unsupported));
        let knob = actions("frequency-limit = [{ socket = 0, mhz = 2000, reasons = 0x08 }]");
        let err = knob.apply(&machine, Some(&dev)).unwrap_err();
        assert!(err.to_string().contains("GET_SOCKET_FREQ_LIMIT"), "{err}");
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn frequency_limit_faults_reach_the_device_crate_through_the_fake() {
        use amd_hsmp_device::messages::{core_freq_limit_mhz, socket_freq_limit};
        use amd_hsmp_proto::ItemError;
        let (machine, _dev, hsmp) = fake_hsmp("turin-2p");
        let spec: FaultSpec = toml::from_str(
            r#"errors = [{ family = "frequency-limit", socket = 1, errno = "EIO" }]
            unsupported = ["core-frequency-limit"]"#,
        )
        .unwrap();
        machine.set_faults(spec.resolve(machine.topology()).unwrap());
        let apic = machine.topology().cores[0].apic_id;
        assert!(socket_freq_limit(&hsmp, 0).is_ok());
        assert_eq!(socket_freq_limit(&hsmp, 1), Err(ItemError::Io { errno: libc::EIO }));
        assert_eq!(core_freq_limit_mhz(&hsmp, 0, apic), Err(ItemError::Unsupported));
    }

    #[test]
    fn a_fault_on_a_core_the_machine_lacks_is_an_error() {
        let topology = fixtures::machine("genoa-2p").unwrap().topology();
        let spec: FaultSpec = toml::from_str(
            r#"errors = [{ family = "core-energy", socket = 0, core = 4, errno = "EIO" }]"#,
        )
        .unwrap();
        let err = spec.resolve(&topology).unwrap_err();
        assert!(err.to_string().contains("no core 4 on socket 0"), "{err}");
    }

    #[test]
    fn errno_names_round_trip() {
        for (name, errno) in ERRNOS {
            assert_eq!(errno_by_name(name), Some(*errno));
            assert_eq!(errno_name(*errno), *name);
        }
        assert_eq!(errno_name(4242), "errno 4242");
    }

    #[test]
    fn the_wire_summary_counts_by_message_and_result() {
        let m = |msg_id, result| WireMessage {
            msg_id,
            sock_ind: 0,
            arg0: 0,
            num_args: 1,
            response_sz: 1,
            result,
        };
        let t = Traffic {
            opens: Vec::new(),
            messages: vec![m(0x0A, Ok(())), m(0x0A, Ok(())), m(0x0A, Err(libc::EIO))],
            msr_reads: vec![MsrRead { cpu: 3, msr: 0xC001_029A, result: Ok(()) }],
        };
        assert_eq!(
            t.summary(),
            "hsmp 0x0a GET_BOOST_LIMIT EIO x1\nhsmp 0x0a GET_BOOST_LIMIT ok x2\nmsr 0xc001029a ok x1\n"
        );
    }
}
