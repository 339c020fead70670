// SPDX-License-Identifier: GPL-2.0-only
/*
 * power_core_sim: the VM test's stand-in for the kernel's own `power_core` PMU
 * (arch/x86/events/rapl.c), which a QEMU TCG guest never has: its CPU has no
 * RAPL CPUID flag, on which rapl.c matches AMD parts, so rapl.c registers
 * nothing (and TCG reads the RAPL MSRs as 0, as every MSR it does not
 * implement).
 *
 * Presented exactly as rapl.c presents its core-scope PMU: named "power_core",
 * .scope = PERF_PMU_SCOPE_CORE (the perf core then provides `cpumask`, one CPU
 * per core, and the scope handling), .task_ctx_nr = perf_invalid_context,
 * PERF_PMU_CAP_NO_EXCLUDE, events/energy-core = event=0x01 with its .scale and
 * .unit, format/event = config:0-7; event_init refuses what rapl.c refuses.
 * It counts as rapl.c does: the 32-bit raw counter of the event's core, read
 * at start, read and stop, accumulated into event->count as
 * delta << (32 - esu) with rapl_event_update()'s sign handling.
 *
 * The raw counters are not MSRs but a table the SMU responder on the host
 * keeps current from the same simulator that answers the HSMP
 * GET_RAPL_CORE_COUNTER message (xtask/src/vm/pmu.rs): in the spare space of
 * each socket's reserved mailbox window (`memmap=` keeps it out of the
 * guest's RAM), at window + table_offset:
 *
 *   u32 magic ("PWRC")   u32 cores
 *   per core: u32 raw counter (the low 32 bits, as MSR_AMD_CORE_ENERGY_STATUS)
 *             u32 esu (one raw step is 2^-esu J)
 *
 * indexed by (package id, core id) of the event's CPU, which is how the
 * responder maps the guest's APIC ids to the simulator's cores.
 *
 * No hrtimer: rapl.c reads on a timer so that a 32-bit wrap is never missed
 * between two reads; here the counters move only when the test moves them, by
 * far less than 2^31 steps between two reads.
 *
 * Test equipment for `cargo xtask vm-test`, built against the guest kernel's
 * headers like the hsmp modules; never packaged.
 */
#include <linux/io.h>
#include <linux/module.h>
#include <linux/perf_event.h>
#include <linux/topology.h>

MODULE_DESCRIPTION("VM test: the power_core PMU over the SMU responder's counters");
MODULE_LICENSE("GPL");

static unsigned long base = 0x1f000000;
module_param(base, ulong, 0444);
MODULE_PARM_DESC(base, "guest-physical address of socket 0's mailbox window");

static unsigned long stride = 0x100000;
module_param(stride, ulong, 0444);
MODULE_PARM_DESC(stride, "distance between two sockets' windows");

static unsigned long table_offset = 0x80000;
module_param(table_offset, ulong, 0444);
MODULE_PARM_DESC(table_offset, "offset of the counter table in a window");

#define TABLE_MAGIC	0x43525750	/* "PWRC" */
#define TABLE_BYTES	PAGE_SIZE
#define ENTRY_BYTES	8
#define MAX_SOCKETS	8
#define EVENT_MASK	0xFFULL		/* rapl.c's RAPL_EVENT_MASK */
#define CNTR_WIDTH	32		/* rapl.c's RAPL_CNTR_WIDTH */

static void __iomem *tables[MAX_SOCKETS];
static unsigned int nr_tables;

/* The raw counter's register; its ESU is the next word. */
static void __iomem *counter_of(struct perf_event *event)
{
	return (void __iomem *)event->hw.event_base;
}

/* rapl_event_update(): the new raw value, the signed 32-bit delta, scaled. */
static u64 pcs_event_update(struct perf_event *event)
{
	struct hw_perf_event *hwc = &event->hw;
	u64 prev_raw_count, new_raw_count;
	s64 delta;
	int shift = CNTR_WIDTH;

	prev_raw_count = local64_read(&hwc->prev_count);
	do {
		new_raw_count = readl(counter_of(event));
	} while (!local64_try_cmpxchg(&hwc->prev_count,
				      &prev_raw_count, new_raw_count));

	delta = (new_raw_count << shift) - (prev_raw_count << shift);
	delta >>= shift;
	/* rapl_scale(): to units of 2^-32 J. */
	local64_add((u64)delta << (32 - hwc->config_base), &event->count);
	return new_raw_count;
}

static void pcs_event_start(struct perf_event *event, int mode)
{
	if (WARN_ON_ONCE(!(event->hw.state & PERF_HES_STOPPED)))
		return;
	event->hw.state = 0;
	local64_set(&event->hw.prev_count, readl(counter_of(event)));
}

static void pcs_event_stop(struct perf_event *event, int mode)
{
	struct hw_perf_event *hwc = &event->hw;

	hwc->state |= PERF_HES_STOPPED;
	if ((mode & PERF_EF_UPDATE) && !(hwc->state & PERF_HES_UPTODATE)) {
		pcs_event_update(event);
		hwc->state |= PERF_HES_UPTODATE;
	}
}

