//! Checks S, D, C and A: SELinux enforcing with the packaged module, the processes in their
//! domains, each confinement probe refused with its AVC record, and no other AVC record.

use super::{COMMAND_TIMEOUT, Ctx, Evidence, Verdict, sh};
use crate::vm::guest::Vm;
use anyhow::{Result, bail};

/// Check S: SELinux enforcing, the module installed by the package's own steps.
pub(super) fn selinux(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let (booted, (policy, policy_seconds)) = (&ctx.booted, &ctx.policy);
    let mut ev = Evidence::default();
    let field = |name: &str| {
        booted
            .text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or("")
            .to_string()
    };
    ev.check(field("mode") == "Enforcing", format!("booted {}", field("mode")));
    ev.check(
        field("lsm").split(',').any(|m| m == "selinux"),
        format!("/sys/kernel/security/lsm: {}", field("lsm")),
    );
    ev.check(field("pid1").contains(":init_t:"), format!("systemd runs as {}", field("pid1")));
    ev.check(true, format!("the test's agent runs as {}", field("agent")));
    ev.check(
        policy.ok(),
        format!(
            "selinux/install.sh (the -selinux package's %post) exit {} in {policy_seconds:.1} s{}",
            policy.rc,
            if policy.text.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", policy.text.trim())
            }
        ),
    );
    let state = sh(
        vm,
        "echo \"mode $(getenforce)\"; semodule -lfull | grep -w amd_hsmp; \
         getsebool amd_hsmp_broker_use_msr; semanage port -l | grep '^amd_hsmp'",
    )?;
    let text = state.text.replace('\n', " | ");
    ev.check(state.text.contains("mode Enforcing"), format!("after the install: {text}"));
    ev.check(
        state
            .text
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["200", "amd_hsmp", "pp"]),
        "module amd_hsmp loaded at priority 200",
    );
    ev.check(
        state.text.contains("amd_hsmp_broker_use_msr --> off"),
        "boolean amd_hsmp_broker_use_msr exists, off by default",
    );
    ev.check(
        state.text.lines().any(|l| {
            l.split_whitespace().collect::<Vec<_>>() == ["amd_hsmp_exporter_port_t", "tcp", "10054"]
        }),
        "tcp/10054 is amd_hsmp_exporter_port_t",
    );
    let files = sh(
        vm,
        "ls -Z /usr/bin/amd-hsmp-broker /usr/bin/amd-hsmp-exporter /dev/hsmp; ls -dZ /run/amd-hsmp \
         /run/amd-hsmp/broker.sock",
    )?;
    for (path, want) in [
        ("/usr/bin/amd-hsmp-broker", ":amd_hsmp_broker_exec_t:"),
        ("/usr/bin/amd-hsmp-exporter", ":amd_hsmp_exporter_exec_t:"),
        ("/dev/hsmp", ":amd_hsmp_device_t:"),
        ("/run/amd-hsmp", ":amd_hsmp_runtime_t:"),
        ("/run/amd-hsmp/broker.sock", ":amd_hsmp_runtime_t:"),
    ] {
        let line = files.text.lines().find(|l| l.trim_end().ends_with(path)).unwrap_or("(missing)");
        ev.check(line.contains(want), line.trim().to_string());
    }
    Ok(ev.verdict("SELinux enforcing; module, boolean, port and labels"))
}

/// Check D: the running processes in their domains.
pub(super) fn domains(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let mut ev = Evidence::default();
    let ps = sh(vm, "ps -eo label=,comm= | grep amd-hsmp")?;
    for (comm, domain) in
        [("amd-hsmp-broker", ":amd_hsmp_broker_t:"), ("amd-hsmp-export", ":amd_hsmp_exporter_t:")]
    {
        let line =
            ps.text.lines().find(|l| l.trim_end().ends_with(comm)).unwrap_or("(not running)");
        ev.check(line.contains(domain), format!("ps -eZ: {}", line.trim()));
    }
    Ok(ev.verdict("broker and exporter run in their domains"))
}

