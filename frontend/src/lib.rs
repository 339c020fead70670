//! amd-hsmp-exporter, the unprivileged, network-facing half: serves `/metrics` over HTTP from
//! what `amd-hsmp-broker` reads, asking it over a Unix socket once per scrape.
//!
//! **Invariant:** this crate opens no device and needs no privilege; everything it knows about
//! the hardware comes through [`amd_hsmp_proto`]. An unavailable value is an absent series,
//! never a sentinel, and a missing broker or device never stops the process.
#![forbid(unsafe_code)]
// What the binary, the tests, xtask and fuzz use is `pub`; everything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod budget;
pub mod cli;
pub mod collectors;
pub mod gzip;
pub mod http;
pub mod metrics;
pub mod scrape;

mod broker;
mod flight;
mod landing;
mod owner;
mod process;
mod translate;
mod work;
mod workload;
