// Recording rules. Names follow level:metric:operations. Every aggregation uses `without`, so
// the target labels (job, instance, and any of your own such as cluster) are kept.
//
// The per-socket and per-node rules exist so that a fleet can keep them and drop the per-core
// series at federation or remote-write (docs/install.md, "Cardinality at fleet scale").
{
  // The labels of instance_owner:amd_hsmp_owner_power_watts:sum_rate5m a workload rule sums
  // away: `owner` and every identity label but `keep`.
  ownerLabelsBut(keep):: std.join(', ', ['owner'] + [
    l
    for l in $._config.identityLabels
    if !std.member(keep, l)
  ]),
  // An owner the exporter gave no identity label (an exporter of an earlier release).
  unlabelled:: std.join(',', ['%s=""' % l for l in $._config.identityLabels]),

  prometheusRules+:: {
    groups+: [
      {
        name: 'amd-hsmp.rules',
        rules: [
          {
            // Watts per physical core: the energy counter's rate. rate() handles the resets of
            // a broker restart (MSR source) and of a restarted counter.
            record: 'instance_socket_core:amd_hsmp_core_power_watts:rate5m',
            expr: |||
              rate(amd_hsmp_core_energy_joules_total{%(amdHsmpSelector)s}[5m])
            ||| % $._config,
          },
          {
            record: 'instance_socket:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (core) (instance_socket_core:amd_hsmp_core_power_watts:rate5m{%(amdHsmpSelector)s})
            ||| % $._config,
          },
          {
            record: 'instance:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (socket) (instance_socket:amd_hsmp_power_watts:sum_rate5m{%(amdHsmpSelector)s})
            ||| % $._config,
          },
          {
            // The lowest boost limit of any core of the socket, in hertz.
            record: 'instance_socket:amd_hsmp_core_boost_limit_hertz:min',
            expr: |||
              min without (core) (amd_hsmp_core_boost_limit_hertz{%(amdHsmpSelector)s})
            ||| % $._config,
          },
          {
            // The average boost limit over the socket's cores, in hertz.
            record: 'instance_socket:amd_hsmp_core_boost_limit_hertz:avg',
            expr: |||
              avg without (core) (amd_hsmp_core_boost_limit_hertz{%(amdHsmpSelector)s})
            ||| % $._config,
          },
          {
            // The highest boost limit of any core of the socket, in hertz: the frequency the
            // socket's cores are allowed, which AmdHsmpFrequencyLimited compares the socket's
            // frequency limit with.
            record: 'instance_socket:amd_hsmp_core_boost_limit_hertz:max',
            expr: |||
              max without (core) (amd_hsmp_core_boost_limit_hertz{%(amdHsmpSelector)s})
            ||| % $._config,
          },
          {
            // How many cores of the socket reported a boost limit in this evaluation.
            record: 'instance_socket:amd_hsmp_core_boost_limit_hertz:count',
            expr: |||
              count without (core) (amd_hsmp_core_boost_limit_hertz{%(amdHsmpSelector)s})
            ||| % $._config,
          },
          {
            // Share of the last 5 minutes the socket spent with PROCHOT asserted (0 to 1).
            record: 'instance_socket:amd_hsmp_prochot_active:avg_over_time5m',
            expr: |||
              avg_over_time(amd_hsmp_prochot_active{%(amdHsmpSelector)s}[5m])
            ||| % $._config,
          },
          {
            // Share of the last 5 minutes the socket's frequency was limited by each limiter
            // (0 to 1, one series per reason; opn_max is the part's own maximum, no limit).
            record: 'instance_socket_reason:amd_hsmp_socket_frequency_limit_reason:avg_over_time5m',
            expr: |||
              avg_over_time(amd_hsmp_socket_frequency_limit_reason{%(amdHsmpSelector)s}[5m])
            ||| % $._config,
          },
          {
            // Sockets of the node with PROCHOT asserted now.
            record: 'instance:amd_hsmp_prochot_active:sum',
            expr: |||
              sum without (socket) (amd_hsmp_prochot_active{%(amdHsmpSelector)s})
            ||| % $._config,
          },
        ],
      },
      {
        // Power per workload, from the cores each workload is assigned by cpuset
        // (amd_hsmp_core_owner_info, --collector.core-owner): exact for those cores, absent for
        // shared ones. An owner's series ends with its assignment. The exporter names the
        // workload from its cgroup's layout (identityLabels: hpc_job, slurm_sluid, step,
        // pod_uid, container_id, vm, unit); each rule below sums by its own. For one release
        // (deprecated, CHANGELOG.md) each also takes its labels from `owner` by regex where the
        // exporter gives none, for an exporter of an earlier release that does not label: the
        // regexes are anchored where each manager puts its cgroups, as the exporter's table is.
        name: 'amd-hsmp.owner.rules',
        rules: [
          {
            record: 'instance_owner:amd_hsmp_owner_power_watts:sum_rate5m',
            expr: |||
              sum without (socket, core) (
                rate(amd_hsmp_core_energy_joules_total{%(amdHsmpSelector)s}[5m])
                * on (job, instance, socket, core) group_left (owner, %(identity)s)
                  amd_hsmp_core_owner_info{%(amdHsmpSelector)s}
              )
            ||| % ($._config { identity: std.join(', ', $._config.identityLabels) }),
          },
          {
            // Per Slurm job: hpc_job, or slurm_sluid where Slurm 26.05 keys the job's cgroup by
            // its SLUID and the exporter could not read the job's number from its slurmstepd
            // (a job with both is summed once, by hpc_job, its slurm_sluid kept). hpc_job is dcgm-exporter's job-mapping label; slurm_job, the same value,
            // is kept for one release (CHANGELOG.md).
            record: 'instance_slurm_job:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (%(others)s) (
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,hpc_job!=""},
                  "slurm_job", "$1", "hpc_job", "(.+)"
                )
                or
                instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,slurm_sluid!="",hpc_job=""}
                or
                label_replace(
                  label_replace(
                    instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,%(unlabelled)s,owner=~"%(slurmJobRegex)s",owner!~"%(userSliceRegex)s"},
                    "hpc_job", "$1", "owner", "%(slurmJobRegex)s"
                  ),
                  "slurm_job", "$1", "owner", "%(slurmJobRegex)s"
                )
              )
            ||| % ($._config { others: $.ownerLabelsBut(['hpc_job', 'slurm_sluid']), unlabelled: $.unlabelled }),
          },
          {
            // kubelet's pods, under either cgroup driver: the dashed uid, as kube-state-metrics'
            // kube_pod_info{uid} has it.
            record: 'instance_pod_uid:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (%(others)s) (
                instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,pod_uid!=""}
                or
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,%(unlabelled)s,owner=~"%(podUidRegex)s"},
                  "pod_uid", "$1-$2-$3-$4-$5", "owner", "%(podUidRegex)s"
                )
              )
            ||| % ($._config { others: $.ownerLabelsBut(['pod_uid']), unlabelled: $.unlabelled }),
          },
          {
            // systemd: a service or scope below system.slice, e.g. postgresql.service.
            record: 'instance_unit:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (%(others)s) (
                instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,unit!=""}
                or
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,%(unlabelled)s,owner=~"%(unitRegex)s"},
                  "unit", "$1", "owner", "%(unitRegex)s"
                )
              )
            ||| % ($._config { others: $.ownerLabelsBut(['unit']), unlabelled: $.unlabelled }),
          },
        ],
      },
    ],
  },
}
