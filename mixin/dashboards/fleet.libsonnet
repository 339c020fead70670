// Fleet overview: built on the per-node and per-socket recording rules only (plus up and the
// exporter's meta metrics), so it keeps working where per-core series are dropped.
local g = import 'lib.libsonnet';

{
  grafanaDashboards+:: {
    'amd-hsmp-fleet.json':
      local c = $._config;
      local cluster = if c.showMultiCluster then ',%s="$cluster"' % c.clusterLabel else '';
      local s = {
        sel: g.variableSelector + cluster,
        k: c.fleetTopK,
        node: c.nodeExporterSelector + cluster,
        on: std.join(', ', (if c.showMultiCluster then [c.clusterLabel] else []) + [c.nodeExporterJoinLabel]),
      };
      g.dashboard(
        c,
        'amd-hsmp-fleet',
        'Fleet',
        'Power, throttling and exporter health of every node scraped by the amd-hsmp job.',
        [
          g.datasourceVariable,
          g.queryVariable('cluster', 'Cluster', 'label_values(up{%s}, %s)' % [c.amdHsmpSelector, c.clusterLabel], hide=if c.showMultiCluster then 0 else 2),
          g.jobVariable(c.amdHsmpSelector + cluster),
          g.instanceVariable('job=~"$job"' + cluster),
        ],
        [
          g.row('Overview'),
          g.stat('Targets', 'amd-hsmp-exporter targets Prometheus knows.', [g.target('count(up{%(sel)s})' % s)], 'short'),
          g.stat('Exporters down', 'Targets whose last scrape failed.', [g.target('count(up{%(sel)s} == 0) or vector(0)' % s)], 'short', thresholds=g.thresholds([[null, 'green'], [1, 'red']])),
          g.stat('Brokers down', 'Exporters that got no answer from their broker.', [g.target('count(amd_hsmp_broker_up{%(sel)s} == 0) or vector(0)' % s)], 'short', thresholds=g.thresholds([[null, 'green'], [1, 'red']])),
          g.stat('HSMP devices down', 'Nodes whose /dev/hsmp is missing or unusable (expected on Rome and non-EPYC nodes).', [g.target('count(amd_hsmp_up{%(sel)s} == 0) or vector(0)' % s)], 'short', thresholds=g.thresholds([[null, 'green'], [1, 'orange']])),
          g.stat('Nodes throttling', 'Nodes with PROCHOT asserted on at least one socket now.', [g.target('count(instance:amd_hsmp_prochot_active:sum{%(sel)s} > 0) or vector(0)' % s)], 'short', thresholds=g.thresholds([[null, 'green'], [1, 'red']])),
          g.stat('Fleet power', 'Sum of the per-core power of every node.', [g.target('sum(instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s})' % s)], 'watt'),

          g.row('Power'),
          g.timeseries('Fleet power', 'Sum of the per-core power of every node.', [
            g.target('sum(instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s})' % s, 'fleet'),
          ], 'watt', w=8),
          g.timeseries('Nodes drawing the most power', 'The %(k)d nodes with the highest per-core power sum.' % s, [
            g.target('topk(%(k)d, instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s})' % s, '{{instance}}'),
          ], 'watt', w=16),
          g.table('Power by node name', "Each node's power with its name from node_exporter (node_uname_info's nodename), joined on %(on)s; empty without node_exporter under nodeExporterSelector or where the join label's values differ (see docs/kubernetes.md)." % s, [
            g.target('topk(%(k)d, instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s}) * on (%(on)s) group_left (nodename) node_uname_info{%(node)s}' % s, instant=true),
          ], 'watt', w=24),
          g.distribution('Node power distribution', 'How many nodes draw how much power, at each time.', [
            g.target('instance:amd_hsmp_power_watts:sum_rate5m{%(sel)s}' % s, '{{instance}}'),
          ], 'watt'),

          g.row('Throttling'),
          g.timeseries('Nodes throttling', 'Nodes with PROCHOT asserted on at least one socket.', [
            g.target('count(instance:amd_hsmp_prochot_active:sum{%(sel)s} > 0) or vector(0)' % s, 'nodes'),
          ], 'short', w=8),
          g.table('Sockets with the most PROCHOT', 'Share of the last hour each socket spent with PROCHOT asserted; sockets that had none are not listed.', [
            g.target('topk(%(k)d, avg_over_time(instance_socket:amd_hsmp_prochot_active:avg_over_time5m{%(sel)s}[1h]) > 0)' % s, instant=true),
          ], 'percentunit', w=8),
          g.table('Lowest boost limits', 'The sockets whose lowest core boost limit is the lowest in the fleet.', [
            g.target('bottomk(%(k)d, instance_socket:amd_hsmp_core_boost_limit_hertz:min{%(sel)s})' % s, instant=true),
          ], 'hertz', w=8),

          g.row('Frequency limits'),
          g.timeseries('Nodes limited, by reason', 'Nodes with a socket limited by each limiter at some time in the last 5 minutes (opn_max, the part\'s own maximum, is no limit).', [
            g.target('count by (reason) (max without (socket) (instance_socket_reason:amd_hsmp_socket_frequency_limit_reason:avg_over_time5m{%(sel)s,reason!="opn_max"}) > 0)' % s, '{{reason}}'),
          ], 'short', w=12),
          g.table('Nodes most limited, by reason', 'Per limiter, the %(k)d nodes whose sockets spent the largest share of the last hour limited by it; nodes never limited are not listed.' % s, [
            g.target('topk by (reason) (%(k)d, avg without (socket) (avg_over_time(instance_socket_reason:amd_hsmp_socket_frequency_limit_reason:avg_over_time5m{%(sel)s,reason!="opn_max"}[1h])) > 0)' % s, instant=true),
          ], 'percentunit', w=12),

          g.row('Exporter health'),
          g.timeseries('Unhealthy targets', 'Exporters that cannot be scraped, that cannot reach their broker, and nodes without a usable /dev/hsmp.', [
            g.target('count(up{%(sel)s} == 0) or vector(0)' % s, 'exporter down'),
            g.target('count(amd_hsmp_broker_up{%(sel)s} == 0) or vector(0)' % s, 'broker down'),
            g.target('count(amd_hsmp_up{%(sel)s} == 0) or vector(0)' % s, 'HSMP device down'),
          ], 'short', w=12),
          g.timeseries('Failed reads by collector', 'Increase of amd_hsmp_scrape_errors_total over the fleet, per collector.', [
            g.target('sum by (collector) (increase(amd_hsmp_scrape_errors_total{%(sel)s}[$__rate_interval]))' % s, '{{collector}}'),
          ], 'short', w=12),
          g.table('Firing alerts', 'The amd-hsmp alerts firing now.', [
            g.target('ALERTS{alertname=~"AmdHsmp.*",alertstate="firing",%(sel)s}' % s, instant=true),
          ], 'none', w=12),
          g.table('Versions and simulated targets', 'Exporter versions in the fleet, and targets whose broker serves the simulator.', [
            g.target('count by (version, revision) (amd_hsmp_build_info{%(sel)s})' % s, instant=true),
            g.target('count by (profile) (amd_hsmp_simulated_info{%(sel)s})' % s, instant=true),
          ], 'short', w=12),
        ],
      ),
  },
}
