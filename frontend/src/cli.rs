//! Command-line flags, following the node_exporter conventions (`--web.*`, `--collector.NAME`,
//! `--no-collector.NAME`, `--log.*`).

use crate::collectors::{Collector, Collectors};
use amd_hsmp_cli::CommonArgs;
use amd_hsmp_proto::Families;
use amd_hsmp_web::flags::{ServerArgs, WebArgs, parse_duration};
use clap::{CommandFactory as _, FromArgMatches as _, Parser};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Prometheus exporter for AMD EPYC HSMP telemetry (per-core energy, boost limit, PROCHOT).
///
/// This process holds no device and no privilege: it asks amd-hsmp-broker over a Unix socket.
#[derive(Debug, Clone, Parser)]
#[command(name = "amd-hsmp-exporter", disable_version_flag = true)]
pub struct Args {
    /// Where to listen and the web configuration (the web crate's flags).
    #[command(flatten)]
    pub web: WebArgs,

    /// Path under which the metrics are served.
    #[arg(long = "web.telemetry-path", value_name = "PATH", default_value = "/metrics",
          value_parser = parse_telemetry_path)]
    pub telemetry_path: String,

    /// Upper bound of the time spent answering one scrape, whatever
    /// `X-Prometheus-Scrape-Timeout-Seconds` asks for (e.g. `10s`, `2500ms`, `1m`).
    #[arg(long = "web.max-scrape-timeout", value_name = "DURATION",
          default_value = DEFAULT_MAX_SCRAPE_TIMEOUT, value_parser = parse_duration)]
    pub max_scrape_timeout: Duration,

    /// Most scrapes and landing-page views handled at once, each counted until the last piece
    /// of work it started has ended (its broker request, its walk of the cgroup hierarchy),
    /// also when its client hung up; more are answered 503 at once. 0 means no limit.
    #[arg(long = "web.max-requests", value_name = "N",
          default_value_t = crate::scrape::DEFAULT_MAX_REQUESTS)]
    pub max_requests: usize,

    /// Leave out the exporter's metrics about itself: `process_*` and
    /// `amd_hsmp_web_refused_total` (as node_exporter's flag leaves out `process_*`, `go_*` and
    /// `promhttp_*`).
    #[arg(long = "web.disable-exporter-metrics")]
    pub disable_exporter_metrics: bool,

    /// The HTTP server's connection caps and timeouts (the web crate's flags).
    #[command(flatten)]
    pub server: ServerArgs,

    /// Unix socket of amd-hsmp-broker.
    #[arg(long = "broker.socket", value_name = "PATH", default_value = amd_hsmp_proto::DEFAULT_SOCKET)]
    pub broker_socket: PathBuf,

    /// `--collector.NAME` and `--no-collector.NAME`, one pair per row of the collector table.
    #[command(flatten)]
    pub collectors: Collectors,

    /// Mount point of the cgroup v2 hierarchy the core-owner collector reads.
    #[arg(long = "path.cgroupfs", value_name = "PATH", default_value = "/sys/fs/cgroup")]
    pub cgroupfs: PathBuf,

    /// Mount point of the procfs: this process's own `process_*` metrics, and where the
    /// core-owner collector reads the title of a Slurm job's `slurmstepd` when the job's
    /// cgroup is named by its SLUID.
    #[arg(long = "path.procfs", value_name = "PATH", default_value = "/proc")]
    pub procfs: PathBuf,

    /// How long one walk of the cgroup hierarchy serves the scrapes that arrive after it began
    /// (at most one walk runs at a time); 0 walks again for every scrape that arrives after a
    /// walk began (e.g. `1s`, `0`, at most 1m).
    #[arg(long = "collector.core-owner.max-age", value_name = "DURATION",
          default_value = DEFAULT_CORE_OWNER_MAX_AGE, value_parser = parse_max_age)]
    pub core_owner_max_age: Duration,

    /// How long a workload's energy counter (`amd_hsmp_workload_core_energy_joules_total`) is
    /// still exported after the last sample at which it held a core, so that its last value is
    /// scraped after it ends (e.g. `5m`, `0`, at most 1d).
    #[arg(long = "collector.core-owner.linger", value_name = "DURATION",
          default_value = DEFAULT_CORE_OWNER_LINGER, value_parser = parse_linger)]
    pub core_owner_linger: Duration,

    /// Also take a sample for the workload energy counters this often between scrapes, so that
    /// a workload shorter than the scrape interval is counted; each costs one broker sample and
    /// one walk of the cgroup hierarchy, as a scrape does. 0 samples at scrapes only (e.g.
    /// `5s`, `0`, at least 1s, at most 1h).
    #[arg(long = "collector.core-owner.sample-interval", value_name = "DURATION",
          default_value = "0", value_parser = parse_sample_interval)]
    pub core_owner_sample_interval: Duration,

    #[command(flatten)]
    pub common: CommonArgs,
}

/// The exporter's `clap` definition, for the man page, the completions and [`Args::try_parse_args`]:
/// the derived one with the exporter's port as the default `--web.listen-address`.
pub fn command() -> clap::Command {
    amd_hsmp_web::flags::with_default_listen_address(Args::command(), DEFAULT_LISTEN_ADDRESS)
}

