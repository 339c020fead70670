//! The measurements: a rig of fake device, broker and exporters per fixture machine, the paired
//! floor client, CPU and memory from procfs, message counts from the fake, start-up times.

use crate::Cli;
use crate::report::{
    Compressed, Concurrent, CoreOwner, Cpu, CpuSplit, Disabled, FixtureReport, Host, Idle, Kept,
    LatencyReport, Memory, Peaks, Percentiles, Report, Startup, StartupFigures,
};
use amd_hsmp_device::{DevHsmp, HsmpMessage, HsmpTransport, Message};
use amd_hsmp_e2e::cgroups;
use amd_hsmp_e2e::fake::{FakeDevice, WireMessage};
use amd_hsmp_e2e::fixtures;
use amd_hsmp_e2e::harness::{self, Binaries, Proc};
use amd_hsmp_e2e::scenario::{DEFAULT_SCRAPE_TIMEOUT, PROMETHEUS_ACCEPT};
use amd_hsmp_exporter::collectors::Collectors;
use amd_hsmp_sim::{Machine, MachineSpec};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

/// Scrapes before each measured series, so one-time work (connections, first probes, page
/// faults) is not counted.
const WARM_UP: usize = 3;
/// How long nothing is scraped while the fake counts what the broker sends on its own.
const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// The collector the second exporter runs without.
const DISABLED_FLAG: &str = "--no-collector.boost-limit";
/// Scrapes of the exporter with a disabled collector.
const DISABLED_SCRAPES: usize = 3;
/// The broker's freshness bound in the benchmark: short, so that concurrent scrapes share a
/// reading as they do at the default, and waited out before every scrape, so that each one is
/// measured reading the mailbox rather than answered from the one before.
const MAX_AGE: Duration = Duration::from_millis(20);
/// Linux reports process times in `USER_HZ` ticks, 100 per second on every architecture
/// the exporter supports (it is part of the user-space ABI, unlike the kernel's `HZ`).
const USER_HZ: u64 = 100;

/// Runs every measurement `cli` asks for.
pub fn run(cli: &Cli, bins: &Binaries) -> Result<Report> {
    let mut fixtures_out = Vec::new();
    for name in &cli.fixtures {
        eprintln!("bench: {name}: {} scrapes at each latency", cli.scrapes);
        fixtures_out.push(fixture(cli, bins, name).with_context(|| format!("fixture {name}"))?);
    }
    let largest = fixtures::machines()
        .into_iter()
        .max_by_key(|(_, spec)| spec.topology().cores.len())
        .map(|(name, _)| name)
        .context("no fixture machines")?;
    eprintln!(
        "bench: {largest}: {} broker start-ups with and without the MSR fallback",
        cli.startups
    );
    let startup = startup(bins, largest, cli.startups).context("start-up")?;
    let reads = match cli.energy_reads {
        0 => None,
        rounds => {
            eprintln!("bench: {rounds} rounds of energy readings through perf and the MSR driver");
            Some(crate::reads::measure(rounds).context("energy readings")?)
        }
    };
    let command = command_line(std::env::args().skip(1));
    let mut report = Report::new(host(), command, cli.scrapes, fixtures_out, startup);
    report.reads = reads;
    Ok(report)
}

/// The command that reran this benchmark: its arguments without the `--bin-dir` that
/// `cargo xtask bench` adds.
fn command_line(mut args: impl Iterator<Item = String>) -> String {
    let mut kept = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bin-dir" => {
                args.next();
            }
            a if a.starts_with("--bin-dir=") => {}
            _ => kept.push(arg),
        }
    }
    format!("cargo xtask bench {}", kept.join(" ")).trim_end().to_owned()
}

/// The fake device for `spec`, with static firmware values and no faults.
fn mount(spec: MachineSpec) -> Result<(Arc<Machine>, FakeDevice)> {
    amd_hsmp_e2e::fake::mount_static(spec)
        .context("cannot mount the fake device (needs root, /dev/fuse and fusermount3 from fuse3)")
}

/// The broker's command line for fixture machine `name` served by `device`, on `socket`.
fn broker_args(device: &FakeDevice, name: &str, socket: &Path) -> Vec<String> {
    let tree = fixtures::tree(&fixtures::fixtures_dir(), name);
    let mut args = vec!["--listen".into(), socket.display().to_string()];
    args.extend(device.broker_args(&tree));
    // Three exporters of one uid, each holding up to two connections (the defaults let one
    // uid hold two).
    for flag in ["--connections.per-uid", "--connections.shared"] {
        args.extend([flag.to_owned(), "6".to_owned()]);
    }
    args.extend(["--sample.max-age".into(), format!("{}ms", MAX_AGE.as_millis())]);
    args
}

/// Which exporter a series scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    /// Every collector but the core owners (the defaults).
    Plain,
    /// The defaults plus `--collector.core-owner` on the generated hierarchy.
    Owner,
}

