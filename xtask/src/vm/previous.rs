//! The previous release's `.deb`, which check U upgrades to this checkout's under scrapes: which
//! commit it is, and the package built from that commit's sources as [`super::prepare::deb`]
//! builds the current one (release binaries, then `cargo deb --no-build`), cached by commit.
//!
//! The build shares the compiled dependencies with the current one without sharing its target
//! directory: cargo judges a workspace member fresh by its path relative to the workspace root
//! and its sources' modification times, so two source trees in one target directory can each
//! take the other's binaries for up to date (and a `.deb` would ship the wrong ones). The
//! previous build runs in a copy of the current release directory instead, with the members'
//! fingerprints removed, so that exactly the members are compiled again; both packages'
//! binaries are then asked for their revision ([`deb_revision`]).

use super::prepare::{Cache, cached, deb_revision, only_deb};
use crate::image::git;
use anyhow::{Context, Result, ensure};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The commit the upgrade starts from while no release tag is reachable: the last commit before
/// check U existed, the state of `main` that installations of 0.1.0 were built from. Its package
/// has this one's name and version (0.1.0), so the upgrade is a reinstall of the same version,
/// which dpkg performs in full (`prerm upgrade`, unpack, `postinst configure`).
pub const BASELINE: &str = "f9958d7349bd1fa18ebacb5dfd44b1d45e1c1da7";

/// The workspace members' package names start with this: their fingerprints are removed from
/// the copied target directory.
const MEMBER_PREFIX: &str = "amd-hsmp-";

/// Bumped whenever [`deb`] changes how it builds the package.
const RECIPE: u32 = 1;

/// A release: its commit and the revision its binaries report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The full commit id.
    pub commit: String,
    /// What it is: a tag, the baseline, or HEAD's parent.
    pub name: String,
    /// The revision `--version` and `amd_hsmp_build_info` report: 12 hex digits.
    pub revision: String,
}

/// The releases check U needs: this checkout's package and the previous one's.
#[derive(Debug, Clone)]
pub struct Releases {
    /// The previous release and its `.deb`.
    pub previous: (Release, PathBuf),
    /// This checkout's revision, as its binaries report it.
    pub current: String,
}

/// Of `tags` (the `v*` tags reachable from HEAD, newest first), the newest whose version is not
/// `version`: an upgrade from a tag of this very version would change nothing.
fn newest_other_tag<'a>(tags: &[&'a str], version: &str) -> Option<&'a str> {
    tags.iter().copied().find(|t| t.strip_prefix('v').is_some_and(|v| v != version))
}

/// The previous release of the checkout at `root`: the newest `v*` tag reachable from HEAD whose
/// version differs from HEAD's; else [`BASELINE`] when it is an ancestor of HEAD; else HEAD's
/// first parent (HEAD is the baseline or older).
pub fn previous(root: &Path, version: &str) -> Result<Release> {
    ensure!(
        git(root, &["rev-parse", "--is-shallow-repository"])? == "false",
        "a shallow clone has no previous release to upgrade from: clone the whole history"
    );
    let tags = git(root, &["tag", "--merged", "HEAD", "--list", "v*", "--sort=-v:refname"])?;
    let tags: Vec<&str> = tags.lines().collect();
    let head = git(root, &["rev-parse", "HEAD"])?;
    let (commit, name) = if let Some(tag) = newest_other_tag(&tags, version) {
        (git(root, &["rev-parse", &format!("{tag}^{{commit}}")])?, format!("tag {tag}"))
    } else if head != BASELINE && is_ancestor(root, BASELINE, "HEAD") {
        (BASELINE.to_string(), "the baseline".to_string())
    } else {
        (git(root, &["rev-parse", "HEAD^"])?, "HEAD's parent".to_string())
    };
    let revision = commit[..12].to_string();
    Ok(Release { commit, name, revision })
}

fn is_ancestor(root: &Path, ancestor: &str, of: &str) -> bool {
    Command::new("git")
        .args(["merge-base", "--is-ancestor", ancestor, of])
        .current_dir(root)
        .status()
        .is_ok_and(|s| s.success())
}

