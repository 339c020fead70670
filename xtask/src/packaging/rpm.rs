//! The RPM: spec parsed, SRPM and binary RPMs built with EL9 stand-in macros, contents compared
//! with the expected lists, rpmlint run.

use super::RPM_NAME;
use super::helpers::{copy, read};
use super::licenses::{license_terms, same_licenses};
use crate::golden::expect_file;
use crate::workspace::{output, stdout, tail};
use anyhow::{Context, Result, bail, ensure};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The spec and the macro stand-ins.
pub(super) const SPEC: &str = "packaging/rpm/amd-hsmp-exporter.spec";
const RPM_SHIM: &str = "packaging/rpm/macros.check";

/// Shared libraries the binaries may link (automatic RPM requires); anything else is a surprise
/// dependency on the EL9 host.
const ALLOWED_SONAMES: &[&str] =
    &["libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "rtld(GNU_HASH)"];

/// Parses the spec and builds the SRPM and the binary RPMs with the EL9 stand-in macros and the
/// release binaries, then compares their contents with `packaging/expected/`. Returns the main
/// RPM's file list.
pub(super) fn rpm(
    root: &Path,
    work: &Path,
    release: &Path,
    licenses: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>)> {
    let version = workspace_version(root)?;
    write_sources(root, work, release, &version)?;

    // What a release build passes for the tarball's missing git history.
    let revision = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".to_string(), |o| stdout(&o).trim().to_string());
    let macros = |cmd: &mut Command| {
        cmd.arg("--load")
            .arg(root.join(RPM_SHIM))
            .arg("--define")
            .arg(format!("_topdir {}", work.display()))
            .arg("--define")
            .arg(format!("shim_dir {}", root.join("packaging/rpm").display()))
            .arg("--define")
            .arg(format!("prebuilt_bindir {}", release.display()))
            .arg("--define")
            .arg(format!("revision {revision}"));
    };

    spec_parses(root, &macros, &version, licenses)?;
    rpmbuild(root, work, &macros)?;
    let srpm = srpm_holds_the_sources(work, &version)?;

    let main = work.join(format!("RPMS/x86_64/{RPM_NAME}-{version}-1.el9.x86_64.rpm"));
    let selinux = work.join(format!("RPMS/noarch/{RPM_NAME}-selinux-{version}-1.el9.noarch.rpm"));
    let (main_manifest, main_files) = rpm_manifest(&main)?;
    let (selinux_manifest, _) = rpm_manifest(&selinux)?;
    expect_file(&root.join("packaging/expected/amd-hsmp-exporter.rpm.txt"), &main_manifest)?;
    expect_file(
        &root.join("packaging/expected/amd-hsmp-exporter-selinux.rpm.txt"),
        &selinux_manifest,
    )?;
    let warnings = rpmlint(&[&root.join(SPEC), &srpm, &main, &selinux])?;
    Ok((
        format!(
            "spec parses, SRPM and 2 RPMs built, contents as expected, rpmlint with Fedora's \
             configuration: no error, {warnings} accepted warnings ({})",
            srpm.display()
        ),
        main_files,
    ))
}

/// The RPM's first step: the spec's three sources in `work/SOURCES` (the working tree's
/// tarball, an empty vendor tarball, the sysusers.d file); an error when a release binary is
/// missing from `release`.
fn write_sources(root: &Path, work: &Path, release: &Path, version: &str) -> Result<()> {
    let sources = work.join("SOURCES");
    fs::create_dir_all(&sources)?;
    // Source0: the working tree as a release tarball would hold it.
    output(
        Command::new("tar")
            .args(["--exclude=./target", "--exclude=./.git"])
            .arg(format!("--transform=s,^\\.,{RPM_NAME}-{version},"))
            .arg("-czf")
            .arg(sources.join(format!("{RPM_NAME}-{version}.tar.gz")))
            .arg("-C")
            .arg(root)
            .arg("."),
    )?;
    // Source1: an empty vendor/ directory stands in for the vendored crates; the stand-in cargo
    // macros use the prebuilt binaries instead.
    let vendor = work.join("vendor-src/vendor");
    fs::create_dir_all(&vendor)?;
    output(
        Command::new("tar")
            .arg("-cJf")
            .arg(sources.join(format!("{RPM_NAME}-{version}-vendor.tar.xz")))
            .arg("-C")
            .arg(work.join("vendor-src"))
            .arg("vendor"),
    )?;
    // Source2: the sysusers.d file, read while the spec is parsed (%sysusers_create_compat).
    copy(
        &root.join("packaging/sysusers.d/amd-hsmp-exporter.conf"),
        &sources.join(format!("{RPM_NAME}.conf")),
    )?;
    for bin in ["amd-hsmp-broker", "amd-hsmp-exporter", "amd-hsmp-check"] {
        ensure!(release.join(bin).is_file(), "no release binary {}", release.join(bin).display());
    }
    Ok(())
}

/// The spec, with the stand-in `macros`, parses without a word on stderr; its Version is the
/// workspace's `version` and its License the linked crates' `licenses`.
fn spec_parses(
    root: &Path,
    macros: &impl Fn(&mut Command),
    version: &str,
    licenses: &BTreeSet<String>,
) -> Result<()> {
    let mut parse = Command::new("rpmspec");
    parse.arg("--parse");
    macros(&mut parse);
    let parsed = output(parse.arg(root.join(SPEC)))?;
    let stderr = String::from_utf8_lossy(&parsed.stderr);
    ensure!(stderr.trim().is_empty(), "rpmspec --parse reported:\n{}", stderr.trim());

    let mut query = Command::new("rpmspec");
    query.args(["--query", "--srpm", "--queryformat", "%{VERSION}\\n%{LICENSE}\\n"]);
    macros(&mut query);
    let queried = stdout(&output(query.arg(root.join(SPEC)))?);
    let mut lines = queried.lines();
    let spec_version = lines.next().unwrap_or_default();
    ensure!(
        spec_version == version,
        "spec Version {spec_version} is not the workspace's {version}"
    );
    same_licenses(
        "the spec's License tag",
        &license_terms(lines.next().unwrap_or_default())?,
        licenses,
    )?;
    Ok(())
}

/// `rpmbuild -ba` of the spec with the stand-in `macros`, its output in `work/rpmbuild.log`;
/// an error with the log's tail when it fails.
fn rpmbuild(root: &Path, work: &Path, macros: &impl Fn(&mut Command)) -> Result<()> {
    let mut build = Command::new("rpmbuild");
    build.args(["-ba", "--nodeps"]);
    macros(&mut build);
    let log = work.join("rpmbuild.log");
    let built = build.arg(root.join(SPEC)).output().context("cannot run rpmbuild")?;
    fs::write(&log, [built.stdout.as_slice(), built.stderr.as_slice()].concat())?;
    ensure!(
        built.status.success(),
        "rpmbuild failed ({}); log in {}:\n{}",
        built.status,
        log.display(),
        tail(&String::from_utf8_lossy(&built.stderr), 30)
    );
    Ok(())
}

/// The SRPM built in `work` holds the three sources and the spec, nothing else; its path.
fn srpm_holds_the_sources(work: &Path, version: &str) -> Result<PathBuf> {
    let srpm = work.join(format!("SRPMS/{RPM_NAME}-{version}-1.el9.src.rpm"));
    let srpm_files: BTreeSet<String> =
        stdout(&output(Command::new("rpm").args(["-qpl"]).arg(&srpm))?)
            .lines()
            .map(String::from)
            .collect();
    let expected_srpm: BTreeSet<String> = [
        format!("{RPM_NAME}-{version}.tar.gz"),
        format!("{RPM_NAME}-{version}-vendor.tar.xz"),
        format!("{RPM_NAME}.conf"),
        format!("{RPM_NAME}.spec"),
    ]
    .into();
    ensure!(srpm_files == expected_srpm, "the SRPM holds {srpm_files:?}, not {expected_srpm:?}");
    Ok(srpm)
}

/// rpmlint warnings accepted on the spec and the RPMs, each with its reason; anything else
/// rpmlint reports, and every error, fails the check. A tag listed here that rpmlint no longer
/// reports fails it too, so the list stays true.
const RPMLINT_ACCEPTED: &[(&str, &str)] = &[
    (
        "unstripped-binary-or-object",
        "the stand-in build root takes the release binaries as they are; EL9's rpmbuild strips \
         them into the -debuginfo package (find-debuginfo), which this check does not build",
    ),
    (
        "invalid-url",
        "Source1, the vendored crates, is made from Cargo.lock at release time (cargo vendor, \
         see the spec's header): there is no upstream URL for it",
    ),
    (
        "invalid-license",
        "rpmlint 2.10's Fedora list holds the pre-2023 Fedora short names (ASL 2.0); Fedora \
         requires SPDX expressions since Fedora 38, and this check compares the tag with the \
         SPDX licenses cargo reports for the linked crates",
    ),
    (
        "invalid-license-exception",
        "LLVM-exception is an SPDX exception (Apache-2.0 WITH LLVM-exception of a linked crate); \
         the same outdated list as invalid-license",
    ),
    (
        "dangerous-command-in-%pre",
        "the cp is %selinux_relabel_pre's, the selinux-policy macro the Fedora SELinux policy \
         guidelines prescribe (it saves file_contexts for the relabel after the transaction)",
    ),
    (
        "dangerous-command-in-%posttrans",
        "the rm is %selinux_relabel_post's (the same macro pair): it removes the saved \
         file_contexts once fixfiles has relabelled",
    ),
];

/// Runs rpmlint with Fedora's configuration (from the rpmlint release, `deps::rpmlint_dir`) on
/// `paths`; returns how many accepted warnings it reported.
fn rpmlint(paths: &[&Path]) -> Result<usize> {
    let dir = crate::deps::rpmlint_dir();
    let out = Command::new(dir.join("bin/rpmlint"))
        .arg("--config")
        .arg(dir.join("configs/Fedora"))
        .args(paths)
        .output()
        .context("cannot run rpmlint")?;
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    // A crash (a missing helper such as checkbashisms) prints no summary and no finding.
    ensure!(
        text.lines().any(|l| l.contains(" checked; ") && l.contains(" errors, ")),
        "rpmlint did not finish ({}):\n{text}",
        out.status
    );
    let (findings, unaccepted) = rpmlint_findings(&text);
    ensure!(
        unaccepted.is_empty(),
        "rpmlint (Fedora's configuration) reported:\n{}\n\nfull output:\n{text}",
        unaccepted.join("\n")
    );
    let stale: Vec<&str> = RPMLINT_ACCEPTED
        .iter()
        .map(|(tag, _)| *tag)
        .filter(|tag| !findings.iter().any(|(_, t)| t == tag))
        .collect();
    ensure!(stale.is_empty(), "rpmlint no longer reports the accepted {stale:?}: remove them");
    Ok(findings.len())
}

/// The (level, tag) of every `E:` and `W:` line of rpmlint's output, and the lines that are
/// errors or warnings not in [`RPMLINT_ACCEPTED`].
fn rpmlint_findings(text: &str) -> (Vec<(char, String)>, Vec<String>) {
    let mut findings = Vec::new();
    let mut unaccepted = Vec::new();
    for line in text.lines() {
        let Some((level, rest)) = [('E', ": E: "), ('W', ": W: ")]
            .into_iter()
            .find_map(|(level, marker)| line.split_once(marker).map(|(_, rest)| (level, rest)))
        else {
            continue;
        };
        let tag = rest.split_whitespace().next().unwrap_or_default().to_string();
        if level == 'E' || !RPMLINT_ACCEPTED.iter().any(|(t, _)| *t == tag) {
            unaccepted.push(line.to_string());
        } else {
            findings.push((level, tag));
        }
    }
    (findings, unaccepted)
}

/// Files (mode, owner, flags, path), non-automatic requirements and scriptlets of an RPM, as
/// compared with the expected file. Checks the automatic (ELF) requirements against
/// [`ALLOWED_SONAMES`] instead, since their symbol versions follow the build host's libc.
fn rpm_manifest(rpm: &Path) -> Result<(String, BTreeSet<String>)> {
    let query = |format: &str| -> Result<String> {
        Ok(stdout(&output(Command::new("rpm").args(["-qp", "--queryformat", format]).arg(rpm))?))
    };
    let mut manifest = String::from("# files: mode owner:group flags path\n");
    let mut files = BTreeSet::new();
    for line in query(
        "[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILENAMES}\\n]",
    )?
    .lines()
    {
        let path = line.rsplit(' ').next().unwrap_or_default();
        // Build-id links depend on the build host's debuginfo settings.
        if path.starts_with("/usr/lib/.build-id") {
            continue;
        }
        if !line.starts_with('d') {
            files.insert(path.to_string());
        }
        manifest.push_str(line);
        manifest.push('\n');
    }
    manifest.push_str("# requires: type name flags version\n");
    for line in query(
        "[%{REQUIREFLAGS:deptype} %{REQUIRENAME} %{REQUIREFLAGS:depflags} %{REQUIREVERSION}\\n]",
    )?
    .lines()
    {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        if kind == "auto" {
            let name = rest.split(['(', ' ']).next().unwrap_or_default();
            let soname = if rest.starts_with("rtld(") { "rtld(GNU_HASH)" } else { name };
            ensure!(
                ALLOWED_SONAMES.contains(&soname),
                "{} requires {rest}, not one of {ALLOWED_SONAMES:?}",
                rpm.display()
            );
            continue;
        }
        manifest.push_str(line.trim_end());
        manifest.push('\n');
    }
    manifest.push_str("# scriptlets\n");
    manifest.push_str(&stdout(&output(Command::new("rpm").args(["-qp", "--scripts"]).arg(rpm))?));
    Ok((manifest, files))
}

pub(crate) fn workspace_version(root: &Path) -> Result<String> {
    let manifest = read(&root.join("Cargo.toml"))?;
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package
            && line.starts_with("version")
            && let Some(v) = line.split('"').nth(1)
        {
            return Ok(v.to_string());
        }
    }
    bail!("no version in [workspace.package] of Cargo.toml")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpmlint_errors_and_unlisted_warnings_are_reported_accepted_ones_counted() {
        let out = "amd-hsmp-exporter.x86_64: W: unstripped-binary-or-object /usr/bin/x\n\
                   amd-hsmp-exporter.src: E: spelling-error ('dev', '%description')\n\
                   amd-hsmp-exporter-selinux.noarch: W: no-documentation\n\
                   amd-hsmp-exporter.spec: W: invalid-url Source1: x.tar.xz\n\
                   3 packages and 1 specfiles checked; 1 errors, 3 warnings\n";
        let (accepted, unaccepted) = rpmlint_findings(out);
        assert_eq!(
            accepted,
            [('W', "unstripped-binary-or-object".into()), ('W', "invalid-url".into())]
        );
        assert_eq!(unaccepted.len(), 2, "{unaccepted:?}");
        assert!(unaccepted[0].contains("E: spelling-error"));
        assert!(unaccepted[1].contains("W: no-documentation"));
    }
}
