// Settings of the amd-hsmp mixin. Override any of them in your own jsonnet:
//   (import 'mixin.libsonnet') + { _config+:: { amdHsmpSelector: 'job="epyc"' } }
// Keys of earlier releases, each with where its setting lives now: a config that still sets one
// fails, rather than silently losing the setting.
local moved = {
  exporterDownFor: 'alerts.AmdHsmpExporterDown.for',
  brokerDownFor: 'alerts.AmdHsmpBrokerDown.for',
  deviceDownFor: 'alerts.AmdHsmpDeviceDown.for',
  prochotFor: 'alerts.AmdHsmpProchotAsserted.for',
  prochotFrequentFor: 'alerts.AmdHsmpProchotFrequent.for',
  boostLimitLowFor: 'alerts.AmdHsmpBoostLimitLow.for',
  frequencyLimitedFor: 'alerts.AmdHsmpFrequencyLimited.for',
  scrapeErrorsFor: 'alerts.AmdHsmpScrapeErrors.for',
  prochotShareThreshold: 'alerts.AmdHsmpProchotFrequent.threshold',
  boostLimitRatio: 'alerts.AmdHsmpBoostLimitLow.threshold',
  frequencyLimitRatio: 'alerts.AmdHsmpFrequencyLimited.threshold',
  criticalSeverity: 'alerts.AmdHsmpProchotAsserted.severity',
  runbookURLPattern: 'runbookBaseURL (without the #%s)',
};
{
  _config+:: {
    local config = self,
    local stale = [k for k in std.objectFields(moved) if std.objectHasAll(config, k)],
    assert stale == [] : 'mixin config keys moved: %s' % std.join(', ', ['%s is now %s' % [k, moved[k]] for k in stale]),

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

    // Each alert by name: whether it is made (`enabled`), how long its condition must hold before
    // it fires (`for`; null: at once), its `severity` label, and for three alerts the
    // `threshold` of their condition. The Helm chart's prometheusRule.alerts takes the same keys
    // (mixin/README.md, "Tuning the alerts").
    alerts: {
      AmdHsmpExporterDown: { enabled: true, 'for': '5m', severity: 'warning' },
      AmdHsmpBrokerDown: { enabled: true, 'for': '5m', severity: 'warning' },
      AmdHsmpDeviceDown: { enabled: true, 'for': '10m', severity: 'warning' },
      AmdHsmpProchotAsserted: { enabled: true, 'for': '5m', severity: 'critical' },
      // The share of the last hour a socket spent with PROCHOT asserted; held 15m, so that a few
      // minutes of data after a start (a short window whose share is easily high) do not fire it.
      AmdHsmpProchotFrequent: { enabled: true, 'for': '15m', severity: 'warning', threshold: 0.25 },
      // The socket's average boost limit below this fraction of its highest average over
      // boostLimitUsualWindow.
      AmdHsmpBoostLimitLow: { enabled: true, 'for': '15m', severity: 'warning', threshold: 0.9 },
      // A socket's frequency limit below this fraction of its highest core boost limit over
      // boostLimitUsualWindow, imposed by one of frequencyLimitReasons.
      AmdHsmpFrequencyLimited: { enabled: true, 'for': '15m', severity: 'warning', threshold: 0.8 },
      AmdHsmpScrapeErrors: { enabled: true, 'for': '15m', severity: 'warning' },
      AmdHsmpEnergyCounterReset: { enabled: true, 'for': null, severity: 'info' },
      AmdHsmpSimulated: { enabled: true, 'for': null, severity: 'warning' },
    },
    // Labels added to every alert (a team, a routing key); an alert's own labels (severity)
    // win over them.
    alertLabels: {},

    // The window over which the usual boost limit is taken (AmdHsmpBoostLimitLow,
    // AmdHsmpFrequencyLimited), and the limiters AmdHsmpFrequencyLimited fires for (a regex of
    // the `reason` label of amd_hsmp_socket_frequency_limit_reason).
    boostLimitUsualWindow: '1d',
    frequencyLimitReasons: 'ppt|tdc|chtc|prochot',
    // AmdHsmpEnergyCounterReset: window in which a reset of a core's energy counter is reported.
    energyResetWindow: '30m',

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

    // Each alert's runbook_url: this URL, '#' and the alert's name in lower case (runbook.md's
    // section of it).
    runbookBaseURL: 'https://github.com/amd-hsmp-exporter/amd-hsmp-exporter/blob/main/mixin/runbook.md',

    // Grafana.
    dashboardNamePrefix: 'AMD HSMP / ',
    dashboardTags: ['amd-hsmp-mixin'],
    dashboardRefresh: '30s',
    dashboardTimezone: 'utc',
    // How many nodes the fleet dashboard's top/bottom panels list.
    fleetTopK: 20,
  },
}