/// Check A: every AVC record of the whole run naming one of the module's types.
pub(super) fn avc_denials(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let provoked = &ctx.provoked;
    let mut ev = Evidence::default();
    let log = sh(vm, AUDIT_LOG)?;
    let records = avc_records(&log.text);
    ev.check(
        log.ok(),
        format!(
            "dmesg: exit {}, {} audit records",
            log.rc,
            log.text.lines().filter(|l| l.contains("type=1400") || l.contains("type=1107")).count()
        ),
    );
    let ours: Vec<&str> = records
        .iter()
        .copied()
        .filter(|r| r.contains("amd_hsmp_") && !provoked.iter().any(|p| p == r))
        .collect();
    let lost: Vec<&str> = log
        .text
        .lines()
        .filter(|l| l.contains("callbacks suppressed") || l.contains("backlog limit exceeded"))
        .collect();
    ev.check(lost.is_empty(), format!("no audit record lost ({} lines say otherwise)", lost.len()));
    ev.check(
        ours.is_empty(),
        format!(
            "{} AVC denials for amd_hsmp domains over the whole run ({} more provoked by checks C \
             and F, each matched there; {} for other domains, not judged)",
            ours.len(),
            provoked.len(),
            records.iter().filter(|r| !r.contains("amd_hsmp_")).count()
        ),
    );
    for record in &ours {
        ev.check(false, format!("denied: {record}"));
    }
    let summary = format!(
        "selinux: Enforcing, module amd_hsmp loaded, {} AVC denials for amd_hsmp domains",
        ours.len()
    );
    Ok(ev.verdict(&summary))
}

/// The kernel log's audit records and the lines that say records were lost. (`dmesg` alone, with
/// its output in the agent's file, printed nothing in the guest.)
const AUDIT_LOG: &str = "dmesg | grep -aE 'type=1400|type=1107|callbacks suppressed|backlog limit'; \
                         test ${PIPESTATUS[0]} -eq 0";

/// One confinement probe: who runs it, what it tries, and the AVC record its refusal must leave
/// (object class and the target's type), or `None` where the policy must allow it.
struct Probe {
    what: &'static str,
    domain: &'static str,
    args: &'static str,
    refused: Option<(&'static str, &'static str)>,
}

const PROBES: &[Probe] = &[
    Probe {
        what: "the exporter's domain opens /dev/hsmp",
        domain: "amd_hsmp_exporter_t",
        args: "open /dev/hsmp",
        refused: Some(("chr_file", "amd_hsmp_device_t")),
    },
    Probe {
        what: "the exporter's domain opens /dev/cpu/0/msr",
        domain: "amd_hsmp_exporter_t",
        args: "open /dev/cpu/0/msr",
        refused: Some(("chr_file", "cpu_device_t")),
    },
    Probe {
        what: "the broker's domain creates a TCP socket",
        domain: "amd_hsmp_broker_t",
        args: "tcp",
        refused: Some(("tcp_socket", "amd_hsmp_broker_t")),
    },
    Probe {
        what: "the broker's domain creates a UDP socket",
        domain: "amd_hsmp_broker_t",
        args: "udp",
        refused: Some(("udp_socket", "amd_hsmp_broker_t")),
    },
    Probe {
        what: "the broker's domain creates a file under /etc",
        domain: "amd_hsmp_broker_t",
        args: "create /etc/amd-hsmp-confine-probe",
        refused: Some(("dir", "etc_t")),
    },
    Probe {
        what: "the broker's domain opens /dev/cpu/0/msr, amd_hsmp_broker_use_msr off",
        domain: "amd_hsmp_broker_t",
        args: "open /dev/cpu/0/msr",
        refused: Some(("chr_file", "cpu_device_t")),
    },
];

