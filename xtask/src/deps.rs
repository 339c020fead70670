//! Installs the Debian packages and cargo tools the test suite needs (the packages when root), or
//! says which are missing.

use anyhow::{Result, bail, ensure};
use std::path::PathBuf;
use std::process::Command;

/// Debian packages the suite uses, with the command each provides (or, for a package that provides
/// no command, the absolute path of a file it installs).
pub const PACKAGES: &[(&str, &str)] = &[
    ("fuse3", "fusermount3"),
    ("prometheus", "promtool"),
    // The broker suite's ptrace attach of a running broker (tests/tests/e2e/broker.rs).
    ("strace", "strace"),
    // The packaging checks (packaging/).
    ("systemd", "systemd-analyze"),
    ("rpm", "rpmbuild"),
    ("lintian", "lintian"),
    ("bzip2", "bzip2"),
    ("xz-utils", "xz"),
    ("selinux-policy-dev", "/usr/share/selinux/devel/Makefile"),
    ("selinux-policy-default", "/usr/share/selinux/default/base.pp.bz2"),
    ("policycoreutils", "/usr/libexec/selinux/hll/pp"),
    ("secilc", "secilc"),
    ("setools", "sesearch"),
    // rpmlint (PyPI, in its own venv, below) with the RPM bindings from Debian; the venvs of the
    // kube test and of the mixin check's dashboard model.
    ("python3-venv", "/usr/share/doc/python3-venv/copyright"),
    ("python3-rpm", "/usr/share/doc/python3-rpm/copyright"),
    // Helpers rpmlint runs: the shell-scriptlet check, and the spelling check of summaries and
    // descriptions (pyenchant in the venv, US English as Fedora's rpmlint uses).
    ("devscripts", "checkbashisms"),
    ("libenchant-2-2", "/usr/share/doc/libenchant-2-2/copyright"),
    ("hunspell-en-us", "/usr/share/hunspell/en_US.dic"),
    // The mixin checks (mixin.rs); promtool is above.
    ("jsonnet", "jsonnet"),
    // Renovate's configuration schema, from its npm package (xtask/src/tidy/renovate.rs).
    ("npm", "npm"),
    // The mixin's Slurm epilog example and its test (xtask/src/mixin/epilog.rs): curl, and mawk,
    // Debian's awk (the test runs the script with gawk too where it is installed).
    ("curl", "curl"),
    ("mawk", "mawk"),
    // The landing page rendered headless (tests/tests/e2e/demo.rs).
    ("chromium", "chromium"),
    // The pod of the Helm chart run for real (kube-test, xtask/src/kube/pod.rs): Debian 12's
    // podman 4.3 with runc (crun refuses this machine's hybrid cgroup layout), and catatonit for
    // the pod's infra container.
    ("podman", "podman"),
    ("runc", "runc"),
    ("catatonit", "catatonit"),
    // `cargo xtask release` signs the checksums of its artifacts (xtask/src/release/sign.rs).
    ("minisign", "minisign"),
];

/// PyPI packages of the kube-test venv (`~/.cache/amd-hsmp-exporter/kube-venv`): Helm's SDK in a
/// wheel (no helm binary to download) and the Kubernetes API schemas, both offline.
pub const KUBE_VENV_PACKAGES: &[&str] = &["helm-python-sdk==0.2.2", "kubernetes-validate==1.37.0"];

/// Cargo subcommands the suite uses: crate, pinned version (the packaging checks compare the
/// maintainer scripts it generates with expected files), command. Installed with
/// `cargo install --locked` when missing or at another version.
pub const CARGO_TOOLS: &[(&str, &str, &str)] = &[
    ("cargo-deb", "3.8.0", "cargo-deb"),
    // `cargo deny check bans licenses sources` (deny.toml) in `cargo xtask test`.
    ("cargo-deny", "0.20.2", "cargo-deny"),
    // `cargo xtask image`: the binaries carry their dependency list (image.rs).
    ("cargo-auditable", "0.7.7", "cargo-auditable"),
    // `cargo xtask release`: the SBOM of each binary, from the dependency list cargo-auditable
    // embeds in it (the same project's converter).
    ("auditable2cdx", "0.1.0", "auditable2cdx"),
];

/// The commands `cargo xtask release` runs, besides cargo: Debian's (of [`PACKAGES`] or of
/// every Debian system) and [`CARGO_TOOLS`]'.
const RELEASE_COMMANDS: &[&str] = &[
    "minisign",
    "rpmbuild",
    "xz",
    "setpriv",
    "ldd",
    "cargo-deb",
    "cargo-auditable",
    "auditable2cdx",
];

