//! What the packaging checks share: file reads and copies, the `.deb` build.

use anyhow::{Context, Result};
use std::fs;
use std::path::Path;

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
    crate::workspace::cargo(&cargo_deb_args(out)?)
}

/// cargo's arguments that build the project's `.deb` from the release binaries already built,
/// into `out`.
pub(crate) fn cargo_deb_args(out: &Path) -> Result<[&str; 8]> {
    let out = out.to_str().context("the .deb output path is not UTF-8")?;
    Ok([
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
