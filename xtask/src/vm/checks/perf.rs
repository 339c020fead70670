//! Checks P, E and F: the guest's `power_core` PMU (the test's module over the responder's
//! counters, the guest having no RAPL of its own) presented and counting as the kernel's
//! `rapl.c`; the broker's perf energy source on a firmware without HSMP RAPL (protocol 5, as
//! Genoa's), without and with the perf drop-in.

use super::exporter::{Scrape, core_labels, healthy, scrape, wait_for_exporter};
use super::package::while_energy_advances;
use super::{COMMAND_TIMEOUT, Ctx, Evidence, Verdict, sh};
use crate::vm::guest::Vm;
use crate::vm::mailbox::{WINDOW_BASE, WINDOW_SIZE};
use crate::vm::pmu::TABLE_OFFSET;
use crate::vm::prepare::POWER_CORE_MODULE;
use crate::vm::responder::{GuestTopology, Responder};
use crate::vm::sim::Machine;
use anyhow::{Context, Result, bail};

/// Where the guest finds PMUs.
const PMU_ROOT: &str = "/sys/bus/event_source/devices";

/// The counter of core `core` of socket `socket` before the counting test: socket 1's last core
/// starts 1000 steps below the 32-bit wrap, so that the test's step crosses it.
fn start_counter(socket: u32, core: u32, cores: u32) -> u64 {
    if socket == 1 && core + 1 == cores {
        (1 << 32) - 1000
    } else {
        (u64::from(socket) << 40) | (u64::from(core) << 20)
    }
}

/// Whether core `core` of socket `socket`'s step crosses the 32-bit wrap of its raw counter.
fn crosses_wrap(socket: u32, core: u32, cores: u32) -> bool {
    let start = start_counter(socket, core, cores) as u32;
    start.checked_add(step(socket, core) as u32).is_none()
}

/// The steps core `core` of socket `socket` draws during the counting test, each core its own.
fn step(socket: u32, core: u32) -> u64 {
    5000 + 100 * u64::from(core) + 10_000 * u64::from(socket)
}

/// The attributes of the kernel's `power_core` PMU (`arch/x86/events/rapl.c`), relative to its
/// directory, with the value each must hold (the cpumask is checked apart).
const RAPL_ATTRIBUTES: &[(&str, &str)] = &[
    ("events/energy-core", "event=0x01"),
    ("events/energy-core.scale", "2.3283064365386962890625e-10"),
    ("events/energy-core.unit", "Joules"),
    ("format/event", "config:0-7"),
];

/// Seconds each event of the counting test stays open between its two reads.
const COUNT_WINDOW_S: u32 = 6;

/// Check P's name.
const NAME: &str = "power_core PMU as rapl.c presents it, counting the simulator's steps";

/// Check P: no RAPL in the guest; the module's `power_core` as rapl.c's; each core's count the
/// simulator's steps, scaled to 2^-32 J, across a 32-bit wrap.
pub(super) fn power_core_pmu(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let responder = ctx.responder;
    let topo = responder.topology();
    let mut ev = Evidence::default();
    no_rapl_in_guest(vm, &mut ev)?;
    let Some(pmu_type) = load_power_core(vm, &mut ev, topo)? else {
        return Ok(ev.verdict(NAME));
    };
    ctx.pmu_type = Some(pmu_type);
    count_power_core(vm, responder, &mut ev, pmu_type)?;
    Ok(ev.verdict(NAME))
}

/// Sets each core's energy counter in `machine`'s firmware to its [`start_counter`].
fn set_start_counters(machine: &Machine, topo: GuestTopology) -> Result<()> {
    let fw = machine.firmware();
    for socket in 0..topo.sockets {
        for core in 0..topo.cores {
            fw.set_energy_counter(socket, core, start_counter(socket, core, topo.cores))?;
        }
    }
    Ok(())
}

/// Steps each core's energy counter in `machine`'s firmware from its [`start_counter`] by its
/// own [`step`].
fn step_counters(machine: &Machine, topo: GuestTopology) -> Result<()> {
    let fw = machine.firmware();
    for socket in 0..topo.sockets {
        for core in 0..topo.cores {
            let start = start_counter(socket, core, topo.cores);
            fw.set_energy_counter(socket, core, start + step(socket, core))?;
        }
    }
    Ok(())
}

