// Recording rules that name workloads the way the GPU exporters and kube-state-metrics do, so a
// workload's CPU core power and its GPU power sum in one `sum by` (docs/metrics.md, "Energy per
// workload"), and the package power the cores' does not cover.
local undoDashes(expr, n) =
  if n == 0 then expr
  else undoDashes('label_replace(%s, "vm", "$1-$2", "vm", "(.*)\\\\\\\\x2d(.*)")' % expr, n - 1);

{
  // The package's power minus its cores', per socket (see the remainder rules below): HSMP's
  // own package counter where the firmware answers it, else node_exporter's RAPL on that host.
  packageMinusCores:: |||
    (
      rate(amd_hsmp_package_energy_joules_total{%(amdHsmpSelector)s}[5m])
      - instance_socket:amd_hsmp_power_watts:sum_rate5m{%(amdHsmpSelector)s}
    )
    or
    sum without (node) (
      max by (node, socket) (
        label_replace(
          label_replace(
            rate(node_rapl_package_joules_total{%(nodeExporterSelector)s}[5m]),
            "socket", "$1", "index", "([0-9]+)"
          ),
          "node", "$1", "instance", "%(instanceHostRegex)s"
        )
      )
      - on (node, socket) group_right ()
        label_replace(
          instance_socket:amd_hsmp_power_watts:sum_rate5m{%(amdHsmpSelector)s},
          "node", "$1", "instance", "%(instanceHostRegex)s"
        )
    )
  ||| % $._config,

  prometheusRules+:: {
    groups+: [
      {
        // Per Slurm step, where the step owns its cores (srun steps and an interactive step on
        // part of the job's cores; a step holding the job's whole set leaves the job the owner
        // and has no series here). hpc_job is dcgm-exporter's job-mapping label.
        name: 'amd-hsmp.workload.rules',
        rules: [
          {
            record: 'instance_slurm_step:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (%(others)s) (
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,step!=""},
                  "slurm_step", "$1", "step", "(.+)"
                )
                or
                label_replace(
                  label_replace(
                    instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,%(unlabelled)s,owner=~"%(slurmStepRegex)s",owner!~"%(userSliceRegex)s"},
                    "hpc_job", "$1", "owner", "%(slurmStepRegex)s"
                  ),
                  "slurm_step", "$2", "owner", "%(slurmStepRegex)s"
                )
              )
            ||| % ($._config { others: $.ownerLabelsBut(['hpc_job', 'slurm_sluid']), unlabelled: $.unlabelled }),
          },
          {
            // A libvirt guest's cores (its vCPU threads' cgroups are threaded, so the guest's
            // scope is their owner), with the domain name the exporter decodes from the scope
            // below machine.slice (amd_hsmp_core_owner_info's vm label: every systemd escape
            // undone). Deprecated, kept for this release only (CHANGELOG.md): for an exporter
            // that does not label vm, the name is taken from the owner here, up to vmNameDashes
            // escapes undone.
            record: 'instance_vm:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (%s) (
                instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%s,vm!=""}
                or
                %s
              )
            ||| % [$.ownerLabelsBut(['vm']), $._config.amdHsmpSelector, undoDashes(
              |||
                label_replace(
                  instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,%(unlabelled)s,owner=~"%(vmRegex)s"},
                  "vm", "$1", "owner", "%(vmRegex)s"
                )
              ||| % ($._config { unlabelled: $.unlabelled }),
              $._config.vmNameDashes
            )],
          },
          {
            // Per pod, named as kube-state-metrics names it (namespace, pod).
            record: 'instance_pod:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              instance_pod_uid:amd_hsmp_power_watts:sum_rate5m{%(amdHsmpSelector)s}
              * on (pod_uid) group_left (namespace, pod)
                max by (pod_uid, namespace, pod) (
                  label_replace(kube_pod_info{%(kubeStateMetricsSelector)s}, "pod_uid", "$1", "uid", "(.+)")
                  * 0 + 1
                )
            ||| % $._config,
          },
          {
            // Per container that owns its cores (kubelet's static CPU manager), named as
            // kube-state-metrics names it (namespace, pod, container).
            record: 'instance_container:amd_hsmp_power_watts:sum_rate5m',
            expr: |||
              sum without (%(others)s, container_runtime_id) (
                (
                  label_replace(
                    instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,container_id!=""},
                    "container_runtime_id", "$1", "container_id", "(.+)"
                  )
                  or
                  label_replace(
                    instance_owner:amd_hsmp_owner_power_watts:sum_rate5m{%(amdHsmpSelector)s,%(unlabelled)s,owner=~"%(containerIdRegex)s"},
                    "container_runtime_id", "$1", "owner", "%(containerIdRegex)s"
                  )
                )
                * on (container_runtime_id) group_left (namespace, pod, container)
                  max by (container_runtime_id, namespace, pod, container) (
                    label_replace(
                      kube_pod_container_info{%(kubeStateMetricsSelector)s},
                      "container_runtime_id", "$1", "container_id", "[^:]+://(.+)"
                    )
                    * 0 + 1
                  )
              )
            ||| % ($._config { others: $.ownerLabelsBut([]), unlabelled: $.unlabelled }),
          },
        ],
      },
      {
        // What the package draws beside its cores (the I/O die, memory controllers, fabric,
        // and the cores' share HSMP does not count), per socket: the package's rate minus the
        // cores'. The package is HSMP's own counter where the firmware answers it (Turin and
        // later: the same series' labels, so a plain subtraction); elsewhere node_exporter's
        // RAPL collector where it runs on the same host, whose index is the powercap package
        // zone's number, which is the socket. `or` keeps HSMP's for a socket that has both.
        name: 'amd-hsmp.remainder.rules',
        rules: [
          {
            // Absent, never below zero, where the firmware reports the package below its own
            // cores: the rule below states by how much instead.
            record: 'instance_socket:amd_hsmp_package_minus_cores_power_watts:rate5m',
            expr: '(\n%s) >= 0\n' % $.packageMinusCores,
          },
          {
            // Where the firmware's package counter runs below the cores it contains (a
            // firmware's own numbers): the cores' power above the package, per socket, so that
            // such sockets are counted, not hidden as a negative remainder.
            record: 'instance_socket:amd_hsmp_cores_above_package_power_watts:rate5m',
            expr: '-(\n%s) > 0\n' % $.packageMinusCores,
          },
        ],
      },
    ],
  },
}