/// The fake device, the broker and the exporters (one with the default collectors, one without
/// [`DISABLED_FLAG`], and, with `--cgroups`, one with `--collector.core-owner` reading a
/// generated hierarchy). Field order is drop order: processes before the mount.
struct Rig {
    exporter: Proc,
    exporter_off: Proc,
    exporter_owner: Option<(Proc, SocketAddr)>,
    broker: Proc,
    addr: SocketAddr,
    addr_off: SocketAddr,
    device: FakeDevice,
    machine: Arc<Machine>,
    /// Cgroups of the generated hierarchy (the root included).
    cgroups: usize,
    /// Its workloads that own cores.
    workloads: usize,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn start(
        bins: &Binaries,
        name: &str,
        spec: MachineSpec,
        cgroups: usize,
        workloads: usize,
    ) -> Result<Rig> {
        let topology = spec.topology();
        let (machine, device) = mount(spec)?;
        let dir = tempfile::Builder::new().prefix("amd-hsmp-bench-").tempdir()?;
        let socket = dir.path().join("broker.sock");
        let args = broker_args(&device, name, &socket);
        let mut broker =
            Proc::spawn("amd-hsmp-broker", &bins.broker, &args, dir.path().join("broker.log"))?;
        harness::wait_until(&mut broker, "broker socket", || UnixStream::connect(&socket).is_ok())?;
        let exe = &bins.exporter;
        let (exporter, addr) =
            harness::start_exporter_from(exe, &socket, &[], None, dir.path(), "exporter")?;
        let off = [DISABLED_FLAG.to_owned()];
        let (exporter_off, addr_off) =
            harness::start_exporter_from(exe, &socket, &off, None, dir.path(), "exporter-off")?;
        let (exporter_owner, written, workloads) = if cgroups == 0 {
            (None, 0, 0)
        } else {
            let root = dir.path().join("cgroup");
            // About four cgroups a pod (its slice, the sandbox, two containers) and three more.
            let pods = cgroups.saturating_sub(3).div_ceil(4);
            let hierarchy = cgroups::generated_with(&topology, pods, workloads);
            let workloads = cgroups::generated_workloads(&topology, pods, workloads);
            hierarchy
                .write(&root, &topology.cores.iter().flat_map(|c| c.threads.clone()).collect())?;
            // Every measured scrape walks the hierarchy afresh, as each of Prometheus' scrapes
            // does at its interval: the bench's back-to-back scrapes would otherwise share
            // walks (the default --collector.core-owner.max-age is 1 s) and hide their cost.
            // Core energy is on by default, so each scrape also takes a sample for the
            // per-workload energy counters.
            let flags = [
                "--collector.core-owner".to_owned(),
                "--path.cgroupfs".to_owned(),
                root.display().to_string(),
                "--collector.core-owner.max-age".to_owned(),
                "0".to_owned(),
            ];
            let started = harness::start_exporter_from(
                exe,
                &socket,
                &flags,
                None,
                dir.path(),
                "exporter-owner",
            )?;
            (Some(started), hierarchy.groups.len() + 1, workloads)
        };
        Ok(Rig {
            exporter,
            exporter_off,
            exporter_owner,
            broker,
            addr,
            addr_off,
            device,
            machine,
            cgroups: written,
            workloads,
            _dir: dir,
        })
    }

    /// The address and process of exporter `which`.
    fn exporter(&self, which: Which) -> Result<(SocketAddr, u32)> {
        match which {
            Which::Plain => Ok((self.addr, self.exporter.pid())),
            Which::Owner => self
                .exporter_owner
                .as_ref()
                .map(|(p, addr)| (*addr, p.pid()))
                .context("no core-owner exporter (--cgroups 0)"),
        }
    }

    /// Scrapes `addr` as Prometheus does, past the freshness bound of the last reading; fails
    /// unless the answer is complete and healthy.
    fn scrape(&mut self, addr: SocketAddr) -> Result<Scraped> {
        std::thread::sleep(MAX_AGE);
        let response = scrape(addr)?;
        self.broker.check_running()?;
        self.exporter.check_running()?;
        self.exporter_off.check_running()?;
        if let Some((owner, _)) = self.exporter_owner.as_mut() {
            owner.check_running()?;
        }
        Ok(response)
    }

    fn messages(&self) -> usize {
        self.device.message_count()
    }
}

/// One scrape's times.
#[derive(Debug, Clone, Copy)]
struct Scraped {
    /// From sending the request to the end of the body.
    wall: Duration,
    /// The exporter's own `amd_hsmp_scrape_duration_seconds`: the broker request and the
    /// metric families, without HTTP and the encoding of the body.
    collect: Duration,
    /// `amd_hsmp_core_owner_info` series in the scrape.
    owners: usize,
    /// `amd_hsmp_workload_core_energy_joules_total` series in the scrape.
    workloads: usize,
    /// Whether the scrape counted a core-owner error (the hierarchy could not be read).
    owner_errors: bool,
}

fn scrape(addr: SocketAddr) -> Result<Scraped> {
    let headers = [
        ("Accept", PROMETHEUS_ACCEPT),
        (amd_hsmp_exporter::http::SCRAPE_TIMEOUT_HEADER, DEFAULT_SCRAPE_TIMEOUT),
    ];
    let response = harness::http_get(addr, "/metrics", &headers, Duration::from_secs(30))?;
    if response.status != 200 {
        bail!("scrape answered {}:\n{}", response.status, response.body);
    }
    scraped(&response)
}

/// A scrape asking for gzip, as Prometheus does: its times and the body's size as sent.
fn scrape_gzip(addr: SocketAddr) -> Result<(Scraped, usize)> {
    let request = scrape_request(addr, true, true);
    let (raw, elapsed) =
        harness::http_exchange_raw(None, addr, request.as_bytes(), Duration::from_secs(30))?;
    let (status, headers, body) = harness::parse_raw_response(&raw)?;
    let sent = body.len();
    Ok((scraped_as_sent(status, headers, body, elapsed, true)?, sent))
}

/// A scrape's request as Prometheus sends it, asking for gzip or not, with `Connection: close`
/// when `close` (the connection is not kept for the next).
fn scrape_request(addr: SocketAddr, gzip: bool, close: bool) -> String {
    let connection = if close { "Connection: close\r\n" } else { "" };
    let encoding = if gzip { "Accept-Encoding: gzip\r\n" } else { "" };
    format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{connection}Accept: {PROMETHEUS_ACCEPT}\r\n\
         {encoding}{}: {DEFAULT_SCRAPE_TIMEOUT}\r\n\r\n",
        amd_hsmp_exporter::http::SCRAPE_TIMEOUT_HEADER
    )
}

