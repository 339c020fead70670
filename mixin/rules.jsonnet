// `jsonnet -S rules.jsonnet > prometheus_rules.yaml`
std.manifestYamlDoc((import 'mixin.libsonnet').prometheusRules, false, false)
