//! `cargo xtask <task>`: the project's automation, in Rust instead of a Makefile.
//!
//! Tasks: `demo` (both processes on the simulated machine), `test` (the whole suite, installing
//! the Debian packages it needs when run as root), `deps` (only the installs), `packaging` (the
//! packaging checks alone), `man OUTDIR` (man pages and shell completions, see `man.rs`), `mixin [--live]` (the monitoring mixin's checks alone; `--live` adds
//! a real Prometheus scraping the simulated machine, which `test` always runs), `vm-test` (the
//! real driver and the package under systemd in a QEMU guest whose SMU is the simulator; see
//! `vm/mod.rs`), `bench` (the benchmark of a scrape's cost; not part of `test`), `image [--reproducible]`
//! (the OCI image, see `image.rs`), `kube-test [--no-pods]` (the Helm chart, and its pod in podman:
//! `kube/mod.rs`).

#![forbid(unsafe_code)]

mod bench;
mod demo;
mod deps;
mod golden;
mod http;
mod image;
mod kube;
mod man;
mod mixin;
mod packaging;
mod tidy;
mod vm;

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <demo [--scenario NAME]|test|deps|packaging|man OUTDIR|\
                     mixin [--live]|vm-test|bench [--help]|image [--reproducible]|kube-test [--no-pods]>";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => demo::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("deps") => deps::install(),
        Some("image") => image::run(&args[1..]),
        Some("kube-test") => kube::run(&args[1..]),
        Some("packaging") => packaging::check(&root()),
        Some("man") => match args.get(1) {
            Some(outdir) => man::run(Path::new(outdir)),
            None => bail!("usage: cargo xtask man OUTDIR"),
        },
        Some("mixin") => mixin::check(&root(), args.get(1).is_some_and(|a| a == "--live")),
        Some("vm-test") => vm::run(&args[1..]),
        Some("test") => {
            deps::install()?;
            // The tests that need root, /dev/fuse, cgroup writes or the tools `deps` installs
            // are `#[ignore]`d, each saying why, so that a plain `cargo test --workspace` passes
            // as an ordinary user; here, as root with the tools installed, every one runs.
            cargo(&["test", "--workspace", "--all-targets", "--", "--include-ignored"])?;
            // `--all-targets` leaves the doctests out.
            cargo(&["test", "--workspace", "--doc", "--", "--include-ignored"])?;
            // The dependency policy (deny.toml); advisories need a database this machine cannot
            // fetch.
            cargo(&["deny", "--locked", "check", "bans", "licenses", "sources"])?;
            packaging::check(&root())?;
            mixin::check(&root(), true)
        }
        Some(other) => bail!("unknown task {other:?}\n{USAGE}"),
        None => bail!("{USAGE}"),
    }
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
