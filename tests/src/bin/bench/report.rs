//! The figures, the targets they are held to, and their rendering as a table (the JSON is the
//! same structures through serde).

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The machine the figures came from.
    pub host: Host,
    /// How to rerun it.
    pub command: String,
    /// Scrapes measured per latency.
    pub scrapes: usize,
    /// One entry per fixture machine.
    pub fixtures: Vec<FixtureReport>,
    /// Broker start-up on the largest fixture.
    pub startup: Startup,
    /// One energy reading through perf and through the MSR driver, on this machine.
    pub reads: Option<crate::reads::Reads>,
}

impl Report {
    /// The report, with each fixture's targets evaluated.
    pub fn new(
        host: Host,
        command: String,
        scrapes: usize,
        mut fixtures: Vec<FixtureReport>,
        startup: Startup,
    ) -> Report {
        for f in &mut fixtures {
            f.targets = targets(f);
        }
        Report { host, command, scrapes, fixtures, startup, reads: None }
    }
}

/// The machine the figures came from.
#[derive(Debug, Serialize)]
pub struct Host {
    /// CPUs available to the benchmark.
    pub nproc: usize,
    /// `model name` of `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// One-minute load average when the run ended: how busy the machine was.
    pub load_average_1m: String,
}

/// The figures of one fixture machine.
#[derive(Debug, Serialize)]
pub struct FixtureReport {
    /// Fixture name.
    pub fixture: String,
    /// How the daemons have their C library: `shared` (`cargo build --release`, the RPM) or
    /// `static` (`cargo xtask bench --static`: the release's tarball, `.deb` and image).
    pub libc: String,
    /// Sockets.
    pub sockets: usize,
    /// Physical cores.
    pub cores: usize,
    /// HSMP messages one steady scrape should cost.
    pub expected_messages: usize,
    /// One series per simulated mailbox latency.
    pub latencies: Vec<LatencyReport>,
    /// Two scrapers at once.
    pub concurrent: Concurrent,
    /// Scrapes asking for gzip.
    pub compressed: Compressed,
    /// Its CPU a scrape, user and system, with a new connection each scrape and over one kept.
    pub kept: Kept,
    /// The exporter with a collector disabled.
    pub disabled_collector: Disabled,
    /// Nobody scraping.
    pub idle: Idle,
    /// Resident memory after every series.
    pub memory: Memory,
    /// Work per scrape of the exporter with the default collectors that grows with what it
    /// serves.
    pub exporter_per_scrape: PerScrape,
    /// The exporter with `--collector.core-owner` on the generated hierarchy (`--cgroups`).
    pub core_owner: Option<CoreOwner>,
    /// The targets, evaluated.
    pub targets: Vec<Target>,
}

/// One series of scrapes at one simulated latency.
#[derive(Debug, Serialize)]
pub struct LatencyReport {
    /// Simulated time per mailbox message, µs.
    pub latency_us: u64,
    /// Scrapes measured.
    pub scrapes: usize,
    /// Scrape wall time over HTTP, ms.
    pub scrape_ms: Percentiles,
    /// The floor client's wall time for the same messages, ms.
    pub floor_ms: Percentiles,
    /// Median of the per-scrape ratios scrape / floor.
    pub ratio_median: f64,
    /// The exporter's collection time (`amd_hsmp_scrape_duration_seconds`: the broker request
    /// and the families, without HTTP and encoding), ms.
    pub collect_ms: Percentiles,
    /// Median of the per-scrape ratios collection / floor.
    pub collect_ratio_median: f64,
    /// CPU time per scrape, ms.
    pub cpu_ms_per_scrape: Cpu,
    /// HSMP messages of one scrape, by message.
    pub messages_per_scrape: BTreeMap<String, usize>,
    /// Whether every scrape sent the same messages.
    pub messages_identical: bool,
    /// Fewest messages in a scrape.
    pub messages_min: usize,
    /// Most messages in a scrape.
    pub messages_max: usize,
    /// Messages the broker sent between scrapes, in the whole series.
    pub messages_between: usize,
}

