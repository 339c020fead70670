//! The Debian package: built with cargo-deb, its contents compared with the expected list, its
//! maintainer scripts and copyright checked, lintian run.

use super::helpers::{cargo_deb, read};
use super::licenses::{license_ids, license_terms, same_licenses};
use super::rpm::workspace_version;
use super::units::deb_unit;
use super::{RPM_NAME, UNITS};
use crate::golden::expect_file;
use crate::workspace::{output, stdout};
use anyhow::{Context, Result, bail, ensure};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

/// Lintian tags accepted, each with its reason.
const LINTIAN_ACCEPTED: &[(&str, &str)] = &[
    ("initial-upload-closes-no-bugs", "the package is not uploaded to the Debian archive"),
    (
        "embedded-library",
        "libyaml's strings are unsafe-libyaml's, the Rust translation of libyaml that the YAML \
         parser of --web.config.file links statically, as every Rust dependency is",
    ),
];

/// Builds the .deb with cargo-deb from the release binaries, compares its contents, control
/// fields and maintainer scripts with `packaging/expected/`, and runs lintian. Returns its file
/// list.
pub(super) fn deb(
    root: &Path,
    work: &Path,
    licenses: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>)> {
    let version = workspace_version(root)?;
    let changelog = read(&root.join("packaging/deb/changelog"))?;
    ensure!(
        changelog.starts_with(&format!("{RPM_NAME} ({version}-1) ")),
        "packaging/deb/changelog does not start with version {version}-1"
    );
    deb_copyright_covers(&read(&root.join("packaging/deb/copyright"))?, licenses)?;
    // The units cargo-deb installs: packaging/systemd's, reading /etc/default.
    for unit in UNITS {
        let text = read(&root.join("packaging/systemd").join(unit))?;
        expect_file(&root.join("packaging/deb/systemd").join(unit), &deb_unit(unit, &text))?;
    }

    fs::create_dir_all(work)?;
    cargo_deb(work)?;
    let deb = work.join(format!("{RPM_NAME}_{version}-1_amd64.deb"));
    ensure!(deb.is_file(), "cargo deb did not write {}", deb.display());

    let mut manifest = String::from("# files: mode owner path\n");
    let mut files = BTreeSet::new();
    for line in stdout(&output(Command::new("dpkg-deb").arg("--contents").arg(&deb))?).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [mode, owner, _size, _date, _time, path] = fields[..] else {
            bail!("unexpected dpkg-deb --contents line {line:?}");
        };
        let path = path.trim_start_matches('.');
        if !mode.starts_with('d') {
            files.insert(path.to_string());
        }
        manifest.push_str(&format!("{mode} {owner} {path}\n"));
    }
    manifest.push_str("# control\n");
    for line in stdout(&output(Command::new("dpkg-deb").arg("--field").arg(&deb))?).lines() {
        if line.starts_with("Installed-Size:") {
            continue;
        }
        manifest.push_str(&normalize_depends(line));
        manifest.push('\n');
    }
    let control = work.join("control");
    output(Command::new("dpkg-deb").arg("--control").arg(&deb).arg(&control))?;
    for name in ["conffiles", "preinst", "postinst", "prerm", "postrm"] {
        let path = control.join(name);
        if path.exists() {
            manifest.push_str(&format!("# {name}\n{}", read(&path)?));
        }
    }
    expect_file(&root.join("packaging/expected/amd-hsmp-exporter.deb.txt"), &manifest)?;

    let accepted: Vec<&str> = LINTIAN_ACCEPTED.iter().map(|(tag, _)| *tag).collect();
    let lintian = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--suppress-tags", &accepted.join(",")])
        .arg(&deb)
        .output()
        .context("cannot run lintian")?;
    ensure!(
        lintian.status.success(),
        "lintian found errors or warnings:\n{}{}",
        stdout(&lintian),
        String::from_utf8_lossy(&lintian.stderr)
    );
    Ok((format!("contents as expected, lintian clean ({})", deb.display()), files))
}

