//! Probes of what the supervisor watches: the HTTP probes the readiness logic uses, and the GPUs
//! (NVML today; ROCm SMI and sysfs follow) with a background sampler.
pub mod gpu;
pub mod http;
pub mod nvml;
pub mod sampler;
