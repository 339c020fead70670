//! `amd-hsmp-exporter`: parses the flags, sets up logging, binds the listen addresses and
//! serves until SIGTERM or SIGINT. SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored.
//!
//! Exit codes: 0 after a clean shutdown, 1 when start-up fails (e.g. an address cannot be
//! bound), 2 for invalid flags. A missing broker or device is never a reason to exit.
#![forbid(unsafe_code)]

use amd_hsmp_exporter::cli::Args;
use amd_hsmp_exporter::server::{self, Admission};
use amd_hsmp_exporter::{Config, Exporter, app};
use anyhow::Context as _;
use clap::Parser as _;
use std::process::ExitCode;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

fn main() -> ExitCode {
    let args = Args::parse();
    if args.common.version {
        print!("{}", amd_hsmp_cli::version::report("amd-hsmp-exporter"));
        return ExitCode::SUCCESS;
    }
    if let Err(e) = amd_hsmp_cli::log::init(args.common.log_level, args.common.log_format) {
        eprintln!("amd-hsmp-exporter: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("amd-hsmp-exporter: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run(args: Args) -> anyhow::Result<()> {
    // First, so that a SIGHUP during start-up does not end the process either.
    let signals = Signals::install()?;
    let families = args.families();
    let fd_limit = server::fd_limit();
    let (limits, lowered) = args.limits(fd_limit).map_err(anyhow::Error::msg)?;
    if let Some(lowered) = lowered {
        tracing::info!("{lowered}");
    }
    let exporter = Exporter::new(Config {
        broker_socket: args.broker_socket.clone(),
        families,
        max_scrape_timeout: args.max_scrape_timeout,
        max_requests: args.max_requests,
        telemetry_path: args.telemetry_path.clone(),
        procfs: "/proc".into(),
    });
    let router = app(exporter);

    let mut listeners = Vec::new();
    for address in &args.listen_addresses {
        listeners.push(bind(*address).await?);
    }
    tracing::info!(
        version = %amd_hsmp_cli::version::summary(),
        broker_socket = %args.broker_socket.display(),
        telemetry_path = %args.telemetry_path,
        core_energy = families.core_energy,
        boost_limit = families.boost_limit,
        prochot = families.prochot,
        fd_limit = fd_limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
        max_connections = limits.max_connections,
        max_connections_per_client = limits.max_per_client,
        max_requests = args.max_requests,
        "amd-hsmp-exporter started"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    // One admission over all listeners: the caps are about this process's descriptors.
    let admission = Admission::new(limits);
    let mut servers = tokio::task::JoinSet::new();
    for listener in listeners {
        let local = listener.local_addr().context("cannot read a bound address")?;
        tracing::info!(address = %local, "listening");
        servers.spawn(server::serve(listener, router.clone(), admission.clone(), stop_rx.clone()));
    }

    signals.until_shutdown().await;
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    while let Some(result) = servers.join_next().await {
        result.context("server task failed")?;
    }
    Ok(())
}

/// Binds one `--web.listen-address`, trying its candidates in order.
async fn bind(address: amd_hsmp_exporter::cli::ListenAddress) -> anyhow::Result<TcpListener> {
    let mut last = None;
    for candidate in address.candidates() {
        match TcpListener::bind(candidate).await {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    let error = last.unwrap_or_else(|| std::io::Error::other("no address to bind"));
    Err(error).with_context(|| format!("cannot listen on {address}"))
}

/// The signals the exporter handles. SIGTERM and SIGINT shut it down; SIGHUP, SIGUSR1 and
/// SIGUSR2, whose default action would end it (and which systemd counts as a clean exit), are
/// ignored: there is no configuration file to re-read yet. Each is logged the first time.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        let install = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("cannot install the {name} handler"))
        };
        Ok(Signals {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
            usr1: install(SignalKind::user_defined1(), "SIGUSR1")?,
            usr2: install(SignalKind::user_defined2(), "SIGUSR2")?,
        })
    }

    /// Resolves on the first SIGTERM or SIGINT.
    async fn until_shutdown(mut self) {
        let mut logged = [false; 3];
        loop {
            let (index, name) = tokio::select! {
                _ = self.term.recv() => return,
                _ = self.int.recv() => return,
                _ = self.hup.recv() => (0, "SIGHUP"),
                _ = self.usr1.recv() => (1, "SIGUSR1"),
                _ = self.usr2.recv() => (2, "SIGUSR2"),
            };
            if std::mem::replace(&mut logged[index], true) {
                tracing::debug!(signal = name, "signal ignored");
            } else {
                tracing::info!(
                    signal = name,
                    "signal ignored: amd-hsmp-exporter has no configuration file to re-read \
                     (further ones are logged at debug level)"
                );
            }
        }
    }
}
