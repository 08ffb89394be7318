//! AMD GPUs through our own run-time bindings to `librocm_smi64` (not the `rocm_smi_lib` crate:
//! it links the library at build time, so a binary without it dies in the loader, and its safe
//! API segfaults on a host without a GPU). Rules learnt the hard way (reference/telemetry.md §2):
//! check `rsmi_init`'s status, then the device count, and never pass an index at or beyond it;
//! resolve every optional symbol on its own, since library versions differ (5.2.3 has
//! `rsmi_dev_power_ave_get` but no `rsmi_dev_current_socket_power_get`).
use crate::gpu::{GpuError, GpuProbe, GpuSample, Want};
use libloading::{Library, Symbol};
use std::ffi::{c_char, c_float, OsStr};
use std::sync::Mutex;

type Status = u32;
const RSMI_STATUS_SUCCESS: Status = 0;
const RSMI_STATUS_INIT_ERROR: Status = 8;
const RSMI_MEM_TYPE_VRAM: u32 = 0;
const RSMI_TEMP_TYPE_EDGE: u32 = 0;
const RSMI_TEMP_CURRENT: u32 = 0;

/// Where the library usually is, in the order we try.
const CANDIDATES: &[&str] = &[
    "librocm_smi64.so.1",
    "librocm_smi64.so.7",
    "librocm_smi64.so",
    "/opt/rocm/lib/librocm_smi64.so.1",
    "/opt/rocm/lib/librocm_smi64.so",
];

/// rsmi_init prints its failures itself ("Exception caught: rsmi_init.", "Failed to open drm root
/// directory") on stderr, where the user reads them as ours; its status says the same. So stderr
/// points at /dev/null for the call (it runs before any thread of ours writes there).
fn stderr_muted<T>(f: impl FnOnce() -> T) -> T {
    use std::os::fd::AsFd;
    let saved = std::io::stderr().as_fd().try_clone_to_owned();
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null");
    let (Ok(saved), Ok(null)) = (saved, null) else {
        return f();
    };
    if nix::unistd::dup2_stderr(&null).is_err() {
        return f();
    }
    let out = f();
    let _ = nix::unistd::dup2_stderr(&saved);
    out
}

type FnInit = unsafe extern "C" fn(u64) -> Status;
type FnShutDown = unsafe extern "C" fn() -> Status;
type FnNum = unsafe extern "C" fn(*mut u32) -> Status;
type FnName = unsafe extern "C" fn(u32, *mut c_char, usize) -> Status;
type FnU64 = unsafe extern "C" fn(u32, *mut u64) -> Status;
type FnPowerAve = unsafe extern "C" fn(u32, u32, *mut u64) -> Status;
type FnEnergy = unsafe extern "C" fn(u32, *mut u64, *mut c_float, *mut u64) -> Status;
type FnMem = unsafe extern "C" fn(u32, u32, *mut u64) -> Status;
type FnBusy = unsafe extern "C" fn(u32, *mut u32) -> Status;
type FnTemp = unsafe extern "C" fn(u32, u32, u32, *mut i64) -> Status;

pub struct RocmProbe {
    lib: Library,
    count: u32,
    initialised: bool,
    /// ROCm SMI's thread safety varies by version: one call at a time (each is microseconds).
    calls: Mutex<()>,
}

