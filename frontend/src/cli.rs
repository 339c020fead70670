//! Command-line flags, following the node_exporter conventions (`--web.*`, `--collector.NAME`,
//! `--no-collector.NAME`, `--log.*`).

use crate::collectors::{Collector, Collectors};
use amd_hsmp_cli::CommonArgs;
use amd_hsmp_proto::Families;
use amd_hsmp_web::server::{Limits, RESERVED_FDS, connection_room};
use clap::{CommandFactory as _, Parser};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Prometheus exporter for AMD EPYC HSMP telemetry (per-core energy, boost limit, PROCHOT).
///
/// This process holds no device and no privilege: it asks amd-hsmp-broker over a Unix socket.
#[derive(Debug, Clone, Parser)]
#[command(name = "amd-hsmp-exporter", disable_version_flag = true)]
pub struct Args {
    /// Address to listen on for HTTP, `host:port`; `:PORT` means every address. Repeatable.
    #[arg(long = "web.listen-address", value_name = "ADDR", default_value = ":10054",
          value_parser = parse_listen_address)]
    pub listen_addresses: Vec<ListenAddress>,

    /// Serve on the sockets systemd passes (socket activation, LISTEN_FDS) instead of
    /// --web.listen-address.
    #[arg(long = "web.systemd-socket", conflicts_with = "listen_addresses")]
    pub systemd_socket: bool,

    /// exporter-toolkit web configuration file (YAML): TLS, basic auth, response headers.
    /// Re-read on SIGHUP and when a certificate or key file changes.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,

    /// Path under which the metrics are served.
    #[arg(long = "web.telemetry-path", value_name = "PATH", default_value = "/metrics",
          value_parser = parse_telemetry_path)]
    pub telemetry_path: String,

    /// Upper bound of the time spent answering one scrape, whatever
    /// `X-Prometheus-Scrape-Timeout-Seconds` asks for (e.g. `10s`, `2500ms`, `1m`).
    #[arg(long = "web.max-scrape-timeout", value_name = "DURATION", default_value = "10s",
          value_parser = parse_duration)]
    pub max_scrape_timeout: Duration,

    /// Most scrapes and landing-page views handled at once, each counted until the last piece
    /// of work it started has ended (its broker request, its walk of the cgroup hierarchy),
    /// also when its client hung up; more are answered 503 at once. 0 means no limit.
    #[arg(long = "web.max-requests", value_name = "N", default_value_t = 40)]
    pub max_requests: usize,

    /// Most HTTP connections open at once; more are closed at once [default: 512, lowered to
    /// what RLIMIT_NOFILE leaves room for].
    #[arg(long = "web.max-connections", value_name = "N", value_parser = parse_positive)]
    pub max_connections: Option<usize>,

    /// Most HTTP connections open at once from one client address (IPv6: one /64)
    /// [default: 32, at most --web.max-connections].
    #[arg(long = "web.max-connections-per-client", value_name = "N", value_parser = parse_positive)]
    pub max_connections_per_client: Option<usize>,

    /// Time a client has from the first byte of a request to the end of its headers.
    #[arg(long = "web.header-read-timeout", value_name = "DURATION", default_value = "10s",
          value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// A connection that handles no request and moves no byte for this long is closed
    /// (idle keep-alive, a client that does not read its answer).
    #[arg(long = "web.idle-timeout", value_name = "DURATION", default_value = "60s",
          value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Unix socket of amd-hsmp-broker.
    #[arg(
        long = "broker.socket",
        value_name = "PATH",
        default_value = "/run/amd-hsmp/broker.sock"
    )]
    pub broker_socket: PathBuf,

    /// `--collector.NAME` and `--no-collector.NAME`, one pair per row of the collector table.
    #[command(flatten)]
    pub collectors: Collectors,

    /// Mount point of the cgroup v2 hierarchy the core-owner collector reads.
    #[arg(long = "path.cgroupfs", value_name = "PATH", default_value = "/sys/fs/cgroup")]
    pub cgroupfs: PathBuf,

    /// How long one walk of the cgroup hierarchy serves the scrapes that arrive after it began
    /// (at most one walk runs at a time); 0 walks again for every scrape that arrives after a
    /// walk began (e.g. `1s`, `0`, at most 1m).
    #[arg(long = "collector.core-owner.max-age", value_name = "DURATION",
          default_value = DEFAULT_CORE_OWNER_MAX_AGE, value_parser = parse_max_age)]
    pub core_owner_max_age: Duration,

    #[command(flatten)]
    pub common: CommonArgs,
}

