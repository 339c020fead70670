//! Work per scrape of the exporter that grows with what it serves: heap allocations (libc's
//! allocation functions, counted by uprobes through `perf stat`) and system calls on procfs
//! paths (`strace`), counted over scrapes of their own, apart from the timed series, since the
//! tracing slows the exporter down. Either figure is left out, with the reason on standard
//! error, where its tool is missing or cannot attach.

use crate::report::PerScrape;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Scrapes each count is taken over.
pub const COUNTED_SCRAPES: usize = 20;
/// How long a tracer is given to attach before the first counted scrape, and to take in the
/// last one before it is stopped. The exporter does nothing between scrapes (no timer, no
/// background work), so these windows add nothing to the counts.
const SETTLE: Duration = Duration::from_millis(1500);
/// The uprobe group of the allocation counters, deleted after the count.
const PROBE_GROUP: &str = "amd_hsmp_bench";
/// libc's allocation entry points (`std::alloc::System` calls `malloc`, `calloc`, `realloc`
/// and, for alignments above 16, `posix_memalign`).
const ALLOCATORS: [&str; 4] = ["malloc", "calloc", "realloc", "posix_memalign"];

/// Counts what `scrapes` calls of `scrape` cost process `pid`.
pub fn per_scrape(pid: u32, mut scrape: impl FnMut() -> Result<()>) -> PerScrape {
    let allocations = allocations(pid, &mut scrape)
        .inspect_err(|e| eprintln!("bench: allocations per scrape not counted: {e:#}"))
        .ok();
    let procfs = procfs_calls(pid, &mut scrape)
        .inspect_err(|e| eprintln!("bench: procfs system calls per scrape not counted: {e:#}"))
        .ok();
    PerScrape {
        scrapes: COUNTED_SCRAPES,
        allocations,
        proc_opens: procfs.map(|(opens, _)| opens),
        proc_syscalls: procfs.map(|(_, calls)| calls),
    }
}

/// A tracer attached to the exporter, stopped with SIGINT (so that it writes its figures) and
/// reaped when dropped.
struct Tracer(Child);

impl Tracer {
    fn spawn(cmd: &mut Command) -> Result<Tracer> {
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn()?;
        std::thread::sleep(SETTLE);
        Ok(Tracer(child))
    }

