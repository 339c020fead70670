//! Build script: records the git revision and the compiler version for `amd_hsmp_build_info`.
//!
//! Both are best effort: a source tree without git (a release tarball, an RPM build) gets the
//! revision `unknown`, and the build never fails because of it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustversion = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| rustc_version_number(&text))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=AMD_HSMP_REVISION={revision}");
    println!("cargo:rustc-env=AMD_HSMP_RUSTVERSION={rustversion}");

    // Rebuild when HEAD moves; without git, only when this script changes.
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]).map(PathBuf::from) {
        watch(&git_dir.join("HEAD"));
        watch(&git_dir.join("packed-refs"));
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&git_dir.join(reference));
        }
    }
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

/// `rustc 1.95.0 (f2d3ce0bd 2026-03-21)` → `1.95.0`.
fn rustc_version_number(text: &str) -> Option<String> {
    text.split_whitespace().nth(1).map(str::to_owned)
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
