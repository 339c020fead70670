//! The end-to-end suite's machinery: the FUSE fake device, fixture machines, scenarios, the
//! harness that runs the real broker and exporter binaries, and golden-file comparison.
//!
//! The suite is one test binary, `tests/e2e/`: `scenarios.rs` (the scenarios), `broker.rs` (the
//! broker binary alone) and a module per other part; `tests/README.md` says how to add a
//! machine or a scenario and how to refresh the golden files.

#![forbid(unsafe_code)]

pub mod cgroupfs;
pub mod cgroups;
pub mod energy;
pub mod fake;
pub mod fixtures;
pub mod golden;
pub mod harness;
pub mod scenario;
