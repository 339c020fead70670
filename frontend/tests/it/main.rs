//! Integration tests of amd-hsmp-exporter: scrapes against an in-process mock broker, the
//! output checked by promtool and against docs/metrics.md, and the real binaries end to end.

mod binaries;
mod docs;
mod mock_broker;
mod promtool;
mod server;
mod support;
