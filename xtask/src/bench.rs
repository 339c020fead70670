//! `cargo xtask bench [ARGS]`: builds the release binaries and runs the benchmark (the e2e
//! crate's `bench` program) with `ARGS`; `cargo xtask bench --help` lists them. Needs root and
//! `/dev/fuse` for the fake device. Not part of `cargo xtask test`: it reports figures.

use anyhow::{Result, bail};
use std::process::Command;

/// Builds `amd-hsmp-broker`, `amd-hsmp-exporter` and `bench` in release mode, then runs
/// `bench ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("the benchmark mounts a FUSE fake device: run it as root (with /dev/fuse)");
    }
    crate::workspace::build_release_daemons()?;
    // The benchmark program alone: the e2e crate's other programs are not run.
    crate::workspace::cargo(&[
        "build",
        "--quiet",
        "--release",
        "-p",
        "amd-hsmp-e2e",
        "--bin",
        "bench",
    ])?;
    let bin = crate::workspace::target_dir(&crate::workspace::root()).join("release");
    crate::workspace::run_cmd(Command::new(bin.join("bench")).args(args).arg("--bin-dir").arg(&bin))
}
