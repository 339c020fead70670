// Recording rules. Names follow level:metric:operations. Every aggregation uses `without`, so
// the target labels (job, instance, and any of your own such as cluster) are kept.
//
// The per-socket and per-node rules exist so that a fleet can keep them and drop the per-core
// series at federation or remote-write (docs/install.md, "Cardinality at fleet scale").
{
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
        // shared ones. An owner's series ends with its assignment. A libvirt guest's owner
        // carries its domain name as vm, decoded by the exporter.
        name: 'amd-hsmp.owner.rules',
        rules: [
          {
            record: 'instance_owner:amd_hsmp_owner_power_watts:sum_rate5m',
            expr: |||
              sum without (socket, core) (
                rate(amd_hsmp_core_energy_joules_total{%(amdHsmpSelector)s}[5m])
                * on (job, instance, socket, core) group_left (owner, vm)
                  amd_hsmp_core_owner_info{%(amdHsmpSelector)s}
              )
            ||| % $._config,
          },
          {
            // Slurm's cgroup v2 plugin: .../job_<id>/step_<id>/user/task_<n>, the stepd scope
            // slurmstepd.scope or, with --enable-multiple-slurmd, <nodename>_slurmstepd.scope.
            // hpc_job is dcgm-exporter's job-mapping label; slurm_job, the same value, is kept
            // for one release (CHANGELOG.md).
            record: 'instance_slurm_job:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (owner) (
                label_replace(
                  label_replace(
                    instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,owner=~"%(slurmJobRegex)s"},
                    "hpc_job", "$1", "owner", "%(slurmJobRegex)s"
                  ),
                  "slurm_job", "$1", "owner", "%(slurmJobRegex)s"
                )
              )
            ||| % $._config,
          },
          {
            // kubelet's systemd driver (.../kubepods-burstable-pod<uid with _>.slice/...) and
            // cgroupfs driver (/kubepods/burstable/pod<uid>/...): the dashed UID, as
            // kube-state-metrics' kube_pod_info{uid} has it.
            record: 'instance_pod_uid:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (owner) (
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,owner=~"%(podUidRegex)s"},
                  "pod_uid", "$1-$2-$3-$4-$5", "owner", "%(podUidRegex)s"
                )
              )
            ||| % $._config,
          },
          {
            // systemd: the owner's last path element when it is a unit (a service, scope or
            // slice), e.g. postgresql.service or a VM's machine-qemu-...scope; a container
            // runtime's scope is a container, not a unit.
            record: 'instance_unit:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (owner) (
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,owner=~"%(unitRegex)s",owner!~"%(containerScopeRegex)s"},
                  "unit", "$1", "owner", "%(unitRegex)s"
                )
              )
            ||| % $._config,
          },
        ],
      },
    ],
  },
}
