//! The start-up sequence of the broker, shared by `amd-hsmp-broker`, which serves this machine's
//! devices, and `amd-hsmp-sim-broker`, which serves a [`Simulation`] instead.
//!
//! Exit codes: 0 after `SIGTERM` or `SIGINT` (the `--listen` socket file removed), 1 start-up
//! failure (the message names the step), 2 bad command line (clap's, in the binaries), 75
//! ([`hotplug::EXIT_FRESH_START`]) to start afresh after CPU hotplug, once the reply that saw it
//! is written. `SIGHUP`,
//! `SIGUSR1` and `SIGUSR2` are ignored (logged once each). A `SIGTERM` or `SIGINT` during
//! start-up, before the capabilities are dropped and the socket taken, ends the broker by the
//! signal's default action (no exit code: "killed by SIGTERM", which systemd counts as a clean
//! stop), so a start-up stuck on a device or a file that does not answer still stops when told.
//! `--check` runs [`CHECK_PROGRAM`] in the broker's place, whose exit codes it then has.

use crate::cli::{Args, CHECK_PROGRAM};
use crate::server::{self, Backend, Identity, ServerConfig};
use crate::{energy, hotplug, lockdown, msr, sampler::Sampler, topology};
use amd_hsmp_device::perf::SysfsPmu;
use amd_hsmp_device::{
    HsmpDeviceOpener, HsmpOpener, MsrDeviceOpener, MsrOpener, OnlineCpus, PmuLocator, SysfsOnline,
};
use anyhow::{Context, Result, bail};
use nix::sys::signal::{SigSet, Signal};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// A machine served in place of this one's devices: what `amd-hsmp-sim-broker` brings. The broker
/// then reads no device, so it also serves the uid that started it (a user runs the demo without
/// root); everything else (privilege drop, seccomp, the allow-lists) is as with the devices.
pub trait Simulation {
    /// The name `Hello` reports as `simulated` (the simulator profile).
    fn profile(&self) -> String;
    /// The machine to serve, made once the allow-lists are resolved.
    fn serve(&self) -> Machine;
    /// The machine `--check` examines.
    fn check(&self) -> Machine;
}

/// The broker's `main` after parsing: `--version`, logging, then serving. `program` names the
/// binary in `--version` and messages; `simulation`, if any, replaces the devices. `--check` is
/// [`CHECK_PROGRAM`]'s: this runs it in place of the broker (see [`run_check_program`]), so the
/// daemon links none of the checks.
pub fn main(program: &str, args: Args, simulation: Option<&dyn Simulation>) -> ExitCode {
    if let Some(done) = crate::cli::begin(program, &args) {
        return done;
    }
    if args.check {
        return run_check_program(std::env::args_os().skip(1));
    }
    match run(args, simulation) {
        Ok(()) => ExitCode::SUCCESS,
        // The chain in the `error` field, as every other line that reports an error.
        Err(e) => {
            tracing::error!(error = %amd_hsmp_cli::chain(e.as_ref()), "exiting");
            ExitCode::FAILURE
        }
    }
}

/// `amd-hsmp-broker --check`, kept for one release: replaces this process by
/// [`CHECK_PROGRAM`] from the broker's own directory, with the same flags but `--check`, after a
/// warning that names it. Returns only if it cannot be run.
fn run_check_program(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let path = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(CHECK_PROGRAM),
        Err(e) => {
            tracing::error!(error = %e, "cannot find the broker's own directory to run {CHECK_PROGRAM}");
            return ExitCode::FAILURE;
        }
    };
    tracing::warn!(
        program = %path.display(),
        "--check has moved to {CHECK_PROGRAM}, which takes the broker's flags: running it; \
         amd-hsmp-broker --check goes in the next release"
    );
    let error = std::process::Command::new(&path).args(args.filter(|a| a != "--check")).exec();
    tracing::error!(error = %error, program = %path.display(), "cannot run {CHECK_PROGRAM}");
    ExitCode::FAILURE
}

