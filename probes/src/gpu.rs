//! The vendor-neutral view of a GPU: plain-data samples whose every reading is optional. A reading
//! a device or driver does not support is `None` — absent, never 0 — so an exporter can leave the
//! series out instead of reporting a false zero.
use serde::Serialize;

/// One reading of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuSample {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Instantaneous power (NVML field POWER_INSTANT), watts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    /// The driver's 1 s average (what `nvidia-smi power.draw` shows), watts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_avg_w: Option<f64>,
    /// Hardware energy counter since driver load, joules (read less often than the rest: it is
    /// expensive on NVIDIA, ~3.6 ms per read on an H200).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    /// GPU busy fraction 0..1 over the driver's sample period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_utilization: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm_clock_hz: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_clock_hz: Option<u64>,
    /// Raw clock-event (throttle) reason bits, vendor-defined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_reasons: Option<u64>,
    /// Compute processes and the memory each holds; `None` when not readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<GpuProcess>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_memory_bytes: Option<u64>,
}

/// What to read in one sample: the cheap readings always, the costly ones on request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Want {
    pub energy: bool,
    pub processes: bool,
    /// Identity (name, uuid, memory total): once per device is enough.
    pub identity: bool,
}

impl Want {
    pub const ALL: Want = Want {
        energy: true,
        processes: true,
        identity: true,
    };
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum GpuError {
    /// The backend's library or driver is not there: the probe is simply unavailable.
    #[error("{backend} is not available: {why}")]
    Unavailable { backend: &'static str, why: String },
    /// The device fell off the bus (NVML `GpuLost`) or disappeared.
    #[error("GPU {index} is gone: {why}")]
    Gone { index: u32, why: String },
    /// Anything else; the sampler retries (re-initialising the library).
    #[error("GPU {index}: {why}")]
    Transient { index: u32, why: String },
}

/// A source of GPU samples. Implementations must be cheap to call from one thread per GPU.
pub trait GpuProbe: Send + Sync {
    /// `nvml`, `rocm`, `sysfs`, ...
    fn backend(&self) -> &'static str;
    fn device_count(&self) -> u32;
    fn sample(&self, index: u32, want: Want) -> Result<GpuSample, GpuError>;
    /// Re-open the library after transient errors. Default: nothing to do.
    fn reinit(&self) -> Result<(), GpuError> {
        Ok(())
    }
}

/// Which backend `--gpu-backend` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Auto,
    Nvml,
    Rocm,
    Sysfs,
    None,
}

/// Where each backend's library or tree is (tests point these at stubs).
#[derive(Debug, Clone, Default)]
pub struct Locations<'a> {
    pub nvml_lib: Option<&'a std::ffi::OsStr>,
    pub rocm_lib: Option<&'a std::ffi::OsStr>,
    pub sysfs_root: Option<&'a std::path::Path>,
}

/// Open the requested backend. `Auto` tries NVML, then ROCm SMI, then amdgpu's sysfs, and takes
/// the first that sees a GPU; it never fails (no GPU is a valid answer), nor does `None`. An
/// explicitly named backend that cannot load is an error.
pub fn open(backend: Backend, at: &Locations<'_>) -> Result<Option<Box<dyn GpuProbe>>, GpuError> {
    let sysfs_root = at.sysfs_root.unwrap_or(std::path::Path::new("/sys"));
    match backend {
        Backend::None => Ok(None),
        Backend::Nvml => Ok(Some(Box::new(crate::nvml::NvmlProbe::open(at.nvml_lib)?))),
        Backend::Rocm => Ok(Some(Box::new(crate::rocm::RocmProbe::open(at.rocm_lib)?))),
        Backend::Sysfs => Ok(Some(Box::new(crate::sysfs::SysfsProbe::open(sysfs_root)?))),
        Backend::Auto => {
            for b in [Backend::Nvml, Backend::Rocm, Backend::Sysfs] {
                match open(b, at) {
                    Ok(Some(p)) if p.device_count() > 0 => return Ok(Some(p)),
                    Ok(_) => tracing::debug!("{b:?}: loaded, no GPU"),
                    Err(e) => tracing::debug!("{b:?}: {e}"),
                }
            }
            Ok(None)
        }
    }
}
