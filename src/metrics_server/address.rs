// SPDX-License-Identifier: Apache-2.0
//! Listen addresses as dcgm-exporter takes them (`--address`, `DCGM_EXPORTER_LISTEN`,
//! Go's `host:port`): `:9400` is every interface, `127.0.0.1:9400` one IPv4 address,
//! `[::1]:9400` one IPv6 address, `localhost:9400` a name resolved once.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};

/// The forms we accept, for error messages.
const VALID: &str = "valid: :PORT, IPv4:PORT, [IPv6]:PORT or HOSTNAME:PORT, e.g. :9400";

/// A parsed listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddress {
    /// `:PORT`: every interface, IPv6 and IPv4 where the host has IPv6.
    AllInterfaces(u16),
    /// An IP literal with its port.
    Ip(SocketAddr),
    /// A host name to resolve, and the port.
    Host(String, u16),
}

/// Why an address cannot be listened on.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("listen address {address:?}: {problem} ({VALID})")]
    Invalid {
        address: String,
        problem: &'static str,
    },
    #[error("listen address {address:?}: cannot resolve the host name: {source}")]
    Resolve {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {address:?} ({tried}): {source}")]
    Bind {
        address: String,
        tried: SocketAddr,
        #[source]
        source: io::Error,
    },
}

impl std::str::FromStr for ListenAddress {
    type Err = AddressError;

    fn from_str(address: &str) -> Result<Self, AddressError> {
        let invalid = |problem| AddressError::Invalid {
            address: address.to_owned(),
            problem,
        };
        let (host, port) = address.rsplit_once(':').ok_or(invalid("no :PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| invalid("the port is not a number from 0 to 65535"))?;
        if host.is_empty() {
            return Ok(Self::AllInterfaces(port));
        }
        if let Some(inner) = host.strip_prefix('[') {
            let ip = inner
                .strip_suffix(']')
                .and_then(|ip| ip.parse::<Ipv6Addr>().ok())
                .ok_or(invalid("not an IPv6 address in brackets"))?;
            return Ok(Self::Ip(SocketAddr::new(IpAddr::V6(ip), port)));
        }
        if host.contains(':') {
            return Err(invalid("an IPv6 address needs brackets"));
        }
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return Ok(Self::Ip(SocketAddr::new(IpAddr::V4(ip), port)));
        }
        let name_ok = host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !name_ok {
            return Err(invalid("the host is neither an IP address nor a host name"));
        }
        Ok(Self::Host(host.to_owned(), port))
    }
}

/// Parses `address` and binds a listener to it. `:PORT` binds `[::]:PORT` (which
/// takes IPv4 too, as Go's listener does) and falls back to `0.0.0.0:PORT` on a host
/// without IPv6.
pub fn bind(address: &str) -> Result<TcpListener, AddressError> {
    let bind_one = |tried: SocketAddr| {
        TcpListener::bind(tried).map_err(|source| AddressError::Bind {
            address: address.to_owned(),
            tried,
            source,
        })
    };
    match address.parse::<ListenAddress>()? {
        ListenAddress::AllInterfaces(port) => {
            bind_one(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)).or_else(|v6| {
                match &v6 {
                    AddressError::Bind { source, .. }
                        if matches!(
                            source.raw_os_error(),
                            Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
                        ) =>
                    {
                        bind_one(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
                    }
                    _ => Err(v6),
                }
            })
        }
        ListenAddress::Ip(addr) => bind_one(addr),
        ListenAddress::Host(host, port) => {
            let resolved = (host.as_str(), port).to_socket_addrs().map_err(|source| {
                AddressError::Resolve {
                    address: address.to_owned(),
                    source,
                }
            })?;
            let mut last = None;
            for addr in resolved {
                match bind_one(addr) {
                    Ok(listener) => return Ok(listener),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| AddressError::Resolve {
                address: address.to_owned(),
                source: io::Error::new(io::ErrorKind::NotFound, "no addresses"),
            }))
        }
    }
}
