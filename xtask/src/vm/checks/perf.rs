//! Check P: the guest's `power_core` PMU (the test's module over the responder's counters, the
//! guest having no RAPL of its own) presented and counting as the kernel's `rapl.c`.

use super::{Ctx, Evidence, Verdict, sh};
use crate::vm::mailbox::{WINDOW_BASE, WINDOW_SIZE};
use crate::vm::pmu::TABLE_OFFSET;
use crate::vm::prepare::POWER_CORE_MODULE;
use anyhow::Result;

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
    // TCG implements no RAPL MSR: reading them through the MSR driver fails, so the guest's
    // rapl.c registers nothing (and the guest has no PMU named power*).
    let rapl = sh(
        vm,
        &format!(
            "modprobe msr; echo \"flag $(grep -cw rapl /proc/cpuinfo)\"; \
             echo \"pmus $(ls {PMU_ROOT} | tr '\\n' ' ')\"; \
             for msr in 0xc0010299 0xc001029a; do perl -e 'open(my $f, \"<\", \"/dev/cpu/0/msr\") \
             or die \"open: $!\"; sysseek($f, hex($ARGV[0]), 0); my $n = sysread($f, my $b, 8); \
             print \"msr $ARGV[0] \", defined $n ? \"read\" : \"$!\", \"\\n\"' $msr; done"
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
            && msrs.matches("Input/output error").count() == 2,
        format!(
            "no RAPL in the guest: rapl flag on {} CPUs; PMUs: {}; MSR_AMD_RAPL_POWER_UNIT and \
             MSR_AMD_CORE_ENERGY_STATUS: {msrs}",
            said("flag"),
            said("pmus").trim()
        ),
    );
    let load = sh(
        vm,
        &format!(
            "insmod /usr/lib/modules/$(uname -r)/extra/{POWER_CORE_MODULE} base={WINDOW_BASE:#x} \
             stride={WINDOW_SIZE:#x} table_offset={TABLE_OFFSET:#x}; rc=$?; \
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
        return Ok(ev.verdict(NAME));
    };
    ctx.pmu_type = Some(pmu_type);

    // Counting: every CPU's event open over a window in which each core's counter steps by its
    // own amount; socket 1's last core across the 32-bit wrap.
    let machine = responder.machine();
    let fw = machine.firmware();
    for socket in 0..topo.sockets {
        for core in 0..topo.cores {
            fw.set_energy_counter(socket, core, start_counter(socket, core, topo.cores))?;
        }
    }
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
    for socket in 0..topo.sockets {
        for core in 0..topo.cores {
            let start = start_counter(socket, core, topo.cores);
            fw.set_energy_counter(socket, core, start + step(socket, core))?;
        }
    }
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
    Ok(ev.verdict(NAME))
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
