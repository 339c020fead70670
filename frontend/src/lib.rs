//! amd-hsmp-exporter, the unprivileged, network-facing half: serves `/metrics` over HTTP from
//! what `amd-hsmp-broker` reads, asking it over a Unix socket once per scrape.
//!
//! **Invariant:** this crate opens no device and needs no privilege; everything it knows about
//! the hardware comes through [`amd_hsmp_proto`]. An unavailable value is an absent series,
//! never a sentinel, and a missing broker or device never stops the process.
#![forbid(unsafe_code)]

pub mod broker;
pub mod budget;
pub mod cli;
pub mod flight;
pub mod http;
pub mod landing;
pub mod metrics;
pub mod owner;
pub mod process;
pub mod scrape;
pub mod translate;

pub use http::app;
pub use scrape::{Config, Exporter};
