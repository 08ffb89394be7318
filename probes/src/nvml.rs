//! NVIDIA GPUs through `nvml-wrapper`, which dlopens `libnvidia-ml.so.1` at run time: a host
//! without the driver simply has no NVIDIA probe, and a symbol an old driver lacks only empties
//! the reading that needs it.
use crate::gpu::{GpuError, GpuProbe, GpuProcess, GpuSample, Want};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT};
use nvml_wrapper::{Device, Nvml};
use std::ffi::{OsStr, OsString};
use std::sync::{Arc, RwLock};

pub struct NvmlProbe {
    nvml: RwLock<Arc<Nvml>>,
    lib: Option<OsString>,
    count: u32,
}

fn init(lib: Option<&OsStr>) -> Result<Nvml, GpuError> {
    let mut b = Nvml::builder();
    if let Some(l) = lib {
        b.lib_path(l);
    }
    b.init().map_err(|e| GpuError::Unavailable {
        backend: "nvml",
        why: e.to_string(),
    })
}

impl NvmlProbe {
    /// Load NVML (from `lib`, else the system's `libnvidia-ml.so.1`) and count the devices.
    pub fn open(lib: Option<&OsStr>) -> Result<Self, GpuError> {
        let nvml = init(lib)?;
        let count = nvml.device_count().map_err(|e| GpuError::Unavailable {
            backend: "nvml",
            why: e.to_string(),
        })?;
        Ok(NvmlProbe {
            nvml: RwLock::new(Arc::new(nvml)),
            lib: lib.map(OsStr::to_os_string),
            count,
        })
    }

    fn current(&self) -> Arc<Nvml> {
        self.nvml.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A reading that failed: absent, unless the failure says the GPU is gone.
struct Reader {
    index: u32,
    gone: Option<String>,
}

impl Reader {
    fn opt<T>(&mut self, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::GpuLost) => {
                self.gone = Some("NVML reports GPU_IS_LOST".into());
                None
            }
            Err(e) => {
                tracing::trace!(index = self.index, "NVML reading unavailable: {e}");
                None
            }
        }
    }
}

fn milliwatts(v: &Result<FieldValueSample, NvmlError>) -> Option<f64> {
    let mw = match v.as_ref().ok()?.value.as_ref().ok()? {
        SampleValue::U32(x) => f64::from(*x),
        SampleValue::U64(x) => *x as f64,
        SampleValue::I64(x) => *x as f64,
        SampleValue::F64(x) => *x,
    };
    Some(mw / 1000.0)
}

/// (used, total) bytes from `nvmlDeviceGetMemoryInfo`, for drivers without its `_v2` (before
/// R510), the only one nvml-wrapper calls. Its `used` counts the driver's reserved memory too.
fn memory_info_v1(nvml: &Nvml, dev: &Device<'_>) -> Result<(u64, u64), NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetMemoryInfo.as_ref())?;
    let mut info = std::mem::MaybeUninit::zeroed();
    // SAFETY: the symbol has nvml.h's v1 signature (nvml-wrapper-sys' binding of it); `dev` is a
    // valid handle of this library; `info` is a writable nvmlMemory_t, read only after success.
    unsafe {
        nvml_try(f(dev.handle(), info.as_mut_ptr()))?;
        let info = info.assume_init();
        Ok((info.used, info.total))
    }
}

impl GpuProbe for NvmlProbe {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn device_count(&self) -> u32 {
        self.count
    }

    fn sample(&self, index: u32, want: Want) -> Result<GpuSample, GpuError> {
        let nvml = self.current();
        let dev = nvml.device_by_index(index).map_err(|e| match e {
            NvmlError::GpuLost | NvmlError::InvalidArg | NvmlError::NotFound => GpuError::Gone {
                index,
                why: e.to_string(),
            },
            other => GpuError::Transient {
                index,
                why: other.to_string(),
            },
        })?;
        let mut r = Reader { index, gone: None };
        let mut s = GpuSample {
            index,
            ..GpuSample::default()
        };
        if want.identity {
            s.name = r.opt(dev.name());
            s.uuid = r.opt(dev.uuid());
        }
        // Instant and 1 s-average power in one driver call.
        let ids = [
            FieldId(NVML_FI_DEV_POWER_INSTANT),
            FieldId(NVML_FI_DEV_POWER_AVERAGE),
        ];
        if let Some(values) = r.opt(dev.field_values_for(&ids)) {
            s.power_w = values.first().and_then(milliwatts);
            s.power_avg_w = values.get(1).and_then(milliwatts);
        }
        if s.power_avg_w.is_none() {
            s.power_avg_w = r.opt(dev.power_usage()).map(|mw| f64::from(mw) / 1000.0);
        }
        let memory = match dev.memory_info() {
            Err(e) if !matches!(e, NvmlError::GpuLost) => {
                tracing::trace!(index, "nvmlDeviceGetMemoryInfo_v2: {e}; trying v1");
                memory_info_v1(&nvml, &dev)
            }
            v2 => v2.map(|m| (m.used, m.total)),
        };
        if let Some((used, total)) = r.opt(memory) {
            s.memory_used_bytes = Some(used);
            s.memory_total_bytes = Some(total);
        }
        if let Some(u) = r.opt(dev.utilization_rates()) {
            s.utilization = Some(f64::from(u.gpu) / 100.0);
            s.memory_utilization = Some(f64::from(u.memory) / 100.0);
        }
        s.temperature_c = r
            .opt(dev.temperature(TemperatureSensor::Gpu))
            .map(f64::from);
        s.sm_clock_hz = r
            .opt(dev.clock_info(Clock::SM))
            .map(|mhz| u64::from(mhz) * 1_000_000);
        s.memory_clock_hz = r
            .opt(dev.clock_info(Clock::Memory))
            .map(|mhz| u64::from(mhz) * 1_000_000);
        s.throttle_reasons = r.opt(dev.current_throttle_reasons()).map(|t| t.bits());
        if want.energy {
            s.energy_j = r
                .opt(dev.total_energy_consumption())
                .map(|mj| mj as f64 / 1000.0);
        }
        if want.processes {
            s.processes = r.opt(dev.running_compute_processes()).map(|ps| {
                ps.into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_memory_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect()
            });
        }
        match r.gone {
            Some(why) => Err(GpuError::Gone { index, why }),
            None => Ok(s),
        }
    }

    fn reinit(&self) -> Result<(), GpuError> {
        let fresh = init(self.lib.as_deref())?;
        *self.nvml.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
        Ok(())
    }
}