/// The exporter's `clap` definition, for the man page and the completions.
pub fn command() -> clap::Command {
    Args::command()
}

/// Default of `--collector.core-owner.max-age`: [`crate::owner::WALK_MAX_AGE`].
const DEFAULT_CORE_OWNER_MAX_AGE: &str = "1s";

/// Default of `--web.max-connections`.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default of `--web.max-connections-per-client`.
pub(crate) const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 32;

impl Args {
    /// The connection limits, sized within the file-descriptor limit `fd_limit`
    /// (`RLIMIT_NOFILE`, `None` = unlimited). A default is lowered to fit (the second value
    /// says so); a flag that does not fit is an error naming the limit.
    pub fn limits(&self, fd_limit: Option<u64>) -> Result<(Limits, Option<String>), String> {
        let room = connection_room(fd_limit);
        let limit = fd_limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        if room < 2 {
            return Err(format!(
                "RLIMIT_NOFILE ({limit}) leaves no room for HTTP connections ({RESERVED_FDS} \
                 descriptors are reserved); raise it (LimitNOFILE= in the unit, ulimit -n)"
            ));
        }
        let mut note = None;
        let max_connections = match self.max_connections {
            Some(n) if n > room => {
                return Err(format!(
                    "--web.max-connections {n} does not fit RLIMIT_NOFILE ({limit}): at most \
                     {room} ({RESERVED_FDS} descriptors are reserved); raise the limit \
                     (LimitNOFILE= in the unit, ulimit -n) or lower the flag"
                ));
            }
            Some(n) => n,
            None if DEFAULT_MAX_CONNECTIONS > room => {
                note = Some(format!(
                    "--web.max-connections lowered from {DEFAULT_MAX_CONNECTIONS} to {room} to \
                     fit RLIMIT_NOFILE ({limit})"
                ));
                room
            }
            None => DEFAULT_MAX_CONNECTIONS,
        };
        let max_per_client = match self.max_connections_per_client {
            Some(n) if n > max_connections => {
                return Err(format!(
                    "--web.max-connections-per-client {n} exceeds --web.max-connections \
                     {max_connections}"
                ));
            }
            Some(n) => n,
            None => DEFAULT_MAX_CONNECTIONS_PER_CLIENT.min(max_connections),
        };
        let limits = Limits {
            max_connections,
            max_per_client,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        };
        Ok((limits, note))
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

/// One `--web.listen-address`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenAddress {
    /// `:PORT`: every address of the host, IPv6 and IPv4.
    AnyHost(u16),
    /// `host:port` with a literal IP address.
    Exact(SocketAddr),
}

impl ListenAddress {
    /// Addresses to try binding, in order; the first that binds wins. `:PORT` tries the
    /// dual-stack IPv6 wildcard first and falls back to IPv4 on hosts without IPv6.
    pub fn candidates(self) -> Vec<SocketAddr> {
        match self {
            ListenAddress::AnyHost(port) => vec![
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            ],
            ListenAddress::Exact(addr) => vec![addr],
        }
    }
}

impl std::fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddress::AnyHost(port) => write!(f, ":{port}"),
            ListenAddress::Exact(addr) => write!(f, "{addr}"),
        }
    }
}