/// Runs the probe binary as `domain` (or in the agent's own unconfined domain with `None`),
/// as root, with every descriptor closed; returns its pid and exit code (the errno).
fn probe(vm: &mut Vm, domain: Option<&str>, args: &str) -> Result<(u32, i32)> {
    let (exe, runcon) = match domain {
        Some(d) => (
            if d.contains("broker") { PROBE_BROKER } else { PROBE_EXPORTER },
            format!("runcon -t {d} "),
        ),
        None => ("/root/vm/confine-probe", String::new()),
    };
    let out = vm.run(
        &format!(
            "bash -c 'echo $$; exec {runcon}{exe} {args} 0<&- 1>&- 2>&- 3>&-'; echo \"rc $?\""
        ),
        COMMAND_TIMEOUT,
    )?;
    let mut lines = out.text.lines();
    let pid = lines.next().and_then(|l| l.trim().parse().ok());
    let rc = lines.find_map(|l| l.strip_prefix("rc ")).and_then(|r| r.trim().parse().ok());
    match (pid, rc) {
        (Some(pid), Some(rc)) => Ok((pid, rc)),
        _ => bail!("the probe printed no pid and exit code: {}", out.text),
    }
}

/// The probe, copied and labelled as each domain's entry point.
const PROBE_BROKER: &str = "/usr/local/libexec/amd-hsmp-probe-broker";

const PROBE_EXPORTER: &str = "/usr/local/libexec/amd-hsmp-probe-exporter";

/// Check C: every probe refused by SELinux (where root in the agent's unconfined domain
/// succeeds), each refusal with its AVC record; the MSR boolean on lets the broker's domain open
/// the MSR device. Returns the verdict and the provoked records, which check A leaves out.
pub(super) fn confinement(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let mut ev = Evidence::default();
    let setup = vm.run(
        &format!(
            "modprobe msr && mkdir -p /usr/local/libexec && \
             cp /root/vm/confine-probe {PROBE_BROKER} && cp /root/vm/confine-probe {PROBE_EXPORTER} && \
             chcon -t amd_hsmp_broker_exec_t {PROBE_BROKER} && \
             chcon -t amd_hsmp_exporter_exec_t {PROBE_EXPORTER} && ls -Z {PROBE_BROKER} {PROBE_EXPORTER}"
        ),
        COMMAND_TIMEOUT,
    )?;
    ev.check(setup.ok(), format!("probes labelled: {}", setup.text.trim().replace('\n', "; ")));
    let mut pids = Vec::new();
    for p in PROBES {
        let (_, control) = probe(vm, None, p.args)?;
        let (pid, rc) = probe(vm, Some(p.domain), p.args)?;
        ev.check(
            control == 0 && rc == libc::EACCES,
            format!(
                "{}: refused with errno {rc} (13 is EACCES; root outside the domain: errno {control})",
                p.what
            ),
        );
        pids.push((p, pid));
    }
    let on = vm.run(
        "setsebool amd_hsmp_broker_use_msr on && getsebool amd_hsmp_broker_use_msr",
        COMMAND_TIMEOUT,
    )?;
    let (_, allowed) = probe(vm, Some("amd_hsmp_broker_t"), "open /dev/cpu/0/msr")?;
    let off = vm.run(
        "setsebool amd_hsmp_broker_use_msr off && getsebool amd_hsmp_broker_use_msr",
        COMMAND_TIMEOUT,
    )?;
    ev.check(
        on.ok() && allowed == 0 && off.ok(),
        format!(
            "with {} the broker's domain opens /dev/cpu/0/msr: errno {allowed}; then {}",
            on.text.trim(),
            off.text.trim()
        ),
    );
    let log = vm.run(AUDIT_LOG, COMMAND_TIMEOUT)?;
    let records = avc_records(&log.text);
    let mut provoked = Vec::new();
    for (p, pid) in pids {
        let Some((class, target)) = p.refused else { continue };
        let mine = records_of(&records, pid);
        let matched = is_one_refusal(&mine, p.domain, class, target);
        ev.check(
            matched,
            format!(
                "{}: {} AVC record(s) of pid {pid}, want one {class} on {target}: {}",
                p.what,
                mine.len(),
                mine.join(" | ")
            ),
        );
        provoked.extend(mine.iter().map(|r| r.to_string()));
    }
    ctx.provoked = provoked;
    Ok(ev.verdict("confinement from inside: each refusal is SELinux's, with its AVC"))
}

