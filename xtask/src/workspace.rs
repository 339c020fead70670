//! The workspace and the commands run in it: where it is, where cargo writes, and running
//! cargo and other commands to completion. What every task of xtask shares.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Where cargo puts its output: `CARGO_TARGET_DIR` if set, else `target/` in the workspace.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// Runs cargo with `args` in the workspace root; fails if it fails.
pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_cmd(Command::new(cargo).args(args).current_dir(root()))
}

/// Builds the release binaries of the two daemons, as the packages ship them: what the
/// packaging check and the VM test's `.deb` are made from.
pub fn build_release_daemons() -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "--locked",
        "--package",
        "amd-hsmp-broker",
        "--package",
        "amd-hsmp-exporter",
        "--bins",
    ])
}

/// Runs a command to completion; a non-zero exit is an error naming the command.
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
