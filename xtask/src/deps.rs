//! Installs the Debian packages the test suite needs (when root), or says which are missing.

use anyhow::{Result, bail};
use std::process::Command;

/// Debian packages the suite uses, with the command each provides.
pub const PACKAGES: &[(&str, &str)] = &[("fuse3", "fusermount3"), ("prometheus", "promtool")];

/// Installs missing packages with apt-get when running as root; otherwise fails listing them.
pub fn install() -> Result<()> {
    let missing: Vec<&str> =
        PACKAGES.iter().filter(|(_, cmd)| !on_path(cmd)).map(|(pkg, _)| *pkg).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!("missing Debian packages: {} (install them, or run as root)", missing.join(" "));
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    crate::run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    crate::run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}