/// Check P's first step: the guest's CPU has no RAPL, neither CPUID flag nor power PMU, and its
/// RAPL MSRs read 0.
fn no_rapl_in_guest(vm: &mut Vm, ev: &mut Evidence) -> Result<()> {
    // The guest's CPU has no RAPL: no CPUID flag (rapl.c matches AMD parts on it), so no power
    // PMU; TCG reads the RAPL MSRs, as every MSR it does not implement, as 0.
    let rapl = sh(
        vm,
        &format!(
            "modprobe msr; echo \"flag $(grep -cw rapl /proc/cpuinfo)\"; \
             echo \"pmus $(ls {PMU_ROOT} | tr '\\n' ' ')\"; \
             for msr in 0xc0010299 0xc001029a; do perl -e 'open(my $f, \"<\", \"/dev/cpu/0/msr\") \
             or die \"open: $!\"; sysseek($f, hex($ARGV[0]), 0); my $n = sysread($f, my $b, 8); \
             printf \"msr %s %s\\n\", $ARGV[0], defined $n ? sprintf(\"%#x\", unpack(\"Q<\", $b)) \
             : \"$!\"' $msr; done"
        ),
    )?;
    let said = |key: &str| {
        rapl.text
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{key} ")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let msrs = said("msr");
    ev.check(
        said("flag") == "0"
            && !said("pmus").split_whitespace().any(|p| p.starts_with("power"))
            && msrs.split("; ").all(|m| m.ends_with(" 0") || m.ends_with(" 0x0")),
        format!(
            "no RAPL in the guest: rapl CPUID flag on {} CPUs; PMUs: {}; MSR_AMD_RAPL_POWER_UNIT and \
             MSR_AMD_CORE_ENERGY_STATUS read {msrs} (TCG's value for an MSR it does not implement)",
            said("flag"),
            said("pmus").trim()
        ),
    );
    Ok(())
}

/// Check P's second step: the module loaded, its `power_core` PMU's attributes as rapl.c's and
/// its cpumask every CPU; the PMU's type, `None` when the PMU has none.
fn load_power_core(vm: &mut Vm, ev: &mut Evidence, topo: GuestTopology) -> Result<Option<u32>> {
    let load = sh(
        vm,
        &format!(
            "insmod /usr/lib/modules/$(uname -r)/extra/{POWER_CORE_MODULE} base={WINDOW_BASE:#x} \
             stride={WINDOW_SIZE:#x} table_offset={TABLE_OFFSET:#x} >/dev/null 2>&1; rc=$?; \
             dmesg | grep -E 'power_core_sim|avc: .*insmod' | tail -n 3; exit $rc"
        ),
    )?;
    ev.check(load.ok(), format!("insmod {POWER_CORE_MODULE}: {}", load.text.trim()));
    let dir = format!("{PMU_ROOT}/power_core");
    let attrs = sh(
        vm,
        &format!(
            "cd {dir} && for f in type cpumask events/* format/*; do echo \"$f=$(cat $f)\"; done"
        ),
    )?;
    let value = |name: &str| {
        attrs.text.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).map(str::to_string)
    };
    for (name, want) in RAPL_ATTRIBUTES {
        let got = value(name);
        ev.check(got.as_deref() == Some(*want), format!("{dir}/{name}: {got:?} (rapl.c: {want})"));
    }
    let all_cpus = format!("0-{}", topo.sockets * topo.cores - 1);
    let cpumask = value("cpumask");
    ev.check(
        cpumask.as_deref() == Some(all_cpus.as_str()),
        format!("{dir}/cpumask: {cpumask:?} (one CPU per core, no SMT: {all_cpus})"),
    );
    let files = attrs.text.lines().count();
    ev.check(files == 2 + RAPL_ATTRIBUTES.len(), format!("{files} attributes, no more"));
    let Some(pmu_type) = value("type").and_then(|t| t.parse::<u32>().ok()) else {
        ev.check(false, format!("no type in {dir}: {}", attrs.text.trim()));
        return Ok(None);
    };
    Ok(Some(pmu_type))
}