/// The figures of a scrape's answer as it came off the wire (status, headers, the body as
/// sent); fails unless it is a 200, gzipped exactly when `gzip` asked for it, and complete and
/// healthy once decoded.
fn scraped_as_sent(
    status: u16,
    headers: harness::Headers,
    body: Vec<u8>,
    elapsed: Duration,
    gzip: bool,
) -> Result<Scraped> {
    use std::io::Read as _;
    let gzipped = headers.iter().any(|(n, v)| n == "content-encoding" && v == "gzip");
    if status != 200 || gzipped != gzip {
        bail!(
            "a scrape asking for gzip: {gzip} answered {status}, content encoding gzip: {gzipped}"
        );
    }
    let text = if gzip {
        let mut text = String::new();
        flate2::read::GzDecoder::new(body.as_slice())
            .read_to_string(&mut text)
            .context("the gzip body does not decode")?;
        text
    } else {
        String::from_utf8(body).context("the body is not UTF-8")?
    };
    scraped(&harness::Response { status, headers, body: text, elapsed })
}

/// The figures of a healthy scrape's answer; fails unless it is complete and healthy.
fn scraped(response: &harness::Response) -> Result<Scraped> {
    for line in ["amd_hsmp_up 1", "amd_hsmp_broker_up 1"] {
        if !response.body.lines().any(|l| l == line) {
            bail!("scrape lacks {line:?}:\n{}", response.body);
        }
    }
    let collect = response
        .body
        .lines()
        .find_map(|l| l.strip_prefix("amd_hsmp_scrape_duration_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .context("scrape lacks amd_hsmp_scrape_duration_seconds")?;
    let series = |family: &str| response.body.lines().filter(|l| l.starts_with(family)).count();
    let owners = series("amd_hsmp_core_owner_info{");
    let workloads = series("amd_hsmp_workload_core_energy_joules_total{");
    let owner_errors = response.body.lines().any(|l| {
        l.starts_with("amd_hsmp_scrape_errors_total{collector=\"core-owner\"}")
            && !l.ends_with(" 0")
    });
    Ok(Scraped {
        wall: response.elapsed,
        collect: Duration::from_secs_f64(collect),
        owners,
        workloads,
        owner_errors,
    })
}

/// HSMP messages expected in one steady scrape with the default collectors on: one per item of
/// each default family the fixture's firmware answers (`MachineSpec::messages_per_sample`, the
/// rule the e2e suite counts on every fixture).
fn expected_messages(spec: &MachineSpec) -> usize {
    spec.messages_per_sample(Collectors::default().families())
}

fn fixture(cli: &Cli, bins: &Binaries, name: &str) -> Result<FixtureReport> {
    let spec = fixtures::machine(name).context("unknown fixture")?;
    let topology = spec.topology();
    let (cores, sockets) = (topology.cores.len(), topology.sockets.len());
    let expected = expected_messages(&spec);
    if spec.hsmp_protocol.is_none() {
        bail!("{name} has no HSMP device: no mailbox message to time against the floor");
    }
    let mut rig = Rig::start(bins, name, spec, cli.cgroups, cli.workloads)?;
    let result = measure_fixture(cli, &mut rig, name, cores, sockets, expected);
    result.with_context(|| format!("logs:\n{}\n{}", rig.broker.log(), rig.exporter.log()))
}

fn measure_fixture(
    cli: &Cli,
    rig: &mut Rig,
    name: &str,
    cores: usize,
    sockets: usize,
    expected: usize,
) -> Result<FixtureReport> {
    let floor = Floor::start(&rig.device.hsmp_path(), sockets)?;
    let libc = libc_of(rig.exporter.pid())?;
    let mut latencies = Vec::new();
    let mut owner_latencies = Vec::new();
    let (mut owners, mut workloads) = (Range::default(), Range::default());
    // The peaks of each process over its whole life, kept across the resets that measure the
    // peak of one series.
    let mut lifetime = Lifetime::default();
    let highest = cli.latencies_us.iter().copied().max().unwrap_or(0);
    let mut one_scraper = None;
    let mut owner_peaks = None;
    for &us in &cli.latencies_us {
        eprintln!("bench: {name}: {us} µs per message");
        rig.machine.update_faults(|f| f.latency = Duration::from_micros(us));
        // At the highest latency, each series' peak is its own: the peaks are reset before it.
        let (broker, exporter) = (rig.broker.pid(), rig.exporter.pid());
        if us == highest {
            lifetime.reset(broker, Some(exporter))?;
        }
        latencies.push(series(rig, &floor, cli.scrapes, us, Which::Plain)?.0);
        if us == highest {
            one_scraper = Some(peaks(broker, exporter)?);
        }
        if let Some((owner, _)) = rig.exporter_owner.as_ref() {
            eprintln!(
                "bench: {name}: {us} µs per message, --collector.core-owner, {} cgroups, {} \
                 workloads",
                rig.cgroups, rig.workloads
            );
            let owner = owner.pid();
            if us == highest {
                lifetime.reset(broker, None)?;
            }
            let (report, o, w) = series(rig, &floor, cli.scrapes, us, Which::Owner)?;
            if us == highest {
                owner_peaks = Some(peaks(broker, owner)?);
            }
            owners.merge(o);
            workloads.merge(w);
            owner_latencies.push(report);
        }
    }
    let core_owner = match rig.exporter_owner.as_ref() {
        None => None,
        Some((owner, _)) => Some(CoreOwner {
            cgroups: rig.cgroups,
            workloads: rig.workloads,
            owners_min: owners.min(),
            owners_max: owners.max,
            workload_series_min: workloads.min(),
            workload_series_max: workloads.max,
            latencies: owner_latencies,
            exporter_peak_kib: status_kib(owner.pid(), "VmHWM")?,
            exporter_anon_kib: status_kib(owner.pid(), "RssAnon")?,
            broker_peak_kib: lifetime.broker.max(status_kib(rig.broker.pid(), "VmHWM")?),
            peaks: owner_peaks.context("no core-owner series")?,
        }),
    };
    // Concurrency and the idle window at the highest latency: the longest flights.
    rig.machine.update_faults(|f| f.latency = Duration::from_micros(highest));
    lifetime.reset(rig.broker.pid(), Some(rig.exporter.pid()))?;
    let concurrent = concurrent(rig, cli.concurrent_rounds, highest)?;
    eprintln!("bench: {name}: {} scrapes asking for gzip at {highest} µs", cli.scrapes);
    let compressed = compressed(rig, &mut lifetime, cli.scrapes, highest)?;
    eprintln!("bench: {name}: {} scrapes over a kept connection at {highest} µs", cli.scrapes);
    let kept = kept(rig, cli.scrapes, highest)?;
    let disabled = disabled(rig)?;
    let idle = idle(rig)?;
    let memory = Memory {
        broker_peak_kib: lifetime.broker.max(status_kib(rig.broker.pid(), "VmHWM")?),
        broker_steady_kib: status_kib(rig.broker.pid(), "VmRSS")?,
        exporter_peak_kib: lifetime.exporter.max(status_kib(rig.exporter.pid(), "VmHWM")?),
        exporter_steady_kib: status_kib(rig.exporter.pid(), "VmRSS")?,
        broker_anon_kib: status_kib(rig.broker.pid(), "RssAnon")?,
        exporter_anon_kib: status_kib(rig.exporter.pid(), "RssAnon")?,
        one_scraper: one_scraper.context("no series at the highest latency")?,
    };
    // After the memory figures: a uprobe gives the traced process a copy of the page it is in.
    eprintln!("bench: {name}: allocations and procfs system calls per scrape");
    let addr = rig.addr;
    let exporter_per_scrape =
        crate::counts::per_scrape(rig.exporter.pid(), || rig.scrape(addr).map(drop));
    Ok(FixtureReport {
        fixture: name.to_owned(),
        libc,
        sockets,
        cores,
        expected_messages: expected,
        latencies,
        concurrent,
        compressed,
        kept,
        disabled_collector: disabled,
        idle,
        memory,
        exporter_per_scrape,
        core_owner,
        targets: Vec::new(),
    })
}

/// `scrapes` scrapes of exporter `which`, each followed by the floor client sending the same
/// messages; with the fewest and most owner series, and workload series, a scrape had.
fn series(
    rig: &mut Rig,
    floor: &Floor,
    scrapes: usize,
    latency_us: u64,
    which: Which,
) -> Result<(LatencyReport, Range, Range)> {
    let (addr, exporter_pid) = rig.exporter(which)?;
    for _ in 0..WARM_UP {
        let before = rig.messages();
        rig.scrape(addr)?;
        floor.replay(&rig.device.messages_from(before))?;
    }
    let (broker0, exporter0) = (cpu_time(rig.broker.pid())?, cpu_time(exporter_pid)?);
    let (mut owners, mut workloads) = (Range::default(), Range::default());
    let mut scrape_walls = Vec::with_capacity(scrapes);
    let mut collects = Vec::with_capacity(scrapes);
    let mut collect_ratios = Vec::with_capacity(scrapes);
    let mut floor_walls = Vec::with_capacity(scrapes);
    let mut ratios = Vec::with_capacity(scrapes);
    let mut floor_cpu = Duration::ZERO;
    let mut by_type: Option<BTreeMap<String, usize>> = None;
    let mut identical = true;
    let (mut min_total, mut max_total) = (usize::MAX, 0);
    let mut between = 0;
    let mut mark = rig.messages();
    for _ in 0..scrapes {
        let before = rig.messages();
        between += before - mark;
        let scraped = rig.scrape(addr)?;
        if scraped.owner_errors {
            bail!("the core-owner exporter could not read its cgroup hierarchy");
        }
        owners.add(scraped.owners);
        workloads.add(scraped.workloads);
        let sent = rig.device.messages_from(before);
        let counts = count_by_type(&sent);
        identical &= by_type.as_ref().is_none_or(|c| *c == counts);
        by_type.get_or_insert(counts);
        (min_total, max_total) = (min_total.min(sent.len()), max_total.max(sent.len()));

        let after_scrape = rig.messages();
        let run = floor.replay(&sent)?;
        // Anything else the fake saw while the floor ran came from the broker on its own.
        between += rig.messages() - after_scrape - sent.len();
        mark = rig.messages();

        let floor_s = run.wall.as_secs_f64().max(1e-9);
        scrape_walls.push(scraped.wall);
        collects.push(scraped.collect);
        floor_walls.push(run.wall);
        ratios.push(scraped.wall.as_secs_f64() / floor_s);
        collect_ratios.push(scraped.collect.as_secs_f64() / floor_s);
        floor_cpu += run.cpu;
    }
    let broker = cpu_time(rig.broker.pid())?.saturating_sub(broker0);
    let exporter = cpu_time(exporter_pid)?.saturating_sub(exporter0);
    let per = |d: Duration| d.as_secs_f64() * 1e3 / scrapes as f64;
    let (broker, exporter, floor_cpu) = (per(broker), per(exporter), per(floor_cpu));
    let report = LatencyReport {
        latency_us,
        scrapes,
        scrape_ms: Percentiles::of(&scrape_walls),
        floor_ms: Percentiles::of(&floor_walls),
        ratio_median: median(&mut ratios),
        collect_ms: Percentiles::of(&collects),
        collect_ratio_median: median(&mut collect_ratios),
        cpu_ms_per_scrape: Cpu {
            broker,
            exporter,
            both: broker + exporter,
            floor: floor_cpu,
            ratio: (broker + exporter) / floor_cpu.max(1e-9),
        },
        messages_per_scrape: by_type.unwrap_or_default(),
        messages_identical: identical,
        messages_min: if min_total == usize::MAX { 0 } else { min_total },
        messages_max: max_total,
        messages_between: between,
    };
    Ok((report, owners, workloads))
}

/// `scrapes` scrapes of the default exporter asking for gzip (`Accept-Encoding: gzip`, which
/// Prometheus sends unless told not to), each past the freshness bound: the exporter's CPU a
/// scrape with compression, and the body's size compressed and not.
fn compressed(
    rig: &mut Rig,
    lifetime: &mut Lifetime,
    scrapes: usize,
    latency_us: u64,
) -> Result<Compressed> {
    let addr = rig.addr;
    let (broker, exporter) = (rig.broker.pid(), rig.exporter.pid());
    let plain_bytes = scrape_body_len(addr)?;
    lifetime.reset(broker, Some(exporter))?;
    let cpu0 = cpu_time(exporter)?;
    let mut walls = Vec::with_capacity(scrapes);
    let mut gzip_bytes = 0;
    for _ in 0..scrapes {
        std::thread::sleep(MAX_AGE);
        let (scraped, bytes) = scrape_gzip(addr)?;
        walls.push(scraped.wall);
        gzip_bytes = gzip_bytes.max(bytes);
    }
    rig.exporter.check_running()?;
    let cpu = cpu_time(exporter)?.saturating_sub(cpu0);
    Ok(Compressed {
        latency_us,
        scrapes,
        scrape_ms: Percentiles::of(&walls),
        exporter_cpu_ms_per_scrape: ms_each(cpu, scrapes),
        plain_bytes,
        gzip_bytes,
        peaks: peaks(broker, exporter)?,
    })
}

/// The default exporter's CPU a scrape split into user and system time, each scrape past the
/// freshness bound: a new connection for each scrape (as the latency series scrape), then one
/// connection kept for all of them, as Prometheus keeps its connection to a target between
/// scrapes, without and with gzip.
fn kept(rig: &mut Rig, scrapes: usize, latency_us: u64) -> Result<Kept> {
    let (addr, exporter) = (rig.addr, rig.exporter.pid());
    let closing = cpu_split_over(exporter, scrapes, || scrape(addr).map(drop))?;
    let mut connection = KeptConnection::open(addr)?;
    // The connection's set-up is not counted: one scrape before the series.
    connection.scrape(false)?;
    let plain = cpu_split_over(exporter, scrapes, || connection.scrape(false).map(drop))?;
    let gzip = cpu_split_over(exporter, scrapes, || connection.scrape(true).map(drop))?;
    rig.exporter.check_running()?;
    Ok(Kept { latency_us, scrapes, closing, plain, gzip })
}

/// Process `pid`'s user and system time a call of `scrape`, over `scrapes` calls each after
/// the freshness bound.
fn cpu_split_over(
    pid: u32,
    scrapes: usize,
    mut scrape: impl FnMut() -> Result<()>,
) -> Result<CpuSplit> {
    let (user0, system0) = cpu_split(pid)?;
    for _ in 0..scrapes {
        std::thread::sleep(MAX_AGE);
        scrape()?;
    }
    let (user1, system1) = cpu_split(pid)?;
    let (user, system) = (
        ms_each(user1.saturating_sub(user0), scrapes),
        ms_each(system1.saturating_sub(system0), scrapes),
    );
    Ok(CpuSplit { user_ms: user, system_ms: system, total_ms: user + system })
}

/// An HTTP/1.1 connection to the exporter that stays open from one scrape to the next, as
/// Prometheus' is: each answer is read to the end of its body as framed (a length, or chunks),
/// never to the connection's end. A connection the exporter closes fails the next scrape.
struct KeptConnection {
    addr: SocketAddr,
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl KeptConnection {
    fn open(addr: SocketAddr) -> Result<KeptConnection> {
        let timeout = Duration::from_secs(30);
        let stream = harness::connect_from(None, addr, timeout)
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(KeptConnection { addr, reader: std::io::BufReader::new(stream) })
    }

    /// One scrape, asking for gzip or not; fails unless the answer is complete and healthy.
    fn scrape(&mut self, gzip: bool) -> Result<Scraped> {
        use std::io::Write as _;
        let request = scrape_request(self.addr, gzip, false);
        let started = Instant::now();
        self.reader.get_mut().write_all(request.as_bytes()).context("sending a scrape")?;
        let (status, headers, body) = read_framed_response(&mut self.reader)?;
        scraped_as_sent(status, headers, body, started.elapsed(), gzip)
    }
}

/// One HTTP/1.1 response read from `reader` up to the end of its body, framed by
/// `Content-Length` or chunked transfer encoding (trailers skipped), and no further: the
/// connection may carry the next. Header names are lower-cased; the body is as sent (still
/// gzipped if it was).
fn read_framed_response(
    reader: &mut impl std::io::BufRead,
) -> Result<(u16, harness::Headers, Vec<u8>)> {
    fn line(reader: &mut impl std::io::BufRead) -> Result<String> {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            bail!("the connection ended mid-response");
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_owned())
    }
    let status_line = line(reader)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP status line: {status_line:?}"))?;
    let mut headers = Vec::new();
    loop {
        let header = line(reader)?;
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').context("a header without a colon")?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let value = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    let mut body = Vec::new();
    if let Some(length) = value("content-length") {
        let length: usize = length.parse().context("a Content-Length that is not a number")?;
        body.resize(length, 0);
        reader.read_exact(&mut body).context("the body ended early")?;
    } else if value("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let size_line = line(reader)?;
            let size = size_line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16)
                .with_context(|| format!("not a chunk size: {size_line:?}"))?;
            if size == 0 {
                while !line(reader)?.is_empty() {}
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..]).context("a chunk ended early")?;
            if !line(reader)?.is_empty() {
                bail!("a chunk longer than its size");
            }
        }
    } else {
        bail!("an answer with neither Content-Length nor chunks cannot share a connection");
    }
    Ok((status, headers, body))
}

