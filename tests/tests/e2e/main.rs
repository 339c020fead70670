//! The end-to-end suite of amd-hsmp-exporter in one test binary: the real broker and exporter
//! binaries against the FUSE fake device, fixture machines and golden scrapes
//! (`tests/README.md`). One module per part; they share the harness's per-process state (the
//! binaries built once, `harness::one_at_a_time`).

mod broker;
mod cardinality;
mod check;
mod collectors;
mod conventions;
mod costs;
mod demo;
mod frontend;
mod hostile;
mod hotplug;
mod sampler_faults;
mod scenarios;
mod web;
mod workload;
