//! Where every measured request ends, whoever measured it (the proxy or the tap): the series,
//! the report's windows, the requests log, and the in-flight count behind `--window-from-proxy`.
use super::record::{ProxyMetrics, RequestRecord, Sink, Started};
use crate::report::RequestStats;
use sglang_probes::sync::lock;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

pub struct Ledger {
    metrics: Arc<ProxyMetrics>,
    stats: Arc<RequestStats>,
    log: Option<Mutex<std::fs::File>>,
    /// Measured requests in flight, and where busy/idle transitions go (`--window-from-proxy`).
    in_flight: AtomicUsize,
    traffic: Option<Mutex<std::sync::mpsc::Sender<bool>>>,
}

impl Ledger {
    pub fn new(
        metrics: Arc<ProxyMetrics>,
        stats: Arc<RequestStats>,
        requests_log: Option<std::fs::File>,
        traffic_window: Option<sglang_probes::sampler::SamplerHandle>,
    ) -> Arc<Ledger> {
        Arc::new(Ledger {
            metrics,
            stats,
            log: requests_log.map(Mutex::new),
            in_flight: AtomicUsize::new(0),
            traffic: traffic_window.and_then(traffic_thread),
        })
    }

    pub fn metrics(&self) -> &Arc<ProxyMetrics> {
        &self.metrics
    }

    /// A measured request began.
    pub fn enter(&self) {
        if self.in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
            self.signal_traffic(true);
        }
    }

    /// A measured request named a client of its own ([`ProxyMetrics::forwarded_client`]).
    pub fn forwarded_client(&self) {
        self.metrics.forwarded_client.store(true, Ordering::Relaxed);
    }

    fn leave(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.signal_traffic(false);
        }
    }

    fn signal_traffic(&self, busy: bool) {
        if let Some(tx) = &self.traffic {
            let _ = lock(tx).send(busy);
        }
    }

    /// A measured request that ended before the server's answer began, now.
    pub fn failed(&self, s: Started, status: u16, why: String) {
        self.failed_at(s, status, why, Instant::now());
    }

    /// A measured request that ended before the server's answer began, at `end` (the tap's
    /// segments are read milliseconds after they pass: their own time is the end).
    pub fn failed_at(&self, s: Started, status: u16, why: String, end: Instant) {
        let ago = Instant::now().saturating_duration_since(end);
        let rec = RequestRecord {
            ts: humantime::format_rfc3339_micros(SystemTime::now() - ago).to_string(),
            start_unix: s.sent_unix,
            endpoint: s.endpoint.into(),
            status,
            stream: false,
            ttft_s: None,
            tpot_s: None,
            e2e_s: end.saturating_duration_since(s.sent).as_secs_f64(),
            itl_s: Vec::new(),
            prompt_tokens: None,
            completion_tokens: None,
            error: Some(why),
        };
        self.metrics.observe(&rec);
        self.finished(rec);
    }
}

impl Sink for Ledger {
    /// Count a finished request in the report windows and write its requests-log line.
    fn finished(&self, r: RequestRecord) {
        self.stats.record(&r);
        if let Some(f) = &self.log {
            if let Ok(mut line) = serde_json::to_vec(&r) {
                line.push(b'\n');
                let mut f = lock(f);
                if let Err(e) = f.write_all(&line) {
                    tracing::error!("writing the requests log: {e}");
                }
            }
        }
        self.leave();
    }
}

/// Busy/idle transitions are handled in order on one thread: each reads energy counters
/// (milliseconds per GPU), which must never delay a request.
fn traffic_thread(
    sampler: sglang_probes::sampler::SamplerHandle,
) -> Option<Mutex<std::sync::mpsc::Sender<bool>>> {
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    std::thread::Builder::new()
        .name("traffic-window".into())
        .spawn(move || {
            for busy in rx {
                if busy {
                    sampler.traffic_busy();
                } else {
                    sampler.traffic_idle();
                }
            }
        })
        .ok()
        .map(|_| Mutex::new(tx))
}
