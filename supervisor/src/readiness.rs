//! When is the server ready: the one rule, used by `run` and by `wait --url`/`--events`.
//!
//! - Node rank 0 (and single-node launches): `GET /ready` answering 200 (SGLang 0.5.20+). A 404
//!   there means "older version", not "not ready": then, if the log said `fired up and ready to
//!   roll`, `GET /model_info` answering 200 confirms it; without that line (`--ready-on http`,
//!   `wait --url`), `GET /health` answering 200 is readiness (503 until its warm-up is done in
//!   0.5.14; some older versions answer 200 at once).
//! - Node rank >= 1 of a multi-node launch serves no API: it starts its local scheduler ranks and
//!   then SGLang's dummy health server on the same host:port (`/health`, `/health_generate`,
//!   `/ping`). Ready when every local rank logged its last startup phase, then `/health` answers
//!   200 (the `/ready` 404 → `/health` path of the rule above).
//!
//! Requests carry `Authorization: Bearer KEY` when the server was started with `--api-key`
//! (`/ready` and `/model_info` answer 401 without it).
use crate::events::PhaseName;
use crate::server_argv;
use sglang_probes::http::{get_status, Bearer, HttpUrl};
use std::collections::BTreeMap;
use std::time::Duration;

/// One readiness request's timeout (`/health` runs a one-token generation, ~1 s on a real server).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// After the ready line, the confirmation is retried this often, this long...
pub const CONFIRM_PERIOD: Duration = Duration::from_millis(100);
pub const CONFIRM_FOR: Duration = Duration::from_secs(5);
/// ... and otherwise polled at most once a second.
pub const POLL_PERIOD: Duration = Duration::from_secs(1);

/// What the server said about itself besides HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// Its log printed the ready line.
    ReadyLine,
    /// Nothing (no log, or a node that prints no ready line).
    None,
}

/// One readiness check: `Ok(path that confirmed it)`, or why not yet.
pub async fn check(url: &HttpUrl, evidence: Evidence) -> Result<&'static str, String> {
    let ask = |path: &'static str| async move {
        match get_status(&url.with_path(path), REQUEST_TIMEOUT).await {
            Ok(200) => Ok(path),
            Ok(code) => Err((code, format!("GET {path} answered {code}"))),
            Err(e) => Err((0, e.to_string())),
        }
    };
    match ask("/ready").await {
        Ok(p) => Ok(p),
        Err((404, _)) => {
            let fallback = match evidence {
                Evidence::ReadyLine => "/model_info",
                Evidence::None => "/health",
            };
            ask(fallback).await.map_err(|(_, why)| why)
        }
        Err((401, why)) if url.bearer.is_none() => Err(format!(
            "{why}: the server wants an API key (pass --api-key or SGLANG_SUPERVISOR_API_KEY)"
        )),
        Err((_, why)) => Err(why),
    }
}

/// Which node of a multi-node launch this is (`--nnodes`, `--node-rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub rank: u32,
    pub nnodes: u32,
}

impl Default for Node {
    fn default() -> Self {
        Node { rank: 0, nnodes: 1 }
    }
}

impl Node {
    /// Node rank >= 1: no API, no ready line; readiness from its ranks' log and `/health`.
    pub fn serves_no_api(self) -> bool {
        self.rank >= 1
    }

    /// `Some((node_rank, nnodes))` for the events of a multi-node launch.
    pub fn multi(self) -> Option<(u32, u32)> {
        (self.nnodes > 1 || self.rank > 0).then_some((self.rank, self.nnodes))
    }

    /// From the server's argv, spelled any way SGLang's argparse accepts ([`server_argv`]).
    pub fn from_argv(argv: &[String]) -> Node {
        use server_argv::{last_number, NNODES, NODE_RANK};
        Node {
            rank: last_number(argv, &NODE_RANK).unwrap_or(0),
            nnodes: last_number(argv, &NNODES).map_or(1, |n: u32| n.max(1)),
        }
    }
}

/// Whether every scheduler rank of this node has logged its last startup phase: at least one
/// rank logged, and each one's last phase settles it (memory allocated, graphs captured).
pub fn ranks_settled(last: &BTreeMap<String, PhaseName>) -> bool {
    !last.is_empty() && last.values().all(|p| p.settles_a_rank())
}

/// Where [`server_url`] read the server's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFrom {
    /// `--health-url`/`--upstream`.
    Given,
    /// The command's `--port`.
    Port,
    /// SGLang's default port: the command has no `--port`.
    DefaultPort,
}

