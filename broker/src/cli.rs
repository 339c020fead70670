//! The broker's command line: every flag, its default and its help text.
//!
//! A library module so that `cargo xtask man` renders the man page and the shell completions
//! from the same definition `main` parses.

use amd_hsmp_cli::CommonArgs;
use clap::{CommandFactory as _, Parser};
use std::path::PathBuf;
use std::time::Duration;

/// Reads AMD EPYC telemetry from /dev/hsmp (and optionally the MSR devices) and answers typed
/// requests from amd-hsmp-exporter on a Unix socket. It never touches the network.
#[derive(Debug, Parser)]
#[command(name = BROKER_PROGRAM, about, long_about = None, disable_version_flag = true)]
pub struct Cli {
    #[command(flatten)]
    pub args: Args,
}

// Every flag of the broker, apart from the command's name and description, so that
// `amd-hsmp-sim-broker` takes the same ones besides its own.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Create and listen on this Unix socket (mode --listen.mode). Without it, the socket passed by
    /// systemd socket activation (LISTEN_FDS) is used.
    #[arg(long, value_name = "PATH")]
    pub listen: Option<PathBuf>,

    /// Mode of the --listen socket, octal, 0600 to 0666: connecting needs write permission.
    /// Created by the broker's user and group; 0666 lets any local user reach the allow-list
    /// (the exporter by hand as `nobody`), which then alone decides who is served.
    #[arg(long = "listen.mode", value_name = "MODE", default_value = "0660",
          value_parser = parse_socket_mode, requires = "listen")]
    pub listen_mode: u32,

    /// Serve peers with this uid (repeatable). Root is always allowed, within the same
    /// --connections.per-uid limit as any uid.
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uid: Vec<u32>,

    /// Serve peers whose effective gid is this (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    pub allow_gid: Vec<u32>,

    /// Serve peers running as this user (repeatable); resolved once at start-up.
    #[arg(long = "allow-user", value_name = "NAME")]
    pub allow_user: Vec<String>,

    /// Serve peers whose effective group is this (repeatable); resolved once at start-up.
    #[arg(long = "allow-group", value_name = "NAME")]
    pub allow_group: Vec<String>,

    /// The HSMP device node.
    #[arg(long = "hsmp.device", value_name = "PATH", default_value = "/dev/hsmp")]
    pub hsmp_device: PathBuf,

    /// Where per-core energy may come from, tried in this order whatever the order given:
    /// hsmp (the firmware's RAPL messages, where it answers them), perf (the kernel's
    /// power_core PMU, Linux 6.14+; needs CAP_PERFMON at start-up), msr (the MSR devices;
    /// needs CAP_SYS_RAWIO at start-up). List one to choose it, leave one out to refuse it.
    #[arg(
        long = "collector.core-energy.sources",
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "hsmp,perf",
        required = false,
        num_args = 1
    )]
    pub energy_sources: Vec<crate::energy::SourceName>,

    /// Also read per-core energy from the MSR devices where HSMP lacks the RAPL messages and
    /// the perf counter cannot be opened: adds msr to --collector.core-energy.sources (needs
    /// CAP_SYS_RAWIO at start-up; dropped right after the devices are opened).
    #[arg(long = "collector.core-energy.msr-fallback")]
    pub msr_fallback: bool,

    /// Directory listing the kernel's PMUs (the power_core PMU's description is read there).
    #[arg(long = "perf.pmu-root", value_name = "PATH",
          default_value = amd_hsmp_device::perf::DEFAULT_PMU_ROOT)]
    pub perf_pmu_root: PathBuf,

    /// Directory holding <cpu>/msr device nodes.
    #[arg(long = "msr.device-root", value_name = "PATH", default_value = "/dev/cpu")]
    pub msr_device_root: PathBuf,

    /// How often the 32-bit MSR energy counters are read to extend them to 64 bits. Shortened
    /// to a quarter of the shortest wrap at 100 W a core (164 s at the usual ESU of 16); a core
    /// not read for a whole wrap period restarts its count and the reset is counted.
    #[arg(long = "msr.poll-interval", value_name = "DURATION", default_value = "30s",
          value_parser = parse_poll_interval)]
    pub msr_poll_interval: Duration,

    /// Freshness bound: every value the broker returns was read no earlier than this before the
    /// request arrived. Requests within it share reads, and it caps the mailbox load any peer
    /// can cause at one read of each item per this interval. 0 shares only reads that begin
    /// after a request arrived.
    #[arg(long = "sample.max-age", value_name = "DURATION", default_value = "500ms",
          value_parser = parse_max_age)]
    pub sample_max_age: Duration,

    /// Connection slots each peer uid may hold at once, root included. Each
    /// --allow-uid/--allow-user/--allow-gid/--allow-group identity has this many slots kept for
    /// it alone, so the exporter (which holds at most 2) always connects, whoever else squats.
    /// A slot is free again as soon as its peer hangs up, even while its request waits; an
    /// allowed peer turned away is told why before the close.
    #[arg(long = "connections.per-uid", value_name = "N", default_value_t = crate::server::DEFAULT_PER_UID,
          value_parser = clap::value_parser!(u16).range(2..=64))]
    pub connections_per_uid: u16,

    /// Connection slots shared by every allowed peer (root included), beyond the reserved ones.
    #[arg(long = "connections.shared", value_name = "N", default_value_t = crate::server::DEFAULT_SHARED,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub connections_shared: u16,

    /// A connection with no request for this long is closed (the exporter reconnects).
    #[arg(long = "connections.idle-timeout", value_name = "DURATION", default_value = "60s",
          value_parser = parse_idle_timeout)]
    pub idle_timeout: Duration,

    /// procfs mount point (for cpuinfo).
    #[arg(long = "path.procfs", value_name = "PATH", default_value = "/proc")]
    pub procfs: PathBuf,

    /// sysfs mount point (for CPU topology).
    #[arg(long = "path.sysfs", value_name = "PATH", default_value = "/sys")]
    pub sysfs: PathBuf,

    /// Run amd-hsmp-check with the other flags instead of serving (moved there; this form goes
    /// in the next release). It checks every precondition of a scrape on this machine, prints
    /// one line each with its verdict and fix, and exits 0 when nothing a scrape needs fails, 1
    /// otherwise.
    #[arg(long)]
    pub check: bool,

    /// How long the checks may take in all. Past it a `deadline` line names the check that did
    /// not finish (a device or a file that does not answer) and they exit 1.
    #[arg(long = "check.timeout", value_name = "DURATION", default_value = "30s",
          value_parser = parse_check_timeout)]
    pub check_timeout: Duration,

    #[command(flatten)]
    pub common: CommonArgs,
}