/// Fails listing the commands of [`RELEASE_COMMANDS`] that are missing, and the cargo tools at
/// another version than pinned.
pub fn require_release_tools() -> Result<()> {
    let mut missing: Vec<String> =
        RELEASE_COMMANDS.iter().filter(|c| !on_path(c)).map(|c| c.to_string()).collect();
    missing.extend(
        CARGO_TOOLS
            .iter()
            .filter(|(krate, version, cmd)| {
                RELEASE_COMMANDS.contains(cmd)
                    && on_path(cmd)
                    && !tool_at_version(krate, cmd, version)
            })
            .map(|(krate, version, _)| format!("{krate} {version}")),
    );
    ensure!(
        missing.is_empty(),
        "missing for the release: {}; run `cargo xtask deps` (as root for the Debian packages)",
        missing.join(", ")
    );
    Ok(())
}

/// rpmlint, pinned, from PyPI: Debian's rpmlint carries Debian's configuration, and only the
/// release's source distribution carries Fedora's (`configs/Fedora/`; the wheel does not), which
/// the packaging check applies to the RPMs and the spec.
pub const RPMLINT_VERSION: &str = "2.10.0";

/// The spelling check's bindings (enchant), pinned; without them rpmlint skips that check.
const PYENCHANT: &str = "pyenchant==3.3.0";

/// Where rpmlint lives: a venv (with the system's RPM bindings) beside the VM test's cache,
/// `~/.cache/amd-hsmp-exporter/rpmlint-VERSION`, with Fedora's configuration in `configs/Fedora`.
pub fn rpmlint_dir() -> PathBuf {
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) => PathBuf::from(xdg),
        (None, Some(home)) => PathBuf::from(home).join(".cache"),
        (None, None) => PathBuf::from("/var/cache"),
    };
    base.join("amd-hsmp-exporter").join(format!("rpmlint-{RPMLINT_VERSION}"))
}

/// What the rpmlint venv's marker holds once it is complete.
fn rpmlint_marker() -> String {
    format!("rpmlint=={RPMLINT_VERSION} {PYENCHANT}\n")
}

/// Whether the rpmlint venv is missing, incomplete or of other pins (its last step leaves a
/// marker naming them).
pub fn rpmlint_missing() -> bool {
    std::fs::read_to_string(rpmlint_dir().join("installed")).ok() != Some(rpmlint_marker())
}

/// Creates the rpmlint venv: the sdist of [`RPMLINT_VERSION`] downloaded once, installed with
/// its dependencies, and its Fedora configuration unpacked beside it.
fn install_rpmlint() -> Result<()> {
    let dir = rpmlint_dir();
    eprintln!("xtask: installing rpmlint {RPMLINT_VERSION} into {}", dir.display());
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    crate::workspace::run_cmd(
        Command::new("python3").args(["-m", "venv", "--system-site-packages"]).arg(&dir),
    )?;
    let pip = dir.join("bin/pip");
    let sdist = dir.join("sdist");
    let pinned = format!("rpmlint=={RPMLINT_VERSION}");
    crate::workspace::run_cmd(
        Command::new(&pip)
            .args(["download", "-q", "--no-deps", "--no-binary", ":all:", &pinned, "-d"])
            .arg(&sdist),
    )?;
    let tarball = sdist.join(format!("rpmlint-{RPMLINT_VERSION}.tar.gz"));
    crate::workspace::run_cmd(Command::new(&pip).args(["install", "-q"]).arg(&tarball))?;
    crate::workspace::run_cmd(Command::new(&pip).args(["install", "-q", PYENCHANT]))?;
    crate::workspace::run_cmd(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dir)
            .arg("--strip-components=1")
            .arg(format!("rpmlint-{RPMLINT_VERSION}/configs/Fedora")),
    )?;
    if !dir.join("configs/Fedora/fedora.toml").is_file() {
        bail!("rpmlint {RPMLINT_VERSION}'s source distribution has no configs/Fedora/fedora.toml");
    }
    std::fs::write(dir.join("installed"), rpmlint_marker())?;
    Ok(())
}

/// Installs missing packages with apt-get when running as root (otherwise fails listing them),
/// then missing cargo tools and rpmlint.
pub fn install() -> Result<()> {
    install_packages()?;
    if rpmlint_missing() {
        install_rpmlint()?;
    }
    install_cargo_tools()?;
    install_kube_venv()?;
    install_venv(&mixin_venv()?, MIXIN_VENV_PACKAGES, "the mixin check's venv")?;
    install_venv(&lint_venv()?, LINT_VENV_PACKAGES, "the lint venv")?;
    install_renovate_schema()
}

