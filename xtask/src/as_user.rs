//! `cargo xtask test-as-user`: the workspace's tests once more, as an ordinary user (uid and
//! gid 65534, no supplementary group, no capability) in a mount namespace where `/dev/fuse` is
//! `/dev/null`, from the build `cargo xtask test` left (the test executables, the binaries and
//! the broker's examples; nothing is compiled twice). The tests that need root or `/dev/fuse`
//! are `#[ignore]`d and stay out; every other test must pass for any user, and a test that
//! assumes root without saying so fails here. Doctests are left out: rustdoc is root's
//! toolchain, which the user cannot run.
//!
//! Six of xtask's own tests run cargo itself, which is root's here ([`NEED_CARGO`]), and stay
//! out of this run only.
//!
//! The user's home and temporary directory is a fresh directory it owns. Where a directory
//! above the workspace or the target directory does not let others search it (a clone under
//! `/root`), search permission for others is added for the run and taken back after it.

use crate::workspace::{build_bins, cargo, cargo_stdout, root, target_dir};
use anyhow::{Context, Result, bail, ensure};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The user the tests run as: `nobody` on Debian and EL.
const UID: u32 = 65_534;

/// A test executable and the package directory cargo would run it in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TestExe {
    exe: PathBuf,
    package_dir: PathBuf,
    name: String,
}

pub fn run() -> Result<()> {
    ensure!(
        rustix::process::geteuid().is_root(),
        "test-as-user starts as root to switch to uid {UID}: run it as root"
    );
    let json = cargo_stdout(&[
        "test",
        "--workspace",
        "--all-targets",
        "--locked",
        "--no-run",
        "--message-format=json",
    ])?;
    let exes = test_executables(&json)?;
    ensure!(!exes.is_empty(), "cargo listed no test executable");
    // What the e2e harness builds itself when it can (harness::PREBUILT_VARIABLE).
    build_bins(&["amd-hsmp-broker", "amd-hsmp-sim-broker", "amd-hsmp-exporter"])?;
    cargo(&["build", "--locked", "--quiet", "-p", "amd-hsmp-broker", "--examples"])?;

    let home = tempfile::Builder::new().prefix("amd-hsmp-as-user-").tempdir()?;
    rustix::fs::chown(
        home.path(),
        Some(rustix::fs::Uid::from_raw(UID)),
        Some(rustix::fs::Gid::from_raw(UID)),
    )
    .context("cannot give the user its home")?;
    let _search = Search::grant(&[root(), target_dir(&root())])?;

    let mut failed = Vec::new();
    for t in &exes {
        println!("test-as-user: {} as uid {UID}", t.name);
        let status = as_user(t, home.path())
            .status()
            .with_context(|| format!("cannot run {}", t.exe.display()))?;
        if !status.success() {
            failed.push(format!("{} ({status})", t.name));
        }
    }
    if !failed.is_empty() {
        bail!("as uid {UID}, without /dev/fuse, these failed: {}", failed.join(", "));
    }
    println!("test-as-user: {} test executables passed as uid {UID}", exes.len());
    Ok(())
}

/// The test executables of `cargo test --no-run --message-format=json`'s output.
fn test_executables(json: &str) -> Result<Vec<TestExe>> {
    let mut out = Vec::new();
    for line in json.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line).context("cargo's JSON")?;
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest)) = (v["executable"].as_str(), v["manifest_path"].as_str())
        else {
            continue;
        };
        let package_dir = Path::new(manifest).parent().context("a manifest in no directory")?;
        let kind = v["target"]["kind"][0].as_str().unwrap_or("test");
        let name = format!("{} ({kind})", v["target"]["name"].as_str().unwrap_or(exe));
        let t = TestExe { exe: exe.into(), package_dir: package_dir.into(), name };
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