pub(crate) fn parse_poll_interval(s: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(s)?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(600) {
        return Err("must be between 10ms and 10m (the counter wraps after ~65536 J)".into());
    }
    Ok(d)
}

pub(crate) fn parse_socket_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s, 8).map_err(|_| format!("{s:?} is not an octal mode"))?;
    if mode & !0o666 != 0 || mode & 0o600 != 0o600 {
        return Err("must be between 0600 and 0666: read and write for the owner, no x bits".into());
    }
    Ok(mode)
}

pub(crate) fn parse_max_age(s: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(s)?;
    if d > Duration::from_secs(10) {
        return Err("must be at most 10s (well under a scrape interval)".into());
    }
    Ok(d)
}

pub(crate) fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(s)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(240) {
        return Err("must be between 1s and 4m".into());
    }
    Ok(d)
}

pub(crate) fn parse_check_timeout(s: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(s)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
        return Err("must be between 1s and 10m".into());
    }
    Ok(d)
}

impl Args {
    /// The energy sources the broker may use, in the order they are tried:
    /// `--collector.core-energy.sources`, plus `msr` with `--collector.core-energy.msr-fallback`.
    pub(crate) fn energy_sources(&self) -> Vec<crate::energy::SourceName> {
        let mut sources = self.energy_sources.clone();
        if self.msr_fallback {
            sources.push(crate::energy::SourceName::Msr);
        }
        sources.sort_unstable();
        sources.dedup();
        sources
    }
}

/// The broker's `clap` definition, for `main`, the man page and the completions.
pub fn command() -> clap::Command {
    serving_rules(Cli::command())
}

/// The broker's flags as `amd-hsmp-broker` parses them; exits 2 on a usage error.
pub fn parse() -> Args {
    let matches = command().get_matches();
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches).map_or_else(|e| e.exit(), |c| c.args)
}

/// What a command that serves (the broker, the simulator's broker) adds to [`Args`]:
/// `--check.timeout` only with `--check`. `amd-hsmp-check` takes it alone.
pub fn serving_rules(command: clap::Command) -> clap::Command {
    command.mut_arg("check_timeout", |a| a.requires("check"))
}

/// What both programs do first with their flags: `--version` answered (then `Some(0)`), else
/// logging set up as `--log.*` say (`Some(1)` if it cannot be). `None`: go on.
pub(crate) fn begin(program: &str, args: &Args) -> Option<std::process::ExitCode> {
    if args.common.version {
        print!("{}", amd_hsmp_cli::version::report(program));
        return Some(std::process::ExitCode::SUCCESS);
    }
    if let Err(e) = amd_hsmp_cli::log::init(args.common.log_level, args.common.log_format) {
        eprintln!("{program}: cannot set up logging: {e}");
        return Some(std::process::ExitCode::FAILURE);
    }
    None
}

