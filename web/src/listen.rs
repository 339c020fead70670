//! The listening sockets [`crate::flags::WebArgs`] asks for, as exporter-toolkit's
//! `ListenAndServe` finds them: each `--web.listen-address` bound (its candidates in order), or
//! with `--web.systemd-socket` every socket systemd passed.

use crate::flags::{ListenAddress, WebArgs};
use std::io;
use tokio::net::TcpListener;

/// The listen backlog of the sockets bound here.
pub const BACKLOG: u32 = 1024;

/// Why no listener came of the flags.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// No candidate of the address could be bound (the last candidate's error).
    #[error("cannot listen on {address}")]
    Bind {
        /// The flag's address.
        address: ListenAddress,
        /// Why its last candidate failed.
        #[source]
        source: io::Error,
    },
    /// Neither an address nor `--web.systemd-socket`: nothing to serve on.
    #[error("no --web.listen-address and no --web.systemd-socket: nothing to listen on")]
    NoAddress,
    /// `--web.systemd-socket` without sockets for this process.
    #[error(
        "--web.systemd-socket: systemd passed no socket (LISTEN_FDS unset or 0, or LISTEN_PID is \
         another process)"
    )]
    NoSocket,
    /// A passed descriptor is not a listening TCP socket.
    #[error("--web.systemd-socket: socket {index} is not a TCP listener")]
    NotTcp {
        /// Its index among the passed sockets.
        index: usize,
        /// What checking it said.
        #[source]
        source: io::Error,
    },
    /// A passed descriptor was taken before.
    #[error("--web.systemd-socket: socket {index} was already taken")]
    Taken {
        /// Its index among the passed sockets.
        index: usize,
    },
    /// A passed socket could not be made non-blocking.
    #[error("--web.systemd-socket: cannot set O_NONBLOCK")]
    Nonblocking(#[source] io::Error),
    /// A passed socket could not join the runtime.
    #[error("--web.systemd-socket")]
    Register(#[source] io::Error),
}

/// The listeners `args` asks for, on the current tokio runtime: systemd's sockets with
/// `--web.systemd-socket`, else each `--web.listen-address` bound.
pub async fn listen(args: &WebArgs) -> Result<Vec<TcpListener>, ListenError> {
    if args.systemd_socket {
        return systemd_listeners();
    }
    if args.listen_addresses.is_empty() {
        return Err(ListenError::NoAddress);
    }
    let mut listeners = Vec::new();
    for address in &args.listen_addresses {
        listeners.push(bind(*address).await?);
    }
    Ok(listeners)
}

/// Binds one `--web.listen-address`, trying its candidates in order.
async fn bind(address: ListenAddress) -> Result<TcpListener, ListenError> {
    let mut last = None;
    for candidate in address.candidates() {
        match bind_one(candidate) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    let source = last.unwrap_or_else(|| io::Error::other("no address to bind"));
    Err(ListenError::Bind { address, source })
}

/// A listening socket on `addr` with a backlog of [`BACKLOG`] (capped by the kernel's
/// `net.core.somaxconn`), so a burst of connections waits in the kernel for the accept loop
/// instead of losing SYNs (and their clients a second to retransmission).
fn bind_one(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// `--web.systemd-socket`: every socket systemd passed (`LISTEN_FDS`, for this process's
/// `LISTEN_PID`), each a listening TCP socket.
fn systemd_listeners() -> Result<Vec<TcpListener>, ListenError> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Err(ListenError::NoSocket);
    }
    let mut listeners = Vec::new();
    for index in 0..fds.len() {
        let listener = fds
            .take_tcp_listener(index)
            .map_err(|source| ListenError::NotTcp { index, source })?
            .ok_or(ListenError::Taken { index })?;
        listener.set_nonblocking(true).map_err(ListenError::Nonblocking)?;
        listeners.push(TcpListener::from_std(listener).map_err(ListenError::Register)?);
    }
    Ok(listeners)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(addresses: &[&str]) -> WebArgs {
        WebArgs {
            listen_addresses: addresses
                .iter()
                .map(|a| crate::flags::parse_listen_address(a).unwrap())
                .collect(),
            systemd_socket: false,
            web_config_file: None,
        }
    }

    #[tokio::test]
    async fn each_listen_address_is_bound_in_order() {
        let listeners = listen(&args(&["127.0.0.1:0", "localhost:0"])).await.unwrap();
        assert_eq!(listeners.len(), 2);
        for listener in &listeners {
            assert!(listener.local_addr().unwrap().ip().is_loopback());
        }
    }

    #[tokio::test]
    async fn no_address_is_an_error_not_a_server_without_sockets() {
        assert!(matches!(listen(&args(&[])).await, Err(ListenError::NoAddress)));
    }

    #[tokio::test]
    async fn an_address_in_use_names_the_flag_value_and_the_cause() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let err = listen(&args(&[&address])).await.unwrap_err();
        let chain = amd_hsmp_cli::chain(&err);
        assert!(chain.starts_with(&format!("cannot listen on {address}: ")), "{chain}");
        assert!(
            matches!(err, ListenError::Bind { ref source, .. }
            if source.kind() == io::ErrorKind::AddrInUse),
            "{err:?}"
        );
    }
}