/// The machine the broker serves: its topology and how to reach its devices.
#[derive(Debug)]
pub struct Machine {
    /// Sockets and cores, as the broker reports them.
    pub topology: amd_hsmp_proto::Topology,
    /// Opens `/dev/hsmp` (or what stands for it).
    pub hsmp: Box<dyn HsmpOpener>,
    /// Opens a CPU's MSR device, for `--collector.core-energy.msr-fallback`.
    pub msr: Box<dyn MsrOpener>,
    /// Finds the kernel's `power_core` PMU and opens its events.
    pub perf: Box<dyn PmuLocator>,
    /// The CPUs online now, read again while serving to follow CPU hotplug; `None` follows
    /// none.
    pub online: Option<Box<dyn OnlineCpus>>,
}

/// The machine to serve and, where the online CPUs can be read, their list at start-up, read
/// before the topology (see [`hotplug::Hotplug::start`]).
fn machine(
    cli: &Args,
    simulation: Option<&dyn Simulation>,
) -> Result<(Machine, Option<hotplug::Started>)> {
    if let Some(simulation) = simulation {
        let mut machine = simulation.serve();
        // The simulator's list is never unreadable.
        let started = machine.online.take().and_then(|o| hotplug::Hotplug::start(o).ok());
        return Ok((machine, started));
    }
    let started = start_hotplug(&cli.sysfs);
    let topology =
        topology::discover(&cli.procfs, &cli.sysfs).context("cannot discover topology")?;
    let (hsmp, msr, perf) = devices(cli);
    Ok((Machine { topology, hsmp, msr, perf, online: None }, started))
}

/// Opens and reads this machine's online list under `sysfs` at start-up; a failure is a
/// warning and follows no hotplug.
fn start_hotplug(sysfs: &Path) -> Option<hotplug::Started> {
    let started = SysfsOnline::open(sysfs).and_then(|online| {
        hotplug::Hotplug::start(Box::new(online)).map_err(std::io::Error::from_raw_os_error)
    });
    match started {
        Ok(started) => Some(started),
        Err(e) => {
            tracing::warn!(
                error = %e,
                path = %sysfs.join(amd_hsmp_device::cpus::ONLINE).display(),
                "cannot read the online CPU list: CPUs that come back online are not followed \
                 until the broker restarts"
            );
            None
        }
    }
}

/// How the broker reaches its devices: `/dev/hsmp`, the MSR devices, the perf PMU.
pub(crate) type Devices = (Box<dyn HsmpOpener>, Box<dyn MsrOpener>, Box<dyn PmuLocator>);

/// This machine's `/dev/hsmp`, MSR devices and perf PMU, where the command line says they are.
pub(crate) fn devices(cli: &Args) -> Devices {
    (
        Box::new(HsmpDeviceOpener { path: cli.hsmp_device.clone() }),
        Box::new(MsrDeviceOpener { root: cli.msr_device_root.clone() }),
        Box::new(SysfsPmu { root: cli.perf_pmu_root.clone() }),
    )
}

/// The numeric allow-lists: ids as given, plus names resolved through NSS now, while the broker
/// may still read /etc/passwd and /etc/group (or ask sssd).
fn allow_lists(cli: &Args) -> Result<(Vec<u32>, Vec<u32>)> {
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
    let mut set = stopping_signals();
    for sig in [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2] {
        set.add(sig);
    }
    set
}

/// The signals that stop the broker.
fn stopping_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
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

