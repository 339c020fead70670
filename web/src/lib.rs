//! The web layer of an exporter, what Prometheus' exporter-toolkit is to a Go exporter: a
//! bounded HTTP/1 server ([`server`]: connection caps overall and per client address, timeouts,
//! eviction of silent connections, TLS handshakes), the exporter-toolkit web configuration file
//! ([`config`]: strict YAML, reloads, files read off the serving threads), TLS ([`tls`]),
//! basic auth with bcrypt bounded by one thread ([`auth`]) and the middleware that applies it
//! and the configured headers ([`layer`]), log lines and requests at a bounded rate
//! ([`ratelimit`]), refusals counted by reason and logged ([`refused`]), the parts of a client
//! certificate its checks read (`x509`), and the front door, as exporter-toolkit's `AddFlags`
//! and `ListenAndServe`: the `--web.*` flags ([`flags`]) and the listeners they ask for
//! ([`listen`]).
//!
//! **Invariant:** it knows nothing of HSMP or of the exporter's metrics: an exporter flattens
//! [`flags::WebArgs`] and [`flags::ServerArgs`] into its flags (its port as the default address,
//! [`flags::with_default_listen_address`]), binds with [`listen::listen`], loads a
//! configuration ([`config::WebState::load`]), puts [`layer::middleware`] in front of its
//! router and serves it with [`server::serve`] within the [`server::Limits`] of
//! [`flags::ServerArgs::limits`].
#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod config;
pub mod files;
pub mod flags;
pub mod layer;
pub mod listen;
pub mod ratelimit;
pub mod refused;
pub mod server;
pub mod tls;
mod x509;
