//! Where `run` serves /metrics, /-/ready and /-/healthy, and what it does when the port is taken.
//!
//! The default port is 19400. Prometheus's list of exporter ports (9100-9999) is full, and the
//! ports in it that GPU nodes run are taken in practice: 9400 is dcgm-exporter's, 9100
//! node-exporter's, 9090 Prometheus's; SGLang serves on 30000 (8000 in many recipes) and takes
//! random ports a few hundred above its own; torch's rendezvous uses 29400/29500. 19400 is clear
//! of all of them and below Linux's ephemeral range (32768+), so no outgoing connection takes it.
//!
//! A port named with `--metrics-addr` is a promise to a scrape config: taken, `run` refuses to
//! start (125) and names the process that holds it. The default is no such promise: taken (two
//! supervisors on one node, one per GPU group), the next free of the following ports is used,
//! said on stderr and recorded in the `listening` event, never a silent clash or a lost run.
use crate::port_holder::{holder, holder_of};
use anyhow::anyhow;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use sglang_exporters::metrics::Shared;
use sglang_exporters::server::{start, ServeError};
use std::net::SocketAddr;
use std::sync::Arc;

pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:19400";
const DEFAULT_HOST: &str = "127.0.0.1";
const DEFAULT_PORT: u16 = 19400;
/// Ports tried after the default when it is taken (one supervisor per GPU group on a node).
const FALLBACK_PORTS: u16 = 16;

/// The metrics listener as it came up: its address (None: `none`), and when the default port
/// was taken, which port and by whom (recorded in the `listening` event).
pub struct MetricsListener {
    pub addr: Option<SocketAddr>,
    pub default_taken: Option<Value>,
}

/// `--metrics-addr none` (or empty): no metrics listener.
pub fn is_off(requested: &str) -> bool {
    matches!(requested, "none" | "")
}

/// Bind now (a port in use is a start-up error, not a surprise an hour in), serve in the
/// background. `requested` is `--metrics-addr` as given, None when left to the default.
pub async fn serve(
    requested: Option<&str>,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
) -> anyhow::Result<MetricsListener> {
    let addr = match requested {
        Some(off) if is_off(off) => None,
        Some(addr) => Some(
            start(addr, registry, shared)
                .await
                .map_err(|e| explain(addr, e))?,
        ),
        None => return serve_default(registry, shared).await,
    };
    Ok(MetricsListener {
        addr,
        default_taken: None,
    })
}

async fn serve_default(
    registry: Arc<Registry>,
    shared: Arc<Shared>,
) -> anyhow::Result<MetricsListener> {
    let mut first_error = None;
    for port in DEFAULT_PORT..=DEFAULT_PORT + FALLBACK_PORTS {
        let addr = format!("{DEFAULT_HOST}:{port}");
        match start(&addr, registry.clone(), shared.clone()).await {
            Ok(local) if port == DEFAULT_PORT => {
                return Ok(MetricsListener {
                    addr: Some(local),
                    default_taken: None,
                })
            }
            Ok(local) => {
                let who = holder(DEFAULT_PORT);
                tracing::warn!(
                    "metrics: {DEFAULT_METRICS_ADDR} is taken{}; serving on {local} instead \
                     (pass --metrics-addr HOST:PORT to insist on one)",
                    who.as_deref()
                        .map(|w| format!(" by {w}"))
                        .unwrap_or_default()
                );
                let taken = json!({"addr": DEFAULT_METRICS_ADDR, "holder": who});
                return Ok(MetricsListener {
                    addr: Some(local),
                    default_taken: Some(taken),
                });
            }
            Err(e) if in_use(&e) => {
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(explain(&addr, e)),
        }
    }
    Err(first_error.map_or_else(
        || anyhow!("no metrics port tried"),
        |e| explain(DEFAULT_METRICS_ADDR, e),
    ))
}

fn in_use(e: &ServeError) -> bool {
    e.addr_in_use()
}

/// A taken port's error names its holder when it can be found.
fn explain(addr: &str, e: ServeError) -> anyhow::Error {
    match holder_of(addr, in_use(&e)) {
        Some(who) => anyhow!(
            "cannot listen on {addr} for metrics: the port is held by {who}; pass --metrics-addr \
             HOST:PORT with a free port (or leave it out: {DEFAULT_METRICS_ADDR} or the next free \
             port), or none"
        ),
        None => e.into(),
    }
}
