//! `amd-hsmp-broker`: start-up sequence and command line of the privileged half.
//!
//! Exit codes: 0 after `SIGTERM` or `SIGINT` (the `--listen` socket file removed), 1 start-up
//! failure (the message names the step), 2 bad command line. `SIGHUP`, `SIGUSR1` and `SIGUSR2`
//! are ignored (logged once each).
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use amd_hsmp_broker::server::{self, Backend, Identity, ServerConfig};
use amd_hsmp_broker::{lockdown, msr, sampler::Sampler, topology};
use amd_hsmp_device::{HsmpDeviceOpener, HsmpOpener, MsrDeviceOpener, MsrOpener};
use amd_hsmp_sim as sim;
use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use nix::sys::signal::{SigSet, Signal};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Reads AMD EPYC telemetry from /dev/hsmp (and optionally the MSR devices) and answers typed
/// requests from amd-hsmp-exporter on a Unix socket. It never touches the network.
#[derive(Debug, Parser)]
#[command(name = "amd-hsmp-broker", version, about, long_about = None)]
struct Cli {
    /// Create and listen on this Unix socket (mode --listen.mode). Without it, the socket passed by
    /// systemd socket activation (LISTEN_FDS) is used.
    #[arg(long, value_name = "PATH")]
    listen: Option<PathBuf>,

    /// Mode of the --listen socket, octal, 0600 to 0666: connecting needs write permission.
    /// Created by the broker's user and group; 0666 lets any local user reach the allow-list
    /// (the exporter by hand as `nobody`), which then alone decides who is served.
    #[arg(long = "listen.mode", value_name = "MODE", default_value = "0660",
          value_parser = parse_socket_mode, requires = "listen")]
    listen_mode: u32,

    /// Serve peers with this uid (repeatable). Root is always served.
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uid: Vec<u32>,

    /// Serve peers whose effective gid is this (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gid: Vec<u32>,

    /// Serve peers running as this user (repeatable); resolved once at start-up.
    #[arg(long = "allow-user", value_name = "NAME")]
    allow_user: Vec<String>,

    /// Serve peers whose effective group is this (repeatable); resolved once at start-up.
    #[arg(long = "allow-group", value_name = "NAME")]
    allow_group: Vec<String>,

    /// The HSMP device node.
    #[arg(long = "hsmp.device", value_name = "PATH", default_value = "/dev/hsmp")]
    hsmp_device: PathBuf,

    /// Read per-core energy from the MSR devices where HSMP lacks the RAPL messages
    /// (needs CAP_SYS_RAWIO at start-up; dropped right after the devices are opened).
    #[arg(long = "collector.core-energy.msr-fallback")]
    msr_fallback: bool,

    /// Directory holding <cpu>/msr device nodes.
    #[arg(long = "msr.device-root", value_name = "PATH", default_value = "/dev/cpu")]
    msr_device_root: PathBuf,

    /// How often the 32-bit MSR energy counters are read to extend them to 64 bits. Shortened
    /// to a quarter of the shortest wrap at 100 W a core (164 s at the usual ESU of 16); a core
    /// not read for a whole wrap period restarts its count and the reset is counted.
    #[arg(long = "msr.poll-interval", value_name = "DURATION", default_value = "30s",
          value_parser = parse_poll_interval)]
    msr_poll_interval: Duration,

    /// Connection slots each peer uid may hold at once. Each --allow-uid/--allow-user/
    /// --allow-gid/--allow-group identity has this many slots kept for it alone, so the
    /// exporter (which holds at most 2) always connects, whoever else squats.
    #[arg(long = "connections.per-uid", value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(2..=64))]
    connections_per_uid: u16,

    /// Connection slots shared by every allowed peer (root included), beyond the reserved ones.
    #[arg(long = "connections.shared", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    connections_shared: u16,

    /// A connection with no request for this long is closed (the exporter reconnects).
    #[arg(long = "connections.idle-timeout", value_name = "DURATION", default_value = "60s",
          value_parser = parse_idle_timeout)]
    idle_timeout: Duration,

    /// procfs mount point (for cpuinfo).
    #[arg(long = "path.procfs", value_name = "PATH", default_value = "/proc")]
    procfs: PathBuf,

    /// sysfs mount point (for CPU topology).
    #[arg(long = "path.sysfs", value_name = "PATH", default_value = "/sys")]
    sysfs: PathBuf,

    /// Serve the built-in firmware simulator for this machine profile instead of the devices.
    /// The broker also serves its own uid, so that a user runs the demo without root.
    #[arg(long, value_name = "PROFILE")]
    simulate: Option<sim::Profile>,

    /// Simulation only: the events the simulated machine goes through (for demos and the live
    /// check of the alerts): normal, thermal-event, prochot-flapping.
    #[arg(long = "simulate.scenario", value_name = "SCENARIO", requires = "simulate",
          default_value_t = sim::Scenario::Normal)]
    simulate_scenario: sim::Scenario,

    /// Only log messages with this level or above.
    #[arg(long = "log.level", value_enum, default_value_t = LogLevel::Info)]
    log_level: LogLevel,

    /// Log line format.
    #[arg(long = "log.format", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn parse_poll_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(600) {
        return Err("must be between 10ms and 10m (the counter wraps after ~65536 J)".into());
    }
    Ok(d)
}