/// The records of `records` that process `pid` left.
fn records_of<'a>(records: &[&'a str], pid: u32) -> Vec<&'a str> {
    records.iter().copied().filter(|r| r.contains(&format!(" pid={pid} "))).collect()
}

/// Whether `records` are exactly one refusal, enforced, of class `class` on type `target` to
/// `domain`.
fn is_one_refusal(records: &[&str], domain: &str, class: &str, target: &str) -> bool {
    records.len() == 1
        && records.iter().all(|r| {
            r.contains(&format!(":{domain}:"))
                && r.contains(&format!(" tclass={class} "))
                && r.contains(&format!(":{target}:"))
                && r.contains("permissive=0")
        })
}

/// Runs the confinement probe with `args` as root outside any of the module's domains, then in
/// `domain`, which must refuse it with `EACCES` and exactly one AVC record of `class` on
/// `target`; adds both to `ev` and returns that record (for check A to leave out).
pub(super) fn refused(
    vm: &mut Vm,
    ev: &mut Evidence,
    what: &str,
    domain: &str,
    args: &str,
    (class, target): (&str, &str),
) -> Result<Vec<String>> {
    let (_, control) = probe(vm, None, args)?;
    let (pid, rc) = probe(vm, Some(domain), args)?;
    ev.check(
        control == 0 && rc == libc::EACCES,
        format!(
            "{what}: refused with errno {rc} (13 is EACCES; root outside the domain: errno {control})"
        ),
    );
    let log = vm.run(AUDIT_LOG, COMMAND_TIMEOUT)?;
    let records = avc_records(&log.text);
    let mine = records_of(&records, pid);
    ev.check(
        is_one_refusal(&mine, domain, class, target),
        format!(
            "{what}: {} AVC record(s) of pid {pid}, want one {class} on {target}: {}",
            mine.len(),
            mine.join(" | ")
        ),
    );
    Ok(mine.iter().map(|r| r.to_string()).collect())
}

/// Runs the confinement probe with `args` as root in `domain`, which must allow it; adds that
/// to `ev`.
pub(super) fn allowed(
    vm: &mut Vm,
    ev: &mut Evidence,
    what: &str,
    domain: &str,
    args: &str,
) -> Result<()> {
    let (_, rc) = probe(vm, Some(domain), args)?;
    ev.check(rc == 0, format!("{what}: errno {rc} (0: allowed)"));
    Ok(())
}

/// The AVC records (`type=1400`, and `type=1107` from user-space object managers such as
/// systemd) of a kernel log, one string each from `avc:` on.
fn avc_records(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("type=1400") || l.contains("type=1107"))
        .filter_map(|l| l.find("avc:").map(|i| &l[i..]))
        .filter(|r| r.contains(" denied "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avc_denials_are_read_from_the_kernel_log_and_grants_are_not() {
        let log = "[   12.5] audit: type=1400 audit(1.2:3): avc:  denied  { read } for  pid=9 \
                   comm=\"p\" scontext=system_u:system_r:amd_hsmp_exporter_t:s0 \
                   tcontext=system_u:object_r:amd_hsmp_device_t:s0 tclass=chr_file permissive=0\n\
                   [   12.6] audit: type=1400 audit(1.2:4): avc:  granted  { setsecparam }\n\
                   [   12.7] audit: type=1107 audit(1.2:5): pid=1 uid=0 msg='avc:  denied  \
                   { start } for auid=n/a'\n[   13.0] random line avc: denied\n";
        let records = avc_records(log);
        assert_eq!(records.len(), 2, "{records:?}");
        assert!(records[0].starts_with("avc:  denied  { read }"));
        assert!(records[0].contains("amd_hsmp_exporter_t"));
    }
}
