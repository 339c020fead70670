//! Build script: records what `--version` and `amd_hsmp_build_info` report about the build.
//!
//! Every value is best effort and the build never fails because of one. A packaged build without
//! git passes the revision and branch in `AMD_HSMP_REVISION` and `AMD_HSMP_BRANCH` (the RPM spec
//! does); otherwise git is asked, else `unknown`. `SOURCE_DATE_EPOCH` (reproducible builds) is the
//! build date when set, and then the build user is `AMD_HSMP_BUILD_USER` or `unknown`, never the
//! host's, so that two builds of one source are identical.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

fn main() {
    let revision = given("AMD_HSMP_REVISION")
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let branch = given("AMD_HSMP_BRANCH")
        .or_else(|| git(&["rev-parse", "--abbrev-ref", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let epoch = given("SOURCE_DATE_EPOCH");
    let date = match &epoch {
        Some(secs) => secs.parse().ok().map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        None => Some(SystemTime::now()),
    };
    let date = date.map_or_else(|| "unknown".into(), promu_date);
    let user = given("AMD_HSMP_BUILD_USER").unwrap_or_else(|| match epoch {
        Some(_) => "unknown".into(),
        None => host_user(),
    });
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustversion = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| rustc_version_number(&text))
        .unwrap_or_else(|| "unknown".into());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    for (key, value) in [
        ("AMD_HSMP_REVISION", revision),
        ("AMD_HSMP_BRANCH", branch),
        ("AMD_HSMP_BUILD_DATE", date),
        ("AMD_HSMP_BUILD_USER", user),
        ("AMD_HSMP_RUSTVERSION", rustversion),
        ("AMD_HSMP_TARGET", target),
    ] {
        println!("cargo:rustc-env={key}={value}");
    }

    println!("cargo:rerun-if-changed=build.rs");
    for var in ["AMD_HSMP_REVISION", "AMD_HSMP_BRANCH", "AMD_HSMP_BUILD_USER", "SOURCE_DATE_EPOCH"]
    {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // Rebuild when HEAD moves; without git, only when this script or the variables change.
    // In a worktree, HEAD is in its own git directory and the refs in the common one.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
        watch(&git_dir.join("HEAD"));
        let common = git(&["rev-parse", "--git-common-dir"]).map_or(git_dir.clone(), |c| {
            let c = PathBuf::from(c);
            if c.is_absolute() { c } else { std::env::current_dir().unwrap_or_default().join(c) }
        });
        watch(&common.join("packed-refs"));
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&common.join(reference));
        }
    }
}

/// A non-empty environment variable.
fn given(var: &str) -> Option<String> {
    std::env::var(var).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// Runs git in the crate directory; `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// `user@host`, as Prometheus' promu records it.
fn host_user() -> String {
    let user = given("USER").unwrap_or_else(|| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    format!("{user}@{host}")
}

/// promu's build date format, `20261201-09:24:42` (UTC).
fn promu_date(time: SystemTime) -> String {
    // `2026-12-01T09:24:42Z`
    let rfc = humantime::format_rfc3339_seconds(time).to_string();
    let (day, clock) = rfc.trim_end_matches('Z').split_once('T').unwrap_or((&rfc, ""));
    format!("{}-{clock}", day.replace('-', ""))
}

/// `rustc 1.95.0 (f2d3ce0bd 2026-03-21)` → `1.95.0`.
fn rustc_version_number(text: &str) -> Option<String> {
    text.split_whitespace().nth(1).map(str::to_owned)
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