/// The length of one uncompressed answer of `addr`.
fn scrape_body_len(addr: SocketAddr) -> Result<usize> {
    let headers = [("Accept", PROMETHEUS_ACCEPT)];
    Ok(harness::http_get(addr, "/metrics", &headers, Duration::from_secs(30))?.body.len())
}

/// How process `pid` has its C library: `shared` where it maps a `libc.so`, else `static`
/// (linked in, `+crt-static`, as the release's tarball, `.deb` and image ship the daemons).
fn libc_of(pid: u32) -> Result<String> {
    let path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    Ok(libc_in(&maps).to_owned())
}

/// `shared` where a `maps` text maps a `libc.so`, else `static`.
pub fn libc_in(maps: &str) -> &'static str {
    let shared =
        maps.lines().any(|l| l.rsplit('/').next().is_some_and(|f| f.starts_with("libc.so")));
    if shared { "shared" } else { "static" }
}

/// The fewest and most of a count over scrapes.
#[derive(Debug, Clone, Copy)]
struct Range {
    min: usize,
    max: usize,
}

impl Default for Range {
    fn default() -> Range {
        Range { min: usize::MAX, max: 0 }
    }
}

impl Range {
    fn add(&mut self, n: usize) {
        (self.min, self.max) = (self.min.min(n), self.max.max(n));
    }