/// The command that runs `t` as [`UID`], in a private mount namespace where `/dev/fuse` is
/// `/dev/null`, with a plain environment: the variables cargo gives a test, the simulated
/// instant and [`PREBUILT`].
fn as_user(t: &TestExe, home: &Path) -> Command {
    let script = "if [ -e /dev/fuse ]; then mount --bind /dev/null /dev/fuse; fi\n\
                  exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
                  --bounding-set=-all -- \"$@\"";
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-ec", script, "sh"])
        .arg(&t.exe)
        .args(NEED_CARGO.iter().flat_map(|name| ["--skip", name]))
        .current_dir(&t.package_dir)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", home)
        .env("TMPDIR", home)
        .env("USER", "nobody")
        .env("LOGNAME", "nobody")
        .env("CARGO_MANIFEST_DIR", &t.package_dir)
        .env(PREBUILT, "1");
    for name in ["AMD_HSMP_SIMULATE_TIME", "LANG", "TERM"] {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd
}

/// Tests that run cargo itself or read what only cargo sets (`cargo metadata`, `CARGO_PKG_NAME`):
/// they pass for a user with a toolchain of its own (`cargo test --workspace`), but the user
/// here has none, since the toolchain is root's. Left out of this run by name, and only here.
const NEED_CARGO: [&str; 6] = [
    "tidy::privileged::every_workspace_crate_the_broker_links_denies_panics",
    "tidy::privileged::the_brokers_dependencies_are_the_reviewed_list",
    "tidy::renovate::the_brokers_renovate_rule_names_its_dependencies",
    "tidy::tests::architecture_crate_graph_is_the_workspace_graph",
    "tidy::tests::no_package_needs_a_newer_rustc_than_the_workspace",
    "workspace::tests::cargo_run_builds_in_the_environment_of_a_plain_cargo_build",
];

/// `tests/src/harness.rs`' `PREBUILT_VARIABLE`: the binaries are built, use them.
const PREBUILT: &str = "AMD_HSMP_E2E_PREBUILT";

/// Search permission for others added to the directories above some paths that lacked it,
/// taken back when dropped.
#[derive(Debug)]
pub(crate) struct Search(Vec<(PathBuf, u32)>);

impl Search {
    pub(crate) fn grant(paths: &[PathBuf]) -> Result<Search> {
        let mut changed = Search(Vec::new());
        for path in paths {
            let path = path.canonicalize().with_context(|| format!("{}", path.display()))?;
            for dir in path.ancestors() {
                let mode = std::fs::metadata(dir)?.mode() & 0o7777;
                if mode & 0o001 == 0 && !changed.0.iter().any(|(d, _)| d == dir) {
                    std::fs::set_permissions(dir, PermissionsExt::from_mode(mode | 0o001))?;
                    println!("xtask: others may search {} for the run", dir.display());
                    changed.0.push((dir.to_path_buf(), mode));
                }
            }
        }
        Ok(changed)
    }
}

impl Drop for Search {
    fn drop(&mut self) {
        for (dir, mode) in self.0.iter().rev() {
            if let Err(e) = std::fs::set_permissions(dir, PermissionsExt::from_mode(*mode)) {
                eprintln!("xtask: cannot restore the mode of {}: {e}", dir.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_executables_are_read_from_cargo_s_artifacts_once_each() {
        let json = r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/deps/e2e-1","manifest_path":"/w/tests/Cargo.toml","target":{"name":"e2e","kind":["test"]}}
{"reason":"compiler-artifact","profile":{"test":false},"executable":"/t/amd-hsmp-broker","manifest_path":"/w/broker/Cargo.toml","target":{"name":"amd-hsmp-broker","kind":["bin"]}}
{"reason":"compiler-artifact","profile":{"test":true},"executable":null,"manifest_path":"/w/proto/Cargo.toml","target":{"name":"p","kind":["lib"]}}
{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/deps/e2e-1","manifest_path":"/w/tests/Cargo.toml","target":{"name":"e2e","kind":["test"]}}
{"reason":"build-finished","success":true}"#;
        let exes = test_executables(json).unwrap();
        assert_eq!(
            exes,
            [TestExe {
                exe: "/t/deps/e2e-1".into(),
                package_dir: "/w/tests".into(),
                name: "e2e (test)".into()
            }]
        );
    }

    #[test]
    fn the_tests_left_out_exist_and_run_cargo() {
        for name in NEED_CARGO {
            // `module::tests::name`, or `module::name` for a test module of its own.
            let (module, test) = name.rsplit_once("::").unwrap();
            let file = module.trim_end_matches("::tests").replace("::", "/");
            let source = std::fs::read_to_string(root().join(format!("xtask/src/{file}.rs")));
            let source = source.unwrap();
            let at = source.find(&format!("fn {test}()")).unwrap_or_else(|| panic!("{name}"));
            let end = ["\n    }\n", "\n}\n"].iter().filter_map(|e| source[at..].find(e)).min();
            let body = &source[at..at + end.unwrap()];
            assert!(body.contains("cargo") || body.contains("CARGO_"), "{name}");
        }
    }

    #[test]
    fn the_variable_is_the_harness_s() {
        let harness = include_str!("../../tests/src/harness.rs");
        assert!(harness.contains(&format!("PREBUILT_VARIABLE: &str = \"{PREBUILT}\"")));
    }
}
