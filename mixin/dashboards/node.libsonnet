// Per-node dashboard: status, power per socket and per core, energy and power per job and workload, boost limits, frequency limits and their limiters, PROCHOT, scrape health.
local g = import 'lib.libsonnet';

{
  grafanaDashboards+:: {
    'amd-hsmp-node.json':
      local c = $._config;
      local sel = g.variableSelector;
      local s = { sel: sel, m: 'amd_hsmp_workload_core_energy_joules_total' };
      g.dashboard(
        c,
        'amd-hsmp-node',
        'Node',
        'Per-core power, boost limits, frequency limits and PROCHOT of one node, from amd-hsmp-exporter and the amd-hsmp recording rules.',
        [
          g.datasourceVariable,
          g.jobVariable(c.amdHsmpSelector),
          g.instanceVariable('job=~"$job"'),
          // The sockets of any per-socket family the node exports (energy, boost limits or
          // PROCHOT, each of which may be off or unsupported), so that the per-core panels
          // repeat on Rome and with --no-collector.prochot too.
          g.queryVariable(
            'socket',
            'Socket',
            'query_result(count by (socket) (instance_socket:amd_hsmp_power_watts:sum_rate5m{%(sel)s} or instance_socket:amd_hsmp_core_boost_limit_hertz:count{%(sel)s} or instance_socket:amd_hsmp_prochot_active:avg_over_time5m{%(sel)s} or amd_hsmp_socket_frequency_limit_hertz{%(sel)s}))' % s,
            multi=true,
            regex='/socket="([^"]+)"/',
          ),
        ],
        [
          g.row('Status'),
          g.stat('Exporter', 'Whether Prometheus scrapes amd-hsmp-exporter (up).', [g.target('up{%(sel)s}' % s, '{{instance}}')], 'none', mappings=g.upDown),
          g.stat('Broker', 'Whether amd-hsmp-broker answered the last scrape (amd_hsmp_broker_up).', [g.target('amd_hsmp_broker_up{%(sel)s}' % s, '{{instance}}')], 'none', mappings=g.upDown),
          g.stat('HSMP device', 'Whether /dev/hsmp opened and answered (amd_hsmp_up). 0 is expected on Rome and non-EPYC machines.', [g.target('amd_hsmp_up{%(sel)s}' % s, '{{instance}}')], 'none', mappings=g.upDown),
          g.stat('HSMP protocol', 'HSMP protocol version of the firmware; RAPL energy needs 7 or later.', [g.target('amd_hsmp_protocol_version{%(sel)s}' % s, '{{instance}}')], 'none'),
          g.stat('Energy source', 'Where per-core energy comes from: hsmp (firmware RAPL), perf (the kernel\'s power_core PMU) or msr (the MSR fallback).', [g.target('amd_hsmp_core_energy_source_info{%(sel)s}' % s, '{{source}}')], 'none', textMode='name', noValue='none'),
          g.stat('Simulated', 'The simulator profile when the broker is amd-hsmp-sim-broker; never on a production node.', [g.target('amd_hsmp_simulated_info{%(sel)s}' % s, '{{profile}}')], 'none', textMode='name', noValue='no', thresholds=g.thresholds([[null, 'orange']])),
          g.stat('Node power', 'Sum of the per-core power of all sockets (instance:amd_hsmp_power_watts:sum_rate5m).', [g.target('instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s}' % s)], 'watt', w=6),
          g.stat('Sockets with PROCHOT', 'Sockets of the node with PROCHOT asserted now.', [g.target('instance:amd_hsmp_prochot_active:sum{%(sel)s}' % s)], 'short', w=6, thresholds=g.thresholds([[null, 'green'], [1, 'red']])),
          g.stat('Lowest boost limit', 'The lowest boost limit of any core of the node.', [g.target('min without (socket) (instance_socket:amd_hsmp_core_boost_limit_hertz:min{%(sel)s})' % s)], 'hertz', w=6),
          g.stat('Cores reporting', 'Physical cores whose boost limit was read in the last evaluation.', [g.target('sum without (socket) (instance_socket:amd_hsmp_core_boost_limit_hertz:count{%(sel)s})' % s)], 'short', w=6),

          g.row('Power'),
          g.timeseries('Power per socket', 'Sum of the per-core power of each socket (instance_socket:amd_hsmp_power_watts:sum_rate5m) and of the node.', [
            g.target('instance_socket:amd_hsmp_power_watts:sum_rate5m{%(sel)s}' % s, 'socket {{socket}}'),
            g.target('instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s}' % s, 'node'),
          ], 'watt'),
          g.heatmap('Per-core power, socket $socket', 'Power of each physical core (rows: sysfs core_id), from the energy counter rate.', [
            g.target('instance_socket_core:amd_hsmp_core_power_watts:rate5m{%(sel)s,socket=~"$socket"}' % s, '{{core}}'),
          ], 'watt', w=12) { repeat: 'socket', repeatDirection: 'h', maxPerRow: 2 },
          g.timeseries('Power by workload', 'Power of the cores each workload (cgroup) is assigned by cpuset (instance_owner:amd_hsmp_owner_power_watts:sum_rate5m, from amd_hsmp_core_owner_info; needs --collector.core-owner). Exact for those cores; cores shared by several workloads are in none, so the sum is below the node power.', [
            g.target('instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(sel)s}' % s, '{{owner}}'),
          ], 'watt'),

          g.row('Jobs and workloads'),
          g.joinedTable('Energy by Slurm job', 'Per Slurm job (hpc_job), the energy of the cores its cgroups (the job, its steps) held at both ends of each sample interval, since the exporter started, and their power now (rate over the dashboard interval). Needs --collector.core-owner; a job stays listed for --collector.core-owner.linger (default 5m) after it ends, at 0 W. Only this node: a job on several nodes has a row on each. Jobs known only by their SLUID are in the table by owner.', [
            g.target('sum by (hpc_job) (%(m)s{%(sel)s,hpc_job!=""})' % s, instant=true),
            g.target('sum by (hpc_job) (rate(%(m)s{%(sel)s,hpc_job!=""}[$__rate_interval]))' % s, instant=true),
          ], [['Energy', 'joule'], ['Power', 'watt']]),
          g.joinedTable('Energy by pod, VM or service', 'The same per Kubernetes pod (pod_uid, its containers summed), libvirt guest (vm) and systemd service or scope (unit).', [
            g.target('sum by (pod_uid, vm, unit) (%s)' % std.join(' or ', ['%s{%s,%s!=""}' % [s.m, sel, l] for l in ['pod_uid', 'vm', 'unit']]), instant=true),
            g.target('sum by (pod_uid, vm, unit) (%s)' % std.join(' or ', ['rate(%s{%s,%s!=""}[$__rate_interval])' % [s.m, sel, l] for l in ['pod_uid', 'vm', 'unit']]), instant=true),
          ], [['Energy', 'joule'], ['Power', 'watt']]),
          g.joinedTable('Energy by owner', 'The same per owning cgroup (owner), every workload the exporter counts, a Slurm job\'s steps each on a row of their own. The cores\' energy that went to no workload is in the panel below, by reason.', [
            g.target('sum by (owner) (%(m)s{%(sel)s})' % s, instant=true),
            g.target('sum by (owner) (rate(%(m)s{%(sel)s}[$__rate_interval]))' % s, instant=true),
          ], [['Energy', 'joule'], ['Power', 'watt']], w=24),
          g.timeseries('Core power given to no workload', 'Power of the cores whose energy went to no workload (amd_hsmp_workload_unattributed_joules_total), by reason: changed-hands (the owner differed at the two ends of a sample interval), unowned (no workload held the core), owner-unknown (the cgroup hierarchy was not read), reset (the core\'s counter restarted).', [
            g.target('rate(amd_hsmp_workload_unattributed_joules_total{%(sel)s}[$__rate_interval])' % s, '{{reason}}'),
          ], 'watt', h=6),

          g.row('Boost limits'),
          g.timeseries('Boost limit per socket', 'Lowest and average boost limit over the cores of each socket.', [
            g.target('instance_socket:amd_hsmp_core_boost_limit_hertz:min{%(sel)s}' % s, 'socket {{socket}} min'),
            g.target('instance_socket:amd_hsmp_core_boost_limit_hertz:avg{%(sel)s}' % s, 'socket {{socket}} avg'),
          ], 'hertz', min=null),
          g.heatmap('Per-core boost limit, socket $socket', 'Boost limit of each physical core (rows: sysfs core_id).', [
            g.target('amd_hsmp_core_boost_limit_hertz{%(sel)s,socket=~"$socket"}' % s, '{{core}}'),
          ], 'hertz', w=12, scheme='Blues') { repeat: 'socket', repeatDirection: 'h', maxPerRow: 2 },

          g.row('Frequency limit'),
          g.timeseries('Frequency limit per socket', "Each socket's current frequency limit (amd_hsmp_socket_frequency_limit_hertz) and the highest boost limit of its cores; the limiters imposing it are below.", [
            g.target('amd_hsmp_socket_frequency_limit_hertz{%(sel)s}' % s, 'socket {{socket}} limit'),
            g.target('instance_socket:amd_hsmp_core_boost_limit_hertz:max{%(sel)s}' % s, 'socket {{socket}} boost max'),
          ], 'hertz', min=null),
          g.stateTimeline('Limiters, socket $socket', 'When each limiter held the socket\'s frequency (amd_hsmp_socket_frequency_limit_reason): ppt package power, tdc rail current, chtc and prochot thermal, apml and hsmp caps set by the BMC or host software, reliability, opn_max none but the part\'s own maximum.', [
            g.target('amd_hsmp_socket_frequency_limit_reason{%(sel)s,socket=~"$socket"}' % s, '{{reason}}'),
          ], g.valueMappings([[0, 'inactive', 'transparent'], [1, 'limiting', 'orange']]), w=12, h=7) { repeat: 'socket', repeatDirection: 'h', maxPerRow: 2 },
          g.timeseries('Time limited by reason', 'Share of the last 5 minutes each socket spent limited by each limiter other than its OPN maximum.', [
            g.target('instance_socket_reason:amd_hsmp_socket_frequency_limit_reason:avg_over_time5m{%(sel)s,reason!="opn_max"}' % s, 'socket {{socket}} {{reason}}'),
          ], 'percentunit', h=6),

          g.row('PROCHOT'),
          g.stateTimeline('PROCHOT', 'When each socket had PROCHOT asserted (the processor throttled hard).', [
            g.target('amd_hsmp_prochot_active{%(sel)s}' % s, 'socket {{socket}}'),
          ], g.valueMappings([[0, 'clear', 'green'], [1, 'PROCHOT', 'red']]), h=5),
          g.timeseries('PROCHOT share', 'Share of the last 5 minutes each socket spent with PROCHOT asserted.', [
            g.target('instance_socket:amd_hsmp_prochot_active:avg_over_time5m{%(sel)s}' % s, 'socket {{socket}}'),
          ], 'percentunit', h=6),

          g.row('Scrape health'),
          g.timeseries('Failed reads by collector', 'Increase of amd_hsmp_scrape_errors_total per collector; a failed read leaves its series out of the scrape.', [
            g.target('increase(amd_hsmp_scrape_errors_total{%(sel)s}[$__rate_interval])' % s, '{{collector}}'),
          ], 'short', w=12),
          g.timeseries('Scrape duration', "The exporter's collection time and the whole scrape as Prometheus measured it.", [
            g.target('amd_hsmp_scrape_duration_seconds{%(sel)s}' % s, 'collection'),
            g.target('scrape_duration_seconds{%(sel)s}' % s, 'scrape'),
          ], 's', w=12),
          g.timeseries('Energy counter resets', 'Core energy counters that went back, per socket, in the last hour: broker restarts with the perf or MSR source, or counters restarted after a possibly missed wrap.', [
            g.target('sum without (core) (resets(amd_hsmp_core_energy_joules_total{%(sel)s}[1h]))' % s, 'socket {{socket}}'),
          ], 'short', w=12),
          g.timeseries('Exporter memory', 'Resident memory of amd-hsmp-exporter.', [
            g.target('process_resident_memory_bytes{%(sel)s}' % s, 'resident'),
          ], 'bytes', w=6),
          g.timeseries('Exporter CPU', 'CPU time of amd-hsmp-exporter per second.', [
            g.target('rate(process_cpu_seconds_total{%(sel)s}[$__rate_interval])' % s, 'cpu'),
          ], 'percentunit', w=6),
        ],
      ),
  },
}