/// Check P's last step: every CPU's event open over a window in which each core's counter steps
/// by its own amount, each count the simulator's step; the probes' output when one is not.
fn count_power_core(
    vm: &mut Vm,
    responder: &Responder,
    ev: &mut Evidence,
    pmu_type: u32,
) -> Result<()> {
    let topo = responder.topology();
    // Counting: every CPU's event open over a window in which each core's counter steps by its
    // own amount; socket 1's last core across the 32-bit wrap.
    let machine = responder.machine();
    set_start_counters(&machine, topo)?;
    // Past two table updates, so that every event opens on the start values.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let cpus = topo.sockets * topo.cores;
    let started = sh(
        vm,
        &format!(
            "for cpu in $(seq 0 {}); do /root/vm/confine-probe perf {pmu_type} $cpu {COUNT_WINDOW_S} \
             > /run/perf-count.$cpu 2>&1 & done; sleep 1; cat /run/perf-count.*",
            cpus - 1
        ),
    )?;
    ev.check(
        started.ok(),
        format!("{cpus} events opened: {} first reads", started.text.lines().count()),
    );
    step_counters(&machine, topo)?;
    // Until every event's second read is in (each probe reads COUNT_WINDOW_S after its first).
    let counts = sh(
        vm,
        &format!(
            "for i in $(seq 300); do [ $(cat /run/perf-count.* | wc -l) -ge {} ] && break; \
             sleep 0.1; done; head /run/perf-count.*",
            2 * cpus
        ),
    )?;
    let esu = u32::from(machine.spec().esu);
    for socket in 0..topo.sockets {
        for core in 0..topo.cores {
            let cpu = socket * topo.cores + core;
            let reads = count_reads(&counts.text, cpu);
            let want = step(socket, core) << (32 - esu);
            let got = match reads[..] {
                [first, second] => Some(second.wrapping_sub(first)),
                _ => None,
            };
            ev.check(
                got == Some(want),
                format!(
                    "cpu {cpu} (socket {socket} core {core}): counted {got:?} x 2^-32 J over the \
                     window, the simulator stepped {} x 2^-{esu} J (= {want}){}",
                    step(socket, core),
                    if crosses_wrap(socket, core, topo.cores) {
                        ", across the 32-bit wrap"
                    } else {
                        ""
                    }
                ),
            );
        }
    }
    if ev.failed() {
        ev.check(true, format!("probe output: {}", counts.text.trim().replace('\n', " | ")));
    }
    Ok(())
}