static int pcs_event_add(struct perf_event *event, int mode)
{
	event->hw.state = PERF_HES_UPTODATE | PERF_HES_STOPPED;
	if (mode & PERF_EF_START)
		pcs_event_start(event, mode);
	return 0;
}

static void pcs_event_del(struct perf_event *event, int flags)
{
	pcs_event_stop(event, PERF_EF_UPDATE);
}

static void pcs_event_read(struct perf_event *event)
{
	pcs_event_update(event);
}

/* rapl_pmu_event_init()'s refusals, in its order, then the core's counter. */
static int pcs_event_init(struct perf_event *event)
{
	u64 cfg = event->attr.config & EVENT_MASK;
	unsigned int pkg, core, esu;
	void __iomem *table;

	if (event->attr.type != event->pmu->type)
		return -ENOENT;
	if (event->attr.sample_period) /* no sampling */
		return -EINVAL;
	if (event->attr.config & ~EVENT_MASK)
		return -EINVAL;
	if (event->cpu < 0)
		return -EINVAL;
	if (cfg != 1) /* energy-core is the only event */
		return -EINVAL;

	pkg = topology_physical_package_id(event->cpu);
	core = topology_core_id(event->cpu);
	if (pkg >= nr_tables)
		return -EINVAL;
	table = tables[pkg];
	if (core >= readl(table + 4) || 8 + (core + 1) * ENTRY_BYTES > TABLE_BYTES)
		return -EINVAL;
	esu = readl(table + 8 + core * ENTRY_BYTES + 4);
	if (esu == 0 || esu > 32)
		return -EINVAL;

	event->hw.event_base = (unsigned long)(table + 8 + core * ENTRY_BYTES);
	event->hw.config = cfg;
	event->hw.config_base = esu;
	return 0;
}

PMU_EVENT_ATTR_STRING(energy-core, attr_energy_core, "event=0x01");
PMU_EVENT_ATTR_STRING(energy-core.unit, attr_energy_core_unit, "Joules");
/* rapl.c: "we compute in 0.23 nJ increments regardless of MSR" (2^-32 J). */
PMU_EVENT_ATTR_STRING(energy-core.scale, attr_energy_core_scale, "2.3283064365386962890625e-10");

static struct attribute *pcs_events[] = {
	&attr_energy_core.attr.attr,
	&attr_energy_core_unit.attr.attr,
	&attr_energy_core_scale.attr.attr,
	NULL,
};

static struct attribute_group pcs_events_group = {
	.name = "events",
	.attrs = pcs_events,
};

PMU_FORMAT_ATTR(event, "config:0-7");
static struct attribute *pcs_formats[] = {
	&format_attr_event.attr,
	NULL,
};

static struct attribute_group pcs_format_group = {
	.name = "format",
	.attrs = pcs_formats,
};

static const struct attribute_group *pcs_attr_groups[] = {
	&pcs_format_group,
	&pcs_events_group,
	NULL,
};

static struct pmu pcs_pmu = {
	.attr_groups	= pcs_attr_groups,
	.task_ctx_nr	= perf_invalid_context,
	.event_init	= pcs_event_init,
	.add		= pcs_event_add,
	.del		= pcs_event_del,
	.start		= pcs_event_start,
	.stop		= pcs_event_stop,
	.read		= pcs_event_read,
	.scope		= PERF_PMU_SCOPE_CORE,
	.module		= THIS_MODULE,
	.capabilities	= PERF_PMU_CAP_NO_EXCLUDE,
};

static void pcs_unmap(void)
{
	while (nr_tables > 0)
		iounmap(tables[--nr_tables]);
}

static int __init pcs_init(void)
{
	unsigned int pkgs = topology_max_packages();
	int ret;

	if (pkgs > MAX_SOCKETS)
		return -E2BIG;
	for (nr_tables = 0; nr_tables < pkgs; nr_tables++) {
		phys_addr_t at = base + nr_tables * stride + table_offset;
		void __iomem *table = ioremap(at, TABLE_BYTES);
		u32 magic;

		if (!table) {
			ret = -ENOMEM;
			goto fail;
		}
		tables[nr_tables] = table;
		magic = readl(table);
		if (magic != TABLE_MAGIC) {
			pr_err("power_core_sim: no counter table at %pa (magic %#x)\n",
			       &at, magic);
			nr_tables++;
			ret = -ENODEV;
			goto fail;
		}
	}
	ret = perf_pmu_register(&pcs_pmu, "power_core", -1);
	if (ret)
		goto fail;
	pr_info("power_core_sim: power_core PMU over %u sockets' counter tables\n", nr_tables);
	return 0;
fail:
	pcs_unmap();
	return ret;
}
module_init(pcs_init);

static void __exit pcs_exit(void)
{
	perf_pmu_unregister(&pcs_pmu);
	pcs_unmap();
}
module_exit(pcs_exit);
