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
    run_cmd(&mut cargo_command(args))
}

/// Variables `cargo run` sets for xtask itself (its manifest and package), by name or prefix.
/// A build script may watch one (ring's `rerun-if-env-changed=CARGO_MANIFEST_DIR`), so a
/// build that inherited them and a plain `cargo build` would each find the other's output
/// stale and rebuild it.
const RUN_ONLY_VARS: [&str; 6] = [
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_PKG_",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
];

/// cargo with `args` in the workspace root, in the environment a plain `cargo` from the
/// shell would have: without [`RUN_ONLY_VARS`].
fn cargo_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args).current_dir(root());
    for (name, _) in std::env::vars_os() {
        let name_str = name.to_string_lossy();
        if RUN_ONLY_VARS
            .iter()
            .any(|v| name_str == *v || (v.ends_with('_') && name_str.starts_with(v)))
        {
            cmd.env_remove(&name);
        }
    }
    cmd
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_run_builds_in_the_environment_of_a_plain_cargo_build() {
        // The test binary runs under cargo, which sets these as `cargo run` does for xtask.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let cmd = cargo_command(&["build"]);
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        for var in
            ["CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_PKG_NAME", "CARGO_PKG_VERSION"]
        {
            assert!(removed.iter().any(|r| r == var), "{var} left in: {removed:?}");
        }
        assert!(!removed.iter().any(|r| r == "CARGO_HOME" || r == "CARGO_TARGET_DIR"));
    }
}
