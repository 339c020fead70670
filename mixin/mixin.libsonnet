// The amd-hsmp mixin: recording rules, alerts and Grafana dashboards for amd-hsmp-exporter.
(import 'config.libsonnet') +
(import 'rules/rules.libsonnet') +
(import 'rules/workloads.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
