//! Generation requests this run's measuring cannot see, which the server's access log shows:
//! from clients elsewhere than this machine while the proxy or a tap on `lo` measures, from
//! this machine's own addresses while the proxy reaches the server over loopback or a tap
//! watches another interface. The first is said at once, the count at the end.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::cli::RunArgs;
use crate::listen_addr::{local, own_addresses, route_among, Route};

/// What a tap on `lo` missing clients elsewhere should be given instead.
pub(super) const TAP_ELSEWHERE: &str =
    "pass --tap-interface with the interface its clients come in on, or any";

/// Missed clients kept to be counted: past them, the count is a floor.
const MAX_CLIENTS: usize = 65_536;

/// How long this machine's addresses are taken as read (an address may come or go in a run).
const OWN_FOR: Duration = Duration::from_secs(10);

/// Which clients' requests the run's measuring misses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blind {
    /// The proxy sees only what is sent to it: not clients elsewhere, nor this machine's own
    /// at its other addresses where the proxy reaches the server over loopback (its own
    /// requests are then logged from loopback).
    Proxy { over_loopback: bool },
    /// A tap on `lo` copies this machine's own traffic only.
    TapOnLo,
    /// A tap on another interface: this machine's own clients reach the server over `lo`.
    /// Those at loopback addresses are not told by the log parser (its fast path), so only
    /// those at the machine's other addresses are counted.
    TapElsewhere,
}

impl Blind {
    fn misses(self, route: Route) -> bool {
        match self {
            Blind::Proxy { over_loopback } => {
                route == Route::Away || (over_loopback && route == Route::ThisHost)
            }
            Blind::TapOnLo => route == Route::Away,
            Blind::TapElsewhere => route == Route::ThisHost,
        }
    }
}

/// The requests read so far that the run could not measure, for a run that misses some.
pub(super) struct Unseen {
    blind: Blind,
    /// How the first one's warning goes on: why it is not measured and what to do.
    how: String,
    /// This machine's addresses, and when they were read.
    own: Option<(Vec<IpAddr>, Instant)>,
    requests: u64,
    /// The clients missed (the first [`MAX_CLIENTS`]; `more`: others came), the first of them.
    clients: HashSet<IpAddr>,
    more: bool,
    first: Option<IpAddr>,
}

impl Unseen {
    /// For a run whose measuring misses some clients (the proxy, a tap on one interface);
    /// `None` where it sees them all (`--tap-interface any`), or measures nothing. `upstream`
    /// is the host the proxy sends requests to.
    pub(super) fn new(args: &RunArgs, proxy: Option<SocketAddr>, upstream: &str) -> Option<Self> {
        const LEFT_OUT: &str =
            "the requests log and the request_* figures leave out this client's requests";
        let iface = &args.tap_interface;
        let (blind, how) = if let Some(proxy) = proxy {
            let how = format!(
                "sent straight to the server, not through the proxy at {proxy}: {LEFT_OUT} \
                 (point the client at the proxy; a server started with --host 127.0.0.1 is \
                 reached through the proxy only)"
            );
            (
                Blind::Proxy {
                    over_loopback: local(upstream),
                },
                how,
            )
        } else if !args.tap || iface == "any" {
            return None;
        } else if iface == "lo" {
            let how = format!(
                "which came in on an interface other than lo: --tap on lo does not see it, so \
                 {LEFT_OUT} ({TAP_ELSEWHERE})"
            );
            (Blind::TapOnLo, how)
        } else {
            let how = format!(
                "an address of this machine, whose requests to the server cross lo, not \
                 {iface}: --tap on {iface} does not see them, so {LEFT_OUT} (--tap-interface \
                 any takes both)"
            );
            (Blind::TapElsewhere, how)
        };
        Some(Unseen {
            blind,
            how,
            own: None,
            requests: 0,
            clients: HashSet::new(),
            more: false,
            first: None,
        })
    }

    /// A generation request from `addr`, not loopback, in the access log: the warning to give
    /// now when it is the first the run misses.
    pub(super) fn request(&mut self, addr: IpAddr) -> Option<String> {
        let now = Instant::now();
        let own = match &self.own {
            Some((own, at)) if now.duration_since(*at) < OWN_FOR => own,
            _ => &self.own.insert((own_addresses(), now)).0,
        };
        if !self.blind.misses(route_among(addr, own)) {
            return None;
        }
        self.requests += 1;
        if self.clients.len() < MAX_CLIENTS {
            self.clients.insert(addr.to_canonical());
        } else {
            self.more |= !self.clients.contains(&addr.to_canonical());
        }
        if self.first.is_some() {
            return None;
        }
        self.first = Some(addr);
        Some(format!(
            "the server's access log shows a generation request from {addr}, {}",
            self.how
        ))
    }

