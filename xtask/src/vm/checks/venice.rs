//! Check V, on a second boot: a Venice-like guest (family 0x1A, model 0x50, a Zen 6 this
//! release does not know) whose second socket's APIC ids are above 255, the driver bound
//! through ACPI, the responder at protocol 7.

use super::exporter::{healthy, scrape, wait_for_exporter};
use super::package::{bound_through_acpi, while_energy_advances};
use super::perf::source_of;
use super::{COMMAND_TIMEOUT, Ctx, Evidence, Verdict, sh};
use anyhow::Result;

/// The family and model the guest's CPUID reports (QEMU's `family=` and `model=`), decimal as
/// `/proc/cpuinfo` prints them.
pub(crate) const FAMILY: u32 = 0x1A;
/// See [`FAMILY`].
pub(crate) const MODEL: u32 = 0x50;

/// Check V: the guest's CPU is family 0x1A model 0x50, socket 1's APIC ids above 255; both AMDI0097 devices bound to
/// hsmp_acpi; the broker serves exact values and energy from HSMP RAPL; `--check` exits 0 with
/// a WARN `cpu` line naming the family and model.
pub(super) fn venice(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let responder = ctx.responder;
    let topo = responder.topology();
    let mut ev = Evidence::default();
    let cpuinfo = sh(vm, "grep -E '^(cpu family|model)\\s*:' /proc/cpuinfo | sort | uniq -c")?;
    let cpus = topo.sockets * topo.cores;
    let want = format!("{cpus} cpu family\t: {FAMILY}\n{cpus} model\t\t: {MODEL}");
    let got: Vec<String> =
        cpuinfo.text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    let want: Vec<String> =
        want.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    ev.check(got == want, format!("/proc/cpuinfo: {got:?} (expected {want:?})"));
    // The set-up compared every APIC id with the responder's; socket 1's are above 255 here.
    let apic = sh(vm, "awk -F': ' '/^apicid/ {print $2}' /proc/cpuinfo | tr '\\n' ' '")?;
    let high = topo.apic_id(topo.sockets - 1, 0);
    ev.check(
        high > 255 && apic.text.split_whitespace().any(|a| a == high.to_string()),
        format!("APIC ids {} (socket {} from {high})", apic.text.trim(), topo.sockets - 1),
    );
    bound_through_acpi(&mut ev, vm, &ctx.load, topo.sockets)?;
    wait_for_exporter(vm)?;
    let s = scrape(vm, 10.0)?;
    healthy(&mut ev, responder, &s, 7, true)?;
    let source = source_of(&s);
    ev.check(source.as_deref() == Some("hsmp"), format!("energy source {source:?}"));
    let check = while_energy_advances(responder, || {
        vm.run("runcon -t unconfined_t -- bash -c 'amd-hsmp-check'", COMMAND_TIMEOUT)
    })?;
    let failed = check.text.lines().filter(|l| l.starts_with("FAIL")).count();
    ev.check(check.ok() && failed == 0, format!("--check: exit {}, {failed} FAIL lines", check.rc));
    let cpu = check.text.lines().find(|l| l.split_whitespace().nth(1) == Some("cpu"));
    let part = format!("family {FAMILY:#x} model {MODEL:#x}");
    ev.check(
        cpu.is_some_and(|l| l.starts_with("WARN") && l.contains(&part)),
        format!("--check's cpu line names {part} as a warning: {cpu:?}"),
    );
    if ev.failed() {
        for line in check.text.lines() {
            ev.check(true, format!("  {line}"));
        }
        ev.journal(vm)?;
    }
    Ok(ev.verdict(
        "Venice-like guest (family 0x1a, model 0x50): binds, energy from HSMP RAPL, --check warns",
    ))
}
