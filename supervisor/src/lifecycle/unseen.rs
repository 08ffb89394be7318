//! Generation requests this run's measuring cannot see: those the server's access log shows
//! from clients elsewhere than this machine, while the proxy or a tap on `lo` measures. The
//! first is said at once, the count at the end.

use std::net::{IpAddr, SocketAddr};

use crate::cli::RunArgs;
use crate::listen_addr::{route_to, Route};

/// What a tap on `lo` missing clients elsewhere should be given instead.
pub(super) const TAP_ELSEWHERE: &str =
    "pass --tap-interface with the interface its clients come in on, or any";

/// The requests from clients elsewhere read so far, for a run that misses them.
pub(super) struct Unseen {
    /// How the first one's warning goes on: why it is not measured and what to do.
    how: String,
    /// Each client address read, and whether the way to it leaves this machine (looked up
    /// once; the log parser tells of a few addresses at most).
    routes: Vec<(IpAddr, bool)>,
    requests: u64,
    first: Option<IpAddr>,
}

impl Unseen {
    /// For a run whose measuring misses clients elsewhere (a tap on `lo`, the proxy); `None`
    /// where it sees them all, or measures nothing.
    pub(super) fn new(args: &RunArgs, proxy: Option<SocketAddr>) -> Option<Self> {
        const LEFT_OUT: &str =
            "the requests log and the request_* figures leave out this client's requests";
        let how = if let Some(proxy) = proxy {
            format!(
                "sent straight to the server, not through the proxy at {proxy}: {LEFT_OUT} \
                 (point the client at the proxy; a server started with --host 127.0.0.1 is \
                 reached through the proxy only)"
            )
        } else if args.tap && args.tap_interface == "lo" {
            format!(
                "which came in on an interface other than lo: --tap on lo does not see it, so \
                 {LEFT_OUT} ({TAP_ELSEWHERE})"
            )
        } else {
            return None;
        };
        Some(Unseen {
            how,
            routes: Vec::new(),
            requests: 0,
            first: None,
        })
    }

    /// A generation request from `addr`, not loopback, in the access log: the warning to give
    /// now when it is the first from a client elsewhere.
    pub(super) fn request(&mut self, addr: IpAddr) -> Option<String> {
        let away = match self.routes.iter().find(|(a, _)| *a == addr) {
            Some(&(_, away)) => away,
            None => {
                let away = route_to(addr) == Route::Away;
                self.routes.push((addr, away));
                away
            }
        };
        if !away {
            return None;
        }
        self.requests += 1;
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
        let clients = match self.routes.iter().filter(|(_, away)| *away).count() {
            1 => format!("from {first}"),
            k => format!("from {k} clients elsewhere, the first {first},"),
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

    fn tapped_on_lo() -> Unseen {
        let cli = parse_from(["sglang-supervisor", "run", "--tap", "--", "true"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not a run")
        };
        Unseen::new(&args, None).expect("a tap on lo misses clients elsewhere")
    }

    #[test]
    fn the_first_request_from_elsewhere_is_said_and_every_one_counted() {
        let mut u = tapped_on_lo();
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
            "in all, 3 generation requests from 2 clients elsewhere, the first 192.0.2.7, went \
             unmeasured: the requests log and the request_* figures leave them out"
        );
    }
}