    fn merge(&mut self, other: Range) {
        (self.min, self.max) = (self.min.min(other.min), self.max.max(other.max));
    }

    /// The fewest, 0 when nothing was counted.
    fn min(self) -> usize {
        if self.min == usize::MAX { 0 } else { self.min }
    }
}

/// The two-scraper mode, as under a Prometheus HA pair: `rounds` pairs of simultaneous
/// scrapes asking for gzip as Prometheus does, each pair past the freshness bound of the last
/// reading. With single flight (and shared readings) a pair costs one reading; the figures are
/// per answered scrape, and the processes' peaks are those of these rounds (reset before them
/// by the caller).
fn concurrent(rig: &mut Rig, rounds: usize, latency_us: u64) -> Result<Concurrent> {
    let start = rig.messages();
    let addr = rig.addr;
    let (broker, exporter) = (rig.broker.pid(), rig.exporter.pid());
    let (broker0, exporter0) = (cpu_time(broker)?, cpu_time(exporter)?);
    let mut answered = 0;
    let mut walls = Vec::with_capacity(2 * rounds);
    for _ in 0..rounds {
        std::thread::sleep(MAX_AGE);
        let barrier = Barrier::new(2);
        let results: Vec<Result<Scraped>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        scrape_gzip(addr).map(|(scraped, _)| scraped)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("scraper panicked"))))
                .collect()
        });
        for r in results {
            walls.push(r?.wall);
            answered += 1;
        }
    }
    rig.broker.check_running()?;
    let messages = rig.messages() - start;
    let broker_cpu = ms_each(cpu_time(broker)?.saturating_sub(broker0), answered);
    let exporter_cpu = ms_each(cpu_time(exporter)?.saturating_sub(exporter0), answered);
    Ok(Concurrent {
        latency_us,
        rounds,
        answered,
        messages,
        per_answered: messages as f64 / answered.max(1) as f64,
        scrape_ms: Percentiles::of(&walls),
        broker_cpu_ms_per_answered: broker_cpu,
        exporter_cpu_ms_per_answered: exporter_cpu,
        peaks: peaks(broker, exporter)?,
    })
}

