//! Generation requests this run's measuring cannot see, which the server's access log shows:
//! from clients elsewhere than this machine while the proxy or a tap on `lo` measures, from
//! this machine's own addresses while the proxy reaches the server over loopback or a tap
//! watches another interface, and from loopback itself (after the server is ready) but the
//! proxy's own source, or while a tap watches another interface. The first is said at once,
//! the count at the end.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cli::RunArgs;
use crate::listen_addr::{local, route_among, Route};
use crate::logs::parse::LoopbackClients;
use crate::own_addresses::OwnAddresses;
use crate::server_argv;
use sglang_exporters::proxy::ProxyMetrics;

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
    /// requests are then logged from loopback), nor loopback clients where its own come from
    /// a `source` of their own (else they cannot be told apart from its own).
    Proxy {
        over_loopback: bool,
        source: Option<Ipv4Addr>,
    },
    /// A tap on `lo` copies this machine's own traffic only.
    TapOnLo,
    /// A tap on another interface: this machine's own clients reach the server over `lo`.
    TapElsewhere,
}

impl Blind {
    /// How the run measures, where that misses some clients: `proxy` and `proxy_source`, the
    /// proxy's address and where its connections to the server come from; `upstream`, the
    /// server's host. `None` where it sees them all (`--tap-interface any`), or measures
    /// nothing.
    fn of(
        args: &RunArgs,
        proxy: Option<SocketAddr>,
        proxy_source: Option<Ipv4Addr>,
        upstream: &str,
    ) -> Option<Blind> {
        Some(if proxy.is_some() {
            Blind::Proxy {
                over_loopback: local(upstream),
                // (with --upstream the proxy's server need not be the one whose log is read)
                source: proxy_source.filter(|_| args.upstream.is_none()),
            }
        } else if !args.tap || args.tap_interface == "any" {
            return None;
        } else if args.tap_interface == "lo" {
            Blind::TapOnLo
        } else {
            Blind::TapElsewhere
        })
    }

    fn misses(self, route: Route, ip: IpAddr) -> bool {
        match (self, route) {
            (Blind::Proxy { source, .. }, Route::Loopback) => {
                source.is_some_and(|s| ip.to_canonical() != IpAddr::V4(s))
            }
            (Blind::Proxy { over_loopback, .. }, _) => {
                route == Route::Away || (over_loopback && route == Route::ThisHost)
            }
            (Blind::TapOnLo, _) => route == Route::Away,
            (Blind::TapElsewhere, _) => matches!(route, Route::ThisHost | Route::Loopback),
        }
    }

    /// The loopback clients the log parsers must tell of for this.
    fn loopback_clients(self) -> LoopbackClients {
        match self {
            Blind::Proxy {
                source: Some(s), ..
            } => LoopbackClients::Told { but: Some(s) },
            Blind::TapElsewhere => LoopbackClients::Told { but: None },
            Blind::Proxy { source: None, .. } | Blind::TapOnLo => LoopbackClients::Skipped,
        }
    }
}

/// `--tokenizer-worker-num` in the server's command: 1 where it is not there.
fn tokenizer_workers(command: &[std::ffi::OsString]) -> u64 {
    let argv = super::server_words(command);
    server_argv::last_number(&argv, &server_argv::TOKENIZER_WORKER_NUM).unwrap_or(1)
}

/// The requests read so far that the run could not measure, for a run that misses some.
pub(super) struct Unseen {
    blind: Blind,
    /// How the first one's warning goes on: why it is not measured and what to do.
    how: String,
    /// The same for a loopback client that bypassed the proxy.
    how_on_loopback: Option<String>,
    /// This machine's addresses.
    own: OwnAddresses,
    requests: u64,
    /// Whether loopback clients are counted, as the server's log has told so far.
    loopback: Loopback,
    /// Says whether the proxy forwarded a request naming a client of its own: from then on
    /// the log's clients may be those, and nothing more is counted.
    proxied: Option<Arc<ProxyMetrics>>,
    /// Nothing more is counted (the proxy forwarded a request naming a client).
    stopped: bool,
    /// The clients missed (the first [`MAX_CLIENTS`]; `more`: others came), the first of them.
    clients: HashSet<IpAddr>,
    more: bool,
    first: Option<IpAddr>,
}