/// The series of the exporter with `--collector.core-owner`, reading a generated hierarchy.
#[derive(Debug, Serialize)]
pub struct CoreOwner {
    /// Cgroups in the hierarchy, the root included.
    pub cgroups: usize,
    /// Workloads in the hierarchy that own cores (`--workloads`).
    pub workloads: usize,
    /// Fewest `amd_hsmp_core_owner_info` series in a scrape.
    pub owners_min: usize,
    /// Most.
    pub owners_max: usize,
    /// Fewest `amd_hsmp_workload_core_energy_joules_total` series in a scrape (0 from an
    /// exporter without the per-workload counters).
    pub workload_series_min: usize,
    /// Most.
    pub workload_series_max: usize,
    /// One series per simulated mailbox latency, as [`FixtureReport::latencies`].
    pub latencies: Vec<LatencyReport>,
    /// Its exporter's `VmHWM`, KiB.
    pub exporter_peak_kib: u64,
    /// Its exporter's `RssAnon`, KiB.
    pub exporter_anon_kib: u64,
    /// The broker's `VmHWM` after its series, KiB (the broker serves every exporter).
    pub broker_peak_kib: u64,
    /// The broker's peak over this exporter's series at the highest latency, beside this
    /// exporter's peak over its life, and where their resident sets are.
    pub peaks: Peaks,
}

/// p50 and p99, ms.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
}

impl Percentiles {
    /// The percentiles of `samples`, ms.
    pub fn of(samples: &[Duration]) -> Percentiles {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        Percentiles { p50: nearest_rank(&ms, 0.50), p99: nearest_rank(&ms, 0.99) }
    }
}

/// The `q` quantile of sorted `values` by nearest rank; 0 when empty.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// CPU time per scrape, ms.
#[derive(Debug, Serialize)]
pub struct Cpu {
    /// The broker, all threads.
    pub broker: f64,
    /// The exporter, all threads.
    pub exporter: f64,
    /// Both.
    pub both: f64,
    /// The floor client's threads for the same messages.
    pub floor: f64,
    /// `both / floor`.
    pub ratio: f64,
}

/// Two scrapers at once.
#[derive(Debug, Serialize)]
pub struct Concurrent {
    /// Simulated latency, µs.
    pub latency_us: u64,
    /// Pairs of simultaneous scrapes.
    pub rounds: usize,
    /// Scrapes answered.
    pub answered: usize,
    /// HSMP messages in all rounds.
    pub messages: usize,
    /// `messages / answered`.
    pub per_answered: f64,
    /// Each scrape's wall time over HTTP, ms.
    pub scrape_ms: Percentiles,
    /// The broker's CPU time per answered scrape, ms.
    pub broker_cpu_ms_per_answered: f64,
    /// The exporter's CPU time per answered scrape, ms.
    pub exporter_cpu_ms_per_answered: f64,
    /// Both processes' peaks over these rounds, and where their resident sets are.
    pub peaks: Peaks,
}

/// Both processes' peak resident sets over one series (`VmHWM` reset before it), KiB, and
/// where each process's resident set is after it.
#[derive(Debug, Serialize)]
pub struct Peaks {
    /// The broker's peak.
    pub broker_peak_kib: u64,
    /// The exporter's peak.
    pub exporter_peak_kib: u64,
    /// The broker's resident set by kind.
    pub broker: crate::smaps::Split,
    /// The exporter's resident set by kind.
    pub exporter: crate::smaps::Split,
}

impl Peaks {
    /// Both peaks together, KiB.
    pub fn both_kib(&self) -> u64 {
        self.broker_peak_kib + self.exporter_peak_kib
    }
}

/// Scrapes of the default exporter asking for gzip, as Prometheus does.
#[derive(Debug, Serialize)]
pub struct Compressed {
    /// Simulated latency, µs.
    pub latency_us: u64,
    /// Scrapes.
    pub scrapes: usize,
    /// Wall time over HTTP, ms.
    pub scrape_ms: Percentiles,
    /// The exporter's CPU time a scrape, ms.
    pub exporter_cpu_ms_per_scrape: f64,
    /// The body's length without compression, bytes.
    pub plain_bytes: usize,
    /// Its length gzipped, bytes (the longest of the scrapes).
    pub gzip_bytes: usize,
    /// Both processes' peaks over these scrapes, and where their resident sets are.
    pub peaks: Peaks,
}