/// The peak resident sets of the broker and an exporter since their last reset, and where
/// their resident sets are now.
fn peaks(broker: u32, exporter: u32) -> Result<Peaks> {
    Ok(Peaks {
        broker_peak_kib: status_kib(broker, "VmHWM")?,
        exporter_peak_kib: status_kib(exporter, "VmHWM")?,
        broker: crate::smaps::of(broker)?,
        exporter: crate::smaps::of(exporter)?,
    })
}

/// The highest peaks the broker and the default exporter reached before their resets.
#[derive(Debug, Default)]
struct Lifetime {
    broker: u64,
    exporter: u64,
}

impl Lifetime {
    /// Keeps the peaks of `broker` and, if given, `exporter` and resets them to their current
    /// resident sets, so that the next reading of `VmHWM` is the peak of what follows.
    fn reset(&mut self, broker: u32, exporter: Option<u32>) -> Result<()> {
        self.broker = self.broker.max(reset_peak(broker)?);
        if let Some(exporter) = exporter {
            self.exporter = self.exporter.max(reset_peak(exporter)?);
        }
        Ok(())
    }
}

/// Resets `VmHWM` of `pid` to its current resident set (`5` written to `clear_refs`, Linux
/// 4.0+), returning the peak it had.
fn reset_peak(pid: u32) -> Result<u64> {
    let peak = status_kib(pid, "VmHWM")?;
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").with_context(|| format!("cannot reset the peak: {path}"))?;
    Ok(peak)
}

/// Scrapes of the exporter started with [`DISABLED_FLAG`].
fn disabled(rig: &mut Rig) -> Result<Disabled> {
    let start = rig.messages();
    for _ in 0..DISABLED_SCRAPES {
        rig.scrape(rig.addr_off)?;
    }
    let sent = rig.device.messages_from(start);
    let boost = sent.iter().filter(|m| m.msg_id == Message::GetBoostLimit.id()).count();
    let mut by_type = count_by_type(&sent);
    for n in by_type.values_mut() {
        *n /= DISABLED_SCRAPES;
    }
    Ok(Disabled {
        flag: DISABLED_FLAG.to_owned(),
        scrapes: DISABLED_SCRAPES,
        messages_per_scrape: by_type,
        boost_limit_messages: boost,
    })
}

