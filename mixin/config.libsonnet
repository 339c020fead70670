// Settings of the amd-hsmp mixin. Override any of them in your own jsonnet:
//   (import 'mixin.libsonnet') + { _config+:: { amdHsmpSelector: 'job="epyc"' } }
{
  _config+:: {
    // Selects the exporter's targets in every alert and rule. The dashboards' `job` variable
    // offers the jobs it selects (the first is the default) and their queries filter by the
    // `job` and `instance` variables instead.
    amdHsmpSelector: 'job="amd_hsmp"',
    // Extra matchers for the hosts that are expected to have /dev/hsmp (AmdHsmpDeviceDown).
    // Rome (family 17h) and non-EPYC hosts have none and always report amd_hsmp_up 0: exclude
    // them here, e.g. 'cpu_family!="17h"' (a target label of your own), or leave it empty.
    hsmpDeviceSelector: '',
    // Selects node_exporter's targets in any rule or panel that joins its series (node-mixin's
    // name; kube-prometheus and kube-prometheus-stack both call the job node-exporter).
    nodeExporterSelector: 'job="node-exporter"',
    // The label whose value names the same node in this exporter's series and node_exporter's:
    // what the joins match on. The Helm chart's instanceLabel (nodeName under kube-prometheus,
    // nodeIP under kube-prometheus-stack) makes `instance` fit; see docs/kubernetes.md.
    nodeExporterJoinLabel: 'instance',
    // Several clusters in one data source (node-mixin's names): with showMultiCluster the fleet
    // dashboard gets a `cluster` variable over clusterLabel and filters every query by it;
    // without, the variable is hidden and no query uses it.
    showMultiCluster: false,
    clusterLabel: 'cluster',

    // How long each condition must hold before its alert fires.
    exporterDownFor: '5m',
    brokerDownFor: '5m',
    deviceDownFor: '10m',
    prochotFor: '5m',
    // AmdHsmpProchotFrequent: the hour's share held this long, so that a few minutes of data
    // after a start (a short window whose share is easily high) do not fire it.
    prochotFrequentFor: '15m',
    boostLimitLowFor: '15m',
    frequencyLimitedFor: '15m',
    scrapeErrorsFor: '15m',

    // AmdHsmpProchotFrequent: share of the last hour a socket spent with PROCHOT asserted.
    prochotShareThreshold: 0.25,
    // AmdHsmpBoostLimitLow: the socket's average boost limit below this fraction of its highest
    // average over boostLimitUsualWindow.
    boostLimitRatio: 0.9,
    boostLimitUsualWindow: '1d',
    // AmdHsmpFrequencyLimited: a socket's frequency limit below this fraction of its highest
    // core boost limit over boostLimitUsualWindow, imposed by one of these limiters (a regex of
    // the `reason` label of amd_hsmp_socket_frequency_limit_reason).
    frequencyLimitRatio: 0.8,
    frequencyLimitReasons: 'ppt|tdc|chtc|prochot',
    // AmdHsmpEnergyCounterReset: window in which a reset of a core's energy counter is reported.
    energyResetWindow: '30m',

    criticalSeverity: 'critical',

    // The workload identity labels the exporter puts on amd_hsmp_core_owner_info, from one
    // table of cgroup layouts (docs/metrics.md, "Labels"): the per-workload rules sum by them.
    identityLabels: ['hpc_job', 'slurm_sluid', 'step', 'pod_uid', 'container_id', 'vm', 'unit'],

    // Deprecated, for one release: label extraction from amd_hsmp_core_owner_info's owner (a
    // cgroup path) for an exporter of an earlier release that gives no identity label. Each
    // regex matches the whole path (PromQL anchors it) and only where the workload's manager
    // puts its cgroups, as the exporter's table does.
    // Slurm's cgroup v2 plugin: the job id of /<slices>/[<node>_]slurmstepd.scope/job_<id>[/...]
    // (the slices not a user's: userSliceRegex).
    slurmJobRegex: '/(?:[^/]+[.]slice/)+(?:[^/]+_)?slurmstepd[.]scope/job_([0-9]+)(/.*)?',
    userSliceRegex: '/user[.]slice(/.*)?',
    // kubelet, systemd and cgroupfs drivers, at the hierarchy's root: the five groups of the
    // pod UID.
    podUidRegex: '/kubepods(?:[.]slice)?(?:/kubepods-(?:burstable|besteffort)[.]slice|/burstable|/besteffort)?/(?:kubepods-(?:burstable-|besteffort-)?)?pod([0-9a-f]{8})[_-]([0-9a-f]{4})[_-]([0-9a-f]{4})[_-]([0-9a-f]{4})[_-]([0-9a-f]{12})(?:[.]slice)?(?:/.*)?',
    // systemd: a service or scope below system.slice, through slices only.
    unitRegex: '/system[.]slice(?:/[^/]+[.]slice)*/([^/]+[.](?:service|scope))',
    // Slurm: the job and the step of .../job_<id>/step_<batch|extern|interactive|N|N+M>[/...].
    slurmStepRegex: '/(?:[^/]+[.]slice/)+(?:[^/]+_)?slurmstepd[.]scope/job_([0-9]+)/step_(batch|extern|interactive|[0-9]+(?:[+][0-9]+)?)(?:/.*)?',
    // libvirt below machine.slice: the escaped domain name of machine-qemu\x2d<id>\x2d<name>.scope,
    // written for a PromQL string (a backslash twice); no control character and no U+FFFD (a
    // byte the owner label could not keep).
    vmRegex: @'/machine[.]slice/(?:.*/)?machine-qemu\\\\x2d[0-9]+\\\\x2d([^/[:cntrl:]\\x{FFFD}]+)[.]scope(?:/.*)?',
    // How many of systemd's \x2d escapes (a '-' of the domain name) the fallback undoes.
    vmNameDashes: 8,
    // A container's runtime id in its pod's cgroup (containerd, CRI-O or Docker under either
    // cgroup driver), as kube-state-metrics' container_id has it after "<runtime>://".
    containerIdRegex: '/kubepods(?:[.]slice)?/.*/(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})(?:[.]scope)?',
    // The series the per-pod and per-container rules join for names (the package energy of the
    // package-minus-cores rule is selected with nodeExporterSelector, above).
    kubeStateMetricsSelector: 'job="kube-state-metrics"',
    // The node's name in both exporters' instance label: the host without the port.
    instanceHostRegex: '(.+):[0-9]+',

    // Each alert's runbook_url: this pattern with the alert's name in lower case.
    runbookURLPattern: 'https://github.com/amd-hsmp-exporter/amd-hsmp-exporter/blob/main/mixin/runbook.md#%s',

    // Grafana.
    dashboardNamePrefix: 'AMD HSMP / ',
    dashboardTags: ['amd-hsmp-mixin'],
    dashboardRefresh: '30s',
    dashboardTimezone: 'utc',
    // How many nodes the fleet dashboard's top/bottom panels list.
    fleetTopK: 20,
  },
}