    /// At the end, how many went unmeasured, where any did.
    pub(super) fn total(&self) -> Option<String> {
        let first = self.first?;
        let (n, them) = match self.requests {
            1 => ("1 generation request".to_string(), "it"),
            n => (format!("{n} generation requests"), "them"),
        };
        let clients = match (self.clients.len(), self.more) {
            (1, false) => format!("from {first}"),
            (k, false) => format!("from {k} clients (the first {first})"),
            (k, true) => format!("from more than {k} clients (the first {first})"),
        };
        Some(format!(
            "in all, {n} {clients} went unmeasured: the requests log and the request_* figures \
             leave {them} out"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse_from, Command};

    fn run_args(flags: &[&str]) -> RunArgs {
        let argv = ["sglang-supervisor", "run"]
            .iter()
            .chain(flags)
            .chain(&["--", "true"]);
        let Command::Run(args) = parse_from(argv).unwrap().command else {
            panic!("not a run")
        };
        *args
    }

    #[test]
    fn the_first_request_missed_is_said_and_every_one_counted() {
        let mut u = Unseen::new(&run_args(&["--tap"]), None, "127.0.0.1").unwrap();
        u.own = Some((Vec::new(), Instant::now()));
        assert_eq!(u.total(), None);
        // This machine's own addresses are reached over lo: seen by the tap, not counted.
        assert_eq!(u.request("::1".parse().unwrap()), None);
        assert_eq!(u.total(), None);
        let first = u.request("192.0.2.7".parse().unwrap()).unwrap();
        assert!(
            first.starts_with("the server's access log shows a generation request from 192.0.2.7, which came in on an interface other than lo"),
            "{first}"
        );
        assert_eq!(
            u.total().unwrap(),
            "in all, 1 generation request from 192.0.2.7 went unmeasured: the requests log and \
             the request_* figures leave it out"
        );
        assert_eq!(u.request("192.0.2.7".parse().unwrap()), None);
        assert_eq!(u.request("198.51.100.3".parse().unwrap()), None);
        assert_eq!(
            u.total().unwrap(),
            "in all, 3 generation requests from 2 clients (the first 192.0.2.7) went unmeasured: \
             the requests log and the request_* figures leave them out"
        );
    }

    #[test]
    fn past_the_clients_kept_their_count_is_a_floor_and_every_request_counted() {
        let mut u = Unseen::new(&run_args(&["--tap"]), None, "127.0.0.1").unwrap();
        // None of them this machine's, whatever addresses the machine that runs this has.
        u.own = Some((Vec::new(), Instant::now()));
        let n = MAX_CLIENTS as u32 + 2;
        for i in 0..n {
            u.request(std::net::Ipv4Addr::from((10u32 << 24) + i).into());
        }
        u.request("10.0.0.0".parse().unwrap());
        assert_eq!(
            u.total().unwrap(),
            format!(
                "in all, {} generation requests from more than {MAX_CLIENTS} clients (the first \
                 10.0.0.0) went unmeasured: the requests log and the request_* figures leave \
                 them out",
                n + 1
            )
        );
    }

    #[test]
    fn each_way_of_measuring_misses_its_own_clients() {
        use Route::{Away, Loopback, ThisHost};
        let proxy = Some("127.0.0.1:31000".parse().unwrap());
        let blind = |flags: &[&str], proxy, upstream| {
            Unseen::new(&run_args(flags), proxy, upstream).map(|u| u.blind)
        };
        let cases = [
            (blind(&[], proxy, "127.0.0.1"), [false, true, true]),
            (blind(&[], proxy, "localhost"), [false, true, true]),
            // A proxy that reaches the server at this machine's own address is logged from it.
            (blind(&[], proxy, "192.0.2.1"), [false, false, true]),
            (blind(&["--tap"], None, "127.0.0.1"), [false, false, true]),
            (
                blind(&["--tap", "--tap-interface", "eth0"], None, ""),
                [false, true, false],
            ),
        ];
        for (blind, want) in cases {
            let blind = blind.expect("misses some");
            let got = [Loopback, ThisHost, Away].map(|r| blind.misses(r));
            assert_eq!(got, want, "{blind:?}");
        }
        // Every interface, or nothing measured: nothing missed.
        assert!(blind(&["--tap", "--tap-interface", "any"], None, "").is_none());
        assert!(blind(&[], None, "127.0.0.1").is_none());
        let named = Unseen::new(&run_args(&["--tap", "--tap-interface", "eth0"]), None, "")
            .unwrap()
            .how;
        assert!(
            named.contains("cross lo, not eth0") && named.contains("any takes both"),
            "{named}"
        );
    }
}
