//! Exporters: the Prometheus `/metrics` endpoint for the supervised server and its GPUs, with the
//! server's own `sglang:*` series re-exposed. (The latency proxy, power CSV reports and JSON
//! reports come with issues #5 and #6.)
pub mod metrics;
pub mod server;
