//! The addresses `run` listens on (`--metrics-addr`, `--proxy-addr`), checked before anything
//! starts: one that is not an address, or that is the server's own, is refused up front with a
//! line saying which flag and what to give instead (not found out as a bind error, or as a
//! server that cannot take its port).
use sglang_probes::http::HttpUrl;
use std::net::IpAddr;

/// `HOST:PORT` as given to a listening flag (`:PORT` is loopback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// Without the brackets of an IPv6 literal.
    pub host: String,
    pub port: u16,
}

#[derive(Debug, thiserror::Error)]
pub enum ListenAddrError {
    #[error("{flag} {value:?} is not an address: {why}; give HOST:PORT (e.g. {example}, or :{port} for loopback, [::1]:{port} for IPv6){none}",
        port = example.rsplit(':').next().unwrap_or("0"),
        none = if *flag == "--metrics-addr" { ", or none" } else { "" })]
    Unparseable {
        flag: &'static str,
        value: String,
        why: &'static str,
        example: &'static str,
    },
    #[error("{flag} {value} is the server's own address ({server}, from {from}): the server and {flag} cannot both listen on it; give {flag} another port, e.g. {flag} {host}:{other}")]
    ServersOwn {
        flag: &'static str,
        value: String,
        server: String,
        /// Where the server's address was read: its --port, --upstream or --health-url.
        from: &'static str,
        host: String,
        other: u32,
    },
}

/// An example address per flag, for the error line.
fn example(flag: &'static str) -> &'static str {
    match flag {
        "--metrics-addr" => "127.0.0.1:19400",
        _ => "127.0.0.1:8001",
    }
}

/// Parse `value` given to `flag`: `HOST:PORT`, `:PORT` (loopback, as the listener binds it) or
/// `[V6]:PORT`; the host may be a name (it is resolved when bound).
pub fn parse(flag: &'static str, value: &str) -> Result<ListenAddr, ListenAddrError> {
    let bad = |why| ListenAddrError::Unparseable {
        flag,
        value: value.to_string(),
        why,
        example: example(flag),
    };
    let bound = sglang_exporters::server::with_host(value);
    let (host, port) = if let Some(rest) = bound.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| bad("no ]:PORT after an IPv6 host"))?;
        h.parse::<std::net::Ipv6Addr>()
            .map_err(|_| bad("the host in brackets is not an IPv6 address"))?;
        (h.to_string(), p)
    } else {
        let (h, p) = bound.rsplit_once(':').ok_or_else(|| bad("no :PORT"))?;
        if h.contains(':') {
            return Err(bad("an IPv6 host needs brackets"));
        }
        if h.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("the host has a space in it"));
        }
        (h.to_string(), p)
    };
    let port = port
        .parse::<u16>()
        .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    Ok(ListenAddr { host, port })
}

/// A host that is this machine's loopback or every interface (where a local server listens).
pub(crate) fn local(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

/// How a client on this machine reaches a host: what `--tap` on `lo` can see of its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Loopback (or every interface): `lo` carries all of a local client's traffic.
    Loopback,
    /// An address of this machine's own: Linux routes it over `lo` for clients here, while
    /// clients on other hosts come in on their interface.
    ThisHost,
    /// Another machine.
    Away,
    /// A name that did not resolve.
    Unresolved,
}

/// The route to `host`. A name is looked up (getaddrinfo, which blocks for as long as the
/// resolver takes: call it where that holds nothing up); one that resolves to several addresses
/// takes the farthest of their routes.
pub(crate) fn route(host: &str) -> Route {
    use std::net::ToSocketAddrs;
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if local(h) {
        return Route::Loopback;
    }
    let ips: Vec<IpAddr> = match h.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => match (h, 0).to_socket_addrs() {
            Ok(addrs) => addrs.map(|a| a.ip()).collect(),
            Err(_) => return Route::Unresolved,
        },
    };
    let own = own_addresses();
    ips.into_iter()
        .map(|ip| route_among(ip, &own))
        .max_by_key(|r| *r as u8)
        .unwrap_or(Route::Unresolved)
}

/// The route to an address, `own` being this machine's addresses ([`own_addresses`]).
pub(crate) fn route_among(ip: IpAddr, own: &[IpAddr]) -> Route {
    // ::ffff:127.0.0.1 is loopback too
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() {
        Route::Loopback
    } else if own.contains(&ip) {
        Route::ThisHost
    } else {
        Route::Away
    }
}

pub(crate) use crate::own_addresses::own_addresses;

