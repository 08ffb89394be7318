//! Probes of what the supervisor watches: the HTTP probes the readiness logic uses, and the GPUs
//! (NVML, ROCm SMI, amdgpu sysfs) with a background sampler.
pub mod gpu;
pub mod http;
pub mod inferencex;
pub mod lines;
pub mod nvml;
pub mod resolve;
pub mod rocm;
pub mod sampler;
pub mod sync;
pub mod sysfs;
