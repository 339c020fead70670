//! Static checks of `packaging/` and `selinux/`: the systemd units (verify, exposure scores,
//! settings), the SELinux module (compiles, policy analysis of a full policy that includes it),
//! the RPM spec (parses, SRPM and binary RPMs built with EL9 stand-in macros, contents compared
//! with expected files) and the Debian package (contents, maintainer scripts, lintian).
//!
//! Every check fails with what was wrong; nothing is skipped. Expected package contents live in
//! `packaging/expected/` and are rewritten with `UPDATE_GOLDEN=1 cargo xtask packaging`, to be
//! reviewed as a diff.

use anyhow::{Context, Result, bail, ensure};
use spdx::expression::{ExprNode, Operator};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// Highest accepted `systemd-analyze security` exposure for either service (the broker measured
/// with the MSR drop-in applied). The single-process predecessor scored 1.8, 2.1 with MSR.
const EXPOSURE_LIMIT: f64 = 1.5;

/// The unit files, as shipped in `packaging/systemd/` and installed in the unit directory.
const UNITS: [&str; 3] =
    ["amd-hsmp-broker.socket", "amd-hsmp-broker.service", "amd-hsmp-exporter.service"];

/// The MSR fallback drop-in for the broker, in `packaging/systemd/`.
const MSR_DROP_IN: &str = "msr-fallback.conf";

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
];

/// The MSR lines shipped commented out; the README's MSR section uncomments exactly these.
const MSR_MODULE_LINE: &str = "#msr";
const MSR_UDEV_LINE: &str = "#SUBSYSTEM==\"msr\", KERNEL==\"msr[0-9]*\", OWNER=\"root\", GROUP=\"amd-hsmp-broker\", MODE=\"0640\"";

/// The reference policy's module build.
const SELINUX_DEVEL_MAKEFILE: &str = "/usr/share/selinux/devel/Makefile";
/// The modules of Debian's reference policy (selinux-policy-default).
const SELINUX_POLICY_MODULES: &str = "/usr/share/selinux/default";
/// Converts a binary policy module to CIL (policycoreutils).
const SELINUX_PP_TO_CIL: &str = "/usr/libexec/selinux/hll/pp";
const SELINUX_MODULE: &str = "amd_hsmp";

/// RPM name and the spec, macro stand-ins and expected contents.
const RPM_NAME: &str = "amd-hsmp-exporter";
const SPEC: &str = "packaging/rpm/amd-hsmp-exporter.spec";
const RPM_SHIM: &str = "packaging/rpm/macros.check";
/// Shared libraries the binaries may link (automatic RPM requires); anything else is a surprise
/// dependency on the EL9 host.
const ALLOWED_SONAMES: &[&str] =
    &["libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "rtld(GNU_HASH)"];

/// Lintian tags accepted, each with its reason.
const LINTIAN_ACCEPTED: &[(&str, &str)] = &[
    ("initial-upload-closes-no-bugs", "the package is not uploaded to the Debian archive"),
    (
        "embedded-library",
        "libyaml's strings are unsafe-libyaml's, the Rust translation of libyaml that the YAML \
         parser of --web.config.file links statically, as every Rust dependency is",
    ),
];

/// Runs every packaging check, printing what each measured.
pub fn check(root: &Path) -> Result<()> {
    require_tools()?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let work = target.join("packaging-check");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("cannot empty {}", work.display()))?;
    }
    let started = Instant::now();
    step("systemd units", || units(root, &work.join("units")))?;
    step("install-tree files", || install_tree(root))?;
    step("SELinux module", || selinux(root, &work.join("selinux")))?;
    step("release binaries", || crate::build_release_daemons().map(|()| "built".to_string()))?;
    let licenses = dependency_licenses(root)?;
    let rpm_files =
        step_value("RPM", || rpm(root, &work.join("rpm"), &target.join("release"), &licenses))?;
    let deb_files = step_value("Debian package", || deb(root, &work.join("deb"), &licenses))?;
    step("RPM and Debian package agree", || same_install_tree(root, &rpm_files, &deb_files))?;
    println!("packaging: all checks passed in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs one named check and prints its summary and duration.
fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    step_value(name, || f().map(|summary| (summary, ())))
}

