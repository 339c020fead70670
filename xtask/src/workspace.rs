//! The workspace and the commands run in it: where it is, where cargo writes, and running
//! cargo and other commands to completion. What every task of xtask shares.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The chart, from the workspace root.
pub const CHART: &str = "deploy/helm/amd-hsmp-exporter";

/// A top-level scalar of Chart.yaml (`version`, `appVersion`, `name`), as Helm writes it.
pub fn chart_field<'a>(chart_yaml: &'a str, key: &str) -> Result<&'a str> {
    chart_yaml
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"'))
        .with_context(|| format!("Chart.yaml has no {key}"))
}

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

/// Builds the binaries of `packages` (debug) and returns the directory that holds them.
pub fn build_bins(packages: &[&str]) -> Result<PathBuf> {
    let mut args = vec!["build", "--quiet"];
    args.extend(packages.iter().flat_map(|p| ["-p", *p]));
    args.push("--bins");
    cargo(&args)?;
    Ok(target_dir(&root()).join("debug"))
}

/// Runs cargo with `args` in the workspace root and returns its standard output.
pub fn cargo_stdout(args: &[&str]) -> Result<String> {
    stdout_of(&mut cargo_command(args))
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
pub(crate) fn cargo_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args).current_dir(root());
    for (name, _) in std::env::vars_os() {
        if is_run_only_var(&name.to_string_lossy()) {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// Whether `name` is one of [`RUN_ONLY_VARS`], which a cargo started from xtask must not
/// inherit.
pub fn is_run_only_var(name: &str) -> bool {
    RUN_ONLY_VARS.iter().any(|v| name == *v || (v.ends_with('_') && name.starts_with(v)))
}

/// Builds the release binaries of the two daemons, as the packages ship them: what the
/// packaging check and the VM test's `.deb` are made from.
pub fn build_release_daemons() -> Result<()> {
    cargo(&RELEASE_DAEMONS)
}

/// cargo's arguments of [`build_release_daemons`].
pub const RELEASE_DAEMONS: [&str; 8] = [
    "build",
    "--release",
    "--locked",
    "--package",
    "amd-hsmp-broker",
    "--package",
    "amd-hsmp-exporter",
    "--bins",
];

/// Runs a command to completion; a non-zero exit is an error naming the command.
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// How many of its last lines of each stream a failed command's error shows.
const SAID: usize = 40;

/// Runs a command to completion, capturing its output; a failure to start or a non-zero exit is
/// an error that shows what the command said.
pub fn output(cmd: &mut Command) -> Result<Output> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            tail(&stdout(&out), SAID),
            tail(&String::from_utf8_lossy(&out.stderr), SAID)
        );
    }
    Ok(out)
}

/// A captured standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut s = lines[lines.len().saturating_sub(n)..].join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

/// Runs a command to completion and returns its standard output: [`output`], as text.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    output(cmd).map(|out| stdout(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_yaml_fields_read_as_helm_writes_them() {
        let y = "apiVersion: v2\nversion: 0.2.0\nappVersion: \"0.1.0\"\n";
        assert_eq!(chart_field(y, "version").unwrap(), "0.2.0");
        assert_eq!(chart_field(y, "appVersion").unwrap(), "0.1.0");
        assert!(chart_field(y, "kubeVersion").is_err());
    }

    /// A failed command's error names it and shows the end of what it printed on each stream,
    /// not all of it; a command that succeeds hands its standard output back.
    #[test]
    fn a_failed_command_shows_the_last_lines_it_printed() {
        let err = stdout_of(Command::new("sh").args(["-c", "seq 100; echo oops >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"sh\"") && err.contains("exit status: 3"), "{err}");
        assert!(err.contains("\n61\n") && err.contains("\n100\noops\n"), "{err}");
        assert!(!err.contains("\n60\n"), "{err}");
        assert_eq!(stdout_of(Command::new("echo").arg("fine")).unwrap(), "fine\n");
    }

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
