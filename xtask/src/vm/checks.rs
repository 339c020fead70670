//! The checks run against the booted guest, in order, each a PASS or FAIL with its evidence.
//!
//! Values are compared with what the responder's simulator answers (static mode: nothing moves
//! unless the test sets it), so "exact" means exact.

mod device;
mod exporter;
mod package;
mod perf;
mod selinux;
mod units;
mod upgrade;
mod venice;

use super::guest::{Output, Vm};
use super::previous::Releases;
use super::responder::Responder;
use anyhow::{Result, bail};
use std::time::Duration;

use device::{faults, message_time_ratio, protocol_5, protocol_7, two_sockets};
use exporter::Scrape;
use package::{driver, operator_check, package};
use perf::{perf_with_drop_in, perf_without_drop_in, power_core_pmu};
use selinux::{avc_denials, confinement, domains, selinux};
use units::{sandbox, web_config};
use upgrade::upgrade;
use venice::venice;

/// Most a guest command may take (TCG is slow; `apt-get install` is the longest but one).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Most the SELinux module's installation may take: `semodule` rebuilds the whole policy, 95 s
/// on the Milan guest under TCG and past [`COMMAND_TIMEOUT`] once on the Venice guest. A bound
/// against a hung guest, not a figure the check asserts.
const POLICY_TIMEOUT: Duration = Duration::from_secs(300);

/// One check's result.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Its number in the list (3 and 3b: protocol 7 and 5).
    pub id: String,
    /// What it checks.
    pub name: String,
    /// Whether it passed.
    pub pass: bool,
    /// The evidence, or what failed.
    pub detail: String,
    /// Time since the previous verdict (or the start of the checks), seconds.
    pub seconds: f64,
}

/// Builds one verdict from a list of (condition, evidence) items: it passes if all hold.
#[derive(Debug, Default)]
struct Evidence {
    items: Vec<(bool, String)>,
}

impl Evidence {
    fn check(&mut self, ok: bool, what: impl Into<String>) -> bool {
        self.items.push((ok, what.into()));
        ok
    }

    fn failed(&self) -> bool {
        self.items.iter().any(|(ok, _)| !ok)
    }

    /// Adds what the units logged lately, as evidence for a failure.
    fn journal(&mut self, vm: &mut Vm) -> Result<()> {
        let log = vm.run(
            "journalctl --no-pager -o short-monotonic -n 30 -u amd-hsmp-broker.service \
             -u amd-hsmp-exporter.service",
            COMMAND_TIMEOUT,
        )?;
        for line in log.text.lines() {
            self.items.push((true, format!("journal: {line}")));
        }
        Ok(())
    }

    /// The verdict; the check table gives its id.
    fn verdict(self, name: &str) -> Verdict {
        let pass = self.items.iter().all(|(ok, _)| *ok);
        let detail = self
            .items
            .iter()
            .map(|(ok, what)| format!("{} {what}", if *ok { "ok  " } else { "FAIL" }))
            .collect::<Vec<_>>()
            .join("\n");
        Verdict { id: String::new(), name: name.into(), pass, detail, seconds: 0.0 }
    }
}

/// A check: what it finds on the guest, as a verdict (its id is the table's).
type Check = fn(&mut Ctx<'_>) -> Result<Verdict>;

/// The checks in the order they run, as docs/testing.md ("The checks") lists them; a check may
/// use what an earlier one left in the [`Ctx`].
const CHECKS: &[(&str, Check)] = &[
    ("1", driver),
    ("2", package),
    ("S", selinux),
    ("3", protocol_7),
    ("D", domains),
    ("4", faults),
    ("5", sandbox),
    ("6", two_sockets),
    ("7", message_time_ratio),
    ("W", web_config),
    ("C", confinement),
    ("K", operator_check),
    ("3b", protocol_5),
    ("P", power_core_pmu),
    ("E", perf_without_drop_in),
    ("F", perf_with_drop_in),
    ("A", avc_denials),
];

/// The checks of the second boot, a Venice-like guest, after [`CHECKS`]: check U ends the run,
/// since it purges the package the set-up installed.
const VENICE_CHECKS: &[(&str, Check)] = &[("V", venice), ("U", upgrade)];

/// The guests the test boots, one after the other, each with its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// A Milan (family 0x19, model 0x01), a part `--check` knows: every check but V and U.
    Milan,
    /// A Venice-like part (family 0x1A, model 0x50, a Zen 6 this release does not know, APIC
    /// ids above 255): checks V and U.
    Venice,
}

impl Guest {
    /// QEMU's `-cpu` for it.
    pub fn cpu(self) -> String {
        match self {
            Guest::Milan => "EPYC-Milan".into(),
            Guest::Venice => {
                format!("EPYC-Milan,family={},model={},x2apic=on", venice::FAMILY, venice::MODEL)
            }
        }
    }

    fn checks(self) -> &'static [(&'static str, Check)] {
        match self {
            Guest::Milan => CHECKS,
            Guest::Venice => VENICE_CHECKS,
        }
    }
}

/// What the checks share: the guest, the responder, what the set-up found, and what one check
/// leaves for a later one.
struct Ctx<'a> {
    vm: &'a mut Vm,
    responder: &'a Responder,
    /// This checkout's revision and the previous release's package (check U).
    releases: &'a Releases,
    /// The system state once the guest settled, before the package (check 2).
    settled: Output,
    /// SELinux as booted (check S).
    booted: Output,
    /// `selinux/install.sh` and the seconds it took (check S).
    policy: (Output, f64),
    /// `apt-get install` of the package (check 2).
    install: Output,
    /// udev loading the driver from our SSDT (check 1).
    load: Output,
    /// Check 3's scrape at protocol 7 and the messages each mailbox had answered before and after
    /// it (check 6).
    protocol_7: Option<(Scrape, Vec<u64>, Vec<u64>)>,
    /// The slowest of three healthy scrapes, measured by check 4 (the bound of checks 4 and 5).
    guest_cost: Option<f64>,
    /// The AVC records checks C and E provoked and matched (check A leaves them out).
    provoked: Vec<String>,
    /// The `power_core` PMU's type, once check P loaded it.
    pmu_type: Option<u32>,
}