fn run(cli: Args, simulation: Option<&dyn Simulation>) -> Result<()> {
    // Blocked before any thread exists, so every thread inherits the mask and only the signal
    // thread's sigwait receives them. SIGTERM and SIGINT only once the devices are open and the
    // capabilities dropped: until then their default action ends the broker, so a start-up that
    // blocks (a device or a file that does not answer) is not deaf to them. The broker is still
    // single-threaded there, and one arriving after the block waits for the signal thread.
    let signals = handled_signals();
    let mut ignored = signals;
    for stop in stopping_signals().iter() {
        ignored.remove(stop);
    }
    ignored.thread_block().context("cannot block signals")?;
    let (mut allow_uids, allow_gids) = allow_lists(&cli)?;
    if simulation.is_some() {
        // The simulator reads no device: whoever started it may read it.
        let own = nix::unistd::getuid().as_raw();
        if own != 0 && !allow_uids.contains(&own) {
            allow_uids.push(own);
        }
    }
    tracing::info!(uids = ?allow_uids, gids = ?allow_gids, "peers allowed besides root");
    let (machine, hotplug) = machine(&cli, simulation)?;
    let topo = &machine.topology;
    tracing::info!(
        sockets = topo.sockets.len(),
        cores = topo.cores.len(),
        family = format_args!("{:#x}", topo.cpu_family),
        model = format_args!("{:#x}", topo.cpu_model),
        "topology discovered"
    );
    let wide = topology::beyond_rapl_apic_ids(topo);
    if let Some(first) = wide.first() {
        tracing::warn!(
            cores = wide.len(),
            first_socket = first.socket,
            first_core = first.core,
            first_apic_id = first.apic_id,
            "APIC ids wider than the 16 bits GET_RAPL_CORE_COUNTER carries: these cores' HSMP \
             energy is refused per item, never read through a truncated id; boost limits, which \
             take 32 bits, are read"
        );
    }

    // The device is opened and probed here: whether HSMP answers RAPL decides whether a
    // fallback is opened at all, while the capabilities to open it are still held.
    let mut sampler =
        Sampler::with_max_age(machine.topology.clone(), machine.hsmp, None, cli.sample_max_age);
    let openers = energy::Openers { perf: machine.perf.as_ref(), msr: machine.msr.as_ref() };
    let msr_energy = sampler.choose_energy(&cli.energy_sources(), &openers);
    if let Some(started) = hotplug {
        sampler.watch_hotplug(started.watch(&machine.topology, std::time::Instant::now()));
    }

    lockdown::drop_privileges().context("cannot drop privileges")?;
    // From here a SIGTERM removes the socket file the next step creates (the signal thread
    // takes it once it runs).
    stopping_signals().thread_block().context("cannot block signals")?;
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
        simulated: simulation.map(Simulation::profile),
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

/// A Unix stream socket bound to `path`, whose file is given `mode` before the socket listens:
/// until `listen(2)` the kernel refuses every connection, so no peer is queued while the file
/// still has the mode the umask gave it, and a client that finds the socket listening finds
/// it with `mode`. (`UnixListener::bind` listens at once, leaving the change of mode after.)
fn bind_with_mode(path: &Path, mode: u32) -> Result<UnixListener> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("cannot create a Unix socket")?;
    let address = SocketAddrUnix::new(path)
        .with_context(|| format!("{} cannot name a Unix socket", path.display()))?;
    rustix::net::bind(&fd, &address)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set mode {mode:04o} on {}", path.display()))?;
    // A negative backlog is capped at net.core.somaxconn, as std's `UnixListener::bind` asks.
    rustix::net::listen(&fd, -1).with_context(|| format!("cannot listen on {}", path.display()))?;
    Ok(UnixListener::from(fd))
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
    let listener = bind_with_mode(path, mode)?;
    let file = lockdown::SocketFile::new(path)
        .with_context(|| format!("cannot open the directory of {}", path.display()))?;
    tracing::info!(path = %path.display(), mode = format_args!("{mode:04o}"), "listening");
    Ok((listener, Some(file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_socket_listens_with_the_mode_asked_and_is_not_inherited() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.sock");
        let listener = bind_with_mode(&path, 0o600).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        let flags = rustix::io::fcntl_getfd(&listener).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
        let taken = bind_with_mode(&path, 0o600).unwrap_err();
        assert!(format!("{taken:#}").contains("cannot listen on"), "{taken:#}");
    }
}
