//! The web layer of an exporter, what Prometheus' exporter-toolkit is to a Go exporter: a
//! bounded HTTP/1 server ([`server`]: connection caps overall and per client address, timeouts,
//! eviction of silent connections, TLS handshakes), the exporter-toolkit web configuration file
//! ([`config`]: strict YAML, reloads, files read off the serving threads), TLS ([`tls`]),
//! basic auth with bcrypt bounded by one thread ([`auth`]) and the middleware that applies it
//! and the configured headers ([`layer`]), and log lines at a bounded rate ([`ratelimit`]).
//!
//! **Invariant:** it knows nothing of HSMP or of the exporter's metrics: an exporter loads a
//! configuration ([`config::WebState::load`]), puts [`layer::middleware`] in front of its
//! router and serves it with [`server::serve`] within [`server::Limits`].
#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod config;
pub mod files;
pub mod layer;
pub mod ratelimit;
pub mod server;
pub mod tls;