/// What the broker sends while nobody scrapes.
fn idle(rig: &Rig) -> Result<Idle> {
    let (messages, reads) = (rig.messages(), rig.device.msr_reads().len());
    std::thread::sleep(IDLE_WINDOW);
    Ok(Idle {
        seconds: IDLE_WINDOW.as_secs_f64(),
        hsmp_messages: rig.messages() - messages,
        msr_reads: rig.device.msr_reads().len() - reads,
    })
}

fn count_by_type(messages: &[WireMessage]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in messages {
        let name = Message::from_id(m.msg_id)
            .map_or_else(|| format!("{:#04x}", m.msg_id), |m| m.name().to_owned());
        *counts.entry(name).or_default() += 1;
    }
    counts
}

/// The floor: a bare client with one thread per socket, each sending its socket's messages
/// back to back through the device crate's ioctl, on one descriptor of the same fake node.
struct Floor {
    workers: Vec<FloorWorker>,
}

struct FloorWorker {
    jobs: mpsc::Sender<Vec<HsmpMessage>>,
    done: mpsc::Receiver<std::result::Result<FloorRun, String>>,
}

/// One socket's share of a replay, or the whole replay.
#[derive(Debug, Clone, Copy)]
struct FloorRun {
    /// From handing out the messages to the last answer.
    wall: Duration,
    /// CPU time of the sending threads.
    cpu: Duration,
}

impl Floor {
    fn start(hsmp: &Path, sockets: usize) -> Result<Floor> {
        let device = Arc::new(
            DevHsmp::open(hsmp)
                .map_err(|e| anyhow::anyhow!("cannot open {}: errno {e}", hsmp.display()))?,
        );
        let mut workers = Vec::new();
        for socket in 0..sockets {
            let (jobs, job_rx) = mpsc::channel::<Vec<HsmpMessage>>();
            let (done_tx, done) = mpsc::channel();
            let device = Arc::clone(&device);
            std::thread::Builder::new().name(format!("floor-{socket}")).spawn(move || {
                for job in job_rx {
                    let run = send_all(device.as_ref(), job);
                    if done_tx.send(run).is_err() {
                        break;
                    }
                }
            })?;
            workers.push(FloorWorker { jobs, done });
        }
        Ok(Floor { workers })
    }

    /// Sends `messages` again, each socket's on its own thread, all sockets at once.
    fn replay(&self, messages: &[WireMessage]) -> Result<FloorRun> {
        let mut per_socket: Vec<Vec<HsmpMessage>> = vec![Vec::new(); self.workers.len()];
        for m in messages {
            let message = Message::from_id(m.msg_id).with_context(|| {
                format!("message {:#04x} is not one the broker sends", m.msg_id)
            })?;
            let queue = per_socket.get_mut(usize::from(m.sock_ind)).with_context(|| {
                format!("message to socket {} of {}", m.sock_ind, self.workers.len())
            })?;
            queue.push(message.request(m.sock_ind, m.arg0));
        }
        let started = Instant::now();
        for (worker, job) in self.workers.iter().zip(per_socket) {
            worker.jobs.send(job).context("floor thread gone")?;
        }
        let mut cpu = Duration::ZERO;
        for worker in &self.workers {
            let run = worker.done.recv().context("floor thread gone")?;
            cpu += run.map_err(|e| anyhow::anyhow!("floor client: {e}"))?.cpu;
        }
        Ok(FloorRun { wall: started.elapsed(), cpu })
    }
}

fn send_all(device: &DevHsmp, job: Vec<HsmpMessage>) -> std::result::Result<FloorRun, String> {
    let started = Instant::now();
    let cpu0 = thread_cpu()?;
    for mut msg in job {
        device.send(&mut msg).map_err(|e| format!("message {:#04x}: errno {e}", msg.msg_id))?;
    }
    let cpu = thread_cpu()?.saturating_sub(cpu0);
    Ok(FloorRun { wall: started.elapsed(), cpu })
}

/// CPU time of the calling thread, in nanoseconds precision (`/proc/thread-self/schedstat`).
fn thread_cpu() -> std::result::Result<Duration, String> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .map_err(|e| format!("cannot read /proc/thread-self/schedstat: {e}"))?;
    parse_schedstat(&text).ok_or_else(|| format!("malformed schedstat {text:?}"))
}

/// The run time (first field, ns) of a `schedstat` line.
pub fn parse_schedstat(text: &str) -> Option<Duration> {
    text.split_whitespace().next()?.parse().ok().map(Duration::from_nanos)
}

/// `time` spread over `n` events (scrapes, answers), in ms each; 0 for none.
fn ms_each(time: Duration, n: usize) -> f64 {
    time.as_secs_f64() * 1e3 / n.max(1) as f64
}

/// User plus system time of every thread of `pid`, living or exited (`/proc/PID/stat`).
fn cpu_time(pid: u32) -> Result<Duration> {
    let (user, system) = cpu_split(pid)?;
    Ok(user + system)
}

/// User and system time of every thread of `pid`, living or exited (`/proc/PID/stat`).
fn cpu_split(pid: u32) -> Result<(Duration, Duration)> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_stat_cpu(&text).with_context(|| format!("malformed {path}: {text:?}"))
}

/// `utime` and `stime` of a `/proc/PID/stat` line. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted from the last `)`: utime and stime are fields 14
/// and 15.
pub fn parse_stat_cpu(text: &str) -> Option<(Duration, Duration)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = |t: u64| Duration::from_millis(t * 1000 / USER_HZ);
    Some((ticks(utime), ticks(stime)))
}

/// A `Vm*` line of `/proc/PID/status`, KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_status_kib(&text, field).with_context(|| format!("{path} has no {field} line"))
}

