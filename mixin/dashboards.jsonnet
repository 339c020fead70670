// `jsonnet -m dashboards_out dashboards.jsonnet` writes one file per dashboard.
(import 'mixin.libsonnet').grafanaDashboards
