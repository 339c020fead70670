//! The systemd units: `systemd-analyze verify`, exposure scores, the settings the privilege
//! split depends on.

use super::UNITS;
use super::helpers::{copy, read, set_mode};
use crate::workspace::{output, stdout};
use anyhow::{Context, Result, ensure};
use std::fs;
use std::path::Path;
use std::process::Command;

/// Highest accepted `systemd-analyze security` exposure for either service (the broker measured
/// with the MSR drop-in applied). The single-process predecessor scored 1.8, 2.1 with MSR.
const EXPOSURE_LIMIT: f64 = 1.5;

/// The MSR fallback drop-in for the broker, in `packaging/systemd/`.
const MSR_DROP_IN: &str = "msr-fallback.conf";

/// The perf energy drop-in for the broker, in `packaging/systemd/`: its exposure may be no
/// higher than the MSR drop-in's.
const PERF_DROP_IN: &str = "perf-energy.conf";

/// The exporter's opt-in drop-in that shows it Slurm's stepds (`ProtectProc=default` alone).
const STEPD_DROP_IN: &str = "slurm-stepd.conf";

/// Settings the privilege split depends on: (file in `packaging/systemd/`, section, key, value).
/// Each must be present literally; an empty value is the reset to "nothing".
const REQUIRED_SETTINGS: &[(&str, &str, &str, &str)] = &[
    ("amd-hsmp-broker.socket", "Socket", "ListenStream", "/run/amd-hsmp/broker.sock"),
    ("amd-hsmp-broker.socket", "Socket", "SocketMode", "0660"),
    ("amd-hsmp-broker.socket", "Socket", "SocketGroup", "amd-hsmp-exporter"),
    ("amd-hsmp-broker.service", "Service", "Type", "notify"),
    ("amd-hsmp-broker.service", "Service", "User", "amd-hsmp-broker"),
    ("amd-hsmp-broker.service", "Service", "EnvironmentFile", "-/etc/sysconfig/amd-hsmp-broker"),
    ("amd-hsmp-broker.service", "Service", "PrivateNetwork", "yes"),
    ("amd-hsmp-broker.service", "Service", "RestrictAddressFamilies", "AF_UNIX"),
    ("amd-hsmp-broker.service", "Service", "IPAddressDeny", "any"),
    ("amd-hsmp-broker.service", "Service", "DevicePolicy", "closed"),
    ("amd-hsmp-broker.service", "Service", "DeviceAllow", "/dev/hsmp r"),
    ("amd-hsmp-broker.service", "Service", "CapabilityBoundingSet", ""),
    ("amd-hsmp-broker.service", "Service", "AmbientCapabilities", ""),
    ("amd-hsmp-broker.service", "Service", "NoNewPrivileges", "yes"),
    ("amd-hsmp-exporter.service", "Unit", "Requires", "amd-hsmp-broker.socket"),
    ("amd-hsmp-exporter.service", "Unit", "After", "amd-hsmp-broker.socket"),
    ("amd-hsmp-exporter.service", "Service", "User", "amd-hsmp-exporter"),
    (
        "amd-hsmp-exporter.service",
        "Service",
        "EnvironmentFile",
        "-/etc/sysconfig/amd-hsmp-exporter",
    ),
    ("amd-hsmp-exporter.service", "Service", "PrivateDevices", "yes"),
    ("amd-hsmp-exporter.service", "Service", "CapabilityBoundingSet", ""),
    ("amd-hsmp-exporter.service", "Service", "AmbientCapabilities", ""),
    ("amd-hsmp-exporter.service", "Service", "NoNewPrivileges", "yes"),
    ("amd-hsmp-exporter.service", "Service", "RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    // The exporter sizes its HTTP connection caps from this limit.
    ("amd-hsmp-exporter.service", "Service", "LimitNOFILE", "1024"),
    (MSR_DROP_IN, "Service", "CapabilityBoundingSet", "CAP_SYS_RAWIO"),
    (MSR_DROP_IN, "Service", "AmbientCapabilities", "CAP_SYS_RAWIO"),
    (MSR_DROP_IN, "Service", "DeviceAllow", "char-cpu/msr r"),
    (
        MSR_DROP_IN,
        "Service",
        "Environment",
        "MSR_FALLBACK_FLAGS=--collector.core-energy.msr-fallback",
    ),
    (PERF_DROP_IN, "Service", "CapabilityBoundingSet", "CAP_PERFMON"),
    (PERF_DROP_IN, "Service", "AmbientCapabilities", "CAP_PERFMON"),
    (PERF_DROP_IN, "Service", "SystemCallFilter", "perf_event_open"),
    (STEPD_DROP_IN, "Service", "ProtectProc", "default"),
];

/// Everything the perf drop-in may set: `CAP_PERFMON` and `perf_event_open`, nothing else.
const PERF_DROP_IN_KEYS: &[&str] =
    &["CapabilityBoundingSet", "AmbientCapabilities", "SystemCallFilter"];

/// `systemd-analyze verify` and `security --offline=true` on the units in a scratch root, without
/// a drop-in, with the perf drop-in and with the MSR drop-in, plus the settings the privilege
/// split depends on.
pub(super) fn units(root: &Path, work: &Path) -> Result<String> {
    let src = root.join("packaging/systemd");
    let unit_dir = work.join("usr/lib/systemd/system");
    fs::create_dir_all(&unit_dir)?;
    copy_host_units(&unit_dir)?;
    for unit in UNITS {
        copy(&src.join(unit), &unit_dir.join(unit))?;
    }
    // verify checks that ExecStart= names an executable inside the root.
    for bin in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        let path = work.join("usr/bin").join(bin);
        fs::create_dir_all(work.join("usr/bin"))?;
        fs::write(&path, "#!/bin/sh\nexit 0\n")?;
        set_mode(&path, 0o755)?;
    }

    verify_units(work).context("units as shipped")?;
    let exporter = exposure(work, "amd-hsmp-exporter.service")?;
    let broker = exposure(work, "amd-hsmp-broker.service")?;

    let drop_in_dir = work.join("etc/systemd/system/amd-hsmp-broker.service.d");
    fs::create_dir_all(&drop_in_dir)?;
    copy(&src.join(PERF_DROP_IN), &drop_in_dir.join(PERF_DROP_IN))?;
    verify_units(work).context("units with the perf drop-in")?;
    let broker_perf = exposure(work, "amd-hsmp-broker.service")?;
    let exporter_perf = exposure(work, "amd-hsmp-exporter.service")?;
    fs::remove_file(drop_in_dir.join(PERF_DROP_IN))?;

    copy(&src.join(MSR_DROP_IN), &drop_in_dir.join(MSR_DROP_IN))?;
    verify_units(work).context("units with the MSR drop-in")?;
    let broker_msr = exposure(work, "amd-hsmp-broker.service")?;
    let exporter_msr = exposure(work, "amd-hsmp-exporter.service")?;

    fs::remove_file(drop_in_dir.join(MSR_DROP_IN))?;

    let exporter_drop_ins = work.join("etc/systemd/system/amd-hsmp-exporter.service.d");
    fs::create_dir_all(&exporter_drop_ins)?;
    copy(&src.join(STEPD_DROP_IN), &exporter_drop_ins.join(STEPD_DROP_IN))?;
    verify_units(work).context("units with the slurm-stepd drop-in")?;
    let exporter_stepd = exposure(work, "amd-hsmp-exporter.service")?;
    fs::remove_file(exporter_drop_ins.join(STEPD_DROP_IN))?;

    for (name, with) in
        [("exporter", exporter), ("exporter with the slurm-stepd drop-in", exporter_stepd)]
    {
        ensure!(
            with <= EXPOSURE_LIMIT,
            "amd-hsmp-{name} exposure {with} is above {EXPOSURE_LIMIT}"
        );
    }
    ensure!(
        broker_msr <= EXPOSURE_LIMIT,
        "amd-hsmp-broker.service exposure with the MSR drop-in {broker_msr} is above \
         {EXPOSURE_LIMIT}"
    );
    ensure!(
        broker_perf <= broker_msr,
        "amd-hsmp-broker.service exposure with the perf drop-in {broker_perf} is above the MSR \
         drop-in's {broker_msr}"
    );
    for (name, with) in [("MSR", exporter_msr), ("perf", exporter_perf)] {
        ensure!(
            with == exporter,
            "the {name} drop-in changed the exporter's exposure ({exporter} -> {with}); it must \
             only touch the broker"
        );
    }
    unit_settings(&src)?;
    Ok(format!(
        "verify clean; exposure: exporter {exporter} ({exporter_stepd} with the slurm-stepd \
         drop-in), broker {broker}, broker with MSR drop-in {broker_msr}, with perf drop-in \
         {broker_perf} (limit {EXPOSURE_LIMIT})"
    ))
}

