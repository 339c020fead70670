//! `bench`: what a scrape costs the node, measured on the real release binaries against the
//! FUSE fake device, side by side with the floor (a bare client sending the same messages).
//!
//! Run it through `cargo xtask bench`, which builds the release binaries first; it needs root
//! and `/dev/fuse`. `docs/benchmarks.md` explains every figure and records a run.

mod counts;
mod measure;
mod reads;
mod report;
mod smaps;

use anyhow::{Context, Result, bail};
use clap::Parser;
use std::path::PathBuf;

/// Benchmarks amd-hsmp-broker and amd-hsmp-exporter against the fake device.
#[derive(Debug, Parser)]
#[command(name = "bench")]
pub struct Cli {
    /// Scrapes measured at each simulated mailbox latency.
    #[arg(long, default_value_t = 200)]
    scrapes: usize,

    /// Fixture machine to benchmark (repeatable); see tests/fixtures.
    #[arg(long = "fixture", value_name = "NAME", default_value = "turin-2p")]
    fixtures: Vec<String>,

    /// Simulated time each mailbox message takes, in µs (repeatable).
    #[arg(long = "latency-us", value_name = "US", default_values_t = [0, 100])]
    latencies_us: Vec<u64>,

    /// Rounds of two simultaneous scrapes, as a Prometheus HA pair's (single flight): messages,
    /// CPU and both processes' peak memory per answered scrape.
    #[arg(long, default_value_t = 100)]
    concurrent_rounds: usize,

    /// Broker start-ups timed with and without the MSR fallback.
    #[arg(long, default_value_t = 5)]
    startups: usize,

    /// Cgroups of the generated Kubernetes-node hierarchy a third exporter reads with
    /// --collector.core-owner, measured like the first at each latency (0: no such run).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    cgroups: usize,

    /// Workloads of that hierarchy that own cores, for the core-owner exporter's per-workload
    /// energy counters: Guaranteed containers with an exclusive core each, two a pod (fewer
    /// where the pods or the fixture's cores leave no room: one core stays in the shared pool).
    #[arg(long, value_name = "N", default_value_t = 100)]
    workloads: usize,

    /// Rounds of per-core energy readings through the kernel's two paths (a perf event's
    /// read(2), the MSR driver's pread(2)) on every CPU of this machine (0: none).
    #[arg(long = "energy-reads", value_name = "N", default_value_t = 2000)]
    energy_reads: usize,

    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Where amd-hsmp-broker and amd-hsmp-exporter are (default: next to this program).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if cli.scrapes == 0 {
        bail!("--scrapes must be at least 1");
    }
    for name in &cli.fixtures {
        if amd_hsmp_e2e::fixtures::machine(name).is_none() {
            let known: Vec<_> = amd_hsmp_e2e::fixtures::machines().into_keys().collect();
            bail!("unknown fixture {name:?}; known: {}", known.join(", "));
        }
    }
    let bin_dir = match cli.bin_dir.clone() {
        Some(dir) => dir,
        None => std::env::current_exe()
            .context("cannot locate this program")?
            .parent()
            .context("this program has no directory")?
            .to_path_buf(),
    };
    let bins = amd_hsmp_e2e::harness::Binaries {
        broker: bin_dir.join("amd-hsmp-broker"),
        // Not built for the benchmark, which measures the broker on the fake device.
        sim_broker: bin_dir.join("amd-hsmp-sim-broker"),
        exporter: bin_dir.join("amd-hsmp-exporter"),
        // Not run by the benchmark.
        check: bin_dir.join("amd-hsmp-check"),
    };
    for bin in [&bins.broker, &bins.exporter] {
        if !bin.is_file() {
            bail!("{} does not exist; build it with `cargo build --release`", bin.display());
        }
    }
    let started = std::time::Instant::now();
    let report = measure::run(&cli, &bins)?;
    print!("{}", report::table(&report));
    eprintln!("bench: measured in {:.0} s", started.elapsed().as_secs_f64());
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("bench: figures written to {}", path.display());
    }
    Ok(())
}
