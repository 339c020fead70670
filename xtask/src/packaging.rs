//! Static checks of `packaging/` and `selinux/`: the systemd units (verify, exposure scores,
//! settings), the SELinux module (compiles, policy analysis of a full policy that includes it),
//! the RPM spec (parses, SRPM and binary RPMs built with EL9 stand-in macros, contents compared
//! with expected files) and the Debian package (contents, maintainer scripts, lintian).
//!
//! Every check fails with what was wrong; nothing is skipped. Expected package contents live in
//! `packaging/expected/` and are rewritten with `UPDATE_GOLDEN=1 cargo xtask packaging`, to be
//! reviewed as a diff.

mod deb;
pub(crate) mod helpers;
mod install_tree;
mod licenses;
mod rpm;
pub(crate) mod selinux;
pub(crate) mod units;

use self::deb::{deb, same_install_tree};
use self::install_tree::install_tree;
use self::licenses::dependency_licenses;
use self::rpm::rpm;
pub(crate) use self::rpm::workspace_version;
use self::selinux::selinux;
use self::units::units;
use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The unit files, as shipped in `packaging/systemd/` and installed in the unit directory.
pub(super) const UNITS: [&str; 3] =
    ["amd-hsmp-broker.socket", "amd-hsmp-broker.service", "amd-hsmp-exporter.service"];

/// The RPM's name (the Debian package's too).
pub(super) const RPM_NAME: &str = "amd-hsmp-exporter";

/// Runs every packaging check, printing what each measured.
pub fn check(root: &Path) -> Result<()> {
    require_tools()?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let work = target.join("packaging-check");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("cannot empty {}", work.display()))?;
    }
    let started = Instant::now();
    step("systemd units", || units(root, &work.join("units")))?;
    step("install-tree files", || install_tree(root))?;
    step("SELinux module", || selinux(root, &work.join("selinux")))?;
    step("release binaries", || {
        crate::workspace::build_release_daemons().map(|()| "built".to_string())
    })?;
    let licenses = dependency_licenses(root)?;
    let rpm_files =
        step_value("RPM", || rpm(root, &work.join("rpm"), &target.join("release"), &licenses))?;
    let deb_files = step_value("Debian package", || deb(root, &work.join("deb"), &licenses))?;
    step("RPM and Debian package agree", || same_install_tree(root, &rpm_files, &deb_files))?;
    println!("packaging: all checks passed in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs one named check and prints its summary and duration.
fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    step_value(name, || f().map(|summary| (summary, ())))
}

/// Like [`step`], for a check that also returns a value for a later one.
fn step_value<T>(name: &str, f: impl FnOnce() -> Result<(String, T)>) -> Result<T> {
    let started = Instant::now();
    let (summary, value) = f().with_context(|| format!("packaging check failed: {name}"))?;
    println!("packaging: {name}: {summary} ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(value)
}

/// Fails up front, listing everything missing, rather than at the first command that is absent.
fn require_tools() -> Result<()> {
    let packages = crate::deps::missing_packages();
    let mut tools = crate::deps::missing_cargo_tools();
    if crate::deps::rpmlint_missing() {
        tools.push(format!("rpmlint {} (PyPI)", crate::deps::RPMLINT_VERSION));
    }
    if !packages.is_empty() || !tools.is_empty() {
        bail!(
            "missing for the packaging checks: Debian packages [{}], tools [{}]; run `cargo \
             xtask deps` (as root for the Debian packages)",
            packages.join(" "),
            tools.join(", ")
        );
    }
    Ok(())
}