/// Parses `:PORT`, `IPv4:PORT`, `[IPv6]:PORT` and `localhost:PORT`.
pub(crate) fn parse_listen_address(text: &str) -> Result<ListenAddress, String> {
    if let Some(port) = text.strip_prefix(':') {
        return port
            .parse()
            .map(ListenAddress::AnyHost)
            .map_err(|_| format!("invalid port in {text:?}"));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse().map_err(|_| format!("invalid port in {text:?}"))?;
        return Ok(ListenAddress::Exact(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)));
    }
    text.parse().map(ListenAddress::Exact).map_err(|_| {
        format!("invalid listen address {text:?}: expected :PORT, IP:PORT or [IPv6]:PORT")
    })
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

fn parse_positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text:?} is not a whole number above 0")),
    }
}

/// A freshness bound: a duration in Prometheus' grammar or `0`, at most 1m.
fn parse_max_age(text: &str) -> Result<Duration, String> {
    let d = amd_hsmp_cli::duration::parse(text)?;
    if d > Duration::from_secs(60) {
        return Err(format!("duration {text:?} must be at most 1m"));
    }
    Ok(d)
}

/// A duration in Prometheus' grammar ([`amd_hsmp_cli::duration`]: `500ms`, `10s`, `1m30s`),
/// above 0 and at most 1h. A plain number of seconds (`10`, `2.5`) is also taken: these flags
/// documented that form before they took the grammar, and a configuration that started must
/// keep starting.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = match amd_hsmp_cli::duration::parse(text) {
        Ok(d) => d,
        Err(grammar) => match text.parse::<f64>() {
            Ok(seconds) if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
                Duration::try_from_secs_f64(seconds).map_err(|_| grammar)?
            }
            _ => return Err(grammar),
        },
    };
    if d.is_zero() || d > Duration::from_secs(3600) {
        return Err(format!("duration {text:?} must be above 0 and at most 1h"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("amd-hsmp-exporter").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_follow_node_exporter_conventions() {
        let args = parse(&[]).map_err(|e| e.to_string()).unwrap();
        assert_eq!(args.listen_addresses, vec![ListenAddress::AnyHost(10054)]);
        assert_eq!(args.telemetry_path, "/metrics");
        assert_eq!(args.broker_socket, PathBuf::from("/run/amd-hsmp/broker.sock"));
        assert_eq!(args.max_scrape_timeout, Duration::from_secs(10));
        assert_eq!(args.families(), Families::ALL);
        assert_eq!(args.common.log_level, amd_hsmp_cli::LogLevel::Info);
        assert_eq!(args.common.log_format, amd_hsmp_cli::LogFormat::Logfmt);
        assert!(!args.common.version);
        assert!(!args.systemd_socket);
        assert_eq!(args.web_config_file, None);
        assert_eq!(args.core_owner(), None, "the core-owner collector is off by default");
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
    fn core_owner_collector_reads_the_cgroupfs_path_and_the_last_flag_wins() {
        let on = parse(&["--collector.core-owner"]).unwrap();
        assert_eq!(on.core_owner(), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(on.families(), Families::ALL, "it asks the broker for nothing more");
        let moved = parse(&["--collector.core-owner", "--path.cgroupfs", "/host/cgroup"]).unwrap();
        assert_eq!(moved.core_owner(), Some(PathBuf::from("/host/cgroup")));
        let off = parse(&["--collector.core-owner", "--no-collector.core-owner"]).unwrap();
        assert_eq!(off.core_owner(), None);
        let again = parse(&["--no-collector.core-owner", "--collector.core-owner"]).unwrap();
        assert!(again.core_owner().is_some());
        assert_eq!(parse(&["--path.cgroupfs", "/x"]).unwrap().core_owner(), None);
    }

    #[test]
    fn systemd_socket_and_an_explicit_listen_address_conflict() {
        assert!(parse(&["--web.systemd-socket"]).unwrap().systemd_socket);
        let err = parse(&["--web.systemd-socket", "--web.listen-address", ":1"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let args = parse(&["--web.config.file", "/etc/web.yml"]).unwrap();
        assert_eq!(args.web_config_file, Some(PathBuf::from("/etc/web.yml")));
    }

    #[test]
    fn no_collector_flag_disables_only_that_family() {
        let args = parse(&["--no-collector.boost-limit"]).map_err(|e| e.to_string()).unwrap();
        assert_eq!(
            args.families(),
            Families { core_energy: true, boost_limit: false, prochot: true }
        );
    }

    #[test]
    fn last_of_collector_and_no_collector_wins() {
        let off = parse(&["--collector.prochot", "--no-collector.prochot"]).unwrap();
        assert!(!off.families().prochot);
        let on = parse(&["--no-collector.prochot", "--collector.prochot"]).unwrap();
        assert!(on.families().prochot);
    }

    #[test]
    fn listen_address_is_repeatable() {
        let args =
            parse(&["--web.listen-address", "127.0.0.1:9", "--web.listen-address", "[::1]:10"])
                .unwrap();
        assert_eq!(
            args.listen_addresses,
            vec![
                ListenAddress::Exact("127.0.0.1:9".parse().unwrap()),
                ListenAddress::Exact("[::1]:10".parse().unwrap()),
            ]
        );
    }

    #[test]
    fn any_host_address_tries_ipv6_wildcard_then_ipv4() {
        let candidates = parse_listen_address(":10054").unwrap().candidates();
        assert_eq!(candidates[0], "[::]:10054".parse().unwrap());
        assert_eq!(candidates[1], "0.0.0.0:10054".parse().unwrap());
        assert_eq!(
            parse_listen_address("localhost:80").unwrap(),
            ListenAddress::Exact("127.0.0.1:80".parse().unwrap())
        );
        assert!(parse_listen_address("example.org:80").is_err());
        assert!(parse_listen_address(":http").is_err());
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
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        for refused in ["0", "0.0", "3601", "1e3", "inf", "NaN", "+5", "-5", ".", "1.5s"] {
            assert!(parse_duration(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn durations_accept_prometheus_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2500ms"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("1h1ms").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("ten").is_err());
    }

    #[test]
    fn connection_limits_default_within_the_fd_limit() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.max_requests, 40);
        let (limits, note) = args.limits(Some(1024)).unwrap();
        assert_eq!(limits.max_connections, 512);
        assert_eq!(limits.max_per_client, 32);
        assert_eq!(limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(note, None);
        let (limits, note) = args.limits(Some(256)).unwrap();
        assert_eq!(limits.max_connections, 192);
        assert!(note.unwrap().contains("lowered from 512 to 192"));
        assert_eq!(args.limits(None).unwrap().0.max_connections, 512);
        let (limits, _) = args.limits(Some(80)).unwrap();
        assert_eq!((limits.max_connections, limits.max_per_client), (16, 16));
    }

    #[test]
    fn connection_flags_beyond_the_fd_limit_refuse_to_start() {
        let args = parse(&["--web.max-connections", "2000"]).unwrap();
        let err = args.limits(Some(1024)).unwrap_err();
        assert!(err.contains("at most 960") && err.contains("LimitNOFILE"), "{err}");
        assert_eq!(args.limits(Some(4096)).unwrap().0.max_connections, 2000);
        let args =
            parse(&["--web.max-connections", "10", "--web.max-connections-per-client", "11"])
                .unwrap();
        assert!(args.limits(Some(1024)).unwrap_err().contains("exceeds --web.max-connections"));
        assert!(parse(&[]).unwrap().limits(Some(65)).unwrap_err().contains("no room"));
        assert!(parse(&["--web.max-connections", "0"]).is_err());
    }

    #[test]
    fn telemetry_path_must_be_a_plain_route() {
        assert!(parse(&["--web.telemetry-path", "/x/metrics"]).is_ok());
        assert!(parse(&["--web.telemetry-path", "metrics"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/{x}"]).is_err());
    }
}