/// The server's base URL and key: `--health-url`/`--upstream` if given, else `--host`/`--port`
/// of the server's argv (SGLang's defaults 127.0.0.1:30000), and its `--api-key` (or
/// `--admin-api-key`) for the requests of the rule; and where its address was read.
pub fn server_url(
    argv: &[String],
    explicit: Option<&str>,
) -> anyhow::Result<(HttpUrl, AddressFrom)> {
    use server_argv::{last, values, ADMIN_API_KEY, API_KEY, HOST, PORT};
    let host = last(argv, &HOST).unwrap_or("127.0.0.1");
    let (mut port, mut port_from) = (30000u16, AddressFrom::DefaultPort);
    for v in values(argv, &PORT) {
        // argparse refuses the server's command for any of them that is no number
        let Ok(p) = v.trim().parse() else {
            anyhow::bail!("the server command has --port {v:?}, which is not a port number");
        };
        (port, port_from) = (p, AddressFrom::Port);
    }
    let (api_key, admin_key) = (last(argv, &API_KEY), last(argv, &ADMIN_API_KEY));
    let host = match host {
        "0.0.0.0" | "" => "127.0.0.1".to_string(),
        "::" | "[::]" => "[::1]".to_string(),
        h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
        h => h.to_string(),
    };
    let bearer = api_key.or(admin_key).map(|k| Bearer(k.to_string()));
    if let Some(u) = explicit {
        let base =
            HttpUrl::parse(u).map_err(|e| anyhow::anyhow!("--health-url/--upstream {u:?}: {e}"))?;
        let url = HttpUrl {
            bearer,
            ..base.with_path("/")
        };
        return Ok((url, AddressFrom::Given));
    }
    let url = HttpUrl {
        host,
        port,
        path: "/".into(),
        bearer,
        tls: false,
    };
    Ok((url, port_from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn node_rank_and_nnodes_are_read_in_every_spelling_argparse_accepts() {
        let cases: &[(&[&str], Node)] = &[
            (&["--model-path", "m"], Node { rank: 0, nnodes: 1 }),
            (
                &["--nnodes", "2", "--node-rank", "1"],
                Node { rank: 1, nnodes: 2 },
            ),
            (
                &["--nnodes=4", "--node-rank=3"],
                Node { rank: 3, nnodes: 4 },
            ),
            (&["--nn", "2", "--node-r", "1"], Node { rank: 1, nnodes: 2 }),
            (&["--nno=2", "--nod=1"], Node { rank: 1, nnodes: 2 }),
            // Too short to be unambiguous: argparse refuses them; we read nothing.
            (&["--n", "2", "--no", "1"], Node { rank: 0, nnodes: 1 }),
            (
                &["numactl", "-N", "1", "--", "python3", "--node-rank", "5"],
                Node { rank: 5, nnodes: 1 },
            ),
        ];
        for (argv, want) in cases {
            assert_eq!(Node::from_argv(&s(argv)), *want, "{argv:?}");
        }
        assert_eq!(Node { rank: 0, nnodes: 1 }.multi(), None);
        assert_eq!(Node { rank: 0, nnodes: 2 }.multi(), Some((0, 2)));
        assert!(Node { rank: 1, nnodes: 2 }.serves_no_api());
    }

    #[test]
    fn a_node_is_settled_only_when_every_rank_logged_its_last_phase() {
        let mut last = BTreeMap::new();
        assert!(!ranks_settled(&last), "nothing logged yet");
        last.insert("TP2".to_string(), PhaseName::CudaGraphEnd);
        last.insert("TP3".to_string(), PhaseName::CudaGraphBegin);
        assert!(!ranks_settled(&last), "TP3 still capturing");
        last.insert("TP3".to_string(), PhaseName::CudaGraphEnd);
        assert!(ranks_settled(&last));
    }

    #[test]
    fn server_url_comes_from_the_command_with_sglang_defaults_and_its_key() {
        let url = |v: &[&str]| server_url(&s(v), None).unwrap().0;
        assert_eq!(url(&["python3"]).base(), "http://127.0.0.1:30000");
        assert_eq!(
            url(&["x", "--host", "0.0.0.0", "--port=8000"]).base(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            url(&["x", "--host=::", "--port", "1"]).base(),
            "http://[::1]:1"
        );
        assert_eq!(
            url(&["x", "--api-key", "k1"]).bearer,
            Some(Bearer("k1".into()))
        );
        assert!(server_url(&s(&["x", "--port", "http"]), None).is_err());
        // argparse's abbreviations, and its refusal of any port that is no number
        let abbreviated = url(&["x", "--ho=::", "--po", "8001", "--ap", "k2"]);
        assert_eq!(abbreviated.base(), "http://[::1]:8001");
        assert_eq!(abbreviated.bearer, Some(Bearer("k2".into())));
        assert!(server_url(&s(&["x", "--port", "x", "--port", "1"]), None).is_err());
        // as Python's int() takes it
        assert_eq!(
            url(&["x", "--port", " 8002 "]).base(),
            "http://127.0.0.1:8002"
        );
        let from = |v: &[&str]| server_url(&s(v), None).unwrap().1;
        assert_eq!(from(&["python3"]), AddressFrom::DefaultPort);
        assert_eq!(from(&["python3", "--port"]), AddressFrom::DefaultPort);
        assert_eq!(from(&["x", "--port=8000"]), AddressFrom::Port);
        let (up, up_from) =
            server_url(&s(&["x", "--api-key=k"]), Some("http://10.0.0.1:9/x")).unwrap();
        assert_eq!(up_from, AddressFrom::Given);
        assert_eq!(
            (up.base(), up.bearer),
            ("http://10.0.0.1:9".into(), Some(Bearer("k".into())))
        );
    }
}