/// The exporter's CPU a scrape, split: where the time goes.
#[derive(Debug, Serialize)]
pub struct CpuSplit {
    /// In the exporter's own code and its libraries, ms.
    pub user_ms: f64,
    /// In the kernel on the exporter's behalf (system calls: on a loopback connection, sending
    /// the body also runs the receiving side's TCP), ms.
    pub system_ms: f64,
    /// Both, ms.
    pub total_ms: f64,
}

/// The default exporter's CPU a scrape, user and system, by how the scraper connects.
#[derive(Debug, Serialize)]
pub struct Kept {
    /// Simulated latency, µs.
    pub latency_us: u64,
    /// Scrapes in each series.
    pub scrapes: usize,
    /// A new connection for each scrape, without gzip (as the latency series scrape).
    pub closing: CpuSplit,
    /// One connection kept from scrape to scrape, as Prometheus keeps it, without gzip.
    pub plain: CpuSplit,
    /// One kept connection, asking for gzip: a Prometheus server's scrape.
    pub gzip: CpuSplit,
}

/// The exporter with a collector disabled.
#[derive(Debug, Serialize)]
pub struct Disabled {
    /// The flag.
    pub flag: String,
    /// Scrapes.
    pub scrapes: usize,
    /// HSMP messages per scrape, by message.
    pub messages_per_scrape: BTreeMap<String, usize>,
    /// `GET_BOOST_LIMIT` messages in all those scrapes.
    pub boost_limit_messages: usize,
}

/// What the broker sends while nobody scrapes.
#[derive(Debug, Serialize)]
pub struct Idle {
    /// Length of the window.
    pub seconds: f64,
    /// HSMP messages.
    pub hsmp_messages: usize,
    /// MSR reads (the MSR poller's, with the fallback).
    pub msr_reads: usize,
}

/// Resident memory, KiB.
#[derive(Debug, Serialize)]
pub struct Memory {
    /// Broker `VmHWM`.
    pub broker_peak_kib: u64,
    /// Broker `VmRSS`.
    pub broker_steady_kib: u64,
    /// Exporter `VmHWM`.
    pub exporter_peak_kib: u64,
    /// Exporter `VmRSS`.
    pub exporter_steady_kib: u64,
    /// Broker `RssAnon`: the steady resident memory that is its own (heap, stacks), not
    /// mapped files such as its binary and libc, whose pages are shared and reclaimable.
    pub broker_anon_kib: u64,
    /// Exporter `RssAnon`.
    pub exporter_anon_kib: u64,
    /// The peaks of the series with one scraper at the highest latency.
    pub one_scraper: Peaks,
}

/// Work per scrape of an exporter, counted over scrapes of their own (`counts.rs`); `None`
/// where the tool that counts it is missing.
#[derive(Debug, Serialize)]
pub struct PerScrape {
    /// Scrapes counted.
    pub scrapes: usize,
    /// Calls of libc's `malloc`, `calloc`, `realloc` and `posix_memalign`.
    pub allocations: Option<f64>,
    /// procfs files opened.
    pub proc_opens: Option<f64>,
    /// System calls on procfs paths or descriptors (open, read, getdents64, close, ...).
    pub proc_syscalls: Option<f64>,
}

/// Broker start-up on the largest fixture.
#[derive(Debug, Serialize)]
pub struct Startup {
    /// Fixture.
    pub fixture: String,
    /// Its physical cores.
    pub cores: usize,
    /// Without the MSR fallback.
    pub without_msr: StartupFigures,
    /// With the MSR fallback (one MSR device opened per core).
    pub with_msr: StartupFigures,
}