/// The counts of CPU `cpu` in `head`'s output of the `/run/perf-count.N` files.
fn count_reads(text: &str, cpu: u32) -> Vec<u64> {
    let header = format!("==> /run/perf-count.{cpu} <==");
    text.split("\n\n")
        .find(|block| block.trim_start().starts_with(&header))
        .map(|block| {
            block
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The perf drop-in as the package ships it, and where an operator installs it.
const PERF_DROP_IN: (&str, &str) = (
    "/usr/share/amd-hsmp-exporter/perf-energy.conf",
    "/etc/systemd/system/amd-hsmp-broker.service.d/perf-energy.conf",
);

/// The MSR drop-in, likewise.
const MSR_DROP_IN: (&str, &str) = (
    "/usr/share/amd-hsmp-exporter/msr-fallback.conf",
    "/etc/systemd/system/amd-hsmp-broker.service.d/msr-fallback.conf",
);

/// The policy's rules for the perf source (`selinux/amd_hsmp.te`), each of which the broker must
/// be seen to use.
const GRANTED: &[(&str, &[&str])] =
    &[("perf_event", &["open", "cpu", "kernel", "read"]), ("capability2", &["perfmon"])];

/// (class, permission) of every AVC "granted" record of the broker's domain in the kernel log
/// (the confinement probe's excepted).
fn granted(vm: &mut Vm) -> Result<Vec<(String, String)>> {
    let log = sh(vm, "dmesg | grep -a 'avc:  granted' | grep -a ':amd_hsmp_broker_t:'")?;
    let mut out = Vec::new();
    for record in log.text.lines().filter(|l| !l.contains("comm=\"amd-hsmp-probe")) {
        let perms = record.split_once("{ ").and_then(|(_, r)| r.split_once(" }")).map(|(p, _)| p);
        let class = record.split_once(" tclass=").and_then(|(_, r)| r.split_whitespace().next());
        if let (Some(perms), Some(class)) = (perms, class) {
            out.extend(perms.split_whitespace().map(|p| (class.to_string(), p.to_string())));
        }
    }
    Ok(out)
}

/// `CAP_SYS_RAWIO`, the MSR drop-in's capability: never the perf source's.
const CAP_SYS_RAWIO: u32 = 17;
/// `CAP_PERFMON`, the perf drop-in's capability.
const CAP_PERFMON: u32 = 38;

/// Both units stopped, the exporter started again; the first scrape starts the broker, which
/// chooses its energy source. Returns that scrape.
fn fresh_broker(vm: &mut Vm) -> Result<Scrape> {
    let restart = sh(
        vm,
        "systemctl daemon-reload && systemctl stop amd-hsmp-exporter.service amd-hsmp-broker.service \
         && systemctl start amd-hsmp-exporter.service",
    )?;
    if !restart.ok() {
        bail!("cannot restart the units: {}", restart.text);
    }
    wait_for_exporter(vm)?;
    scrape(vm, 10.0)
}

/// The broker's start-up line naming its energy source (chosen, or none) since its last start.
fn source_line(vm: &mut Vm) -> Result<String> {
    let out = sh(
        vm,
        "since=$(systemctl show -p ExecMainStartTimestamp --value amd-hsmp-broker.service \
         | xargs -I{} date -d {} +%s); for i in $(seq 50); do \
         line=$(journalctl -u amd-hsmp-broker.service -o cat --no-pager --since=@$since \
         | grep -E 'core energy source' | tail -n 1); [ -n \"$line\" ] && break; sleep 0.1; done; \
         echo \"$line\"",
    )?;
    Ok(out.text.trim().to_string())
}

/// `amd-hsmp-check` as an operator runs it, while the simulator's energy advances (its
/// energy line waits for that); its exit code, `perf` line and the other lines that failed or
/// warned.
fn check_perf_line(vm: &mut Vm, responder: &Responder) -> Result<(i32, String, Vec<String>)> {
    let out = while_energy_advances(responder, || {
        vm.run("runcon -t unconfined_t -- bash -c 'amd-hsmp-check'", COMMAND_TIMEOUT)
    })?;
    let line = out
        .text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("perf"))
        .unwrap_or("(no perf line)")
        .to_string();
    let other: Vec<String> = out
        .text
        .lines()
        .filter(|l| l.starts_with("FAIL") || l.starts_with("WARN"))
        .filter(|l| l.split_whitespace().nth(1) != Some("perf"))
        .map(str::to_string)
        .collect();
    Ok((out.rc, line, other))
}

/// The source `amd_hsmp_core_energy_source_info` names with 1 in `s`, if any.
pub(super) fn source_of(s: &Scrape) -> Option<String> {
    s.samples
        .iter()
        .find(|x| x.name == "amd_hsmp_core_energy_source_info" && x.value == 1.0)
        .and_then(|x| x.labels.get("source").cloned())
}

/// Check E: without the drop-in, the broker cannot open the events: it serves no energy (never a
/// wrong value) and says why; `--check` names the drop-in.
pub(super) fn perf_without_drop_in(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let responder = ctx.responder;
    let mut ev = Evidence::default();
    let paranoid = sh(vm, "sysctl -n kernel.perf_event_paranoid")?;
    ev.check(
        true,
        format!("kernel.perf_event_paranoid {} (Debian's default)", paranoid.text.trim()),
    );
    let s = fresh_broker(vm)?;
    healthy(&mut ev, responder, &s, 5, false)?;
    ev.check(source_of(&s).is_none(), format!("energy source {:?}", source_of(&s)));
    let line = source_line(vm)?;
    ev.check(
        line.contains("perf_passed_over=") && line.contains("perf-energy.conf"),
        format!("start-up log: {line}"),
    );
    let (rc, perf, other) = check_perf_line(vm, responder)?;
    ev.check(
        rc == 1 && perf.starts_with("FAIL") && perf.contains(PERF_DROP_IN.1),
        format!("--check exit {rc}: {perf}; other lines not ok: {other:?}"),
    );
    if ev.failed() {
        ev.journal(vm)?;
    }
    Ok(ev.verdict("perf without the drop-in: no energy, the reason logged, --check names the fix"))
}

/// The capability sets of the broker's process, as `/proc/PID/status` has them.
fn broker_caps(vm: &mut Vm) -> Result<Vec<(String, u64)>> {
    let out = sh(
        vm,
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/$(systemctl show -p MainPID --value \
         amd-hsmp-broker.service)/status",
    )?;
    let mut sets = Vec::new();
    for line in out.text.lines() {
        let (key, value) = line.split_once(':').unwrap_or((line, ""));
        let bits = u64::from_str_radix(value.trim(), 16)
            .with_context(|| format!("bad capability line {line:?}"))?;
        sets.push((key.to_string(), bits));
    }
    Ok(sets)
}

/// The `systemd-analyze security` exposure of the broker's unit as loaded now.
fn broker_exposure(vm: &mut Vm) -> Result<f64> {
    let unit = "amd-hsmp-broker.service";
    let report = sh(vm, &format!("systemd-analyze security --no-pager {unit}"))?;
    crate::packaging::units::parse_exposure(&report.text, unit)
}

/// Check F: with the perf drop-in: at Debian's `perf_event_paranoid` 3 no wrong value; at 2,
/// source perf with each core's energy exactly the simulator's since the broker started,
/// across a wrap; no capability left and never `CAP_SYS_RAWIO`; the exporter's domain refused
/// the event even as root; the unit's exposure no higher than with the MSR drop-in.
pub(super) fn perf_with_drop_in(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let responder = ctx.responder;
    let topo = responder.topology();
    let pmu_type = ctx.pmu_type.context("check F runs after check P")?;
    let mut ev = Evidence::default();
    let install =
        sh(vm, &format!("install -D -m 0644 {} {} && ls -Z {1}", PERF_DROP_IN.0, PERF_DROP_IN.1))?;
    ev.check(install.ok(), format!("drop-in installed: {}", install.text.trim()));

    at_paranoid_3(vm, responder, &mut ev)?;

    let machine = responder.machine();
    set_start_counters(&machine, topo)?;
    audit_perf_rules(vm, &mut ev)?;
    let opened = open_at_paranoid_2(vm, &mut ev)?;
    step_counters(&machine, topo)?;
    let stepped = scrape(vm, 10.0)?;
    perf_rules_used(vm, &mut ev)?;
    energy_exact(&machine, topo, &mut ev, &opened, &stepped);
    let (rc, perf, other) = check_perf_line(vm, responder)?;
    ev.check(
        rc == 0 && perf.starts_with("ok") && other.is_empty(),
        format!("--check exit {rc}: {perf}; other lines not ok: {other:?}"),
    );

    no_capability_left(vm, &mut ev)?;
    only_the_broker_opens(vm, &mut ev, &mut ctx.provoked, pmu_type)?;
    exposure_against_msr(vm, &mut ev)?;
    if ev.failed() {
        ev.journal(vm)?;
    }
    Ok(ev.verdict("perf with the drop-in: exact energy, no capability left, exporter refused"))
}

/// Check F's first step: at Debian's `perf_event_paranoid` 3 the broker reads no wrong value,
/// names no source, and both its start-up log and `--check` name the sysctl to set.
fn at_paranoid_3(vm: &mut Vm, responder: &Responder, ev: &mut Evidence) -> Result<()> {
    // Debian's kernels refuse every perf_event_open without CAP_SYS_ADMIN above paranoid 2.
    let at_3 = fresh_broker(vm)?;
    let line = source_line(vm)?;
    let (rc, perf, _) = check_perf_line(vm, responder)?;
    let energy = at_3.samples.iter().filter(|x| x.name == "amd_hsmp_core_energy_joules_total");
    let wrong: Vec<String> =
        energy.filter(|x| x.value != 0.0).map(|x| format!("{:?} {}", x.labels, x.value)).collect();
    // Both name the sysctl, not the drop-in that is already there: root's --check holds
    // CAP_SYS_ADMIN and opens the events, the broker does not.
    let fix = "kernel.perf_event_paranoid=2";
    ev.check(
        wrong.is_empty()
            && source_of(&at_3).is_none()
            && line.contains(fix)
            && rc == 1
            && perf.starts_with("FAIL")
            && perf.contains(fix),
        format!(
            "at perf_event_paranoid 3: source {:?}, no wrong value ({} nonzero); start-up log: \
             {line}; --check exit {rc}: {perf}",
            source_of(&at_3),
            wrong.len()
        ),
    );
    Ok(())
}

/// Check F: loads a policy module auditing every use of [`GRANTED`] as granted, to show each
/// one is needed.
fn audit_perf_rules(vm: &mut Vm, ev: &mut Evidence) -> Result<()> {
    // Every use of the module's perf rules audited as granted, to show each one is needed.
    let audit = sh(
        vm,
        &format!(
            "printf '%s\\n' {} > /root/vm/perf_audit.cil && semodule -i /root/vm/perf_audit.cil",
            GRANTED
                .iter()
                .map(|(class, perms)| format!(
                    "'(auditallow amd_hsmp_broker_t self ({class} ({})))'",
                    perms.join(" ")
                ))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    )?;
    ev.check(
        audit.ok(),
        format!("auditallow module for the perf rules loaded: {}", audit.text.trim()),
    );
    Ok(())
}

/// Check F: at `perf_event_paranoid` 2 (upstream's default) a fresh broker's source is perf;
/// its first scrape.
fn open_at_paranoid_2(vm: &mut Vm, ev: &mut Evidence) -> Result<Scrape> {
    let sysctl = sh(vm, "sysctl -w kernel.perf_event_paranoid=2")?;
    ev.check(sysctl.ok(), format!("{} (upstream's default)", sysctl.text.trim()));
    let opened = fresh_broker(vm)?;
    let line = source_line(vm)?;
    ev.check(
        source_of(&opened).as_deref() == Some("perf") && line.contains("source=perf"),
        format!(
            "amd_hsmp_core_energy_source_info{{source={:?}}} 1; start-up log: {line}",
            source_of(&opened)
        ),
    );
    Ok(opened)
}

/// Check F: the broker used each rule of [`GRANTED`], as the audit records show.
fn perf_rules_used(vm: &mut Vm, ev: &mut Evidence) -> Result<()> {
    let used = granted(vm)?;
    for (class, perms) in GRANTED {
        for perm in *perms {
            let n = used.iter().filter(|(c, p)| c == class && p == perm).count();
            ev.check(n > 0, format!("the broker used {class} {{ {perm} }}: {n} granted records"));
        }
    }
    Ok(())
}

/// Check F: each core's energy 0 J in the `opened` scrape and its own step in the `stepped` one,
/// across the 32-bit wrap too.
fn energy_exact(
    machine: &Machine,
    topo: GuestTopology,
    ev: &mut Evidence,
    opened: &Scrape,
    stepped: &Scrape,
) {
    let esu = f64::from(machine.spec().esu);
    let mut exact = 0;
    for socket in 0..topo.sockets {
        for core in 0..topo.cores {
            let labels = core_labels(socket, core);
            let (before, after) = (
                opened.get("amd_hsmp_core_energy_joules_total", &labels),
                stepped.get("amd_hsmp_core_energy_joules_total", &labels),
            );
            let want = step(socket, core) as f64 / esu.exp2();
            let ok = before == Some(0.0) && after == Some(want);
            exact += usize::from(ok);
            if !ok || crosses_wrap(socket, core, topo.cores) {
                ev.check(
                    ok,
                    format!(
                        "socket {socket} core {core}: {before:?} J at the broker's start, then \
                         {after:?} J; the simulator stepped {want} J{}",
                        if crosses_wrap(socket, core, topo.cores) {
                            " across the 32-bit wrap"
                        } else {
                            ""
                        }
                    ),
                );
            }
        }
    }
    let cores = (topo.sockets * topo.cores) as usize;
    ev.check(
        exact == cores && stepped.count("amd_hsmp_core_energy_joules_total") == cores,
        format!("{exact} of {cores} cores exact: 0 J at the start, each core's own step after"),
    );
}

/// Check F: what the broker holds after start-up: no capability but `CAP_PERFMON` in its
/// bounding set, never `CAP_SYS_RAWIO`.
fn no_capability_left(vm: &mut Vm, ev: &mut Evidence) -> Result<()> {
    // What the broker holds after start-up.
    let caps = broker_caps(vm)?;
    for (set, bits) in &caps {
        let ok = match set.as_str() {
            // Without CAP_SETPCAP the bounding set keeps what the unit gave: CAP_PERFMON only.
            "CapBnd" => bits & !(1 << CAP_PERFMON) == 0,
            _ => *bits == 0,
        };
        let rawio = bits & (1 << CAP_SYS_RAWIO) != 0;
        ev.check(ok && !rawio, format!("broker {set}: {bits:016x} (CAP_SYS_RAWIO: {rawio})"));
    }
    ev.check(caps.len() == 5, "all five capability sets read");
    Ok(())
}

/// Check F: the exporter's domain may not open a `power_core` event even as root, its refusal's
/// AVC records added to `provoked`; the broker's domain may.
fn only_the_broker_opens(
    vm: &mut Vm,
    ev: &mut Evidence,
    provoked: &mut Vec<String>,
    pmu_type: u32,
) -> Result<()> {
    // The exporter's domain may not open the event even as root; the broker's may.
    let args = format!("perf {pmu_type} 0");
    provoked.extend(super::selinux::refused(
        vm,
        ev,
        "the exporter's domain opens a power_core event",
        "amd_hsmp_exporter_t",
        &args,
        ("perf_event", "amd_hsmp_exporter_t"),
    )?);
    super::selinux::allowed(
        vm,
        ev,
        "the broker's domain opens and reads a power_core event",
        "amd_hsmp_broker_t",
        &args,
    )?;
    Ok(())
}

/// Check F's last step: the unit's exposure with the perf drop-in no higher than with the MSR
/// drop-in, on the units as loaded; the perf drop-in back in place.
fn exposure_against_msr(vm: &mut Vm, ev: &mut Evidence) -> Result<()> {
    // Exposure: the perf drop-in against the MSR drop-in, on the units as loaded.
    let with_perf = broker_exposure(vm)?;
    let swap = sh(
        vm,
        &format!(
            "rm {} && install -D -m 0644 {} {} && systemctl daemon-reload",
            PERF_DROP_IN.1, MSR_DROP_IN.0, MSR_DROP_IN.1
        ),
    )?;
    let with_msr = broker_exposure(vm)?;
    let back = sh(
        vm,
        &format!(
            "rm {} && install -D -m 0644 {} {} && systemctl daemon-reload",
            MSR_DROP_IN.1, PERF_DROP_IN.0, PERF_DROP_IN.1
        ),
    )?;
    ev.check(
        swap.ok() && back.ok() && with_perf <= with_msr,
        format!(
            "systemd-analyze security amd-hsmp-broker.service: {with_perf} with the perf drop-in, \
             {with_msr} with the MSR drop-in"
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cpu_s_reads_are_found_in_head_s_output() {
        let text = "==> /run/perf-count.0 <==\n0 10 10\n655360000 20 20\n\n\
                    ==> /run/perf-count.10 <==\n0 1 1\n7 2 2\n";
        assert_eq!(count_reads(text, 0), [0, 655_360_000]);
        assert_eq!(count_reads(text, 10), [0, 7]);
        assert!(count_reads(text, 1).is_empty());
    }

    #[test]
    fn one_core_steps_across_the_wrap_and_every_core_steps_its_own_amount() {
        let (sockets, cores) = (2, 6);
        let wraps = (0..sockets)
            .flat_map(|s| (0..cores).map(move |c| (s, c)))
            .filter(|&(s, c)| crosses_wrap(s, c, cores))
            .count();
        assert_eq!(wraps, 1);
        let mut steps: Vec<u64> =
            (0..sockets).flat_map(|s| (0..cores).map(move |c| step(s, c))).collect();
        steps.dedup();
        assert_eq!(steps.len(), (sockets * cores) as usize);
    }
}
