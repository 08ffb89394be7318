//! Probes of what the supervisor watches. Today: the HTTP probes the readiness logic uses.
//! GPU probes (NVML, ROCm SMI, sysfs) and the sampler live here too once built.
pub mod http;