/// The broker's program, whose label `amd-hsmp-check` checks beside itself.
pub(crate) const BROKER_PROGRAM: &str = "amd-hsmp-broker";

/// The program that checks a scrape's preconditions, installed beside the broker.
pub const CHECK_PROGRAM: &str = "amd-hsmp-check";

/// `amd-hsmp-check`'s `clap` definition: the broker's flags, so that it runs with the service's,
/// `--check` hidden (it is what the program does).
pub fn check_command() -> clap::Command {
    let about = "Checks every precondition of a scrape on this machine (CPU, driver, /dev/hsmp, \
        SELinux, the firmware's answers, energy, the broker's socket), prints one line each with \
        its verdict and fix, and exits 0 when nothing a scrape needs fails, 1 otherwise. Starts \
        no server. Run it as root with the flags the broker's service has \
        (/etc/sysconfig/amd-hsmp-broker with the RPM, /etc/default/amd-hsmp-broker with the .deb): \
        they are the broker's, read as the broker reads them (--listen is the socket it asks).";
    let command = clap::Command::new(CHECK_PROGRAM).disable_version_flag(true);
    // After the flags: flattening them sets the description of their struct.
    <Args as clap::Args>::augment_args(command).about(about).mut_arg("check", |a| a.hide(true))
}

/// `amd-hsmp-check`'s flags, parsed from its command line; exits 2 on a usage error.
pub fn check_args() -> Args {
    let matches = check_command().get_matches();
    <Args as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("amd-hsmp-broker").chain(args.iter().copied()))
            .map(|cli| cli.args)
    }

    /// Each default is said once, as a constant the code uses; the flag's text is tied to it.
    #[test]
    fn flag_defaults_are_the_constants_the_code_uses() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.sample_max_age, crate::sampler::DEFAULT_MAX_AGE);
        assert_eq!(args.msr_poll_interval, crate::msr::DEFAULT_POLL_INTERVAL);
        assert_eq!(args.idle_timeout, crate::server::DEFAULT_IDLE_TIMEOUT);
        assert_eq!(args.connections_per_uid, crate::server::DEFAULT_PER_UID);
        assert_eq!(args.connections_shared, crate::server::DEFAULT_SHARED);
        assert_eq!(args.energy_sources(), crate::energy::DEFAULT_SOURCES);
        let root = std::path::Path::new(amd_hsmp_device::perf::DEFAULT_PMU_ROOT);
        assert_eq!(args.perf_pmu_root, root);
    }

    #[test]
    fn energy_sources_are_tried_in_one_order_and_the_msr_flag_adds_msr() {
        use crate::energy::SourceName::{Hsmp, Msr, Perf};
        let sources = |args: &[&str]| parse(args).unwrap().energy_sources();
        assert_eq!(sources(&["--collector.core-energy.sources=perf"]), [Perf]);
        assert_eq!(sources(&["--collector.core-energy.sources", "msr,hsmp"]), [Hsmp, Msr]);
        assert_eq!(sources(&["--collector.core-energy.msr-fallback"]), [Hsmp, Perf, Msr]);
        let both = ["--collector.core-energy.sources=perf", "--collector.core-energy.msr-fallback"];
        assert_eq!(sources(&both), [Perf, Msr]);
        for bad in ["rapl", "", "hsmp,,perf"] {
            let err = parse(&["--collector.core-energy.sources", bad]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
            let said = err.to_string();
            assert!(said.contains("invalid value") || said.contains("value is required"), "{said}");
        }
    }

    #[test]
    fn duration_flags_take_prometheus_grammar_and_keep_their_ranges() {
        let args = parse(&[
            "--msr.poll-interval",
            "1m30s",
            "--sample.max-age",
            "0",
            "--connections.idle-timeout",
            "2m",
        ])
        .unwrap();
        assert_eq!(args.msr_poll_interval, Duration::from_secs(90));
        assert_eq!(args.sample_max_age, Duration::ZERO);
        assert_eq!(args.idle_timeout, Duration::from_secs(120));
        assert_eq!(parse(&["--sample.max-age", "250ms"]).unwrap().sample_max_age.as_millis(), 250);

        for (flag, value, says) in [
            ("--connections.idle-timeout", "1min", "unknown unit \"min\""),
            ("--msr.poll-interval", "30", "\"30\" is not a duration"),
            ("--sample.max-age", "0.5s", "\"0.5s\" is not a duration"),
            ("--msr.poll-interval", "11m", "between 10ms and 10m"),
            ("--sample.max-age", "10s1ms", "at most 10s"),
            ("--connections.idle-timeout", "999ms", "between 1s and 4m"),
        ] {
            let err = parse(&[flag, value]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{flag} {value}: {err}");
            assert!(err.to_string().contains(says), "{flag} {value}: {err}");
        }
    }
}
