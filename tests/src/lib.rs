//! The end-to-end suite's machinery: the FUSE fake device, fixture machines, scenarios, the
//! harness that runs the real broker and exporter binaries, and golden-file comparison.

pub mod fake;
pub mod fixtures;