/// Refuse a listening address that is the server's own: the same port (not 0) on the same host,
/// or both on this machine (loopback or every interface).
pub fn check_not_server(
    flag: &'static str,
    value: &str,
    addr: &ListenAddr,
    (server, from): (&HttpUrl, &'static str),
) -> Result<(), ListenAddrError> {
    let server_host = server.host.trim_start_matches('[').trim_end_matches(']');
    let same_host =
        addr.host.eq_ignore_ascii_case(server_host) || (local(server_host) && local(&addr.host));
    if addr.port == 0 || addr.port != server.port || !same_host {
        return Ok(());
    }
    let host = if addr.host.contains(':') {
        format!("[{}]", addr.host)
    } else {
        addr.host.clone()
    };
    Err(ListenAddrError::ServersOwn {
        flag,
        value: value.to_string(),
        server: server.base(),
        from,
        host,
        other: if addr.port == u16::MAX {
            u32::from(addr.port) - 1
        } else {
            u32::from(addr.port) + 1
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_for_loopback_and_this_machines_own_address_are_told_from_another_host() {
        assert_eq!(route("localhost"), Route::Loopback);
        assert_eq!(route("127.0.0.2"), Route::Loopback);
        assert_eq!(route("[::1]"), Route::Loopback);
        assert_eq!(route("[::ffff:127.0.0.1]"), Route::Loopback);
        assert_eq!(route("0.0.0.0"), Route::Loopback);
        // Names that /etc/hosts gives a loopback address, "localhost" aside (a host's own
        // name often is one).
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        let loopback_names = hosts.lines().filter_map(|l| {
            let mut words = l.split('#').next()?.split_whitespace();
            let ip = words.next()?.parse::<IpAddr>().ok()?;
            ip.is_loopback().then_some(words)
        });
        for name in loopback_names.flatten().filter(|n| *n != "localhost") {
            assert_eq!(route(name), Route::Loopback, "{name}");
        }
        // 198.51.100.1 is TEST-NET-2: documentation only, never assigned here.
        assert_eq!(route("198.51.100.1"), Route::Away);
        assert_eq!(route("no-such-host.invalid"), Route::Unresolved);
        // The address this machine sends from on its default route, when it has one: a UDP
        // socket's connect picks it without sending anything.
        let own = std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.connect("198.51.100.1:9").map(|_| s))
            .and_then(|s| s.local_addr());
        if let Ok(ip) = own.map(|a| a.ip()) {
            assert_eq!(route(&ip.to_string()), Route::ThisHost, "{ip}");
        }
        // A link-local address of ours cannot be bound without its scope, which a log line
        // does not give: it is still this machine's; one nobody here has is not.
        let inet6 = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
        let ours = inet6.lines().filter_map(|l| {
            let hex = l.get(..32)?;
            let bits = u128::from_str_radix(hex, 16).ok()?;
            Some(std::net::Ipv6Addr::from(bits)).filter(|a| a.is_unicast_link_local())
        });
        for ip in ours {
            assert_eq!(
                route_among(IpAddr::V6(ip), &own_addresses()),
                Route::ThisHost,
                "{ip}"
            );
        }
        assert_eq!(route("fe80::dead:beef:1:2"), Route::Away);
    }

    #[test]
    fn this_machine_is_its_interfaces_addresses_not_what_it_may_bind() {
        // With net.ipv4.ip_nonlocal_bind any address binds: ownership is the interfaces' list.
        let own: Vec<IpAddr> = ["192.0.2.2", "fd00::2"].map(|a| a.parse().unwrap()).into();
        let at = |a: &str| route_among(a.parse().unwrap(), &own);
        assert_eq!(at("192.0.2.2"), Route::ThisHost);
        assert_eq!(at("::ffff:192.0.2.2"), Route::ThisHost);
        assert_eq!(at("fd00::2"), Route::ThisHost);
        assert_eq!(at("10.9.9.9"), Route::Away);
        assert_eq!(at("::ffff:127.0.0.1"), Route::Loopback);
        assert!(own_addresses().contains(&IpAddr::from([127, 0, 0, 1])));
    }

    #[test]
    fn listen_addresses_parse_in_every_accepted_form() {
        let p = |v| parse("--proxy-addr", v).map(|a| (a.host, a.port)).ok();
        assert_eq!(p("127.0.0.1:8001"), Some(("127.0.0.1".into(), 8001)));
        assert_eq!(p(":8001"), Some(("127.0.0.1".into(), 8001)));
        assert_eq!(p("[::1]:0"), Some(("::1".into(), 0)));
        assert_eq!(p("localhost:9"), Some(("localhost".into(), 9)));
        for bad in [
            "garbage",
            "1.2.3.4",
            "host:port",
            ":70000",
            "::1:80",
            "[::1]",
            "a b:1",
        ] {
            assert_eq!(p(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_garbage_metrics_addr_is_said_to_be_no_address_with_the_accepted_form() {
        let e = parse("--metrics-addr", "garbage").unwrap_err().to_string();
        assert!(
            e.starts_with("--metrics-addr \"garbage\" is not an address"),
            "{e}"
        );
        assert!(e.contains("HOST:PORT (e.g. 127.0.0.1:19400"), "{e}");
        assert!(e.ends_with(", or none"), "{e}");
        assert!(!e.contains("hold"), "not about a held port: {e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn a_listen_address_on_the_servers_port_of_this_machine_is_refused() {
        let server = HttpUrl::parse("http://127.0.0.1:30000").unwrap();
        let check = |v| {
            let a = parse("--proxy-addr", v).unwrap();
            check_not_server("--proxy-addr", v, &a, (&server, "--upstream"))
                .map_err(|e| e.to_string())
        };
        for same in [
            "127.0.0.1:30000",
            ":30000",
            "0.0.0.0:30000",
            "localhost:30000",
            "[::]:30000",
        ] {
            let e = check(same).unwrap_err();
            assert!(
                e.contains("(http://127.0.0.1:30000, from --upstream)"),
                "{e}"
            );
            assert!(e.contains("cannot both listen on it"), "{e}");
            assert!(
                e.contains(&format!("--proxy-addr {same} is the server's own")),
                "{e}"
            );
        }
        for other in ["127.0.0.1:30001", ":0", "10.1.2.3:30000"] {
            assert!(check(other).is_ok(), "{other}");
        }
    }
}