/// Whether loopback clients are counted. Each tokenizer worker warms itself up from loopback,
/// and only the first to be ready is sure to be logged before the request that starts the
/// count: as many loopback requests as there are other workers are taken for their warm-ups
/// (past them, the count is a floor). Anything that may bring another warm-up later ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loopback {
    /// The server's arguments are not read yet: how many workers warm up is not known.
    /// `workers`: as the command line says.
    Unknown { workers: u64, ready_lines: u64 },
    /// Counted, once `warm_ups_left` more are taken for warm-ups; `ready_lines`: those read,
    /// one a worker (each after its warm-up).
    Counted {
        workers: u64,
        warm_ups_left: u64,
        ready_lines: u64,
    },
    /// Counted no more, and why.
    Off(Uncounted),
}

/// Why loopback clients are counted no more: something may bring a warm-up (or a router's
/// requests) from loopback that nothing tells apart from a client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Uncounted {
    /// The server's arguments were logged again: a second server start.
    SecondServer,
    /// A worker began, died or was ready again once the server was ready.
    WorkerAgain,
    /// The log's server listens on another port than the one measured.
    OtherPort { logged: u16, measured: u16 },
}

impl std::fmt::Display for Uncounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uncounted::SecondServer => {
                f.write_str("a second server start (its arguments logged again)")
            }
            Uncounted::WorkerAgain => {
                f.write_str("a server worker started again after the server was ready")
            }
            Uncounted::OtherPort { logged, measured } => write!(
                f,
                "the log's uvicorn said it listens on port {logged}, not on {measured}, the port \
                 measured"
            ),
        }
    }
}

impl Loopback {
    /// The server's arguments were read (a second time: a second server in the run, whose
    /// warm-ups nothing tells apart).
    fn server_args(self, logged_workers: Option<u64>) -> Loopback {
        match self {
            Loopback::Unknown {
                workers,
                ready_lines,
            } => {
                let workers = workers.max(logged_workers.unwrap_or(1));
                Loopback::Counted {
                    workers,
                    warm_ups_left: workers - 1,
                    ready_lines,
                }
                .ready_lines_within()
            }
            Loopback::Counted { .. } => Loopback::Off(Uncounted::SecondServer),
            Loopback::Off(_) => self,
        }
    }

    /// A ready line: past one a worker, a worker started again, whose warm-up may come after
    /// the count began.
    fn ready_line(self) -> Loopback {
        match self {
            Loopback::Unknown {
                workers,
                ready_lines,
            } => Loopback::Unknown {
                workers,
                ready_lines: ready_lines + 1,
            },
            Loopback::Counted {
                workers,
                warm_ups_left,
                ready_lines,
            } => Loopback::Counted {
                workers,
                warm_ups_left,
                ready_lines: ready_lines + 1,
            }
            .ready_lines_within(),
            Loopback::Off(_) => self,
        }
    }

    /// Off where more ready lines were read than there are workers.
    fn ready_lines_within(self) -> Loopback {
        match self {
            Loopback::Counted {
                workers,
                ready_lines,
                ..
            } if ready_lines > workers => Loopback::Off(Uncounted::WorkerAgain),
            other => other,
        }
    }

    /// Counted no more, for `why` unless already for another reason (the first is kept).
    fn off(self, why: Uncounted) -> Loopback {
        match self {
            Loopback::Off(_) => self,
            _ => Loopback::Off(why),
        }
    }

    /// A loopback client's request: whether it counts, and what is left.
    fn request(self) -> (bool, Loopback) {
        match self {
            Loopback::Counted {
                warm_ups_left: 0, ..
            } => (true, self),
            Loopback::Counted {
                workers,
                warm_ups_left,
                ready_lines,
            } => (
                false,
                Loopback::Counted {
                    workers,
                    warm_ups_left: warm_ups_left - 1,
                    ready_lines,
                },
            ),
            Loopback::Unknown { .. } | Loopback::Off(_) => (false, self),
        }
    }
}

