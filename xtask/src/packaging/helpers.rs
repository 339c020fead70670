//! What the packaging checks share: running commands, file copies.

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

/// Runs a command to completion, capturing its output; a failure to start or a non-zero exit is
/// an error that shows what the command said.
pub(super) fn output(cmd: &mut Command) -> Result<Output> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            tail(&stdout(&out), 20),
            tail(&String::from_utf8_lossy(&out.stderr), 20)
        );
    }
    Ok(out)
}

pub(super) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last `n` lines of `text`.
pub(super) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut s = lines[lines.len().saturating_sub(n)..].join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

pub(super) fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

pub(super) fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))
}

pub(super) fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// Builds the project's `.deb` from the release binaries already built, into `out`.
pub(crate) fn cargo_deb(out: &Path) -> Result<()> {
    let out = out.to_str().context("the .deb output path is not UTF-8")?;
    crate::workspace::cargo(&[
        "deb",
        "--package",
        "amd-hsmp-exporter",
        "--no-build",
        "--locked",
        "--fast",
        "--output",
        out,
    ])
}