/// Runs the checks in order and returns every verdict; an error is a broken step (the guest
/// stopped answering), not a failed check.
pub fn run_all(
    guest: Guest,
    vm: &mut Vm,
    responder: &Responder,
    releases: &Releases,
    report: &mut dyn FnMut(&Verdict),
) -> Result<Vec<Verdict>> {
    // Check 1's time includes the set-up's.
    let mut since = std::time::Instant::now();
    let mut ctx = prepare(vm, responder, releases)?;
    let mut verdicts = Vec::new();
    for (id, check) in guest.checks() {
        let mut v = check(&mut ctx)?;
        v.id = (*id).to_string();
        v.seconds = since.elapsed().as_secs_f64();
        since = std::time::Instant::now();
        report(&v);
        verdicts.push(v);
    }
    if let Some(e) = responder.error() {
        bail!("the responder stopped: {e}");
    }
    Ok(verdicts)
}

/// Runs a shell command on the guest.
fn sh(vm: &mut Vm, script: &str) -> Result<Output> {
    vm.run(script, COMMAND_TIMEOUT)
}

/// Before the checks: the guest's APIC ids, SELinux as booted, the policy module and the package
/// installed, the driver loaded.
fn prepare<'a>(
    vm: &'a mut Vm,
    responder: &'a Responder,
    releases: &'a Releases,
) -> Result<Ctx<'a>> {
    let topo = responder.topology();
    // The guest's APIC ids must be the ones the responder translates.
    let apic = sh(vm, "awk -F': ' '/^apicid/ {print $2}' /proc/cpuinfo")?;
    let want: Vec<String> = (0..topo.sockets)
        .flat_map(|s| (0..topo.cores).map(move |c| topo.apic_id(s, c).to_string()))
        .collect();
    let got: Vec<&str> = apic.text.lines().collect();
    if got != want {
        bail!("the guest's APIC ids are {got:?}, the responder expects {want:?}");
    }
    let settled =
        sh(vm, "systemctl is-system-running --wait; systemctl --failed --plain --no-legend")?;

    // SELinux as booted, then the policy module installed the way the -selinux package's
    // %post installs it (selinux/install.sh, its very text), before the package as an RPM
    // transaction orders them.
    let booted = sh(
        vm,
        "echo \"mode $(getenforce)\"; echo \"lsm $(cat /sys/kernel/security/lsm)\"; \
         echo \"pid1 $(ps -o label= -p 1)\"; echo \"agent $(ps -o label= -p $$)\"; \
         ls -Z /usr/lib/systemd/systemd",
    )?;
    let policy_started = std::time::Instant::now();
    let policy = vm.run(
        "policytype=default module=/root/vm/amd_hsmp.pp.bz2 sh -e /root/vm/install.sh",
        POLICY_TIMEOUT,
    )?;
    let policy_seconds = policy_started.elapsed().as_secs_f64();
    // Install the package as an operator does, then let udev load the driver from our SSDT.
    let install = sh(vm, "apt-get install -y /root/vm/amd-hsmp-exporter.deb")?;
    let load = sh(
        vm,
        "rm /etc/modprobe.d/vm-test-hold-hsmp.conf && udevadm trigger --action=add \
         --subsystem-match=acpi && udevadm settle && lsmod | grep -E '^hsmp_(acpi|common) '",
    )?;
    Ok(Ctx {
        vm,
        responder,
        releases,
        settled,
        booted,
        policy: (policy, policy_seconds),
        install,
        load,
        protocol_7: None,
        guest_cost: None,
        provoked: Vec::new(),
        pmu_type: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table runs each check once, in the order docs/testing.md's "The checks" lists them
    /// (`1.` or `**S.**` at the start of a line).
    #[test]
    fn the_check_table_has_unique_ids_in_the_documented_order() {
        let doc =
            std::fs::read_to_string(crate::workspace::root().join("docs/testing.md")).unwrap();
        let section = doc.split("\n### The checks\n").nth(1).unwrap();
        let section = section.split("\n#").next().unwrap();
        let mut documented: Vec<&str> = Vec::new();
        for line in section.lines() {
            let marker = line.strip_prefix("**").and_then(|l| l.split_once(".**")).map(|(m, _)| m);
            let marker = marker.or_else(|| {
                line.split_once(". ")
                    .map(|(m, _)| m)
                    .filter(|m| m.len() <= 2 && m.starts_with(|c: char| c.is_ascii_digit()))
            });
            if let Some(m) = marker.filter(|m| !documented.contains(m)) {
                documented.push(m);
            }
        }
        let ids: Vec<&str> = CHECKS.iter().chain(VENICE_CHECKS).map(|(id, _)| *id).collect();
        let unique: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "{ids:?}");
        assert_eq!(ids, documented);
    }

    #[test]
    fn a_verdict_fails_when_one_item_fails() {
        let mut ev = Evidence::default();
        ev.check(true, "a");
        ev.check(false, "b");
        let v = ev.verdict("x");
        assert!(!v.pass);
        assert!(v.detail.contains("FAIL b"));
    }
}