impl RocmProbe {
    /// Load the library (`path`, else the usual names) and initialise it. A library that loads
    /// but finds no GPU (Debian's librocm-smi64-1 on a machine without AMD) gives 0 devices.
    pub fn open(path: Option<&OsStr>) -> Result<Self, GpuError> {
        let unavailable = |why: String| GpuError::Unavailable {
            backend: "rocm",
            why,
        };
        let lib = match path {
            // SAFETY: loading a shared library runs its initialisers; ROCm SMI's are benign.
            Some(p) => unsafe { Library::new(p) }.map_err(|e| unavailable(e.to_string()))?,
            None => {
                let mut last = String::from("no candidate tried");
                let mut found = None;
                for c in CANDIDATES {
                    // SAFETY: as above.
                    match unsafe { Library::new(c) } {
                        Ok(l) => {
                            found = Some(l);
                            break;
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                found.ok_or_else(|| unavailable(last))?
            }
        };
        // SAFETY: symbol types match rocm_smi.h.
        let init: Symbol<FnInit> =
            unsafe { lib.get(b"rsmi_init\0") }.map_err(|e| unavailable(e.to_string()))?;
        // SAFETY: rsmi_init takes flags by value.
        let st = stderr_muted(|| unsafe { init(0) });
        if st == RSMI_STATUS_INIT_ERROR {
            // What a host without an AMD GPU gets (no /sys/class/kfd): the library is there, the
            // answer is "no AMD GPU". No other call may follow a failed init.
            tracing::debug!("rsmi_init: INIT_ERROR, no AMD GPU on this host");
            return Ok(RocmProbe {
                lib,
                count: 0,
                initialised: false,
                calls: Mutex::new(()),
            });
        }
        if st != RSMI_STATUS_SUCCESS {
            return Err(unavailable(format!("rsmi_init returned status {st}")));
        }
        let mut count = 0u32;
        // SAFETY: as above; `count` is a valid out pointer.
        let num: Symbol<FnNum> = unsafe { lib.get(b"rsmi_num_monitor_devices\0") }
            .map_err(|e| unavailable(e.to_string()))?;
        // SAFETY: valid out pointer.
        let st = unsafe { num(&mut count) };
        if st != RSMI_STATUS_SUCCESS {
            return Err(unavailable(format!(
                "rsmi_num_monitor_devices returned status {st}"
            )));
        }
        Ok(RocmProbe {
            lib,
            count,
            initialised: true,
            calls: Mutex::new(()),
        })
    }

    fn sym<T>(&self, name: &[u8]) -> Option<Symbol<'_, T>> {
        // SAFETY: callers name symbols with the matching function type from rocm_smi.h.
        unsafe { self.lib.get(name).ok() }
    }
}

impl Drop for RocmProbe {
    fn drop(&mut self) {
        if !self.initialised {
            return;
        }
        if let Some(f) = self.sym::<FnShutDown>(b"rsmi_shut_down\0") {
            // SAFETY: no other call is in flight once we are dropped.
            unsafe { f() };
        }
    }
}

impl GpuProbe for RocmProbe {
    fn backend(&self) -> &'static str {
        "rocm"
    }

    fn device_count(&self) -> u32 {
        self.count
    }

    fn sample(&self, index: u32, want: Want) -> Result<GpuSample, GpuError> {
        if index >= self.count {
            // Never hand ROCm SMI an index it does not have: some versions segfault on it.
            return Err(GpuError::Gone {
                index,
                why: format!("index {index} is beyond the {} devices", self.count),
            });
        }
        let _one = crate::sync::lock(&self.calls);
        let mut s = GpuSample {
            index,
            ..GpuSample::default()
        };
        let ok = |st: Status| st == RSMI_STATUS_SUCCESS;
        if want.identity {
            if let Some(f) = self.sym::<FnName>(b"rsmi_dev_name_get\0") {
                let mut buf = [0 as c_char; 256];
                // SAFETY: buffer and its length.
                if ok(unsafe { f(index, buf.as_mut_ptr(), buf.len()) }) {
                    // SAFETY: the library NUL-terminates within the given length.
                    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
                    s.name = Some(name.to_string_lossy().into_owned()).filter(|n| !n.is_empty());
                }
            }
            if let Some(f) = self.sym::<FnU64>(b"rsmi_dev_unique_id_get\0") {
                let mut id = 0u64;
                // SAFETY: valid out pointer.
                if ok(unsafe { f(index, &mut id) }) {
                    s.uuid = Some(format!("{id:016x}"));
                }
            }
        }
        // Socket power where the library has it (newer), else the average (µW).
        let mut uw = 0u64;
        let socket = self.sym::<FnU64>(b"rsmi_dev_current_socket_power_get\0");
        // SAFETY: valid out pointer.
        if socket.is_some_and(|f| ok(unsafe { f(index, &mut uw) })) {
            s.power_w = Some(uw as f64 / 1e6);
        }
        if let Some(f) = self.sym::<FnPowerAve>(b"rsmi_dev_power_ave_get\0") {
            // SAFETY: valid out pointer; sensor 0.
            if ok(unsafe { f(index, 0, &mut uw) }) {
                s.power_avg_w = Some(uw as f64 / 1e6);
            }
        }
        if want.energy {
            if let Some(f) = self.sym::<FnEnergy>(b"rsmi_dev_energy_count_get\0") {
                let (mut count, mut resolution, mut ts) = (0u64, 0f32, 0u64);
                // SAFETY: valid out pointers.
                if ok(unsafe { f(index, &mut count, &mut resolution, &mut ts) }) && resolution > 0.0
                {
                    // The counter ticks in units of `resolution` µJ (forgetting it is a known bug).
                    s.energy_j = Some(count as f64 * f64::from(resolution) / 1e6);
                }
            }
        }
        if let Some(f) = self.sym::<FnMem>(b"rsmi_dev_memory_total_get\0") {
            let mut v = 0u64;
            // SAFETY: valid out pointer.
            if ok(unsafe { f(index, RSMI_MEM_TYPE_VRAM, &mut v) }) {
                s.memory_total_bytes = Some(v);
            }
        }
        if let Some(f) = self.sym::<FnMem>(b"rsmi_dev_memory_usage_get\0") {
            let mut v = 0u64;
            // SAFETY: valid out pointer.
            if ok(unsafe { f(index, RSMI_MEM_TYPE_VRAM, &mut v) }) {
                s.memory_used_bytes = Some(v);
            }
        }
        if let Some(f) = self.sym::<FnBusy>(b"rsmi_dev_busy_percent_get\0") {
            let mut v = 0u32;
            // SAFETY: valid out pointer.
            if ok(unsafe { f(index, &mut v) }) {
                s.utilization = Some(f64::from(v) / 100.0);
            }
        }
        if let Some(f) = self.sym::<FnTemp>(b"rsmi_dev_temp_metric_get\0") {
            let mut v = 0i64;
            // SAFETY: valid out pointer.
            if ok(unsafe { f(index, RSMI_TEMP_TYPE_EDGE, RSMI_TEMP_CURRENT, &mut v) }) {
                s.temperature_c = Some(v as f64 / 1000.0);
            }
        }
        Ok(s)
    }
}
