//! `cargo xtask demo [--scenario NAME]`: the broker on the simulated Turin 2P
//! (`amd-hsmp-sim-broker`) and the exporter on :10054, as whoever runs it (the simulating broker
//! serves its own uid; no root needed).

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Simulated machine the demo serves.
const PROFILE: &str = "turin-2p";
/// Where the exporter listens.
const LISTEN: &str = ":10054";

/// Kills a child on drop, so an early error leaves nothing behind.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            if let Some(pid) = Pid::from_raw(self.0.id() as i32) {
                let _ = kill_process(pid, Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Builds both binaries, starts them and waits for Ctrl-C (or for either to exit). `args` are
/// the task's arguments: `--scenario NAME` picks the simulator's events.
pub fn run(args: &[String]) -> Result<()> {
    let scenario = match args {
        [] => None,
        [flag, name] if flag == "--scenario" => Some(name.clone()),
        _ => bail!("usage: cargo xtask demo [--scenario normal|thermal-event|prochot-flapping]"),
    };
    let bin = build()?;
    let dir = std::env::temp_dir().join(format!("amd-hsmp-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = serve(&bin, &dir, scenario.as_deref());
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Builds the simulating broker and the exporter (debug); returns the directory that holds them.
pub fn build() -> Result<PathBuf> {
    crate::workspace::build_bins(&["amd-hsmp-sim-broker", "amd-hsmp-exporter"])
}

fn serve(bin: &Path, dir: &Path, scenario: Option<&str>) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("cannot install the Ctrl-C handler")?;

    let socket = dir.join("broker.sock");
    let sim_broker = bin.join("amd-hsmp-sim-broker");
    let mut broker = Guard(
        Command::new(&sim_broker)
            .args(["--simulate", PROFILE, "--listen"])
            .arg(&socket)
            .args(scenario.iter().flat_map(|s| ["--simulate.scenario", *s]))
            // .cargo/config.toml pins the simulated instant for the tests; the demo follows
            // the real day.
            .env_remove("AMD_HSMP_SIMULATE_TIME")
            .spawn()
            .with_context(|| format!("cannot start {}", sim_broker.display()))?,
    );
    let started = Instant::now();
    while !socket.exists() {
        if let Some(status) = broker.0.try_wait()? {
            bail!("amd-hsmp-sim-broker exited: {status}");
        }
        if started.elapsed() > Duration::from_secs(10) {
            bail!("amd-hsmp-sim-broker did not create {} within 10 s", socket.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let exporter_bin = bin.join("amd-hsmp-exporter");
    let mut exporter = Guard(
        Command::new(&exporter_bin)
            .args(["--web.listen-address", LISTEN, "--broker.socket"])
            .arg(&socket)
            .spawn()
            .with_context(|| format!("cannot start {}", exporter_bin.display()))?,
    );
    eprintln!(
        "\nDemo running on a simulated {PROFILE} ({}): http://localhost:10054/ (the node at a \
         glance) and http://localhost:10054/metrics\nPress Ctrl-C to stop.\n",
        scenario.unwrap_or("normal")
    );
    while !stop.load(Ordering::SeqCst) {
        if let Some(status) = broker.0.try_wait()? {
            bail!("amd-hsmp-sim-broker exited: {status}");
        }
        if let Some(status) = exporter.0.try_wait()? {
            bail!("amd-hsmp-exporter exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("stopping");
    Ok(())
}