/// Copies the host's unit files (not symlinks) so that verify can resolve sockets.target,
/// modprobe@.service and the other units ours name.
fn copy_host_units(dest: &Path) -> Result<()> {
    let host = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .context("no systemd unit directory on this machine (install systemd)")?;
    for entry in fs::read_dir(host)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            copy(&entry.path(), &dest.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// `systemd-analyze verify` must succeed and print nothing: it reports unknown keys and bad
/// values as warnings with exit status 0.
fn verify_units(sysroot: &Path) -> Result<()> {
    let out = output(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", sysroot.display()))
            .args(UNITS),
    )?;
    let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    ensure!(said.trim().is_empty(), "systemd-analyze verify reported:\n{}", said.trim());
    Ok(())
}

/// The "Overall exposure level" of `unit` from `systemd-analyze security --offline=true`.
fn exposure(sysroot: &Path, unit: &str) -> Result<f64> {
    let out = output(
        Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(format!("--root={}", sysroot.display()))
            .arg(unit),
    )?;
    parse_exposure(&stdout(&out), unit)
}

pub(crate) fn parse_exposure(report: &str, unit: &str) -> Result<f64> {
    let marker = format!("Overall exposure level for {unit}:");
    let line = report
        .lines()
        .find(|l| l.contains(&marker))
        .with_context(|| format!("no \"{marker}\" line in:\n{report}"))?;
    let rest = line.split_once(&marker).map(|(_, r)| r.trim()).unwrap_or_default();
    let number = rest.split_whitespace().next().unwrap_or_default();
    number.parse().with_context(|| format!("cannot read the exposure level in {line:?}"))
}

/// (section, key, value) of every assignment in a unit file.
pub(crate) fn parse_unit(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut settings = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            settings.push((section.clone(), key.trim().to_string(), value.trim().to_string()));
        }
    }
    settings
}

