//! `cargo xtask <task>`: the project's automation, in Rust instead of a Makefile.
//!
//! Tasks: `demo` (both processes on the simulated machine), `test` (the whole suite, installing
//! the Debian packages it needs when run as root), `test-as-user` (as root: the suite's tests
//! again as uid 65534 without `/dev/fuse`, from the same build; `as_user.rs`), `deps` (only the installs), `packaging` (the
//! packaging checks alone), `man OUTDIR` (man pages and shell completions, see `man.rs`), `mixin [--live]` (the monitoring mixin's checks alone; `--live` adds
//! a real Prometheus scraping the simulated machine, which `test` always runs), `vm-test` (the
//! real driver and the package under systemd in a QEMU guest whose SMU is the simulator; see
//! `vm.rs`), `bench` (the benchmark of a scrape's cost; not part of `test`), `image [--reproducible]`
//! (the OCI image, see `image.rs`), `kube-test [--no-pods]` (the Helm chart, and its pod in podman:
//! `kube.rs`), `release [--dry-run] [--out DIR]` (every artifact of a release, built twice and
//! compared, its checksums signed: `release.rs`), `changelog [--check|--release|--notes V]`
//! (CHANGELOG.md from the commits: `changelog.rs`).

#![forbid(unsafe_code)]

mod as_user;
mod bench;
mod changelog;
mod demo;
mod deps;
mod golden;
mod http;
mod image;
mod kube;
mod man;
mod mixin;
mod packaging;
mod release;
mod tidy;
mod vm;
mod workspace;

use anyhow::{Result, bail};
use std::path::Path;
use std::process::ExitCode;
use workspace::{cargo, root};

const USAGE: &str = "usage: cargo xtask <demo [--scenario NAME]|test|test-as-user|deps|packaging|man OUTDIR|\
                     mixin [--live]|vm-test|bench [--help]|image [--reproducible]|kube-test [--no-pods]|\
                     release [--dry-run] [--out DIR]|changelog [--check|--release|--notes V]>";

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
        Some("changelog") => changelog::run(&args[1..]),
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
        Some("release") => release::run(&args[1..]),
        Some("test-as-user") => as_user::run(),
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
