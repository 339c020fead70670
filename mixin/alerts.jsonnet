// `jsonnet -S alerts.jsonnet > prometheus_alerts.yaml`
std.manifestYamlDoc((import 'mixin.libsonnet').prometheusAlerts, false, false)