fn parse_socket_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s, 8).map_err(|_| format!("{s:?} is not an octal mode"))?;
    if mode & !0o666 != 0 || mode & 0o600 != 0o600 {
        return Err("must be between 0600 and 0666: read and write for the owner, no x bits".into());
    }
    Ok(mode)
}

fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(240) {
        return Err("must be between 1s and 4m".into());
    }
    Ok(d)
}

fn init_logging(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Error => tracing::Level::ERROR,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        // No colour codes in the journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level, cli.log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The machine the broker serves: its topology and how to reach its devices.
struct Machine {
    topology: amd_hsmp_proto::Topology,
    hsmp: Box<dyn HsmpOpener>,
    msr: Box<dyn MsrOpener>,
}

fn machine(cli: &Cli) -> Result<Machine> {
    if let Some(profile) = cli.simulate {
        tracing::warn!(
            %profile,
            scenario = %cli.simulate_scenario,
            "SIMULATION: serving the built-in firmware simulator, not this machine's devices"
        );
        // A real mailbox round trip takes ~100 µs (the driver sleeps before its first poll), so
        // scrape durations in the demo look like a real machine's.
        let mut config = sim::FirmwareConfig::live();
        config.faults.latency = Duration::from_micros(100);
        config.scenario = cli.simulate_scenario;
        let machine = sim::Machine::new(profile.spec(), config);
        return Ok(Machine {
            topology: machine.topology().clone(),
            hsmp: Box::new(machine.hsmp_opener()),
            msr: Box::new(machine.msr_opener()),
        });
    }
    let topology =
        topology::discover(&cli.procfs, &cli.sysfs).context("cannot discover topology")?;
    Ok(Machine {
        topology,
        hsmp: Box::new(HsmpDeviceOpener { path: cli.hsmp_device.clone() }),
        msr: Box::new(MsrDeviceOpener { root: cli.msr_device_root.clone() }),
    })
}

/// The numeric allow-lists: ids as given, plus names resolved through NSS now, while the broker
/// may still read /etc/passwd and /etc/group (or ask sssd).
fn allow_lists(cli: &Cli) -> Result<(Vec<u32>, Vec<u32>)> {
    let mut uids = cli.allow_uid.clone();
    for name in &cli.allow_user {
        let user = nix::unistd::User::from_name(name)
            .with_context(|| format!("cannot look up user {name:?}"))?
            .with_context(|| format!("--allow-user {name:?}: no such user"))?;
        uids.push(user.uid.as_raw());
    }
    let mut gids = cli.allow_gid.clone();
    for name in &cli.allow_group {
        let group = nix::unistd::Group::from_name(name)
            .with_context(|| format!("cannot look up group {name:?}"))?
            .with_context(|| format!("--allow-group {name:?}: no such group"))?;
        gids.push(group.gid.as_raw());
    }
    Ok((uids, gids))
}

/// The signals the broker handles on its own thread instead of dying of them.
fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2] {
        set.add(sig);
    }
    set
}

