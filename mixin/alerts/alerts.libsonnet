// Alerts. Each has a summary, a description and a runbook_url pointing at its section of
// runbook.md; mixin/tests/alerts_test.yaml makes every one fire on a bad series and stay quiet
// on a healthy one.
{
  local c = $._config,
  // The config's values by name for the alerts' texts: its own, and each alert's `for` and
  // `threshold` as for_NAME and threshold_NAME.
  local v = c + {
    ['for_' + name]: c.alerts[name]['for']
    for name in std.objectFields(c.alerts)
  } + {
    // A number as written ('%g'); a string (the Helm chart's placeholder) as it is.
    ['threshold_' + name]: local t = c.alerts[name].threshold; if std.isNumber(t) then '%g' % t else t
    for name in std.objectFields(c.alerts)
    if std.objectHas(c.alerts[name], 'threshold')
  },
  local deviceSelector = std.join(',', std.filter(function(s) s != '', [c.amdHsmpSelector, c.hsmpDeviceSelector])),

  _amdHsmpAlerts:: [
    {
      alert: 'AmdHsmpExporterDown',
      expr: |||
        up{%(amdHsmpSelector)s} == 0
      ||| % v,
            annotations: {
        summary: 'amd-hsmp-exporter cannot be scraped.',
        description: 'Prometheus has failed to scrape amd-hsmp-exporter on {{ $labels.instance }} for %(for_AmdHsmpExporterDown)s: no per-core energy, boost limit or PROCHOT from this node.' % v,
      },
    },
    {
      alert: 'AmdHsmpBrokerDown',
      expr: |||
        amd_hsmp_broker_up{%(amdHsmpSelector)s} == 0
      ||| % v,
            annotations: {
        summary: 'amd-hsmp-exporter cannot reach amd-hsmp-broker.',
        description: 'amd-hsmp-exporter on {{ $labels.instance }} has had no answer from amd-hsmp-broker for %(for_AmdHsmpBrokerDown)s: the scrape carries no telemetry.' % v,
      },
    },
    {
      alert: 'AmdHsmpDeviceDown',
      expr: |||
        amd_hsmp_up{%(deviceSelector)s} == 0
        and
        amd_hsmp_broker_up{%(deviceSelector)s} == 1
      ||| % { deviceSelector: deviceSelector },
            annotations: {
        summary: 'The HSMP device of the node is missing or unusable.',
        description: 'amd-hsmp-broker on {{ $labels.instance }} answers, but /dev/hsmp has been missing or unusable for %(for_AmdHsmpDeviceDown)s: no boost limit and PROCHOT, and no HSMP energy.' % v,
      },
    },
    {
      alert: 'AmdHsmpProchotAsserted',
      expr: |||
        amd_hsmp_prochot_active{%(amdHsmpSelector)s} == 1
      ||| % v,
            annotations: {
        summary: 'A CPU socket has been throttled by PROCHOT for minutes.',
        description: 'Socket {{ $labels.socket }} of {{ $labels.instance }} has had PROCHOT asserted for %(for_AmdHsmpProchotAsserted)s: the processor is throttled hard, usually for heat or a power-delivery limit.' % v,
      },
    },
    {
      alert: 'AmdHsmpProchotFrequent',
      expr: |||
        avg_over_time(amd_hsmp_prochot_active{%(amdHsmpSelector)s}[1h]) > %(threshold_AmdHsmpProchotFrequent)s
      ||| % v,
            annotations: {
        summary: 'A CPU socket spends a large share of its time throttled by PROCHOT.',
        description: 'Socket {{ $labels.socket }} of {{ $labels.instance }} had PROCHOT asserted for {{ $value | humanizePercentage }} of the last hour (threshold {{ %(threshold_AmdHsmpProchotFrequent)s | humanizePercentage }}).' % v,
      },
    },
    {
      alert: 'AmdHsmpBoostLimitLow',
      expr: |||
        instance_socket:amd_hsmp_core_boost_limit_hertz:avg{%(amdHsmpSelector)s}
        <
        %(threshold_AmdHsmpBoostLimitLow)s * max_over_time(instance_socket:amd_hsmp_core_boost_limit_hertz:avg{%(amdHsmpSelector)s}[%(boostLimitUsualWindow)s])
      ||| % v,
            annotations: {
        summary: 'A CPU socket has been held below its usual boost limit.',
        description: 'The average boost limit of socket {{ $labels.socket }} of {{ $labels.instance }} is {{ $value | humanize }}Hz, below {{ %(threshold_AmdHsmpBoostLimitLow)s | humanizePercentage }} of its highest in the last %(boostLimitUsualWindow)s, and has been for %(for_AmdHsmpBoostLimitLow)s.' % v,
      },
    },
    {
      // One alert per limiter holding the socket down: the reason series at 1, with the
      // socket's frequency limit as its value.
      alert: 'AmdHsmpFrequencyLimited',
      expr: |||
        (
          amd_hsmp_socket_frequency_limit_reason{%(amdHsmpSelector)s,reason=~"%(frequencyLimitReasons)s"} == 1
        )
        * ignoring (reason) group_left ()
        (
          amd_hsmp_socket_frequency_limit_hertz{%(amdHsmpSelector)s}
          <
          %(threshold_AmdHsmpFrequencyLimited)s * max_over_time(instance_socket:amd_hsmp_core_boost_limit_hertz:max{%(amdHsmpSelector)s}[%(boostLimitUsualWindow)s])
        )
      ||| % v,
            annotations: {
        summary: 'A CPU socket is held below its boost limit by {{ $labels.reason }}.',
        description: 'Socket {{ $labels.socket }} of {{ $labels.instance }} has been limited to {{ $value | humanize }}Hz, below {{ %(threshold_AmdHsmpFrequencyLimited)s | humanizePercentage }} of its highest core boost limit in the last %(boostLimitUsualWindow)s, by {{ $labels.reason }} for %(for_AmdHsmpFrequencyLimited)s.' % v,
      },
    },
    {
      alert: 'AmdHsmpScrapeErrors',
      expr: |||
        increase(amd_hsmp_scrape_errors_total{%(amdHsmpSelector)s}[5m]) > 0
      ||| % v,
            annotations: {
        summary: 'amd-hsmp-exporter keeps counting failed reads.',
        description: 'amd-hsmp-exporter on {{ $labels.instance }} has counted failed reads of collector {{ $labels.collector }} for %(for_AmdHsmpScrapeErrors)s ({{ $value | humanize }} in the last 5 minutes): the affected series are missing from its scrapes.' % v,
      },
    },
    {
      alert: 'AmdHsmpEnergyCounterReset',
      expr: |||
        sum without (core) (resets(amd_hsmp_core_energy_joules_total{%(amdHsmpSelector)s}[%(energyResetWindow)s])) > 0
      ||| % v,
      annotations: {
        summary: 'Core energy counters of a CPU socket went back.',
        description: '{{ $value }} core energy counter resets on socket {{ $labels.socket }} of {{ $labels.instance }} in the last %(energyResetWindow)s: the broker restarted (MSR source) or a counter was restarted after a possibly missed wrap.' % v,
      },
    },
    {
      alert: 'AmdHsmpSimulated',
      expr: |||
        amd_hsmp_simulated_info{%(amdHsmpSelector)s} == 1
      ||| % v,
      annotations: {
        summary: 'amd-hsmp-sim-broker serves simulated data.',
        description: '{{ $labels.instance }} reports the simulator profile {{ $labels.profile }} instead of the machine: its broker is amd-hsmp-sim-broker.',
      },
    },
  ],

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'amd-hsmp',
        rules: [
          a {
            [if c.alerts[a.alert]['for'] != null then 'for']: c.alerts[a.alert]['for'],
            labels: c.alertLabels { severity: c.alerts[a.alert].severity },
            annotations+: { runbook_url: '%s#%s' % [c.runbookBaseURL, std.asciiLower(a.alert)] },
          }
          for a in $._amdHsmpAlerts
          if c.alerts[a.alert].enabled
        ],
      },
    ],
  },
}