/// Start-up times, spawn to `READY=1`.
#[derive(Debug, Serialize)]
pub struct StartupFigures {
    /// Whether the MSR fallback was on.
    pub msr_fallback: bool,
    /// Start-ups timed.
    pub runs: usize,
    /// Median, ms.
    pub ready_ms_median: f64,
    /// Fastest, ms.
    pub ready_ms_min: f64,
    /// Slowest, ms.
    pub ready_ms_max: f64,
    /// Largest `VmHWM` at `READY=1`, KiB.
    pub peak_rss_kib: u64,
}

/// One target and whether the run met it.
#[derive(Debug, Serialize)]
pub struct Target {
    /// What is measured.
    pub what: String,
    /// The figure.
    pub value: f64,
    /// The bound.
    pub limit: f64,
    /// `"at most"` or `"exactly"`.
    pub kind: &'static str,
    /// Whether the figure meets the bound.
    pub met: bool,
}

fn at_most(what: String, value: f64, limit: f64) -> Target {
    Target { what, value, limit, kind: "at most", met: value <= limit }
}

fn exactly(what: String, value: f64, limit: f64) -> Target {
    Target { what, value, limit, kind: "exactly", met: value == limit }
}

/// The issue's targets, evaluated on the series with the highest latency (100 µs by default):
/// the latency and CPU targets are about the code, which the fake's own cost hides at 0 µs.
pub fn targets(f: &FixtureReport) -> Vec<Target> {
    let mut out = Vec::new();
    if let Some(s) = f.latencies.iter().max_by_key(|s| s.latency_us) {
        let at = s.latency_us;
        out.push(at_most(format!("scrape p50 / paired floor at {at} µs"), s.ratio_median, 1.05));
        out.push(at_most(
            format!("CPU per scrape, both processes / floor client at {at} µs"),
            s.cpu_ms_per_scrape.ratio,
            1.3,
        ));
    }
    if let Some(o) = &f.core_owner
        && let Some(s) = o.latencies.iter().max_by_key(|s| s.latency_us)
    {
        let at = s.latency_us;
        let n = o.cgroups;
        out.push(at_most(
            format!("scrape p50 / paired floor at {at} µs, --collector.core-owner on {n} cgroups"),
            s.ratio_median,
            1.05,
        ));
        out.push(at_most(
            format!("CPU per scrape, both processes / floor client at {at} µs, --collector.core-owner on {n} cgroups"),
            s.cpu_ms_per_scrape.ratio,
            1.3,
        ));
    }
    out.push(at_most("broker peak RSS, MiB".into(), mib(f.memory.broker_peak_kib), 4.0));
    out.push(at_most("exporter peak RSS, MiB".into(), mib(f.memory.exporter_peak_kib), 8.0));
    out.push(at_most(
        "peak RSS of both processes with one scraper asking for gzip, MiB".into(),
        mib(f.compressed.peaks.both_kib()),
        7.5,
    ));
    out.push(at_most(
        "peak RSS of both processes with two scrapers at once asking for gzip, MiB".into(),
        mib(f.concurrent.peaks.both_kib()),
        7.5,
    ));
    if let Some(o) = &f.core_owner {
        out.push(at_most(
            format!(
                "peak RSS of the broker and the --collector.core-owner exporter on {} cgroups, MiB",
                o.cgroups
            ),
            mib(o.peaks.both_kib()),
            8.0,
        ));
    }
    if let Some(s) = f.latencies.iter().max_by_key(|s| s.latency_us) {
        out.push(at_most(
            format!("exporter CPU per scrape at {} µs, ms", s.latency_us),
            s.cpu_ms_per_scrape.exporter,
            0.5,
        ));
    }
    for s in &f.latencies {
        let worst =
            if s.messages_min == f.expected_messages { s.messages_max } else { s.messages_min };
        out.push(exactly(
            format!("messages per steady scrape at {} µs", s.latency_us),
            worst as f64,
            f.expected_messages as f64,
        ));
    }
    out.push(exactly(
        format!("GET_BOOST_LIMIT messages with {}", f.disabled_collector.flag),
        f.disabled_collector.boost_limit_messages as f64,
        0.0,
    ));
    let between: usize =
        f.latencies.iter().map(|s| s.messages_between).sum::<usize>() + f.idle.hsmp_messages;
    out.push(exactly("HSMP messages between scrapes".into(), between as f64, 0.0));
    out
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The report as a table for a terminal.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let h = &r.host;
    let _ = writeln!(
        out,
        "\nhost: {} CPUs, {}, Linux {}, load {}\ncommand: {}",
        h.nproc, h.cpu_model, h.kernel, h.load_average_1m, r.command
    );
    for f in &r.fixtures {
        fixture_table(&mut out, f);
    }
    let s = &r.startup;
    let _ =
        writeln!(out, "\nbroker start-up on {} ({} cores), spawn to READY=1:", s.fixture, s.cores);
    let _ = writeln!(
        out,
        "  {:<22} {:>9} {:>9} {:>9} {:>12}",
        "", "median ms", "min ms", "max ms", "peak RSS KiB"
    );
    for (name, x) in
        [("without the MSR source", &s.without_msr), ("with the MSR source", &s.with_msr)]
    {
        let _ = writeln!(
            out,
            "  {name:<22} {:>9.1} {:>9.1} {:>9.1} {:>12}",
            x.ready_ms_median, x.ready_ms_min, x.ready_ms_max, x.peak_rss_kib
        );
    }
    if let Some(r) = &r.reads {
        let _ = writeln!(
            out,
            "\none energy reading, {} CPUs, {} rounds, through the device crate's transports:",
            r.cpus, r.rounds
        );
        let _ = writeln!(out, "  {:<52} {:>9} {:>9}", "", "wall µs", "CPU µs");
        let msr = format!("msr: pread(2) of {}", r.msr_path);
        let perf = format!("perf: read(2) of {}", r.perf_event);
        for (name, x) in [(perf.as_str(), &r.perf), (msr.as_str(), &r.msr)] {
            let _ = writeln!(out, "  {name:<52} {:>9.2} {:>9.2}", x.wall_us, x.cpu_us);
        }
        let _ = writeln!(out, "  {:<52} {:>9.2} {:>9.2}", "perf / msr", r.wall_ratio, r.cpu_ratio);
        interrupts_table(&mut out, r, [(perf.as_str(), &r.perf), (msr.as_str(), &r.msr)]);
    }
    out
}