/// The value of `field` (`VmHWM`, `VmRSS`) in a `/proc/PID/status` text, KiB.
pub fn parse_status_kib(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

/// A broker killed and reaped when dropped, started without `setpriv` so that nothing but
/// the broker runs between the spawn and its notification.
struct Broker(Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Broker start-ups on fixture `name`: spawn to `READY=1` on `NOTIFY_SOCKET` (sent once the
/// listening socket is bound), without and with the MSR fallback.
fn startup(bins: &Binaries, name: &str, runs: usize) -> Result<Startup> {
    let spec = fixtures::machine(name).context("unknown fixture")?;
    let cores = spec.topology().cores.len();
    let (_machine, device) = mount(spec)?;
    let dir = tempfile::Builder::new().prefix("amd-hsmp-bench-").tempdir()?;
    let mut figures = Vec::new();
    for msr in [false, true] {
        let mut ready = Vec::new();
        let mut peak = 0;
        for run in 0..runs.max(1) {
            let (time, hwm) = start_once(bins, &device, name, dir.path(), msr, run)?;
            ready.push(time.as_secs_f64() * 1e3);
            peak = peak.max(hwm);
        }
        let (min, max) = ready.iter().fold((f64::MAX, 0f64), |(a, b), &v| (a.min(v), b.max(v)));
        figures.push(StartupFigures {
            msr_fallback: msr,
            runs: ready.len(),
            ready_ms_median: median(&mut ready),
            ready_ms_min: min,
            ready_ms_max: max,
            peak_rss_kib: peak,
        });
    }
    let with_msr = figures.pop().context("no start-up figures")?;
    let without_msr = figures.pop().context("no start-up figures")?;
    Ok(Startup { fixture: name.to_owned(), cores, without_msr, with_msr })
}

fn start_once(
    bins: &Binaries,
    device: &FakeDevice,
    name: &str,
    dir: &Path,
    msr: bool,
    run: usize,
) -> Result<(Duration, u64)> {
    let notify: PathBuf = dir.join(format!("notify-{run}-{msr}"));
    let socket = dir.join(format!("broker-{run}-{msr}.sock"));
    let listener =
        UnixDatagram::bind(&notify).with_context(|| format!("cannot bind {}", notify.display()))?;
    listener.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut args = broker_args(device, name, &socket);
    if msr {
        // The MSR source chosen outright: where HSMP answers RAPL (the largest fixture is a
        // Turin), a fallback alone would not be opened.
        args.push("--collector.core-energy.sources=msr".into());
    }
    let log = dir.join(format!("broker-{run}-{msr}.log"));
    let err = std::fs::File::create(&log)?;
    let started = Instant::now();
    let child = Command::new(&bins.broker)
        .args(&args)
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(err.try_clone()?)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {}", bins.broker.display()))?;
    let broker = Broker(child);
    let mut buf = [0u8; 256];
    loop {
        let n = listener.recv(&mut buf).with_context(|| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            format!("no READY=1 from the broker; its log:\n{text}")
        })?;
        if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1") {
            break;
        }
    }
    let elapsed = started.elapsed();
    UnixStream::connect(&socket).context("READY sent but the socket does not accept")?;
    let hwm = status_kib(broker.0.id(), "VmHWM")?;
    drop(broker);
    Ok((elapsed, hwm))
}

/// The machine the figures came from.
fn host() -> Host {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim()))
        .unwrap_or("unknown")
        .to_owned();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let nproc = std::thread::available_parallelism().map_or(0, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default();
    Host { nproc, cpu_model, kernel, load_average_1m: load }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_on_a_kept_connection_are_read_one_at_a_time_by_their_framing() {
        let wire: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello\
            HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n\
            3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort";
        let mut reader = std::io::BufReader::new(wire);
        let (status, headers, body) = read_framed_response(&mut reader).unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"hello"[..]));
        assert!(headers.contains(&("x-a".to_owned(), "1".to_owned())));
        let (status, _, body) = read_framed_response(&mut reader).unwrap();
        assert_eq!((status, body.as_slice()), (503, &b"abcde"[..]));
        let cut = read_framed_response(&mut reader).unwrap_err();
        assert!(format!("{cut:#}").contains("ended early"), "{cut:#}");
        let unframed: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nbody";
        let err = read_framed_response(&mut std::io::BufReader::new(unframed)).unwrap_err();
        assert!(err.to_string().contains("cannot share a connection"), "{err:#}");
    }

    #[test]
    fn process_cpu_time_is_counted_from_the_last_parenthesis() {
        // A command name with spaces and a parenthesis; utime 250, stime 50 ticks.
        let stat = "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(
            parse_stat_cpu(stat),
            Some((Duration::from_millis(2500), Duration::from_millis(500)))
        );
        assert_eq!(parse_stat_cpu("4242 (x) S 1"), None);
    }

    #[test]
    fn schedstat_run_time_is_in_nanoseconds() {
        assert_eq!(
            parse_schedstat("114422142 744847391 57\n"),
            Some(Duration::from_nanos(114422142))
        );
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tx\nVmHWM:\t    3712 kB\nVmRSS:\t    3400 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(3712));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(3400));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn the_echoed_command_leaves_out_the_xtasks_bin_dir() {
        let args = ["--scrapes", "5", "--bin-dir", "/t/release", "--json", "f", "--bin-dir=/x"];
        let echoed = command_line(args.into_iter().map(String::from));
        assert_eq!(echoed, "cargo xtask bench --scrapes 5 --json f");
        assert_eq!(command_line(std::iter::empty()), "cargo xtask bench");
    }

    #[test]
    fn a_process_mapping_libc_so_has_it_shared_and_one_without_has_it_linked_in() {
        let dynamic = "55d0-55d1 r-xp 00001000 fd:01 12 /usr/bin/amd-hsmp-exporter\n\
                       7f10-7f12 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n";
        assert_eq!(libc_in(dynamic), "shared");
        let linked_in = "55d0-55d1 r-xp 00001000 fd:01 12 /usr/bin/amd-hsmp-exporter\n\
                         7ffc-7ffd rw-p 00000000 00:00 0 [stack]\n";
        assert_eq!(libc_in(linked_in), "static");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
