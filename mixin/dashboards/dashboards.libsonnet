(import 'node.libsonnet') + (import 'fleet.libsonnet')