impl Unseen {
    /// For a run whose measuring misses some clients (the proxy, a tap on one interface);
    /// `None` where it sees them all (`--tap-interface any`), or measures nothing. `upstream`
    /// is the host the proxy sends requests to, and `proxy_source` where they come from.
    pub(super) fn new(
        args: &RunArgs,
        proxy: Option<SocketAddr>,
        proxy_source: Option<Ipv4Addr>,
        upstream: &str,
    ) -> Option<Self> {
        const LEFT_OUT: &str =
            "the requests log and the request_* figures leave out this client's requests";
        let iface = &args.tap_interface;
        let blind = Blind::of(args, proxy, proxy_source, upstream)?;
        let straight = |to: &str| {
            proxy.map(|proxy| {
                format!(
                    "sent straight to the server, not through the proxy at {proxy}: {LEFT_OUT} \
                     (point the client at the proxy{to})"
                )
            })
        };
        // a loopback client can reach a server on 127.0.0.1; a client elsewhere cannot
        let how_on_loopback = straight("");
        let how = match (
            blind,
            straight("; a server started with --host 127.0.0.1 is reached through the proxy only"),
        ) {
            (Blind::Proxy { .. }, Some(how)) => how,
            (Blind::TapOnLo, _) => format!(
                "which came in on an interface other than lo: --tap on lo does not see it, so \
                 {LEFT_OUT} ({TAP_ELSEWHERE})"
            ),
            _ => format!(
                "an address of this machine, whose requests to the server cross lo, not \
                 {iface}: --tap on {iface} does not see them, so {LEFT_OUT} (--tap-interface \
                 any takes both)"
            ),
        };
        Some(Unseen {
            blind,
            how,
            how_on_loopback,
            own: OwnAddresses::new(OWN_FOR),
            requests: 0,
            loopback: Loopback::Unknown {
                workers: tokenizer_workers(&args.command),
                ready_lines: 0,
            },
            proxied: None,
            stopped: false,
            clients: HashSet::new(),
            more: false,
            first: None,
        })
    }

    /// The loopback clients the run's log parsers must tell of.
    pub(super) fn loopback_clients(&self) -> LoopbackClients {
        self.blind.loopback_clients()
    }

    /// Reads `proxied`'s [`ProxyMetrics::forwarded_client`] before counting (with the proxy).
    pub(super) fn forwarded_when(mut self, proxied: Arc<ProxyMetrics>) -> Self {
        self.proxied = matches!(self.blind, Blind::Proxy { .. }).then_some(proxied);
        self
    }

    /// Loopback clients are counted no more: the log is, at least in part, another server's
    /// than the one measured (uvicorn on another port: a router in front of it), or a worker
    /// began or was lost once the server was ready (the one started in its place warms up).
    pub(super) fn loopback_off(&mut self, why: Uncounted) {
        self.set_loopback(self.loopback.off(why));
    }

    /// The server's arguments, as its log gave them.
    pub(super) fn server_args(&mut self, args: &serde_json::Map<String, serde_json::Value>) {
        let workers = args.get("tokenizer_worker_num").and_then(|v| v.as_u64());
        self.set_loopback(self.loopback.server_args(workers));
    }

    /// The server's ready line.
    pub(super) fn ready_line(&mut self) {
        self.set_loopback(self.loopback.ready_line());
    }

    /// Whether the log parsers tell of loopback clients, so that they may be counted.
    fn loopback_told(&self) -> bool {
        self.loopback_clients() != LoopbackClients::Skipped
    }

    /// Where loopback clients stop being counted, says so once (unless nothing is counted
    /// any more): from then on the count of unmeasured requests is a floor.
    fn set_loopback(&mut self, next: Loopback) {
        if let (Loopback::Unknown { .. } | Loopback::Counted { .. }, Loopback::Off(why)) =
            (self.loopback, next)
        {
            if self.loopback_told() && !self.stopped {
                tracing::info!(
                    "loopback clients that go around the run's measuring are not counted \
                     since {why}"
                );
            }
        }
        self.loopback = next;
    }

