//! Tests of the mixin's Slurm epilog example (`mixin/examples/slurm-epilog.sh`): the script run
//! with `sh` (and `bash` where installed) and each awk installed (mawk, gawk, busybox's), against
//! `file://` URLs of the exposition fixtures in `mixin/examples/testdata/`.

use crate::deps::find;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SCRIPT: &str = "mixin/examples/slurm-epilog.sh";
const TESTDATA: &str = "mixin/examples/testdata";

/// One way to run the script: a shell, and a directory whose `awk` is one implementation.
struct Runner {
    shell: PathBuf,
    awk: String,
    bin: tempfile::TempDir,
}

/// Every shell and awk installed, paired; fails, naming what to install, without curl or an awk.
fn runners() -> Vec<Runner> {
    assert!(
        find("curl").is_some(),
        "curl is not installed: the epilog example's test needs it (`cargo xtask deps`, as \
         root, installs Debian's curl)"
    );
    // busybox runs the applet its link's name gives: awk.
    let awks: Vec<(&str, PathBuf)> = ["mawk", "gawk", "original-awk", "busybox"]
        .into_iter()
        .filter_map(|cmd| find(cmd).map(|p| (cmd, p)))
        .collect();
    assert!(
        !awks.is_empty(),
        "no awk is installed (mawk, gawk, original-awk or busybox): the epilog example's test \
         needs one (`cargo xtask deps`, as root, installs Debian's mawk)"
    );
    let shells: Vec<PathBuf> = ["sh", "bash"].into_iter().filter_map(find).collect();
    assert!(!shells.is_empty(), "no sh on PATH");
    let mut runners = Vec::new();
    for shell in &shells {
        for (name, path) in &awks {
            let bin = tempfile::tempdir().unwrap();
            std::os::unix::fs::symlink(path, bin.path().join("awk")).unwrap();
            runners.push(Runner { shell: shell.clone(), awk: (*name).to_owned(), bin });
        }
    }
    runners
}

impl Runner {
    /// Runs the script with `args` and `env` (besides a PATH whose awk is this runner's, and no
    /// Slurm or exporter variables of the caller's).
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let root = crate::workspace::root();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.bin.path().to_path_buf()];
        dirs.extend(std::env::split_paths(&path));
        let mut cmd = Command::new(&self.shell);
        cmd.arg(root.join(SCRIPT)).args(args).current_dir(&root);
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            if key.starts_with("SLURM") || key.starts_with("AMD_HSMP_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("PATH", std::env::join_paths(dirs).unwrap()).env("SLURMD_NODENAME", "node01");
        cmd.envs(env.iter().copied());
        cmd.output().unwrap()
    }

    fn name(&self) -> String {
        format!("{} with {}", self.shell.display(), self.awk)
    }
}

fn fixture(name: &str) -> String {
    let path = crate::workspace::root().join(TESTDATA).join(name);
    assert!(Path::new(&path).is_file(), "{}", path.display());
    format!("file://{}", path.display())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the script on every runner against `url` and asserts its one line of output.
fn prints(url: &str, args: &[&str], env: &[(&str, &str)], expected: &str) {
    for runner in runners() {
        let mut all = vec![("AMD_HSMP_EXPORTER_URL", url)];
        all.extend_from_slice(env);
        let out = runner.run(args, &all);
        let name = runner.name();
        assert!(out.status.success(), "{name}: {:?}: {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("{expected}\n"), "{name}");
        assert_eq!(text(&out.stderr), "", "{name}");
    }
}

/// Runs the script on every runner against `url`, asserting that it fails with nothing on
/// stdout, `expected` in stderr and exit code `code`.
fn fails(url: &str, args: &[&str], env: &[(&str, &str)], expected: &str, code: i32) {
    for runner in runners() {
        let mut all = vec![("AMD_HSMP_EXPORTER_URL", url)];
        all.extend_from_slice(env);
        let out = runner.run(args, &all);
        let name = runner.name();
        assert_eq!(out.status.code(), Some(code), "{name}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "", "{name}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }
}

/// A job's series, the job's own and a step's (labels in another order), are summed; those of
/// job 42420 and 424, whose ids share a prefix with it, and a series whose other labels' values
/// hold `hpc_job="4242"` behind escaped quotes, are not.
#[test]
fn the_series_of_a_job_are_summed_and_no_other() {
    let classic = fixture("classic.prom");
    let line = "Energy: 1234.5 J (0.000343 kWh), the CPU cores of job 4242 on node01";
    prints(&classic, &["4242"], &[], line);
    // The job id from Slurm's environment.
    prints(&classic, &[], &[("SLURM_JOB_ID", "4242")], line);
    prints(
        &classic,
        &["42420"],
        &[],
        "Energy: 5000.0 J (0.001389 kWh), the CPU cores of job 42420 on node01",
    );
    // A value in exponent notation, after a label value with `\"`, `\\` and `}`.
    prints(
        &classic,
        &["77"],
        &[],
        "Energy: 1500.0 J (0.000417 kWh), the CPU cores of job 77 on node01",
    );
}

/// OpenMetrics: `# UNIT`, `_created`, a timestamp, an exemplar and `# EOF`.
#[test]
fn openmetrics_is_read_as_the_classic_format() {
    prints(
        &fixture("openmetrics.prom"),
        &["4242"],
        &[],
        "Energy: 1234.5 J (0.000343 kWh), the CPU cores of job 4242 on node01",
    );
}

/// No series of the job (a prefix of one that has some): a message and exit 1, never 0 J; as
/// slurmd's Epilog, whose failure drains the node, the message and exit 0.
#[test]
fn a_job_without_series_fails_with_a_message() {
    let classic = fixture("classic.prom");
    fails(
        &classic,
        &["42"],
        &[],
        r#"no amd_hsmp_workload_core_energy_joules_total series with hpc_job="42""#,
        1,
    );
    fails(&classic, &[], &[], "no job id", 1);
    let context = [("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")];
    fails(&classic, &["42"], &context, r#"hpc_job="42""#, 0);
}

/// An exporter that cannot be read: curl's error, the script's, and exit 1.
#[test]
fn an_unreachable_exporter_fails_with_curls_error() {
    let port = crate::http::free_port().unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");
    fails(&url, &["4242"], &[], "curl: (7)", 1);
    fails(&url, &["4242"], &[], &format!("cannot read {url}"), 1);
    let missing = fixture("classic.prom").replace("classic.prom", "missing.prom");
    fails(&missing, &["4242"], &[], "curl: (37)", 1);
    // Options of the caller's reach curl.
    fails(
        &fixture("classic.prom"),
        &["4242"],
        &[("AMD_HSMP_CURL_OPTS", "--no-such-option")],
        "curl: ",
        1,
    );
}