/// The kube-test venv's directory, outside the clone.
pub fn kube_venv() -> Result<std::path::PathBuf> {
    let home = std::env::var_os("HOME").ok_or_else(|| anyhow::anyhow!("HOME is not set"))?;
    Ok(std::path::PathBuf::from(home).join(".cache/amd-hsmp-exporter/kube-venv"))
}

/// Makes the kube-test venv, or adds what it lacks: the pinned packages, checked with pip.
fn install_kube_venv() -> Result<()> {
    install_venv(&kube_venv()?, KUBE_VENV_PACKAGES, "the kube-test venv")
}

/// PyPI packages of the mixin check's venv ([`mixin_venv`]): Grafana's typed dashboard model.
pub const MIXIN_VENV_PACKAGES: &[&str] = &["grafana-foundation-sdk==1769699379!11.6.0"];

/// PyPI packages of the lint venv ([`lint_venv`]): a JSON Schema validator, for renovate.json
/// against [`RENOVATE_VERSION`]'s schema and the workflows against SchemaStore's.
pub const LINT_VENV_PACKAGES: &[&str] = &["check-jsonschema==0.39.0"];

/// The Renovate release whose configuration schema (`renovate-schema.json`, in its npm package)
/// checks renovate.json; the package alone, without its dependencies, from `npm pack`.
pub const RENOVATE_VERSION: &str = "44.121.2";

/// The lint venv's directory, outside the clone.
pub fn lint_venv() -> Result<PathBuf> {
    Ok(cache()?.join("lint-venv"))
}

/// Renovate's configuration schema, `~/.cache/amd-hsmp-exporter/renovate-VERSION/renovate-schema.json`.
pub fn renovate_schema() -> Result<PathBuf> {
    Ok(cache()?.join(format!("renovate-{RENOVATE_VERSION}")).join("renovate-schema.json"))
}

fn cache() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").ok_or_else(|| anyhow::anyhow!("HOME is not set"))?;
    Ok(PathBuf::from(home).join(".cache/amd-hsmp-exporter"))
}

/// Unpacks [`renovate_schema`] from the npm package of [`RENOVATE_VERSION`] when missing.
fn install_renovate_schema() -> Result<()> {
    let schema = renovate_schema()?;
    if schema.is_file() {
        return Ok(());
    }
    let dir = schema.parent().unwrap_or(std::path::Path::new("."));
    eprintln!("xtask: fetching renovate {RENOVATE_VERSION}'s schema into {}", dir.display());
    std::fs::create_dir_all(dir)?;
    let package = format!("renovate@{RENOVATE_VERSION}");
    crate::workspace::run_cmd(
        Command::new("npm").args(["pack", "--silent", &package]).current_dir(dir),
    )
    .map_err(|e| e.context("cannot fetch Renovate's package (npm is Debian's package npm)"))?;
    let tarball = dir.join(format!("renovate-{RENOVATE_VERSION}.tgz"));
    crate::workspace::run_cmd(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(dir)
            .args(["--strip-components=1", "package/renovate-schema.json"]),
    )?;
    std::fs::remove_file(&tarball)?;
    Ok(())
}

/// The venv of the mixin check's typed dashboard model, outside the clone.
pub fn mixin_venv() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").ok_or_else(|| anyhow::anyhow!("HOME is not set"))?;
    Ok(PathBuf::from(home).join(".cache/amd-hsmp-exporter/mixin-venv"))
}

/// The pinned `packages` (`name==version`) that `venv` lacks.
fn missing_in_venv<'a>(venv: &std::path::Path, packages: &[&'a str]) -> Vec<&'a str> {
    let installed = Command::new(venv.join("bin/pip"))
        .args(["freeze", "--disable-pip-version-check"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    not_frozen(&installed, packages)
}

/// The pinned `packages` that `pip freeze`'s output lacks. pip prints a name as its distribution
/// spells it (`grafana_foundation_sdk` for `grafana-foundation-sdk`): names compare as PEP 503
/// normalizes them (case, and `-`, `_`, `.` alike).
fn not_frozen<'a>(freeze: &str, packages: &[&'a str]) -> Vec<&'a str> {
    let normal = |pin: &str| match pin.split_once("==") {
        Some((name, version)) => {
            format!("{}=={version}", name.to_ascii_lowercase().replace(['_', '.'], "-"))
        }
        None => pin.to_ascii_lowercase(),
    };
    let installed: Vec<String> = freeze.lines().map(normal).collect();
    packages.iter().copied().filter(|p| !installed.contains(&normal(p))).collect()
}