/// The function-call interrupts per reading of each path, their noise, and HSMP's.
fn interrupts_table(
    out: &mut String,
    r: &crate::reads::Reads,
    paths: [(&str, &crate::reads::PerRead); 2],
) {
    let Some(noise) = &r.noise else {
        let _ = writeln!(
            out,
            "  function-call interrupts: not counted (no CAL row in /proc/interrupts)"
        );
        return;
    };
    let _ = writeln!(
        out,
        "  function-call interrupts (CAL of /proc/interrupts) per reading, the reader pinned to \
         CPU {}, noise subtracted:",
        r.reader_cpu
    );
    let _ = writeln!(out, "  {:<52} {:>9} {:>9} {:>9}", "", "other CPU", "reader's", "own read");
    let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    for (name, x) in paths {
        let Some(i) = &x.interrupts else { continue };
        let _ = writeln!(
            out,
            "  {name:<52} {:>9} {:>9} {:>9.3}",
            figure(i.other_cpu),
            figure(i.reader_cpu_per_other_reading),
            i.own_cpu_reading
        );
    }
    let h = r.hsmp_interrupts_per_reading;
    let _ = writeln!(
        out,
        "  {:<52} {h:>9} {h:>9} {h:>9}",
        "hsmp: ioctl (by the driver's source, not measured)"
    );
    let _ = writeln!(
        out,
        "  (other CPU: on the CPU read; reader's: on the reader's CPU, per reading of another\n   \
         CPU; own read: on every CPU, per reading of the reader's own CPU alone. Noise without\n   \
         readings: {} per s on another CPU, {:.1} per s on the reader's, over {:.1} ms)",
        figure(noise.other_cpu_per_s),
        noise.reader_cpu_per_s,
        noise.window_ms
    );
}