fn unit_settings(src: &Path) -> Result<()> {
    let mut missing = Vec::new();
    for (file, section, key, value) in REQUIRED_SETTINGS {
        let settings = parse_unit(&read(&src.join(file))?);
        if !settings.iter().any(|(s, k, v)| s == section && k == key && v == value) {
            missing.push(format!("{file}: [{section}] {key}={value}"));
        }
    }
    ensure!(missing.is_empty(), "required unit settings missing:\n{}", missing.join("\n"));
    for (file, flags) in [
        ("amd-hsmp-broker.service", &["$OPTIONS", "$MSR_FALLBACK_FLAGS"][..]),
        ("amd-hsmp-exporter.service", &["$OPTIONS"][..]),
    ] {
        let settings = parse_unit(&read(&src.join(file))?);
        let exec = settings
            .iter()
            .find(|(s, k, _)| s == "Service" && k == "ExecStart")
            .map(|(_, _, v)| v.as_str())
            .with_context(|| format!("{file} has no ExecStart="))?;
        for flag in flags {
            ensure!(exec.split_whitespace().any(|w| w == *flag), "{file}: ExecStart lacks {flag}");
        }
        ensure!(
            settings.iter().any(|(s, k, _)| s == "Service" && k == "SystemCallFilter"),
            "{file} has no SystemCallFilter="
        );
    }
    let perf = parse_unit(&read(&src.join(PERF_DROP_IN))?);
    let extra: Vec<String> = perf
        .iter()
        .filter(|(s, k, _)| s != "Service" || !PERF_DROP_IN_KEYS.contains(&k.as_str()))
        .map(|(s, k, v)| format!("[{s}] {k}={v}"))
        .collect();
    ensure!(
        extra.is_empty() && perf.len() == PERF_DROP_IN_KEYS.len(),
        "{PERF_DROP_IN} may set only {PERF_DROP_IN_KEYS:?}, once each; it sets {perf:?}"
    );
    let stepd = parse_unit(&read(&src.join(STEPD_DROP_IN))?);
    ensure!(
        stepd == [("Service".to_owned(), "ProtectProc".to_owned(), "default".to_owned())],
        "{STEPD_DROP_IN} may set only ProtectProc=default; it sets {stepd:?}"
    );
    let exporter = parse_unit(&read(&src.join("amd-hsmp-exporter.service"))?);
    ensure!(
        !exporter.iter().any(|(_, k, _)| k == "DeviceAllow" || k == "SupplementaryGroups"),
        "amd-hsmp-exporter.service must not allow devices or add groups"
    );
    Ok(())
}

