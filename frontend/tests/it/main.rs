//! Integration tests of amd-hsmp-exporter: scrapes against an in-process mock broker, the
//! output checked by promtool and against docs/metrics.md, and the bounded HTTP server. The
//! binaries themselves are tested end to end in the e2e crate (`tests/tests/e2e/frontend.rs`).

mod core_owner;
mod docs;
mod mock_broker;
mod promtool;
mod server;
mod support;
