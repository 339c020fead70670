//! The SELinux module: compiled, its rules commented, policy analysis of a full policy with it.

use super::helpers::{copy, read};
use crate::workspace::{output, stdout};
use anyhow::{Context, Result, ensure};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The reference policy's module build.
const SELINUX_DEVEL_MAKEFILE: &str = "/usr/share/selinux/devel/Makefile";

/// The modules of Debian's reference policy (selinux-policy-default).
const SELINUX_POLICY_MODULES: &str = "/usr/share/selinux/default";

/// Converts a binary policy module to CIL (policycoreutils).
const SELINUX_PP_TO_CIL: &str = "/usr/libexec/selinux/hll/pp";

const SELINUX_MODULE: &str = "amd_hsmp";

/// The module's rules explain themselves, it compiles against the reference policy headers, and
/// the policy analysis of a full policy including it shows the confinement the design promises.
pub(super) fn selinux(root: &Path, work: &Path) -> Result<String> {
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
        claim: "amd_hsmp_exporter_t cannot open or read a perf event",
        args: &["-A", "-s", "amd_hsmp_exporter_t", "-c", "perf_event"],
        expect: Expect::Nothing,
    },
    Query {
        claim: "amd_hsmp_broker_t holds CAP_SYS_RAWIO only with amd_hsmp_broker_use_msr",
        args: &["-A", "-s", "amd_hsmp_broker_t", "-c", "capability"],
        expect: Expect::AllContain("sys_rawio; [ amd_hsmp_broker_use_msr ]:True"),
    },
    Query {
        claim: "amd_hsmp_broker_t holds CAP_PERFMON and no other capability2",
        args: &["-A", "-s", "amd_hsmp_broker_t", "-c", "capability2"],
        expect: Expect::AllContain("amd_hsmp_broker_t:capability2 perfmon;"),
    },
    Query {
        claim: "amd_hsmp_broker_t holds no capability in a user namespace",
        args: &["-A", "-s", "amd_hsmp_broker_t", "-c", "cap_userns,cap2_userns"],
        expect: Expect::Nothing,
    },
    Query {
        claim: "amd_hsmp_broker_t opens and reads its own CPU-wide perf events, nothing more",
        args: &["-A", "-s", "amd_hsmp_broker_t", "-c", "perf_event"],
        expect: Expect::AllContain("amd_hsmp_broker_t:perf_event { cpu kernel open read };"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packaging::rpm::SPEC;

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
        let fc = fs::read_to_string(crate::workspace::root().join("selinux/amd_hsmp.fc")).unwrap();
        let script =
            fs::read_to_string(crate::workspace::root().join("selinux/install.sh")).unwrap();
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
        let spec = fs::read_to_string(crate::workspace::root().join(SPEC)).unwrap();
        assert!(spec.lines().any(|l| l == "%post selinux -f selinux/install.sh"));
        // RPM expands macros in the file it appends: a percent sign would change the script.
        let script =
            fs::read_to_string(crate::workspace::root().join("selinux/install.sh")).unwrap();
        assert!(!script.contains('%'), "selinux/install.sh holds a percent sign");
    }

    #[test]
    fn the_shipped_module_comments_every_rule() {
        let te = fs::read_to_string(crate::workspace::root().join("selinux/amd_hsmp.te")).unwrap();
        te_rules_are_commented(&te).unwrap();
    }
}
