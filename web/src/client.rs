//! Who a connection or request comes from, as the server's per-client limits count it.

use std::net::{IpAddr, Ipv6Addr};

/// The address a request came from, as an extension of every request the server hands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The address a per-client share is counted under: IPv4 as is (also when IPv4-mapped), IPv6
/// by its /64 prefix, since one host commonly holds a whole /64.
pub fn client_key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}
