//! The broker's command line: every flag, its default and its help text.
//!
//! A library module so that `cargo xtask man` renders the man page and the shell completions
//! from the same definition `main` parses.

use amd_hsmp_cli::CommonArgs;
use amd_hsmp_sim as sim;
use clap::{CommandFactory as _, Parser};
use std::path::PathBuf;
use std::time::Duration;

/// Reads AMD EPYC telemetry from /dev/hsmp (and optionally the MSR devices) and answers typed
/// requests from amd-hsmp-exporter on a Unix socket. It never touches the network.
#[derive(Debug, Parser)]
#[command(name = "amd-hsmp-broker", about, long_about = None, disable_version_flag = true)]
pub struct Cli {
    /// Create and listen on this Unix socket (mode 0660). Without it, the socket passed by
    /// systemd socket activation (LISTEN_FDS) is used.
    #[arg(long, value_name = "PATH")]
    pub listen: Option<PathBuf>,

    /// Serve peers with this uid (repeatable). Root is always served.
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

    /// Read per-core energy from the MSR devices where HSMP lacks the RAPL messages
    /// (needs CAP_SYS_RAWIO at start-up; dropped right after the devices are opened).
    #[arg(long = "collector.core-energy.msr-fallback")]
    pub msr_fallback: bool,

    /// Directory holding <cpu>/msr device nodes.
    #[arg(long = "msr.device-root", value_name = "PATH", default_value = "/dev/cpu")]
    pub msr_device_root: PathBuf,

    /// How often the 32-bit MSR energy counters are read to extend them to 64 bits. Shortened
    /// to a quarter of the shortest wrap at 100 W a core (164 s at the usual ESU of 16); a core
    /// not read for a whole wrap period restarts its count and the reset is counted.
    #[arg(long = "msr.poll-interval", value_name = "DURATION", default_value = "30s",
          value_parser = parse_poll_interval)]
    pub msr_poll_interval: Duration,

    /// Connection slots each peer uid may hold at once. Each --allow-uid/--allow-user/
    /// --allow-gid/--allow-group identity has this many slots kept for it alone, so the
    /// exporter (which holds at most 2) always connects, whoever else squats.
    #[arg(long = "connections.per-uid", value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(2..=64))]
    pub connections_per_uid: u16,

    /// Connection slots shared by every allowed peer (root included), beyond the reserved ones.
    #[arg(long = "connections.shared", value_name = "N", default_value_t = 4,
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

    /// Serve the built-in firmware simulator for this machine profile instead of the devices.
    #[arg(long, value_name = "PROFILE")]
    pub simulate: Option<sim::Profile>,

    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn parse_poll_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(600) {
        return Err("must be between 10ms and 10m (the counter wraps after ~65536 J)".into());
    }
    Ok(d)
}

pub fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(240) {
        return Err("must be between 1s and 4m".into());
    }
    Ok(d)
}

/// The broker's `clap` definition, for the man page and the completions.
pub fn command() -> clap::Command {
    Cli::command()
}
