//! Prometheus exporter, latency-measuring proxy, power CSV and JSON reports.
//! Not built yet: tracked as issues #5 and #6.
