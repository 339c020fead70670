//! `amd-hsmp-check` as a command: the machine's accounts and the `--check.timeout` watchdog
//! around [`super::run_streaming`], printing each line as it is decided.

use super::{Account, Accounts};
use crate::cli::Args;
use crate::daemon::{Machine, Simulation};
use amd_hsmp_device::{HsmpOpener, MsrOpener, PmuLocator};
use amd_hsmp_proto::Topology;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// `amd-hsmp-check`'s `main` after parsing, and `amd-hsmp-sim-broker --check`'s: `--version`,
/// logging, then the checks on this machine's devices where the flags say they are, or on
/// `simulation`'s machine. `program` names the binary in `--version` and the verdict.
pub fn main(program: &str, args: Args, simulation: Option<&dyn Simulation>) -> ExitCode {
    if let Some(done) = crate::cli::begin(program, &args) {
        return done;
    }
    let (simulated, (hsmp, msr, perf)) = match simulation.map(Simulation::check) {
        Some(Machine { topology, hsmp, msr, perf, .. }) => (Some(topology), (hsmp, msr, perf)),
        None => (None, crate::daemon::devices(&args)),
    };
    run(program, &args, simulated, hsmp, msr, perf)
}

/// Runs the checks of [`crate::check`] on the devices `hsmp`, `msr` and `perf` (the
/// simulated machine's, with its topology as `simulated`) and prints one line each as soon as
/// it is decided, within `--check.timeout`.
fn run(
    program: &str,
    cli: &Args,
    simulated: Option<Topology>,
    hsmp: Box<dyn HsmpOpener>,
    msr: Box<dyn MsrOpener>,
    perf: Box<dyn PmuLocator>,
) -> ExitCode {
    let sources = cli.energy_sources();
    let msr = sources.contains(&crate::energy::SourceName::Msr).then_some(msr);
    let perf = sources.contains(&crate::energy::SourceName::Perf).then_some(perf);
    let group = |name: &str| nix::unistd::Group::from_name(name).ok().flatten();
    let exporter = nix::unistd::User::from_name(super::EXPORTER_USER).ok().flatten().map(|u| {
        let mut gids = vec![u.gid.as_raw()];
        if let Ok(name) = std::ffi::CString::new(u.name.clone())
            && let Ok(all) = nix::unistd::getgrouplist(&name, u.gid)
        {
            gids.extend(all.iter().map(|g| g.as_raw()));
        }
        Account { uid: u.uid.as_raw(), gids }
    });
    let accounts =
        Accounts { broker_gid: group(super::BROKER_GROUP).map(|g| g.gid.as_raw()), exporter };
    let socket = cli.listen.clone().unwrap_or_else(|| amd_hsmp_proto::DEFAULT_SOCKET.into());
    let mut wait = || {
        let started = std::time::Instant::now();
        std::thread::sleep(super::ENERGY_WINDOW);
        started.elapsed()
    };
    let mut clock = std::time::Instant::now;
    let mut inputs = super::Inputs {
        procfs: &cli.procfs,
        sysfs: &cli.sysfs,
        hsmp_device: &cli.hsmp_device,
        hsmp: hsmp.as_ref(),
        msr: msr.as_deref(),
        perf: perf.as_deref(),
        msr_root: &cli.msr_device_root,
        etc: Path::new("/etc"),
        socket: &socket,
        accounts: &accounts,
        labels: &super::selinux_label,
        energy_wait: &mut wait,
        energy_clock: &mut clock,
        simulated,
    };
    // Each line is printed as soon as it is decided. A watchdog ends the run at
    // --check.timeout with a line naming the check that did not finish: a blocking ioctl or
    // read cannot be interrupted, so the deadline is kept from another thread.
    let printed = Arc::new(std::sync::Mutex::new(Printed::default()));
    let watched = Arc::clone(&printed);
    let timeout = cli.check_timeout;
    let verdict = |passed: bool| {
        if passed {
            format!("{program}: every check a scrape needs passed")
        } else {
            format!("{program}: a scrape cannot work as it should; see FAIL above")
        }
    };
    let failed = verdict(false);
    let watchdog = std::thread::Builder::new().name("check-deadline".into()).spawn(move || {
        std::thread::sleep(timeout);
        let printed = watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !printed.finished {
            println!("{}", super::deadline(timeout, printed.last));
            println!("{failed}");
            std::process::exit(1);
        }
    });
    if let Err(e) = watchdog {
        eprintln!("{program}: cannot start the --check.timeout deadline: {e}; running without it");
    }
    let lock = || printed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let lines = super::run_streaming(&mut inputs, &mut |line| {
        let mut printed = lock();
        println!("{line}");
        printed.last = Some(line.name);
    });
    let mut printed = lock();
    printed.finished = true;
    let passed = super::passed(&lines);
    println!("{}", verdict(passed));
    if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// What `--check` has printed, shared with its deadline's watchdog: the last line's name, and
/// whether the verdict is being printed (then the watchdog says nothing).
#[derive(Debug, Default)]
struct Printed {
    last: Option<&'static str>,
    finished: bool,
}