/// `libc6 (>= 2.34)` and the like follow the build host's symbol files: keep the names only.
fn normalize_depends(line: &str) -> String {
    let Some(list) = line.strip_prefix("Depends: ") else { return line.to_string() };
    let deps: Vec<String> = list
        .split(", ")
        .map(|d| match d.split_once(' ') {
            Some((name, _)) if name.starts_with("libc6") || name.starts_with("libgcc-s") => {
                format!("{name} (host version)")
            }
            _ => d.to_string(),
        })
        .collect();
    format!("Depends: {}", deps.join(", "))
}

/// The Debian copyright file states the linked crates' licenses (its `usr/bin` paragraph's
/// License, in DEP-5 spelling) and carries a License paragraph for each license id.
fn deb_copyright_covers(copyright: &str, licenses: &BTreeSet<String>) -> Result<()> {
    let paragraph = copyright
        .split("\n\n")
        .find(|p| p.starts_with("Files: usr/bin/"))
        .context("packaging/deb/copyright has no Files: usr/bin/... paragraph")?;
    let expr = paragraph
        .lines()
        .find_map(|l| l.strip_prefix("License: "))
        .context("the usr/bin paragraph of packaging/deb/copyright has no License")?;
    let spdx = expr.replace(" with LLVM exception", " WITH LLVM-exception");
    same_licenses("packaging/deb/copyright (usr/bin)", &license_terms(&spdx)?, licenses)?;
    let stand_alone: BTreeSet<String> = copyright
        .split("\n\n")
        .filter_map(|p| p.strip_prefix("License: "))
        .filter_map(|p| p.lines().next())
        .map(|name| name.trim().replace("Apache-2.0 with LLVM exception", "LLVM-exception"))
        .collect();
    let missing: Vec<String> = license_ids(licenses).difference(&stand_alone).cloned().collect();
    ensure!(missing.is_empty(), "packaging/deb/copyright has no License paragraph for {missing:?}");
    Ok(())
}

/// Both packages install the same units, users, rules, configuration, binaries and guides.
pub(super) fn same_install_tree(
    root: &Path,
    rpm: &BTreeSet<String>,
    deb: &BTreeSet<String>,
) -> Result<String> {
    // Package-format files: RPM license directory, Debian copyright and changelog.
    let shared = |path: &&String| {
        !path.starts_with("/usr/share/licenses/")
            && !path.ends_with("/copyright")
            && !path.ends_with("/changelog.Debian.gz")
    };
    // firewalld's service definition: EL's firewall; Debian's default is none.
    let rpm: BTreeSet<String> = rpm
        .iter()
        .filter(shared)
        .filter(|p| !p.starts_with("/usr/lib/firewalld/"))
        .cloned()
        .collect();
    // zsh looks for vendor completions in site-functions on Fedora and EL, vendor-completions on
    // Debian; a service's variables are in /etc/sysconfig on EL, /etc/default on Debian.
    let deb: BTreeSet<String> = deb
        .iter()
        .filter(shared)
        .map(|p| p.replace("/usr/share/zsh/vendor-completions/", "/usr/share/zsh/site-functions/"))
        .map(|p| p.replace("/etc/default/", "/etc/sysconfig/"))
        .collect();
    ensure!(
        rpm == deb,
        "the packages install different files: only in the RPM {:?}, only in the .deb {:?}",
        rpm.difference(&deb).collect::<Vec<_>>(),
        deb.difference(&rpm).collect::<Vec<_>>()
    );
    for unit in UNITS {
        let text = read(&root.join("packaging/systemd").join(unit))?;
        for doc in text.lines().filter_map(|l| l.strip_prefix("Documentation=file://")) {
            ensure!(rpm.contains(doc), "{unit} documents {doc}, which neither package installs");
        }
    }
    Ok(format!("{} files in common", rpm.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_specific_library_versions_are_masked_in_depends() {
        assert_eq!(
            normalize_depends("Depends: libc6 (>= 2.34), systemd (>= 248)"),
            "Depends: libc6 (host version), systemd (>= 248)"
        );
        assert_eq!(normalize_depends("Section: admin"), "Section: admin");
    }
}