fn fixture_table(out: &mut String, f: &FixtureReport) {
    let _ = writeln!(
        out,
        "\n== {} ({} sockets, {} cores; a steady scrape should cost {} messages; libc {}) ==",
        f.fixture, f.sockets, f.cores, f.expected_messages, f.libc
    );
    let _ = writeln!(
        out,
        "  {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>5} | {:>4} {:>3}",
        "µs/msg",
        "p50",
        "p99",
        "collect",
        "floor50",
        "floor99",
        "ratio",
        "c/f",
        "broker",
        "export",
        "both",
        "floor",
        "ratio",
        "msgs",
        "btw"
    );
    for s in &f.latencies {
        let msgs = if s.messages_min == s.messages_max {
            s.messages_min.to_string()
        } else {
            format!("{}-{}", s.messages_min, s.messages_max)
        };
        let _ = writeln!(out, "{} | {:>4} {:>3}", latency_row(s), msgs, s.messages_between);
    }
    let _ = writeln!(
        out,
        "  (wall ms: the scrape over HTTP (p50, p99), the exporter's own collection time (p50),\n   \
         the floor client for the same messages (p50, p99); ratio and c/f: medians of per-scrape\n   \
         scrape / floor and collection / floor. CPU ms per scrape. msgs: HSMP messages per\n   \
         scrape; btw: messages between scrapes)"
    );
    if let Some(s) = f.latencies.last() {
        let by_type: Vec<String> =
            s.messages_per_scrape.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "  messages per scrape: {}", by_type.join(", "));
    }
    if let Some(o) = &f.core_owner {
        let _ = writeln!(
            out,
            "  with --collector.core-owner on {} cgroups, {} workloads owning cores ({}-{} owner \
             series and {}-{} workload series a scrape; exporter peak {} KiB, anonymous {}; with \
             the broker's peak {} KiB):",
            o.cgroups,
            o.workloads,
            o.owners_min,
            o.owners_max,
            o.workload_series_min,
            o.workload_series_max,
            o.exporter_peak_kib,
            o.exporter_anon_kib,
            o.exporter_peak_kib + o.broker_peak_kib
        );
        for s in &o.latencies {
            let c = &s.cpu_ms_per_scrape;
            let plain = f.latencies.iter().find(|p| p.latency_us == s.latency_us);
            let extra = plain.map_or(0.0, |p| c.exporter - p.cpu_ms_per_scrape.exporter);
            let _ = writeln!(out, "{} | exporter CPU +{extra:.2} ms", latency_row(s));
        }
    }
    let c = &f.concurrent;
    let _ = writeln!(
        out,
        "  two scrapers at once asking for gzip ({} µs, {} rounds): {} messages for {} answered scrapes = {:.1} per scrape;\n   \
         per answered scrape: p50 {:.2} ms, p99 {:.2} ms, CPU broker {:.2} ms, exporter {:.2} ms",
        c.latency_us,
        c.rounds,
        c.messages,
        c.answered,
        c.per_answered,
        c.scrape_ms.p50,
        c.scrape_ms.p99,
        c.broker_cpu_ms_per_answered,
        c.exporter_cpu_ms_per_answered
    );
    let z = &f.compressed;
    let _ = writeln!(
        out,
        "  asking for gzip ({} µs, {} scrapes): exporter CPU {:.2} ms a scrape, p50 {:.2} ms; body {} \
         bytes gzipped, {} not",
        z.latency_us,
        z.scrapes,
        z.exporter_cpu_ms_per_scrape,
        z.scrape_ms.p50,
        z.gzip_bytes,
        z.plain_bytes
    );
    let k = &f.kept;
    let split = |c: &CpuSplit| {
        format!("{:.2} ms (user {:.2}, system {:.2})", c.total_ms, c.user_ms, c.system_ms)
    };
    let _ = writeln!(
        out,
        "  exporter CPU a scrape ({} µs, {} scrapes each): new connection each {}; one kept \
         connection {}; kept, asking for gzip {}",
        k.latency_us,
        k.scrapes,
        split(&k.closing),
        split(&k.plain),
        split(&k.gzip)
    );
    let d = &f.disabled_collector;
    let by_type: Vec<String> =
        d.messages_per_scrape.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(out, "  with {}: {} per scrape", d.flag, by_type.join(", "));
    let _ = writeln!(
        out,
        "  idle {:.0} s: {} HSMP messages, {} MSR reads",
        f.idle.seconds, f.idle.hsmp_messages, f.idle.msr_reads
    );
    let m = &f.memory;
    let _ = writeln!(
        out,
        "  memory KiB: broker peak {} steady {} (anonymous {}); exporter peak {} steady {} \
         (anonymous {})",
        m.broker_peak_kib,
        m.broker_steady_kib,
        m.broker_anon_kib,
        m.exporter_peak_kib,
        m.exporter_steady_kib,
        m.exporter_anon_kib
    );
    let p = &f.exporter_per_scrape;
    let figure = |v: Option<f64>| v.map_or_else(|| "not counted".to_owned(), |v| format!("{v:.1}"));
    let _ = writeln!(
        out,
        "  exporter per scrape ({} scrapes): {} allocations, {} procfs files opened, {} procfs \
         system calls",
        p.scrapes,
        figure(p.allocations),
        figure(p.proc_opens),
        figure(p.proc_syscalls)
    );
    let sum = m.broker_peak_kib + m.exporter_peak_kib;
    let _ =
        writeln!(out, "  peak RSS of both processes over the run: {sum} KiB ({:.2} MiB)", mib(sum));
    let _ = writeln!(
        out,
        "  peak RSS, KiB, and the resident set after the series by kind (files: binaries and libraries):"
    );
    let _ = writeln!(
        out,
        "  {:<34} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5}",
        "", "both", "peak", "files", "heap", "stacks", "rest"
    );
    let mut rows = vec![
        ("one scraper, no gzip", &m.one_scraper),
        ("one scraper, gzip", &f.compressed.peaks),
        ("two scrapers at once, gzip", &c.peaks),
    ];
    if let Some(o) = &f.core_owner {
        rows.push(("core-owner exporter", &o.peaks));
    }
    for (name, p) in rows {
        for (process, peak, split) in [
            ("broker", p.broker_peak_kib, &p.broker),
            ("exporter", p.exporter_peak_kib, &p.exporter),
        ] {
            let both = if process == "broker" { p.both_kib().to_string() } else { String::new() };
            let _ = writeln!(
                out,
                "  {:<34} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5}",
                format!("{name}: {process}"),
                both,
                peak,
                split.files_kib,
                split.heap_kib,
                split.stacks_kib,
                split.rest_kib
            );
        }
    }
    let _ = writeln!(out, "  targets:");
    for t in &f.targets {
        let _ = writeln!(
            out,
            "    [{}] {}: {} ({} {})",
            if t.met { " met " } else { "MISSED" },
            t.what,
            trim(t.value),
            t.kind,
            trim(t.limit)
        );
    }
}

