//! Exporters: the Prometheus `/metrics` endpoint for the supervised server and its GPUs (with the
//! server's own `sglang:*` series re-exposed), the latency-measuring proxy, and
//! the passive tap that measures the same requests with no hop in between.
pub mod listen;
pub mod metrics;
pub mod proxy;
pub mod report;
pub mod server;
pub mod tap;
