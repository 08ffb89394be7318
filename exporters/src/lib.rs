//! Exporters: the Prometheus `/metrics` endpoint for the supervised server and its GPUs (with the
//! server's own `sglang:*` series re-exposed), and the latency-measuring proxy.
pub mod listen;
pub mod metrics;
pub mod proxy;
pub mod report;
pub mod server;