/// The Debian package's variant of a unit in `packaging/systemd/`: the same, with its
/// `EnvironmentFile=` in `/etc/default` (Debian's place for a service's variables) instead of
/// `/etc/sysconfig`. Kept in `packaging/deb/systemd/` for cargo-deb.
pub(super) fn deb_unit(name: &str, text: &str) -> String {
    format!(
        "# packaging/systemd/{name} with EnvironmentFile= in /etc/default, for the .deb; \
         generated by\n# UPDATE_GOLDEN=1 cargo test -p xtask deb_units\n{}",
        text.replace("EnvironmentFile=-/etc/sysconfig/", "EnvironmentFile=-/etc/default/")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb_units_are_the_units_reading_etc_default() {
        let root = crate::workspace::root();
        for unit in UNITS {
            let text = read(&root.join("packaging/systemd").join(unit)).unwrap();
            let deb = deb_unit(unit, &text);
            if text.contains("EnvironmentFile=") {
                assert!(deb.contains("EnvironmentFile=-/etc/default/"), "{unit}");
                assert!(!deb.contains("/etc/sysconfig"), "{unit}");
            }
            let path = root.join("packaging/deb/systemd").join(unit);
            crate::golden::expect_file(&path, &deb).unwrap();
        }
    }

    #[test]
    fn exposure_is_read_from_the_overall_line() {
        let report = "  NAME  DESCRIPTION  EXPOSURE\n✗ PrivateUsers=  ...  0.2\n\n\
                      → Overall exposure level for amd-hsmp-broker.service: 0.9 SAFE 😀\n";
        assert_eq!(parse_exposure(report, "amd-hsmp-broker.service").unwrap(), 0.9);
        assert!(parse_exposure(report, "amd-hsmp-exporter.service").is_err());
    }

    #[test]
    fn unit_settings_keep_their_section_and_empty_values() {
        let unit = "# comment\n[Unit]\nRequires=a.socket\n\n[Service]\nCapabilityBoundingSet=\n\
                    DeviceAllow=/dev/hsmp r\n";
        let settings = parse_unit(unit);
        assert!(settings.contains(&("Service".into(), "CapabilityBoundingSet".into(), "".into())));
        assert!(settings.contains(&("Service".into(), "DeviceAllow".into(), "/dev/hsmp r".into())));
        assert!(settings.contains(&("Unit".into(), "Requires".into(), "a.socket".into())));
    }
}
