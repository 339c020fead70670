//! `amd-hsmp-broker`: the privileged half of amd-hsmp-exporter.
//!
//! It discovers the topology, opens `/dev/hsmp` (and, opt-in, the MSR devices) once at start-up,
//! drops every capability, and answers the typed requests of [`amd_hsmp_proto`] on a Unix socket.
//!
//! **Invariant:** the broker never listens on an IP socket and never parses text from a peer.
//! **Invariant:** `unsafe` lives only in [`sys`].
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod hsmp;
pub mod lockdown;
pub mod msr;
pub mod sampler;
pub mod server;
pub mod sim;
pub mod sleep;
pub mod sys;
pub mod topology;