    /// A generation request from `addr` in the access log: the warning to give
    /// now when it is the first the run misses.
    pub(super) fn request(&mut self, addr: IpAddr) -> Option<String> {
        let now = Instant::now();
        let route = route_among(addr, self.own.get(now));
        if self.stopped || !self.blind.misses(route, addr) || self.forwarded() {
            return None;
        }
        if route == Route::Loopback {
            let counts;
            (counts, self.loopback) = self.loopback.request();
            if !counts {
                return None;
            }
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
        let how = match (&self.how_on_loopback, route) {
            (Some(how), Route::Loopback) => how,
            _ => &self.how,
        };
        Some(format!(
            "the server's access log shows a generation request from {addr}, {how}"
        ))
    }

    /// Whether the proxy forwarded a request that named a client: said once when first seen.
    fn forwarded(&mut self) -> bool {
        let Some(m) = &self.proxied else {
            return false;
        };
        if !m.forwarded_client.load(Ordering::Relaxed) {
            return false;
        }
        self.proxied = None;
        self.stopped = true;
        tracing::info!(
            "a request through the proxy named a client of its own with a port \
             (X-Forwarded-For or Forwarded), which a server that trusts it logs instead of the \
             proxy: requests that went around the proxy are counted no more"
        );
        true
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
        let floor = match self.loopback {
            _ if self.stopped => {
                " (none counted since a proxied request named a client of its own)".to_string()
            }
            _ if !self.loopback_told() => String::new(),
            Loopback::Off(why) => format!(" (loopback clients not counted since {why})"),
            Loopback::Unknown { .. } => " (loopback clients not counted: the server's \
                                          arguments were never read from its log)"
                .to_string(),
            Loopback::Counted { .. } => String::new(),
        };
        Some(format!(
            "in all, {n} {clients} went unmeasured{floor}: the requests log and the request_* \
             figures leave {them} out"
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

    /// The count for a proxy on 127.0.0.1:31000 whose connections come from 127.0.0.2, on a
    /// machine whose own addresses are loopback's alone.
    fn behind_proxy(flags: &[&str]) -> Unseen {
        let proxy = Some("127.0.0.1:31000".parse().unwrap());
        let source = Some(Ipv4Addr::new(127, 0, 0, 2));
        let mut u = Unseen::new(&run_args(flags), proxy, source, "127.0.0.1").unwrap();
        u.own = OwnAddresses::these(Vec::new());
        u
    }

    #[test]
    fn the_first_request_missed_is_said_and_every_one_counted() {
        let mut u = Unseen::new(&run_args(&["--tap"]), None, None, "127.0.0.1").unwrap();
        u.own = OwnAddresses::these(Vec::new());
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
        let mut u = Unseen::new(&run_args(&["--tap"]), None, None, "127.0.0.1").unwrap();
        // None of them this machine's, whatever addresses the machine that runs this has.
        u.own = OwnAddresses::these(Vec::new());
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
        let source = Some(Ipv4Addr::new(127, 0, 0, 2));
        let blind = |flags: &[&str], proxy, source, upstream| {
            Unseen::new(&run_args(flags), proxy, source, upstream).map(|u| u.blind)
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases = [
            // a proxy whose own requests come from loopback like any other's: not told apart
            (blind(&[], proxy, None, "127.0.0.1"), [false, true, true]),
            (blind(&[], proxy, None, "localhost"), [false, true, true]),
            // its own from a source of their own: every other loopback client went straight
            (blind(&[], proxy, source, "127.0.0.1"), [true, true, true]),
            // with --upstream the server it sends to need not be the one whose log is read
            (
                blind(
                    &["--upstream", "http://127.0.0.1:9"],
                    proxy,
                    source,
                    "127.0.0.1",
                ),
                [false, true, true],
            ),
            // A proxy that reaches the server at this machine's own address is logged from it.
            (blind(&[], proxy, None, "192.0.2.1"), [false, false, true]),
            (
                blind(&["--tap"], None, None, "127.0.0.1"),
                [false, false, true],
            ),
            (
                blind(&["--tap", "--tap-interface", "eth0"], None, None, ""),
                [true, true, false],
            ),
        ];
        for (blind, want) in cases {
            let blind = blind.expect("misses some");
            let got = [
                (Loopback, "127.0.0.1"),
                (ThisHost, "192.0.2.1"),
                (Away, "198.51.100.3"),
            ]
            .map(|(r, a)| blind.misses(r, ip(a)));
            assert_eq!(got, want, "{blind:?}");
        }
        // The proxy's own source, in either form a server logs it, is never missed.
        let with_source = blind(&[], proxy, source, "127.0.0.1").unwrap();
        assert!(!with_source.misses(Loopback, ip("127.0.0.2")));
        assert!(!with_source.misses(Loopback, ip("::ffff:127.0.0.2")));
        assert!(with_source.misses(Loopback, ip("::1")));
        // Every interface, or nothing measured: nothing missed.
        assert!(blind(&["--tap", "--tap-interface", "any"], None, None, "").is_none());
        assert!(blind(&[], None, None, "127.0.0.1").is_none());
        let named = Unseen::new(
            &run_args(&["--tap", "--tap-interface", "eth0"]),
            None,
            None,
            "",
        )
        .unwrap()
        .how;
        assert!(
            named.contains("cross lo, not eth0") && named.contains("any takes both"),
            "{named}"
        );
    }

    #[test]
    fn the_log_parsers_tell_of_loopback_clients_only_where_a_way_of_measuring_misses_them() {
        let proxy = Some("127.0.0.1:31000".parse().unwrap());
        let source = Some(Ipv4Addr::new(127, 0, 0, 2));
        let rule = |flags: &[&str], proxy, source| {
            Unseen::new(&run_args(flags), proxy, source, "127.0.0.1")
                .map_or(LoopbackClients::Skipped, |u| u.loopback_clients())
        };
        use LoopbackClients::{Skipped, Told};
        assert_eq!(rule(&[], proxy, source), Told { but: source });
        assert_eq!(rule(&[], proxy, None), Skipped);
        assert_eq!(
            rule(&["--upstream", "http://127.0.0.1:9"], proxy, source),
            Skipped
        );
        assert_eq!(rule(&["--tap"], None, None), Skipped);
        assert_eq!(
            rule(&["--tap", "--tap-interface", "any"], None, None),
            Skipped
        );
        assert_eq!(
            rule(&["--tap", "--tap-interface", "eth0"], None, None),
            Told { but: None }
        );
        assert_eq!(rule(&[], None, None), Skipped);
    }

    /// With several tokenizer workers each warms itself up, and only the first to be ready is
    /// logged for sure before the count starts: as many loopback requests as the other workers
    /// are taken for their warm-ups. A second server in the run (its arguments read again) has
    /// warm-ups of its own that nothing tells apart: loopback clients are counted no more; nor
    /// before the server's arguments are read, when how many workers warm up is not known.
    #[test]
    fn the_other_tokenizer_workers_warm_ups_and_a_second_servers_are_not_counted() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let away: IpAddr = "198.51.100.3".parse().unwrap();
        let args = |workers: u64| {
            let mut m = serde_json::Map::new();
            m.insert("tokenizer_worker_num".into(), workers.into());
            m
        };
        let counted = |flags: &[&str], workers: Option<u64>, sent: &[IpAddr]| {
            let mut u = behind_proxy(flags);
            if let Some(w) = workers {
                u.server_args(&args(w));
            }
            for &a in sent {
                u.request(a);
            }
            u.requests
        };
        assert_eq!(counted(&[], Some(1), &[lo, lo]), 2);
        assert_eq!(counted(&[], Some(3), &[lo, lo, lo]), 1);
        // a client elsewhere is no warm-up
        assert_eq!(counted(&[], Some(2), &[away, lo, lo]), 2);
        // the larger of the command line's, in either form, and the log's
        let flags = |w: &'static str| ["--", "x", "--tokenizer-worker-num", w];
        assert_eq!(counted(&flags("2"), Some(1), &[lo, lo]), 1);
        assert_eq!(
            counted(&["--", "x", "--tokenizer-worker-num=4"], Some(1), &[lo; 4]),
            1
        );
        assert_eq!(counted(&flags("2"), Some(4), &[lo; 4]), 1);
        // argparse's abbreviation of the flag
        assert_eq!(
            counted(&["--", "x", "--tokenizer-w", "3"], Some(1), &[lo; 3]),
            1
        );
        // a log whose arguments were not read: how many warm up is not known, so no loopback
        // client is counted (a client elsewhere still is)
        assert_eq!(counted(&[], None, &[lo, lo, away]), 1);
        // a ready line past one a worker: a worker started again, its warm-up maybe after the
        // count began; loopback no more
        let mut u = behind_proxy(&[]);
        u.server_args(&args(2));
        u.ready_line();
        u.ready_line();
        u.request(lo);
        u.request(lo);
        assert_eq!(u.requests, 1);
        u.ready_line();
        u.request(lo);
        u.request(away);
        assert_eq!(u.requests, 2);
        assert_eq!(u.loopback, Loopback::Off(Uncounted::WorkerAgain));
        assert!(
            u.total().unwrap().contains(
                "went unmeasured (loopback clients not counted since a server worker started \
                 again after the server was ready): "
            ),
            "{:?}",
            u.total()
        );
        // ready lines read before the arguments count as well
        let mut u = behind_proxy(&[]);
        u.ready_line();
        u.ready_line();
        u.server_args(&args(1));
        u.request(lo);
        assert_eq!(
            (u.requests, u.loopback),
            (0, Loopback::Off(Uncounted::WorkerAgain))
        );
        // a second server: loopback no more, elsewhere still
        let mut u = behind_proxy(&[]);
        u.server_args(&args(1));
        u.request(lo);
        u.server_args(&args(1));
        u.request(lo);
        u.request(away);
        assert_eq!(u.requests, 2);
        // the first reason is kept
        u.loopback_off(Uncounted::OtherPort {
            logged: 9,
            measured: 8,
        });
        assert_eq!(u.loopback, Loopback::Off(Uncounted::SecondServer));
    }

    #[test]
    fn a_loopback_client_that_bypassed_the_proxy_is_told_to_use_it_and_one_elsewhere_why_it_must() {
        let mut u = behind_proxy(&[]);
        u.server_args(&serde_json::Map::new());
        assert_eq!(u.request("127.0.0.2".parse().unwrap()), None);
        let here = u.request("127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(
            here,
            "the server's access log shows a generation request from 127.0.0.1, sent straight \
             to the server, not through the proxy at 127.0.0.1:31000: the requests log and the \
             request_* figures leave out this client's requests (point the client at the proxy)"
        );
        let mut u = behind_proxy(&[]);
        let away = u.request("198.51.100.3".parse().unwrap()).unwrap();
        assert!(
            away.ends_with(
                "(point the client at the proxy; a server started with --host \
                            127.0.0.1 is reached through the proxy only)"
            ),
            "{away}"
        );
    }

    /// The final count says how far it is a floor: loopback clients never counted (the server's
    /// arguments never read), counted no more since a named event, or nothing counted since a
    /// proxied request named its client, which goes before any later loopback event.
    #[test]
    fn the_final_count_says_where_loopback_clients_or_all_went_uncounted() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let away: IpAddr = "198.51.100.3".parse().unwrap();
        let mut u = behind_proxy(&[]);
        u.ready_line();
        u.request(lo);
        u.request(away);
        assert!(
            u.total().unwrap().contains(
                "went unmeasured (loopback clients not counted: the server's arguments were \
                 never read from its log): "
            ),
            "{:?}",
            u.total()
        );
        let mut u = behind_proxy(&[]);
        u.server_args(&serde_json::Map::new());
        u.loopback_off(Uncounted::OtherPort {
            logged: 31001,
            measured: 30000,
        });
        u.request(away);
        assert!(
            u.total().unwrap().contains(
                "(loopback clients not counted since the log's uvicorn said it listens on port \
                 31001, not on 30000, the port measured): "
            ),
            "{:?}",
            u.total()
        );
        let metrics = ProxyMetrics::register(&mut prometheus_client::registry::Registry::default());
        let mut u = behind_proxy(&[]).forwarded_when(metrics.clone());
        u.server_args(&serde_json::Map::new());
        u.request(away);
        metrics.forwarded_client.store(true, Ordering::Relaxed);
        u.request(away);
        u.request(lo);
        u.loopback_off(Uncounted::WorkerAgain);
        assert_eq!(u.requests, 1);
        assert!(
            u.total().unwrap().contains(
                "went unmeasured (none counted since a proxied request named a client of its \
                 own): "
            ),
            "{:?}",
            u.total()
        );
        // where loopback clients are seen (no source for the proxy), nothing is said of them
        let mut u = Unseen::new(
            &run_args(&[]),
            Some("127.0.0.1:31000".parse().unwrap()),
            None,
            "127.0.0.1",
        )
        .unwrap();
        u.own = OwnAddresses::these(Vec::new());
        u.request(away);
        assert!(!u.total().unwrap().contains("loopback"), "{:?}", u.total());
    }
}
