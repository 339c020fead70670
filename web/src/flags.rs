//! The `--web.*` flags of the web layer, as exporter-toolkit's `AddFlags`: where to listen
//! ([`WebArgs`]: `--web.listen-address`, `--web.systemd-socket`, `--web.config.file`) and the
//! server's bounds ([`ServerArgs`]: connection caps and timeouts, turned into [`Limits`] within
//! `RLIMIT_NOFILE`). An exporter flattens both into its own `clap` definition, and sets the
//! default of `--web.listen-address` (its own port) with [`with_default_listen_address`].

use crate::server::{Limits, RESERVED_FDS, connection_room};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Where the exporter listens and its web configuration.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct WebArgs {
    /// Address to listen on for HTTP, `host:port`; `:PORT` means every address. Repeatable.
    #[arg(long = "web.listen-address", value_name = "ADDR", value_parser = parse_listen_address)]
    pub listen_addresses: Vec<ListenAddress>,

    /// Serve on the sockets systemd passes (socket activation, LISTEN_FDS) instead of
    /// --web.listen-address.
    #[arg(long = "web.systemd-socket", conflicts_with = "listen_addresses")]
    pub systemd_socket: bool,

    /// exporter-toolkit web configuration file (YAML): TLS, basic auth, response headers.
    /// Re-read on SIGHUP and when a certificate or key file changes.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
}

/// Sets the default of `--web.listen-address` in `command`, which flattens [`WebArgs`]: the
/// exporter's own port, as the address exporter-toolkit's `AddFlags` takes.
pub fn with_default_listen_address(command: clap::Command, address: &'static str) -> clap::Command {
    // Not `mut_arg`, which moves the argument last (and so in the completions).
    command.mut_args(|arg| {
        if arg.get_id() == "listen_addresses" { arg.default_value(address) } else { arg }
    })
}

/// Default of `--web.max-connections`, lowered to what `RLIMIT_NOFILE` leaves room for.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default of `--web.max-connections-per-client`, at most `--web.max-connections`.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 32;
/// Default of `--web.header-read-timeout`: [`DEFAULT_HEADER_READ_TIMEOUT`].
const DEFAULT_HEADER_READ_TIMEOUT_TEXT: &str = "10s";
/// Default of `--web.header-read-timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--web.idle-timeout`: [`DEFAULT_IDLE_TIMEOUT`].
const DEFAULT_IDLE_TIMEOUT_TEXT: &str = "60s";
/// Default of `--web.idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's bounds: connections and timeouts.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServerArgs {
    /// Most HTTP connections open at once; more are closed at once [default: 512, lowered to
    /// what RLIMIT_NOFILE leaves room for].
    #[arg(long = "web.max-connections", value_name = "N", value_parser = parse_positive)]
    pub max_connections: Option<usize>,

    /// Most HTTP connections open at once from one client address (IPv6: one /64)
    /// [default: 32, at most --web.max-connections].
    #[arg(long = "web.max-connections-per-client", value_name = "N", value_parser = parse_positive)]
    pub max_connections_per_client: Option<usize>,

    /// Time a client has from the first byte of a request to the end of its headers.
    #[arg(long = "web.header-read-timeout", value_name = "DURATION",
          default_value = DEFAULT_HEADER_READ_TIMEOUT_TEXT, value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// A connection that handles no request and moves no byte for this long is closed
    /// (idle keep-alive, a client that does not read its answer).
    #[arg(long = "web.idle-timeout", value_name = "DURATION",
          default_value = DEFAULT_IDLE_TIMEOUT_TEXT, value_parser = parse_duration)]
    pub idle_timeout: Duration,
}

impl ServerArgs {
    /// The connection limits, sized within the file-descriptor limit `fd_limit`
    /// (`RLIMIT_NOFILE`, `None` = unlimited; [`crate::server::fd_limit`]). A default is lowered
    /// to fit (the second value says so); a flag that does not fit is an error naming the limit.
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
pub fn parse_listen_address(text: &str) -> Result<ListenAddress, String> {
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

fn parse_positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text:?} is not a whole number above 0")),
    }
}

/// A duration in Prometheus' grammar ([`amd_hsmp_cli::duration`]: `500ms`, `10s`, `1m30s`),
/// above 0 and at most 1h, for the `--web.*` duration flags (an exporter's too). A plain number
/// of seconds (`10`, `2.5`) is also taken: these flags documented that form before they took the
/// grammar, and a configuration that started must keep starting.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
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
    use clap::Parser;

    /// What an exporter's definition looks like: both groups flattened, a default address.
    #[derive(Debug, Parser)]
    struct Exporter {
        #[command(flatten)]
        web: WebArgs,
        #[command(flatten)]
        server: ServerArgs,
    }

    fn parse(args: &[&str]) -> Result<Exporter, clap::Error> {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let command = with_default_listen_address(Exporter::command(), ":10054");
        let matches =
            command.try_get_matches_from(std::iter::once("x").chain(args.iter().copied()))?;
        Exporter::from_arg_matches(&matches)
    }

    /// Each default is said once, as a constant the code uses; the flag's text is tied to it.
    #[test]
    fn web_flag_defaults_are_the_constants_the_code_uses() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.server.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(args.server.idle_timeout, DEFAULT_IDLE_TIMEOUT);
        let (limits, _) = args.server.limits(None).unwrap();
        assert_eq!(limits.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(limits.max_per_client, DEFAULT_MAX_CONNECTIONS_PER_CLIENT);
        assert_eq!(args.web.listen_addresses, vec![ListenAddress::AnyHost(10054)]);
        assert!(!args.web.systemd_socket);
        assert_eq!(args.web.web_config_file, None);
        use clap::CommandFactory as _;
        let help = Exporter::command().render_long_help().to_string();
        for said in [
            format!("[default: {DEFAULT_MAX_CONNECTIONS},"),
            format!("[default: {DEFAULT_MAX_CONNECTIONS_PER_CLIENT},"),
        ] {
            assert!(help.contains(&said), "{said} not in {help}");
        }
    }

    #[test]
    fn systemd_socket_and_an_explicit_listen_address_conflict() {
        assert!(parse(&["--web.systemd-socket"]).unwrap().web.systemd_socket);
        let err = parse(&["--web.systemd-socket", "--web.listen-address", ":1"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let args = parse(&["--web.config.file", "/etc/web.yml"]).unwrap();
        assert_eq!(args.web.web_config_file, Some(PathBuf::from("/etc/web.yml")));
    }

    #[test]
    fn listen_address_is_repeatable() {
        let args =
            parse(&["--web.listen-address", "127.0.0.1:9", "--web.listen-address", "[::1]:10"])
                .unwrap();
        assert_eq!(
            args.web.listen_addresses,
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
    fn a_plain_number_of_seconds_is_still_a_duration_as_documented_before() {
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
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
        let args = parse(&[]).unwrap().server;
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
        let args = parse(&["--web.max-connections", "2000"]).unwrap().server;
        let err = args.limits(Some(1024)).unwrap_err();
        assert!(err.contains("at most 960") && err.contains("LimitNOFILE"), "{err}");
        assert_eq!(args.limits(Some(4096)).unwrap().0.max_connections, 2000);
        let args =
            parse(&["--web.max-connections", "10", "--web.max-connections-per-client", "11"])
                .unwrap()
                .server;
        assert!(args.limits(Some(1024)).unwrap_err().contains("exceeds --web.max-connections"));
        assert!(parse(&[]).unwrap().server.limits(Some(65)).unwrap_err().contains("no room"));
        assert!(parse(&["--web.max-connections", "0"]).is_err());
    }
}
