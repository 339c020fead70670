//! `cargo xtask bench [--static] [ARGS]`: builds the release binaries and runs the benchmark
//! (the e2e crate's `bench` program) with `ARGS`; `cargo xtask bench --help` lists them. Needs
//! root and `/dev/fuse` for the fake device. Not part of `cargo xtask test`: it reports figures.
//!
//! `--static` measures the daemons as the release's tarball, `.deb` and image ship them (glibc
//! linked statically, `+crt-static`: docs/releasing.md) instead of as `cargo build --release`
//! makes them (the RPM's and a build from source), which map the shared libc.

use anyhow::{Result, bail};
use std::process::Command;

/// The flag that chooses the statically linked daemons.
const STATIC: &str = "--static";

/// Builds `amd-hsmp-broker`, `amd-hsmp-exporter` (statically linked with [`STATIC`]) and
/// `bench` in release mode, then runs `bench ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("the benchmark mounts a FUSE fake device: run it as root (with /dev/fuse)");
    }
    let linked_statically = args.iter().any(|a| a == STATIC);
    let args: Vec<&String> = args.iter().filter(|a| *a != STATIC).collect();
    let target = crate::workspace::target_dir(&crate::workspace::root());
    let daemons = if linked_statically {
        // As the image and the release build them: for the target named, so that the flag does
        // not reach build scripts and proc macros.
        let triple = crate::image::TARGET;
        let mut build = crate::workspace::cargo_command(&crate::workspace::RELEASE_DAEMONS);
        build.args(["--target", triple]).env("CARGO_ENCODED_RUSTFLAGS", crate::image::CRT_STATIC);
        crate::workspace::run_cmd(&mut build)?;
        target.join(triple).join("release")
    } else {
        crate::workspace::build_release_daemons()?;
        target.join("release")
    };
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
    let bench = target.join("release").join("bench");
    crate::workspace::run_cmd(Command::new(bench).args(args).arg("--bin-dir").arg(&daemons))
}