/// Waits for the handled signals for the life of the process: `SIGTERM`/`SIGINT` remove the
/// socket file the broker created and exit 0; the others are ignored, logged the first time.
fn spawn_signal_thread(set: SigSet, socket: Option<lockdown::SocketFile>) -> Result<()> {
    let body = move || {
        let mut logged: Vec<Signal> = Vec::new();
        loop {
            let sig = match set.wait() {
                Ok(sig) => sig,
                Err(e) => {
                    // Without sigwait, let SIGTERM end the process the default way.
                    tracing::error!(error = %e, "cannot wait for signals; SIGTERM will not remove the socket");
                    let mut term = SigSet::empty();
                    term.add(Signal::SIGTERM);
                    term.add(Signal::SIGINT);
                    let _ = term.thread_unblock();
                    loop {
                        std::thread::park();
                    }
                }
            };
            match sig {
                Signal::SIGTERM | Signal::SIGINT => {
                    if let Some(Err(e)) = socket.as_ref().map(lockdown::SocketFile::remove) {
                        tracing::warn!(error = %e, "cannot remove the socket file");
                    }
                    tracing::info!(signal = %sig, "stopping");
                    std::process::exit(0);
                }
                other if !logged.contains(&other) => {
                    logged.push(other);
                    tracing::info!(signal = %other, "signal ignored (logged once)");
                }
                _ => {}
            }
        }
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(body)
        .context("cannot start the signal thread")?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    // Blocked before any thread exists, so every thread inherits the mask and only the signal
    // thread's sigwait receives them.
    let signals = handled_signals();
    signals.thread_block().context("cannot block signals")?;
    let (mut allow_uids, allow_gids) = allow_lists(&cli)?;
    if cli.simulate.is_some() {
        // The simulator reads no device: whoever started it may read it.
        let own = nix::unistd::getuid().as_raw();
        if own != 0 && !allow_uids.contains(&own) {
            allow_uids.push(own);
        }
    }
    tracing::info!(uids = ?allow_uids, gids = ?allow_gids, "peers allowed besides root");
    let machine = machine(&cli)?;
    let topo = &machine.topology;
    tracing::info!(
        sockets = topo.sockets.len(),
        cores = topo.cores.len(),
        family = format_args!("{:#x}", topo.cpu_family),
        model = format_args!("{:#x}", topo.cpu_model),
        "topology discovered"
    );

    let msr_energy = if cli.msr_fallback {
        match msr::MsrEnergy::open(topo, machine.msr.as_ref()) {
            Ok(energy) => Some(Arc::new(energy)),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "MSR fallback unavailable; core energy will come from HSMP only");
                None
            }
        }
    } else {
        None
    };
    let sampler = Sampler::new(machine.topology.clone(), machine.hsmp, msr_energy.clone());

    lockdown::drop_privileges().context("cannot drop privileges")?;
    let (listener, socket_file) = listener(cli.listen.as_deref(), cli.listen_mode)?;
    // Not under systemd this is a no-op.
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
    lockdown::install_seccomp(socket_file.as_ref()).context("cannot install the seccomp filter")?;
    tracing::info!("capabilities dropped, no-new-privs set, seccomp filter installed");
    spawn_signal_thread(signals, socket_file)?;

    if let Some(energy) = msr_energy {
        msr::spawn_poller(energy, cli.msr_poll_interval).context("cannot start the MSR poller")?;
    }
    let identity = Identity {
        instance: server::random_instance(),
        simulated: cli.simulate.map(|p| p.to_string()),
    };
    let config = ServerConfig {
        allow_uids,
        allow_gids,
        per_uid: usize::from(cli.connections_per_uid),
        shared: usize::from(cli.connections_shared),
        idle_timeout: cli.idle_timeout,
        ..ServerConfig::default()
    };
    let backend: Arc<dyn Backend> = Arc::new(sampler);
    server::serve(listener, backend, identity, config).context("listening socket failed")
}

/// Creates the socket at `path` (replacing a stale one) with `mode`, or takes the one systemd
/// passed. A created socket comes with the handle that removes it on `SIGTERM`.
fn listener(
    path: Option<&Path>,
    mode: u32,
) -> Result<(UnixListener, Option<lockdown::SocketFile>)> {
    let Some(path) = path else {
        let mut fds = listenfd::ListenFd::from_env();
        return match fds
            .take_unix_listener(0)
            .context("LISTEN_FDS socket is not a Unix stream socket")?
        {
            Some(l) => {
                tracing::info!("listening on the socket passed by systemd");
                Ok((l, None))
            }
            None => bail!(
                "no socket to listen on: pass --listen PATH or start under systemd socket activation"
            ),
        };
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!("{} exists and is not a socket", path.display());
        }
        if UnixStream::connect(path).is_ok() {
            bail!("{} is in use by another process", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set mode {mode:04o} on {}", path.display()))?;
    let file = lockdown::SocketFile::new(path)
        .with_context(|| format!("cannot open the directory of {}", path.display()))?;
    tracing::info!(path = %path.display(), mode = format_args!("{mode:04o}"), "listening");
    Ok((listener, Some(file)))
}