    /// Stops it and waits for it, returning its standard error.
    fn finish(mut self) -> Result<String> {
        std::thread::sleep(SETTLE);
        let pid = rustix::process::Pid::from_raw(self.0.id() as i32).context("no pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::INT)?;
        let mut err = String::new();
        if let Some(mut stderr) = self.0.stderr.take() {
            std::io::Read::read_to_string(&mut stderr, &mut err)?;
        }
        let status = self.0.wait()?;
        // strace ends by the signal it was sent, perf with its figures and status 0.
        let interrupted = std::os::unix::process::ExitStatusExt::signal(&status)
            == Some(rustix::process::Signal::INT.as_raw());
        if !status.success() && !interrupted {
            bail!("{status}: {err}");
        }
        Ok(err)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_scrapes(scrape: &mut impl FnMut() -> Result<()>) -> Result<()> {
    for _ in 0..COUNTED_SCRAPES {
        scrape()?;
    }
    Ok(())
}

/// uprobes on libc's allocation functions, deleted when dropped.
struct Probes;

impl Probes {
    fn add(libc: &Path) -> Result<Probes> {
        let _ = Probes::delete();
        for function in ALLOCATORS {
            let out = Command::new("perf")
                .arg("probe")
                .arg("-x")
                .arg(libc)
                .arg("--add")
                .arg(format!("{PROBE_GROUP}:{function}={function}"))
                .stdout(Stdio::null())
                .output()
                .context("cannot run perf (linux-perf)")?;
            if !out.status.success() {
                bail!("perf probe {function}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        Ok(Probes)
    }

    fn delete() -> Result<()> {
        Command::new("perf")
            .args(["probe", "--del", &format!("{PROBE_GROUP}:*")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        Ok(())
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        let _ = Probes::delete();
    }
}

/// The libc `pid` maps, from `/proc/PID/maps`.
fn libc_of(pid: u32) -> Result<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with("libc.so")))
        .map(PathBuf::from)
        .context("the exporter maps no libc.so (a static build): its allocations are not counted")
}

/// Calls of libc's allocation functions per scrape.
fn allocations(pid: u32, scrape: &mut impl FnMut() -> Result<()>) -> Result<f64> {
    let probes = Probes::add(&libc_of(pid)?)?;
    let events: Vec<String> = ALLOCATORS.iter().map(|f| format!("{PROBE_GROUP}:{f}")).collect();
    let tracer = Tracer::spawn(
        Command::new("perf")
            .args(["stat", "-x", ",", "-e", &events.join(","), "-p", &pid.to_string()])
            .stderr(Stdio::piped()),
    )?;
    run_scrapes(scrape)?;
    let out = tracer.finish()?;
    drop(probes);
    let total =
        parse_perf_counts(&out).with_context(|| format!("unexpected perf stat output: {out}"))?;
    Ok(total as f64 / COUNTED_SCRAPES as f64)
}

/// The sum of the counts of `perf stat -x ,` output (`count,unit,event,...` lines).
pub fn parse_perf_counts(text: &str) -> Option<u64> {
    let mut total = 0;
    let mut lines = 0;
    for line in text.lines().filter(|l| l.contains(PROBE_GROUP)) {
        total += line.split(',').next()?.trim().parse::<u64>().ok()?;
        lines += 1;
    }
    (lines == ALLOCATORS.len()).then_some(total)
}

/// procfs files opened and system calls on procfs paths, per scrape.
fn procfs_calls(pid: u32, scrape: &mut impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("strace.log");
    let tracer = Tracer::spawn(
        Command::new("strace")
            .args(["-f", "-qq", "-y", "-e", "trace=%file,%desc", "-o"])
            .arg(&log)
            .args(["-p", &pid.to_string()])
            .stderr(Stdio::piped()),
    )
    .context("cannot run strace")?;
    run_scrapes(scrape)?;
    tracer.finish()?;
    let text = std::fs::read_to_string(&log)?;
    let (opens, calls) = count_procfs(&text);
    let per = |n: usize| n as f64 / COUNTED_SCRAPES as f64;
    Ok((per(opens), per(calls)))
}

/// Opens of procfs paths, and system calls naming one (by path, or by a descriptor that
/// `strace -y` shows as one), in an strace log.
pub fn count_procfs(log: &str) -> (usize, usize) {
    let on_procfs = |l: &&str| l.contains("\"/proc/") || l.contains("</proc/");
    let calls: Vec<&str> = log.lines().filter(on_procfs).collect();
    let opens = calls.iter().filter(|l| l.contains("open") && l.contains("\"/proc/")).count();
    (opens, calls.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_counts_of_every_probe_are_summed() {
        let out = "1200,,amd_hsmp_bench:malloc,1000,100.00,,\n\
                   3,,amd_hsmp_bench:calloc,1000,100.00,,\n\
                   40,,amd_hsmp_bench:realloc,1000,100.00,,\n\
                   0,,amd_hsmp_bench:posix_memalign,1000,100.00,,\n";
        assert_eq!(parse_perf_counts(out), Some(1243));
        assert_eq!(parse_perf_counts("<not counted>,,amd_hsmp_bench:malloc"), None);
        assert_eq!(parse_perf_counts(""), None);
    }

    #[test]
    fn procfs_calls_are_told_by_path_and_by_descriptor() {
        let log = "12 openat(AT_FDCWD, \"/proc/self/stat\", O_RDONLY|O_CLOEXEC) = 9</proc/12/stat>\n\
                   12 read(9</proc/12/stat>, \"12 (x) S\"..., 2048) = 300\n\
                   12 close(9</proc/12/stat>) = 0\n\
                   12 read(7<socket:[1234]>, \"GET /metrics\"..., 8192) = 80\n\
                   12 openat(AT_FDCWD, \"/etc/hosts\", O_RDONLY) = 9</etc/hosts>\n";
        assert_eq!(count_procfs(log), (1, 3));
    }
}