/// Makes `venv` (named `what` in messages), or adds the pinned `packages` it lacks.
pub fn install_venv(venv: &std::path::Path, packages: &[&str], what: &str) -> Result<()> {
    let missing = missing_in_venv(venv, packages);
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {} in {}", missing.join(" "), venv.display());
    let pip = venv.join("bin/pip");
    if !pip.is_file() {
        crate::workspace::run_cmd(Command::new("python3").args(["-m", "venv"]).arg(venv)).map_err(
            |e| e.context(format!("cannot make {what} (Debian's python3 needs python3-venv)")),
        )?;
    }
    crate::workspace::run_cmd(
        Command::new(&pip)
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(&missing),
    )
}

/// Installs the cargo tools that are missing or at another version.
pub fn install_cargo_tools() -> Result<()> {
    install_cargo_tools_of(|_| true)
}

/// Installs cargo tool `krate` of [`CARGO_TOOLS`] alone, when missing or at another version.
pub fn install_cargo_tool(krate: &str) -> Result<()> {
    ensure!(CARGO_TOOLS.iter().any(|(k, _, _)| *k == krate), "{krate} is not in CARGO_TOOLS");
    install_cargo_tools_of(|k| k == krate)
}

fn install_cargo_tools_of(wanted: impl Fn(&str) -> bool) -> Result<()> {
    for (krate, version, cmd) in CARGO_TOOLS.iter().filter(|(k, _, _)| wanted(k)) {
        if !tool_at_version(krate, cmd, version) {
            eprintln!("xtask: installing {krate} {version}");
            crate::workspace::cargo(&[
                "install",
                "--locked",
                "--force",
                krate,
                "--version",
                version,
            ])?;
        }
    }
    Ok(())
}

/// Debian packages whose command or file is missing.
pub fn missing_packages() -> Vec<&'static str> {
    PACKAGES.iter().filter(|(_, cmd)| !on_path(cmd)).map(|(pkg, _)| *pkg).collect()
}

/// Cargo tools missing or at another version than pinned, as `crate version`.
pub fn missing_cargo_tools() -> Vec<String> {
    CARGO_TOOLS
        .iter()
        .filter(|(krate, version, cmd)| !tool_at_version(krate, cmd, version))
        .map(|(krate, version, _)| format!("{krate} {version}"))
        .collect()
}

fn install_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    if !rustix::process::geteuid().is_root() {
        bail!("missing Debian packages: {} (install them, or run as root)", missing.join(" "));
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    crate::workspace::run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    crate::workspace::run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Whether `cmd` is on `PATH` or in the system directories a root shell has (`/usr/sbin`,
/// `/sbin`), or, when it is an absolute path, whether that file exists.
pub(crate) fn on_path(cmd: &str) -> bool {
    find(cmd).is_some()
}

/// Where `cmd` is, as [`on_path`] looks for it: the first of `PATH`'s directories and the
/// system ones that holds it, or the absolute path itself.
pub(crate) fn find(cmd: &str) -> Option<std::path::PathBuf> {
    if cmd.starts_with('/') {
        let path = std::path::PathBuf::from(cmd);
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(std::path::PathBuf::from))
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// Whether `cmd` is on `PATH` at `version`: `cmd --version` prints it (cargo-deb prints
/// `cargo-deb 3.8.0`), or, for a tool that prints cargo's version instead (cargo-auditable),
/// `cargo install --list` has the line `KRATE vVERSION:`.
fn tool_at_version(krate: &str, cmd: &str, version: &str) -> bool {
    let output = |c: &mut Command| {
        c.output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let installed = format!("{krate} v{version}:");
    on_path(cmd)
        && (output(Command::new(cmd).arg("--version")).split_whitespace().any(|w| w == version)
            || output(Command::new(cargo).args(["install", "--list"]))
                .lines()
                .any(|l| l == installed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pip freeze spells a name as its distribution does; a pin with dashes is installed all the
    /// same, and a pin at another version is not.
    #[test]
    fn a_pinned_package_frozen_with_underscores_is_installed() {
        let freeze = "grafana_foundation_sdk==1769699379!11.6.0\nKubernetes.Validate==1.37.0\n";
        let pins = ["grafana-foundation-sdk==1769699379!11.6.0", "kubernetes-validate==1.37.0"];
        assert!(not_frozen(freeze, &pins).is_empty());
        assert_eq!(
            not_frozen(freeze, &["kubernetes-validate==1.36.0"]),
            ["kubernetes-validate==1.36.0"]
        );
    }
}