/// Default of `--web.listen-address`: every address, the exporter's port.
pub const DEFAULT_LISTEN_ADDRESS: &str = ":10054";

/// Default of `--collector.core-owner.max-age`: [`crate::owner::WALK_MAX_AGE`].
const DEFAULT_CORE_OWNER_MAX_AGE: &str = "1s";

/// Default of `--collector.core-owner.linger`: [`crate::workload::DEFAULT_LINGER`].
const DEFAULT_CORE_OWNER_LINGER: &str = "5m";

/// Default of `--web.max-scrape-timeout`: [`crate::scrape::DEFAULT_MAX_SCRAPE_TIMEOUT`].
const DEFAULT_MAX_SCRAPE_TIMEOUT: &str = "10s";

impl Args {
    /// The flags of this process's command line; a usage error (or `--help`) ends the process
    /// as clap's own parser does. Not `Parser::parse`: the derived definition lacks the default
    /// `--web.listen-address` that [`command`] sets.
    pub fn from_env() -> Args {
        Args::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// The flags of `args` (the program's name first), parsed by [`command`].
    pub fn try_parse_args<I, T>(args: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut command = command();
        let matches = command.try_get_matches_from_mut(args)?;
        Args::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
    }

    /// The cgroup hierarchy the core-owner collector reads; `None` while it is off.
    pub fn core_owner(&self) -> Option<PathBuf> {
        self.collectors.is_on(Collector::CoreOwner).then(|| self.cgroupfs.clone())
    }

    /// The families the enabled collectors ask the broker for.
    pub fn families(&self) -> Families {
        self.collectors.families()
    }
}

fn parse_telemetry_path(text: &str) -> Result<String, String> {
    if !text.starts_with('/') || text == "/" {
        return Err(format!("telemetry path {text:?} must start with / and not be / itself"));
    }
    if text.contains(['?', '#', '*', '{', '}']) || text.chars().any(char::is_whitespace) {
        return Err(format!("telemetry path {text:?} contains characters not allowed in a route"));
    }
    Ok(text.to_owned())
}

/// A freshness bound: a duration in Prometheus' grammar or `0`, at most 1m.
fn parse_max_age(text: &str) -> Result<Duration, String> {
    at_most(text, Duration::from_secs(60), "1m")
}

/// A duration in Prometheus' grammar or `0`, at most `max` (`max_text` in the error).
fn at_most(text: &str, max: Duration, max_text: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(text)?;
    if d > max {
        return Err(format!("duration {text:?} must be at most {max_text}"));
    }
    Ok(d)
}

/// A linger: a duration in Prometheus' grammar or `0`, at most 1d.
fn parse_linger(text: &str) -> Result<Duration, String> {
    at_most(text, Duration::from_secs(24 * 3600), "1d")
}

/// A sampling interval: `0` (off), or a duration in Prometheus' grammar from 1s to 1h.
fn parse_sample_interval(text: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(text)?;
    if d != Duration::ZERO && !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) {
        return Err(format!("duration {text:?} must be 0 (off) or from 1s to 1h"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::Family;
    use amd_hsmp_web::flags::ListenAddress;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_args(std::iter::once("amd-hsmp-exporter").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_follow_node_exporter_conventions() {
        let args = parse(&[]).map_err(|e| e.to_string()).unwrap();
        assert_eq!(args.web.listen_addresses, vec![ListenAddress::AnyHost(10054)]);
        assert_eq!(args.telemetry_path, "/metrics");
        assert_eq!(args.broker_socket, PathBuf::from("/run/amd-hsmp/broker.sock"));
        assert_eq!(args.max_scrape_timeout, Duration::from_secs(10));
        assert_eq!(args.families(), Families::ALL.without(Family::CoreFrequencyLimit));
        assert_eq!(args.common.log_level, amd_hsmp_cli::LogLevel::Info);
        assert_eq!(args.common.log_format, amd_hsmp_cli::LogFormat::Logfmt);
        assert!(!args.common.version);
        assert!(!args.web.systemd_socket);
        assert_eq!(args.web.web_config_file, None);
        assert_eq!(args.core_owner(), None, "the core-owner collector is off by default");
        assert_eq!(args.procfs, PathBuf::from("/proc"));
        assert!(!args.disable_exporter_metrics, "the exporter's own metrics are on by default");
        let args = parse(&["--web.disable-exporter-metrics"]).unwrap();
        assert!(args.disable_exporter_metrics);
    }

    /// Each default is said once, as a constant the code uses; the flag's text is tied to it.
    #[test]
    fn exporter_flag_defaults_are_the_constants_the_code_uses() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.max_scrape_timeout, crate::scrape::DEFAULT_MAX_SCRAPE_TIMEOUT);
        assert_eq!(args.max_requests, crate::scrape::DEFAULT_MAX_REQUESTS);
        assert_eq!(args.core_owner_max_age, crate::owner::WALK_MAX_AGE);
        assert_eq!(args.broker_socket, PathBuf::from(amd_hsmp_proto::DEFAULT_SOCKET));
        let default = amd_hsmp_web::flags::parse_listen_address(DEFAULT_LISTEN_ADDRESS);
        assert_eq!(Ok(args.web.listen_addresses), default.map(|a| vec![a]));
    }

    #[test]
    fn the_core_owner_max_age_is_its_constant_and_takes_zero() {
        let default = parse(&[]).unwrap().core_owner_max_age;
        assert_eq!(default, crate::owner::WALK_MAX_AGE);
        let zero = parse(&["--collector.core-owner.max-age", "0"]).unwrap();
        assert_eq!(zero.core_owner_max_age, Duration::ZERO);
        assert!(parse(&["--collector.core-owner.max-age", "2m"]).is_err());
    }

    #[test]
    fn the_workload_linger_is_its_constant_and_sampling_between_scrapes_is_off_by_default() {
        let default = parse(&[]).unwrap();
        assert_eq!(default.core_owner_linger, crate::workload::DEFAULT_LINGER);
        assert_eq!(default.core_owner_sample_interval, Duration::ZERO);
        let set = parse(&[
            "--collector.core-owner.linger",
            "0",
            "--collector.core-owner.sample-interval",
            "5s",
        ])
        .unwrap();
        assert_eq!(set.core_owner_linger, Duration::ZERO);
        assert_eq!(set.core_owner_sample_interval, Duration::from_secs(5));
        assert!(parse(&["--collector.core-owner.linger", "2d"]).is_err());
        for refused in ["500ms", "2h", "-1s"] {
            let args = ["--collector.core-owner.sample-interval", refused];
            assert!(parse(&args).is_err(), "{refused}");
        }
    }

    #[test]
    fn core_owner_collector_reads_the_cgroupfs_path_and_the_last_flag_wins() {
        let on = parse(&["--collector.core-owner"]).unwrap();
        assert_eq!(on.core_owner(), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            on.families(),
            parse(&[]).unwrap().families(),
            "it asks the broker for nothing more"
        );
        let moved = parse(&["--collector.core-owner", "--path.cgroupfs", "/host/cgroup"]).unwrap();
        assert_eq!(moved.core_owner(), Some(PathBuf::from("/host/cgroup")));
        let off = parse(&["--collector.core-owner", "--no-collector.core-owner"]).unwrap();
        assert_eq!(off.core_owner(), None);
        let again = parse(&["--no-collector.core-owner", "--collector.core-owner"]).unwrap();
        assert!(again.core_owner().is_some());
        assert_eq!(parse(&["--path.cgroupfs", "/x"]).unwrap().core_owner(), None);
    }

    #[test]
    fn no_collector_flag_disables_only_that_family() {
        let default = parse(&[]).unwrap().families();
        for family in Family::ALL {
            let flag = format!("--no-collector.{family}");
            let args = parse(&[&flag]).map_err(|e| e.to_string()).unwrap();
            assert_eq!(args.families(), default.without(family), "{flag}");
        }
    }

    #[test]
    fn the_core_frequency_limit_is_off_by_default_and_the_socket_one_on() {
        let default = parse(&[]).unwrap().families();
        assert!(
            default.contains(Family::FrequencyLimit)
                && !default.contains(Family::CoreFrequencyLimit)
        );
        let on = parse(&["--collector.core-frequency-limit"]).unwrap().families();
        assert!(on.contains(Family::CoreFrequencyLimit));
    }

    #[test]
    fn last_of_collector_and_no_collector_wins() {
        let off = parse(&["--collector.prochot", "--no-collector.prochot"]).unwrap();
        assert!(!off.families().contains(Family::Prochot));
        let on = parse(&["--no-collector.prochot", "--collector.prochot"]).unwrap();
        assert!(on.families().contains(Family::Prochot));
    }

    #[test]
    fn unknown_flag_is_a_usage_error_with_exit_code_2() {
        let err = parse(&["--collector.cpu"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--collector.cpu"), "{err}");
    }

    #[test]
    fn a_compound_duration_such_as_prometheus_writes_is_a_valid_scrape_timeout() {
        let args = parse(&["--web.max-scrape-timeout", "1m30s"]).unwrap();
        assert_eq!(args.max_scrape_timeout, Duration::from_secs(90));
    }

    #[test]
    fn a_plain_number_of_seconds_still_sets_the_scrape_timeout_as_documented_before() {
        let args = parse(&["--web.max-scrape-timeout", "2.5"]).unwrap();
        assert_eq!(args.max_scrape_timeout, Duration::from_millis(2500));
    }

    #[test]
    fn the_web_crates_flags_are_flattened_in() {
        let args = parse(&["--web.systemd-socket", "--web.max-connections", "10"]).unwrap();
        assert!(args.web.systemd_socket);
        assert_eq!(args.server.limits(Some(1024)).unwrap().0.max_connections, 10);
        let err = parse(&["--web.systemd-socket", "--web.listen-address", ":1"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn telemetry_path_must_be_a_plain_route() {
        assert!(parse(&["--web.telemetry-path", "/x/metrics"]).is_ok());
        assert!(parse(&["--web.telemetry-path", "metrics"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/{x}"]).is_err());
    }
}