/// A figure without needless decimals.
fn trim(v: f64) -> String {
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.3}") }
}

/// The columns a latency series shares in the text report: wall times, ratios and CPU.
fn latency_row(s: &LatencyReport) -> String {
    let c = &s.cpu_ms_per_scrape;
    format!(
        "  {:>6} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>6.3} {:>6.3} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>5.2}",
        s.latency_us,
        s.scrape_ms.p50,
        s.scrape_ms.p99,
        s.collect_ms.p50,
        s.floor_ms.p50,
        s.floor_ms.p99,
        s.ratio_median,
        s.collect_ratio_median,
        c.broker,
        c.exporter,
        c.both,
        c.floor,
        c.ratio
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 0.5), 50.0);
        assert_eq!(nearest_rank(&v, 0.99), 99.0);
        assert_eq!(nearest_rank(&[7.0], 0.99), 7.0);
        assert_eq!(nearest_rank(&[], 0.5), 0.0);
    }

    #[test]
    fn a_message_count_off_by_one_misses_its_target() {
        let exact = exactly("m".into(), 770.0, 770.0);
        assert!(exact.met);
        assert!(!exactly("m".into(), 771.0, 770.0).met);
        assert!(at_most("r".into(), 1.05, 1.05).met);
        assert!(!at_most("r".into(), 1.051, 1.05).met);
    }
}