/// The revision this checkout's binaries report: `AMD_HSMP_REVISION` when the build is given
/// one, else git's, as `cli/build.rs` decides.
pub fn current_revision(root: &Path) -> Result<String> {
    match std::env::var("AMD_HSMP_REVISION") {
        Ok(r) if !r.is_empty() => Ok(r),
        _ => git(root, &["rev-parse", "--short=12", "HEAD"]),
    }
}

/// The `.deb` of `release`, from `cache/previous-deb/` when it was built from the same commit
/// (and [`RECIPE`]); else built from the commit's sources (`git archive`) with a copy of the
/// current release build's target directory, whose path is `target`. Returns the package and
/// whether it was cached.
pub fn deb(
    cache: &Cache,
    root: &Path,
    target: &Path,
    release: &Release,
) -> Result<(PathBuf, bool)> {
    let dir = cache.dir.join("previous-deb");
    let key = format!("commit {}\nrecipe {RECIPE}\n", release.commit);
    let log = cache.log("previous-deb");
    let was_cached = cached(&dir, &key, |tmp| {
        let src = tmp.join("src");
        fs::create_dir_all(&src)?;
        let out = Command::new("git")
            .args(["archive", "--format=tar", &release.commit])
            .current_dir(root)
            .output()
            .context("cannot run git archive")?;
        ensure!(
            out.status.success(),
            "git archive {}: {}",
            release.commit,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut archive = tar::Archive::new(out.stdout.as_slice());
        // Modification times of now: newer than anything in the copied target directory.
        archive.set_preserve_mtime(false);
        archive.unpack(&src)?;
        let build_target = tmp.join("target");
        seed_target(target, &build_target)?;
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let cargo_in = |args: &[&str]| {
            let mut cmd = Command::new(&cargo);
            cmd.args(args)
                .current_dir(&src)
                .env("CARGO_TARGET_DIR", &build_target)
                .env("AMD_HSMP_REVISION", &release.revision)
                .env("AMD_HSMP_BRANCH", "HEAD");
            for (name, _) in std::env::vars_os() {
                if crate::workspace::is_run_only_var(&name.to_string_lossy()) {
                    cmd.env_remove(&name);
                }
            }
            cmd
        };
        super::prepare::run_logged(&mut cargo_in(&crate::workspace::RELEASE_DAEMONS), &log)?;
        let deb_args = crate::packaging::helpers::cargo_deb_args(tmp)?;
        super::prepare::run_logged(&mut cargo_in(&deb_args), &log)?;
        fs::remove_dir_all(&src)?;
        fs::remove_dir_all(&build_target)?;
        let deb = only_deb(tmp)?;
        fs::rename(&deb, tmp.join("amd-hsmp-exporter-previous.deb"))?;
        Ok(())
    })?;
    let deb = dir.join("amd-hsmp-exporter-previous.deb");
    let revision = deb_revision(&deb, &cache.dir.join("run/previous-deb-binaries"))?;
    ensure!(
        revision == release.revision,
        "the previous .deb's binaries report revision {revision}, its commit is {}",
        release.revision
    );
    Ok((deb, was_cached))
}

/// Copies the release directory of `from` (a target directory) into `to`, without the
/// workspace members' fingerprints: cargo then compiles exactly the members again and takes
/// every dependency compiled alike as fresh.
fn seed_target(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    let release = from.join("release");
    ensure!(release.is_dir(), "no release build in {} to start from", from.display());
    crate::workspace::run_cmd(
        Command::new("cp").arg("-a").arg("--reflink=auto").arg(&release).arg(to),
    )?;
    let fingerprints = to.join("release/.fingerprint");
    for entry in fs::read_dir(&fingerprints)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(MEMBER_PREFIX) {
            fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_tag_of_another_version_is_the_previous_release() {
        let tags = ["v0.3.0", "v0.2.1", "v0.2.0", "v0.1.0"];
        assert_eq!(newest_other_tag(&tags, "0.4.0"), Some("v0.3.0"));
        // HEAD is tagged with its own version: the tag before it.
        assert_eq!(newest_other_tag(&tags, "0.3.0"), Some("v0.2.1"));
        assert_eq!(newest_other_tag(&["v0.1.0"], "0.1.0"), None);
        assert_eq!(newest_other_tag(&[], "0.1.0"), None);
    }
}