/// Like [`step`], for a check that also returns a value for a later one.
fn step_value<T>(name: &str, f: impl FnOnce() -> Result<(String, T)>) -> Result<T> {
    let started = Instant::now();
    let (summary, value) = f().with_context(|| format!("packaging check failed: {name}"))?;
    println!("packaging: {name}: {summary} ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(value)
}

/// Fails up front, listing everything missing, rather than at the first command that is absent.
fn require_tools() -> Result<()> {
    let packages = crate::deps::missing_packages();
    let mut tools = crate::deps::missing_cargo_tools();
    if crate::deps::rpmlint_missing() {
        tools.push(format!("rpmlint {} (PyPI)", crate::deps::RPMLINT_VERSION));
    }
    if !packages.is_empty() || !tools.is_empty() {
        bail!(
            "missing for the packaging checks: Debian packages [{}], tools [{}]; run `cargo \
             xtask deps` (as root for the Debian packages)",
            packages.join(" "),
            tools.join(", ")
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// systemd units

/// `systemd-analyze verify` and `security --offline=true` on the units in a scratch root, with
/// and without the MSR drop-in, plus the settings the privilege split depends on.
fn units(root: &Path, work: &Path) -> Result<String> {
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
    copy(&src.join(MSR_DROP_IN), &drop_in_dir.join(MSR_DROP_IN))?;
    verify_units(work).context("units with the MSR drop-in")?;
    let broker_msr = exposure(work, "amd-hsmp-broker.service")?;
    let exporter_msr = exposure(work, "amd-hsmp-exporter.service")?;

    ensure!(
        exporter <= EXPOSURE_LIMIT,
        "amd-hsmp-exporter.service exposure {exporter} is above {EXPOSURE_LIMIT}"
    );
    ensure!(
        broker_msr <= EXPOSURE_LIMIT,
        "amd-hsmp-broker.service exposure with the MSR drop-in {broker_msr} is above \
         {EXPOSURE_LIMIT}"
    );
    ensure!(
        exporter_msr == exporter,
        "the MSR drop-in changed the exporter's exposure ({exporter} -> {exporter_msr}); it must \
         only touch the broker"
    );
    unit_settings(&src)?;
    Ok(format!(
        "verify clean; exposure: exporter {exporter}, broker {broker}, broker with MSR drop-in \
         {broker_msr} (limit {EXPOSURE_LIMIT})"
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
    let exporter = parse_unit(&read(&src.join("amd-hsmp-exporter.service"))?);
    ensure!(
        !exporter.iter().any(|(_, k, _)| k == "DeviceAllow" || k == "SupplementaryGroups"),
        "amd-hsmp-exporter.service must not allow devices or add groups"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Users, udev rule, modules, sysconfig

/// The files around the units agree with them: the users exist, the udev rule hands /dev/hsmp
/// to the broker's group, the MSR lines are present but commented out.
fn install_tree(root: &Path) -> Result<String> {
    let p = root.join("packaging");
    let sysusers = read(&p.join("sysusers.d/amd-hsmp-exporter.conf"))?;
    for user in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        ensure!(
            sysusers.lines().any(|l| l.split_whitespace().take(2).eq(["u", user])),
            "sysusers.d/amd-hsmp-exporter.conf does not create user {user}"
        );
    }
    let udev = read(&p.join("udev/60-amd-hsmp.rules"))?;
    ensure!(
        udev.lines().any(|l| !l.starts_with('#')
            && l.contains("KERNEL==\"hsmp_cdev\"")
            && l.contains("GROUP=\"amd-hsmp-broker\"")
            && l.contains("MODE=\"0640\"")),
        "60-amd-hsmp.rules does not give /dev/hsmp (hsmp_cdev) to group amd-hsmp-broker, 0640"
    );
    ensure!(
        udev.lines().any(|l| l == MSR_UDEV_LINE),
        "60-amd-hsmp.rules lacks the commented MSR line {MSR_UDEV_LINE}"
    );
    let modules = read(&p.join("modules-load.d/amd-hsmp.conf"))?;
    ensure!(modules.lines().any(|l| l == "amd_hsmp"), "modules-load.d does not load amd_hsmp");
    ensure!(
        modules.lines().any(|l| l == MSR_MODULE_LINE),
        "modules-load.d lacks the commented line {MSR_MODULE_LINE}"
    );
    for name in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        let sysconfig = read(&p.join("sysconfig").join(name))?;
        ensure!(
            sysconfig.lines().any(|l| l.starts_with("OPTIONS=")),
            "sysconfig/{name} does not set OPTIONS"
        );
    }
    Ok("users, udev rule, modules-load and sysconfig consistent with the units".into())
}

// ---------------------------------------------------------------------------------------------
// SELinux

/// The module's rules explain themselves, it compiles against the reference policy headers, and
/// the policy analysis of a full policy including it shows the confinement the design promises.
fn selinux(root: &Path, work: &Path) -> Result<String> {
    let src = root.join("selinux");
    let te = read(&src.join(format!("{SELINUX_MODULE}.te")))?;
    te_rules_are_commented(&te)?;

    let module = build_selinux_module(&src, &work.join("module"))?;
    let policy = full_policy(work, &module)?;
    policy_analysis(&policy)?;
    Ok("compiles against selinux-policy-dev; policy analysis holds".into())
}

/// Compiles `src/amd_hsmp.{te,fc,if}` in `build` against the reference policy headers
/// (`selinux-policy-dev`) and returns the `.pp`; a warning or error from the build is an error.
pub(crate) fn build_selinux_module(src: &Path, build: &Path) -> Result<PathBuf> {
    fs::create_dir_all(build)?;
    for ext in ["te", "fc", "if"] {
        let name = format!("{SELINUX_MODULE}.{ext}");
        copy(&src.join(&name), &build.join(&name))?;
    }
    let out = output(
        Command::new("make")
            .args(["-f", SELINUX_DEVEL_MAKEFILE, &format!("{SELINUX_MODULE}.pp")])
            .current_dir(build),
    )?;
    let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    let complaints: Vec<&str> = said
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("warning") || l.contains("error")
        })
        .collect();
    ensure!(complaints.is_empty(), "the module build complained:\n{}", complaints.join("\n"));
    Ok(build.join(format!("{SELINUX_MODULE}.pp")))
}

/// Every paragraph of the .te file that grants something (an `allow`, an `allowxperm` or an
/// interface call) begins with a comment naming what needs it; nothing is permissive.
fn te_rules_are_commented(te: &str) -> Result<()> {
    let mut uncommented = Vec::new();
    for paragraph in te.split("\n\n") {
        let lines: Vec<&str> = paragraph.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let Some(first) = lines.first() else { continue };
        let grants = lines.iter().any(|l| is_grant(l));
        if grants && !first.starts_with('#') {
            uncommented.push(lines.join("\n"));
        }
    }
    ensure!(
        uncommented.is_empty(),
        "rules without a comment naming the code path that needs them:\n{}",
        uncommented.join("\n---\n")
    );
    ensure!(
        !te.lines().any(|l| l.trim_start().starts_with("permissive")),
        "the module declares a permissive domain"
    );
    Ok(())
}

/// Whether a .te line grants access: `allow`, `allowxperm`, or an interface or pattern call other
/// than the declarations (types, policy_module, gen_tunable, require blocks, conditionals).
fn is_grant(line: &str) -> bool {
    const NOT_GRANTS: [&str; 7] = [
        "policy_module(",
        "gen_tunable(",
        "gen_require(",
        "tunable_policy(",
        "ifdef(",
        "optional_policy(",
        "type ",
    ];
    if line.starts_with('#') || line.starts_with('\'') || line.starts_with(',') {
        return false;
    }
    if line.starts_with("allow ") || line.starts_with("allowxperm ") {
        return true;
    }
    let is_call = line.split('(').next().is_some_and(|name| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    }) && line.contains('(');
    is_call && !NOT_GRANTS.iter().any(|d| line.starts_with(d))
}

/// Debian's reference policy modules plus ours, converted to CIL and compiled into one binary
/// policy (tunables kept as booleans so that both states can be queried).
fn full_policy(work: &Path, module: &Path) -> Result<PathBuf> {
    let cil_dir = work.join("cil");
    fs::create_dir_all(&cil_dir)?;
    let mut modules = Vec::new();
    for entry in fs::read_dir(SELINUX_POLICY_MODULES)
        .with_context(|| format!("cannot list {SELINUX_POLICY_MODULES}"))?
    {
        let path = entry?.path();
        if path.to_string_lossy().ends_with(".pp.bz2") {
            modules.push(path);
        }
    }
    ensure!(
        modules.len() > 100,
        "only {} policy modules in {SELINUX_POLICY_MODULES}",
        modules.len()
    );
    // Converting some 330 modules one process at a time dominates this check: use every core.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = modules.len().div_ceil(workers);
    let mut cils = std::thread::scope(|scope| {
        let handles: Vec<_> = modules
            .chunks(chunk)
            .map(|part| {
                scope.spawn(|| part.iter().map(|m| bz2_module_to_cil(m, &cil_dir)).collect())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a conversion thread panicked")))
            })
            .collect::<Result<Vec<Vec<PathBuf>>>>()
    })?
    .concat();
    let ours = cil_dir.join(format!("{SELINUX_MODULE}.pp"));
    copy(module, &ours)?;
    cils.push(pp_to_cil(&ours)?);
    let policy = work.join("policy.bin");
    output(
        Command::new("secilc")
            .arg("--preserve-tunables")
            .arg("-o")
            .arg(&policy)
            .args(["-f", "/dev/null"])
            .args(&cils),
    )
    .context("the reference policy with the module does not compile")?;
    Ok(policy)
}

/// Decompresses one shipped module (`NAME.pp.bz2`) into `dir` and converts it to CIL.
fn bz2_module_to_cil(module: &Path, dir: &Path) -> Result<PathBuf> {
    let name = module.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let pp = dir.join(name.trim_end_matches(".bz2"));
    let raw = output(Command::new("bzip2").arg("-dc").arg(module))?;
    fs::write(&pp, &raw.stdout).with_context(|| format!("cannot write {}", pp.display()))?;
    pp_to_cil(&pp)
}

fn pp_to_cil(pp: &Path) -> Result<PathBuf> {
    let cil = pp.with_extension("cil");
    output(Command::new(SELINUX_PP_TO_CIL).arg(pp).arg(&cil))?;
    Ok(cil)
}

/// One policy query: what it shows, the `sesearch` arguments, and the expected answer.
struct Query {
    claim: &'static str,
    args: &'static [&'static str],
    expect: Expect,
}

enum Expect {
    /// No rule at all.
    Nothing,
    /// At least one rule, and every rule contains this text.
    AllContain(&'static str),
}

const QUERIES: &[Query] = &[
    Query {
        claim: "amd_hsmp_exporter_t has no access to the HSMP device",
        args: &["-A", "-s", "amd_hsmp_exporter_t", "-t", "amd_hsmp_device_t"],
        expect: Expect::Nothing,
    },
    Query {
        claim: "amd_hsmp_exporter_t has no access to the MSR devices (cpu_device_t)",
        args: &["-A", "-s", "amd_hsmp_exporter_t", "-t", "cpu_device_t"],
        expect: Expect::Nothing,
    },
    Query {
        claim: "amd_hsmp_exporter_t holds no capability",
        args: &["-A", "-s", "amd_hsmp_exporter_t", "-c", "capability,capability2,cap_userns"],
        expect: Expect::Nothing,
    },
    Query {
        claim: "amd_hsmp_broker_t cannot create, bind or connect any TCP/UDP/SCTP/raw IP socket",
        args: &[
            "-A",
            "-s",
            "amd_hsmp_broker_t",
            "-c",
            "tcp_socket,udp_socket,sctp_socket,rawip_socket",
            "-p",
            "create,bind,connect,listen,accept,name_bind,name_connect,node_bind",
        ],
        expect: Expect::Nothing,
    },
    Query {
        claim: "amd_hsmp_broker_t holds CAP_SYS_RAWIO only with amd_hsmp_broker_use_msr",
        args: &["-A", "-s", "amd_hsmp_broker_t", "-c", "capability,capability2,cap_userns"],
        expect: Expect::AllContain("sys_rawio; [ amd_hsmp_broker_use_msr ]:True"),
    },
    Query {
        claim: "amd_hsmp_broker_t opens the MSR devices only with amd_hsmp_broker_use_msr",
        args: &["-A", "-s", "amd_hsmp_broker_t", "-t", "cpu_device_t", "-c", "chr_file"],
        expect: Expect::AllContain("[ amd_hsmp_broker_use_msr ]:True"),
    },
    Query {
        claim: "amd_hsmp_broker_t reads and ioctls the HSMP device",
        args: &[
            "-A",
            "-s",
            "amd_hsmp_broker_t",
            "-t",
            "amd_hsmp_device_t",
            "-c",
            "chr_file",
            "-p",
            "open,read",
        ],
        expect: Expect::AllContain("{ getattr ioctl open read }"),
    },
    Query {
        claim: "the HSMP device's ioctl is limited to HSMP_IOCTL_CMD",
        args: &["--allowxperm", "-s", "amd_hsmp_broker_t", "-t", "amd_hsmp_device_t"],
        expect: Expect::AllContain("ioctl 0xf800;"),
    },
    Query {
        claim: "amd_hsmp_exporter_t binds its port",
        args: &[
            "-A",
            "-s",
            "amd_hsmp_exporter_t",
            "-t",
            "amd_hsmp_exporter_port_t",
            "-c",
            "tcp_socket",
        ],
        expect: Expect::AllContain("name_bind"),
    },
    Query {
        claim: "amd_hsmp_exporter_t connects to the broker's socket",
        args: &[
            "-A",
            "-s",
            "amd_hsmp_exporter_t",
            "-t",
            "amd_hsmp_broker_t",
            "-c",
            "unix_stream_socket",
        ],
        expect: Expect::AllContain("connectto"),
    },
    Query {
        claim: "systemd starts the broker in amd_hsmp_broker_t",
        args: &["-T", "-s", "init_t", "-t", "amd_hsmp_broker_exec_t", "-c", "process"],
        expect: Expect::AllContain("amd_hsmp_broker_t;"),
    },
    Query {
        claim: "the broker's transition works under no_new_privs",
        args: &["-A", "-s", "init_t", "-t", "amd_hsmp_broker_t", "-c", "process2"],
        expect: Expect::AllContain("nnp_transition"),
    },
    Query {
        claim: "the exporter's transition works under no_new_privs",
        args: &["-A", "-s", "init_t", "-t", "amd_hsmp_exporter_t", "-c", "process2"],
        expect: Expect::AllContain("nnp_transition"),
    },
    Query {
        claim: "systemd starts the exporter in amd_hsmp_exporter_t",
        args: &["-T", "-s", "init_t", "-t", "amd_hsmp_exporter_exec_t", "-c", "process"],
        expect: Expect::AllContain("amd_hsmp_exporter_t;"),
    },
];

fn policy_analysis(policy: &Path) -> Result<()> {
    let mut failures = Vec::new();
    for q in QUERIES {
        let out = output(Command::new("sesearch").args(q.args).arg(policy))?;
        let rules: Vec<String> = stdout(&out)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        let holds = match q.expect {
            Expect::Nothing => rules.is_empty(),
            Expect::AllContain(text) => !rules.is_empty() && rules.iter().all(|r| r.contains(text)),
        };
        if !holds {
            failures.push(format!(
                "{}: sesearch {} gave:\n  {}",
                q.claim,
                q.args.join(" "),
                if rules.is_empty() { "(no rule)".into() } else { rules.join("\n  ") }
            ));
        }
    }
    let booleans = stdout(&output(
        Command::new("seinfo").args(["-b", "amd_hsmp_broker_use_msr", "-x"]).arg(policy),
    )?);
    if !booleans.contains("bool amd_hsmp_broker_use_msr false;") {
        failures
            .push(format!("amd_hsmp_broker_use_msr is not a boolean, off by default:\n{booleans}"));
    }
    let permissive =
        stdout(&output(Command::new("seinfo").args(["--permissive", "-x"]).arg(policy))?);
    if permissive.contains("amd_hsmp") {
        failures.push(format!("a domain of the module is permissive:\n{permissive}"));
    }
    ensure!(failures.is_empty(), "policy analysis failed:\n{}", failures.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Licenses

/// The license expressions of every crate linked into the two binaries (normal dependencies on
/// x86_64 Linux, proc-macro subtrees excluded, as `%cargo_license` counts them), our own included.
fn dependency_licenses(root: &Path) -> Result<BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = output(
        Command::new(cargo)
            .args(["tree", "--locked", "--quiet", "--edges", "normal,no-proc-macro"])
            .args(["--target", "x86_64-unknown-linux-gnu", "--prefix", "none", "--format", "{l}"])
            .args(["--package", "amd-hsmp-broker", "--package", "amd-hsmp-exporter"])
            .current_dir(root),
    )?;
    let mut terms = BTreeSet::new();
    for line in stdout(&out).lines() {
        let expr = line.trim().trim_end_matches("(*)").trim();
        if expr.is_empty() {
            continue;
        }
        terms.extend(license_terms(expr)?);
    }
    ensure!(!terms.is_empty(), "cargo tree listed no license");
    Ok(terms)
}

/// Splits an SPDX expression (as cargo reports it: `/` for OR allowed) into its top-level AND
/// terms, each written one way: the alternatives of an OR sorted and in parentheses, a `WITH`
/// exception after its licence, operators upper-case. An expression that is not SPDX is an error.
fn license_terms(expr: &str) -> Result<BTreeSet<String>> {
    let parsed = spdx::Expression::parse_mode(expr, spdx::ParseMode::LAX)
        .with_context(|| format!("not an SPDX license expression: {expr}"))?;
    // Each subexpression as the AND of its terms, each term the set of its OR alternatives.
    let mut stack: Vec<Vec<BTreeSet<String>>> = Vec::new();
    for node in parsed.iter() {
        let value = match node {
            ExprNode::Req(req) => vec![BTreeSet::from([req.req.to_string()])],
            ExprNode::Op(op) => {
                let (Some(rhs), Some(mut lhs)) = (stack.pop(), stack.pop()) else {
                    bail!("{expr}: an operator without two operands");
                };
                match op {
                    Operator::And => {
                        lhs.extend(rhs);
                        lhs
                    }
                    Operator::Or => {
                        vec![alternatives(lhs).into_iter().chain(alternatives(rhs)).collect()]
                    }
                }
            }
        };
        stack.push(value);
    }
    let terms = stack.pop().filter(|_| stack.is_empty());
    let terms = terms.with_context(|| format!("{expr}: not one expression"))?;
    Ok(terms.into_iter().map(|alternatives| written(&alternatives, " OR ")).collect())
}

/// The alternatives of one side of an OR: its own alternatives, or the whole side when it is an
/// AND (written in parentheses).
fn alternatives(side: Vec<BTreeSet<String>>) -> BTreeSet<String> {
    match <[_; 1]>::try_from(side) {
        Ok([one]) => one,
        Err(terms) => {
            let terms: BTreeSet<String> = terms.iter().map(|t| written(t, " OR ")).collect();
            BTreeSet::from([written(&terms, " AND ")])
        }
    }
}

/// Items joined by an operator, in parentheses when there is more than one.
fn written(items: &BTreeSet<String>, op: &str) -> String {
    let joined = items.iter().map(String::as_str).collect::<Vec<_>>().join(op);
    if items.len() > 1 { format!("({joined})") } else { joined }
}

/// The license ids of a set of terms (`LLVM-exception` and the like included).
fn license_ids(terms: &BTreeSet<String>) -> BTreeSet<String> {
    terms
        .iter()
        .flat_map(|t| t.split(|c: char| c.is_whitespace() || c == '(' || c == ')'))
        .filter(|w| !w.is_empty() && !["AND", "OR", "WITH"].contains(w))
        .map(String::from)
        .collect()
}

fn same_licenses(what: &str, declared: &BTreeSet<String>, linked: &BTreeSet<String>) -> Result<()> {
    let missing: Vec<&String> = linked.difference(declared).collect();
    let extra: Vec<&String> = declared.difference(linked).collect();
    ensure!(
        missing.is_empty() && extra.is_empty(),
        "{what} does not match the licenses of the linked crates (cargo tree): missing {missing:?}, \
         not used {extra:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// RPM

/// Parses the spec and builds the SRPM and the binary RPMs with the EL9 stand-in macros and the
/// release binaries, then compares their contents with `packaging/expected/`. Returns the main
/// RPM's file list.
fn rpm(
    root: &Path,
    work: &Path,
    release: &Path,
    licenses: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>)> {
    let version = workspace_version(root)?;
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
    for bin in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        ensure!(release.join(bin).is_file(), "no release binary {}", release.join(bin).display());
    }

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

fn workspace_version(root: &Path) -> Result<String> {
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

// ---------------------------------------------------------------------------------------------
// Debian package

/// Builds the .deb with cargo-deb from the release binaries, compares its contents, control
/// fields and maintainer scripts with `packaging/expected/`, and runs lintian. Returns its file
/// list.
fn deb(
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
fn same_install_tree(
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
    let rpm: BTreeSet<String> = rpm.iter().filter(shared).cloned().collect();
    // zsh looks for vendor completions in site-functions on Fedora and EL, vendor-completions on
    // Debian.
    let deb: BTreeSet<String> = deb
        .iter()
        .filter(shared)
        .map(|p| p.replace("/usr/share/zsh/vendor-completions/", "/usr/share/zsh/site-functions/"))
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

// ---------------------------------------------------------------------------------------------
// Helpers

/// Compares `actual` with the expected file, or rewrites it when `UPDATE_GOLDEN=1`.
pub(crate) fn expect_file(path: &Path, actual: &str) -> Result<()> {
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, actual).with_context(|| format!("cannot write {}", path.display()))?;
        println!("packaging: rewrote {}", path.display());
        return Ok(());
    }
    let expected = fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {}; create it by running the check with UPDATE_GOLDEN=1",
            path.display()
        )
    })?;
    if expected == actual {
        return Ok(());
    }
    let expected_lines: BTreeSet<&str> = expected.lines().collect();
    let actual_lines: BTreeSet<&str> = actual.lines().collect();
    let mut diff = String::new();
    for line in expected.lines().filter(|l| !actual_lines.contains(l)) {
        diff.push_str(&format!("- {line}\n"));
    }
    for line in actual.lines().filter(|l| !expected_lines.contains(l)) {
        diff.push_str(&format!("+ {line}\n"));
    }
    if diff.is_empty() {
        diff.push_str("(same lines, different order or repetition)\n");
    }
    bail!(
        "{} differs from what was built (- expected, + built):\n{diff}accept by running the check \
         again with UPDATE_GOLDEN=1 (cargo xtask packaging, cargo test -p xtask) and review the \
         diff",
        path.display()
    )
}

/// Runs a command to completion, capturing its output; a failure to start or a non-zero exit is
/// an error that shows what the command said.
fn output(cmd: &mut Command) -> Result<Output> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            tail(&stdout(&out), 20),
            tail(&String::from_utf8_lossy(&out.stderr), 20)
        );
    }
    Ok(out)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut s = lines[lines.len().saturating_sub(n)..].join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// Builds the project's `.deb` from the release binaries already built, into `out`.
pub(crate) fn cargo_deb(out: &Path) -> Result<()> {
    let out = out.to_str().context("the .deb output path is not UTF-8")?;
    crate::cargo(&[
        "deb",
        "--package",
        "amd-hsmp-exporter",
        "--no-build",
        "--locked",
        "--fast",
        "--output",
        out,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn license_expressions_that_mean_the_same_compare_equal() {
        assert_eq!(
            license_terms("MIT/Apache-2.0").unwrap(),
            license_terms("Apache-2.0 OR MIT").unwrap()
        );
        assert_eq!(license_terms("MIT/Apache-2.0").unwrap(), set(&["(Apache-2.0 OR MIT)"]));
        assert_eq!(
            license_terms("(MIT OR Apache-2.0) AND Unicode-3.0").unwrap(),
            set(&["(Apache-2.0 OR MIT)", "Unicode-3.0"])
        );
        assert_eq!(license_terms("MIT AND BSD-3-Clause").unwrap(), set(&["BSD-3-Clause", "MIT"]));
        assert_eq!(
            license_terms("Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT").unwrap(),
            set(&["(Apache-2.0 OR Apache-2.0 WITH LLVM-exception OR MIT)"])
        );
        assert_eq!(
            license_terms("Apache-2.0 and (MIT or Unlicense)").unwrap(),
            set(&["Apache-2.0", "(MIT OR Unlicense)"])
        );
        assert_eq!(
            license_terms("(MIT AND ISC) OR Apache-2.0").unwrap(),
            set(&["((ISC AND MIT) OR Apache-2.0)"])
        );
    }

    /// SPDX's AND binds tighter than OR: a crate under "Apache-2.0 OR MIT AND ISC" may be taken
    /// under Apache-2.0 alone, so ISC is not a license the package must name on its own.
    #[test]
    fn and_binds_tighter_than_or_in_a_license_expression() {
        assert_eq!(
            license_terms("Apache-2.0 OR MIT AND ISC").unwrap(),
            set(&["((ISC AND MIT) OR Apache-2.0)"])
        );
    }

    #[test]
    fn a_license_string_that_is_not_spdx_is_an_error() {
        for bad in ["MIT OR", "Apache 2 OR MIT", "MIT AND (ISC", "Not-A-License"] {
            let err = license_terms(bad).unwrap_err();
            assert!(err.to_string().contains("not an SPDX license expression"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_license_missing_from_the_declared_set_is_reported() {
        let linked = set(&["MIT", "(Apache-2.0 OR MIT)"]);
        assert!(same_licenses("tag", &set(&["MIT", "(Apache-2.0 OR MIT)"]), &linked).is_ok());
        let err = same_licenses("tag", &set(&["MIT"]), &linked).unwrap_err().to_string();
        assert!(err.contains("missing [\"(Apache-2.0 OR MIT)\"]"), "{err}");
    }

    #[test]
    fn license_ids_include_exceptions() {
        let ids = license_ids(&set(&["(Apache-2.0 OR Apache-2.0 WITH LLVM-exception OR MIT)"]));
        assert_eq!(ids, set(&["Apache-2.0", "LLVM-exception", "MIT"]));
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

    #[test]
    fn an_uncommented_selinux_rule_is_rejected() {
        let good = "# server.rs: accept\nallow a_t self:unix_stream_socket accept;\n\n\
                    # topology.rs\nkernel_read_system_state(a_t)\n";
        assert!(te_rules_are_commented(good).is_ok());
        let bad = "type a_t;\n\nallow a_t b_t:file read;\n";
        assert!(te_rules_are_commented(bad).is_err());
        let bad_call = "type a_t;\n\ndev_read_sysfs(a_t)\n";
        assert!(te_rules_are_commented(bad_call).is_err());
        assert!(te_rules_are_commented("# x\npermissive a_t;\n").is_err());
    }

    #[test]
    fn declarations_are_not_grants() {
        assert!(!is_grant("type amd_hsmp_broker_t;"));
        assert!(!is_grant("gen_tunable(amd_hsmp_broker_use_msr, false)"));
        assert!(!is_grant("ifdef(`files_runtime_file',`"));
        assert!(is_grant("files_runtime_file(amd_hsmp_runtime_t)"));
        assert!(is_grant("allowxperm a_t b_t:chr_file ioctl 0xf800;"));
    }

    #[test]
    fn the_shared_install_script_relabels_every_path_of_the_file_contexts() {
        let fc = fs::read_to_string(crate::root().join("selinux/amd_hsmp.fc")).unwrap();
        let script = fs::read_to_string(crate::root().join("selinux/install.sh")).unwrap();
        let start = script.find("for path in ").unwrap() + "for path in ".len();
        let end = start + script[start..].find("; do").unwrap();
        let relabelled: Vec<&str> =
            script[start..end].split_whitespace().filter(|w| *w != "\\").collect();
        let paths: Vec<&str> = fc
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(|p| p.trim_end_matches("(/.*)?"))
            .collect();
        assert_eq!(paths.len(), 5, "{paths:?}");
        for path in paths {
            assert!(relabelled.contains(&path), "install.sh does not relabel {path}");
        }
    }

    #[test]
    fn the_spec_runs_the_shared_install_script_as_its_post() {
        let spec = fs::read_to_string(crate::root().join(SPEC)).unwrap();
        assert!(spec.lines().any(|l| l == "%post selinux -f selinux/install.sh"));
        // RPM expands macros in the file it appends: a percent sign would change the script.
        let script = fs::read_to_string(crate::root().join("selinux/install.sh")).unwrap();
        assert!(!script.contains('%'), "selinux/install.sh holds a percent sign");
    }

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

    #[test]
    fn host_specific_library_versions_are_masked_in_depends() {
        assert_eq!(
            normalize_depends("Depends: libc6 (>= 2.34), systemd (>= 248)"),
            "Depends: libc6 (host version), systemd (>= 248)"
        );
        assert_eq!(normalize_depends("Section: admin"), "Section: admin");
    }

    #[test]
    fn the_shipped_module_comments_every_rule() {
        let te = fs::read_to_string(crate::root().join("selinux/amd_hsmp.te")).unwrap();
        te_rules_are_commented(&te).unwrap();
    }
}
