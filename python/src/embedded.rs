//! The interpreter linked into the binary (feature `embedded-python`): runs [`FLAGS_PY`] in-process.
//!
//! libpython is linked statically, so the binary starts anywhere; what the interpreter needs at run
//! time is a standard library of its own minor version. It is initialised once per process, with
//! the home the first caller names (the target environment's `sys.base_prefix` in import mode);
//! a caller that needs another home, or a machine with no usable standard library, gets
//! [`EmbedError::Unavailable`] and runs the same module in a subprocess instead.
use crate::schema::FLAGS_PY;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::ffi::{CStr, CString};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The embedded interpreter cannot serve this call; the caller falls back to a subprocess.
    #[error("the embedded Python cannot run here: {0}")]
    Unavailable(String),
    /// The module ran and failed: its message, one line. `clean` when it was the module's own
    /// verdict (SystemExit: a bad wheel, no sglang), not an exception along the way (which may
    /// come from this interpreter, and deserves a retry in the target's own).
    #[error("{message}")]
    Failed { message: String, clean: bool },
}

/// The embedded interpreter's `[major, minor, micro]` (known before it is initialised). Only a
/// target of exactly this version may lend its standard library: the extension modules in
/// lib-dynload use private C API that changes between patch releases (3.11.7's `_ssl` needs
/// `_PyModule_Add`, which 3.11.2 lacks).
pub fn version() -> [u32; 3] {
    // SAFETY: Py_GetVersion returns a static string and may be called before initialisation.
    let v = unsafe { CStr::from_ptr(ffi::Py_GetVersion()) }.to_string_lossy();
    let mut it = v
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|x| x.parse().ok());
    [0; 3].map(|_| it.next().unwrap_or(0))
}

/// How the process's interpreter started: `Ok(home)` (`None`: the built-in prefix), or why not.
static STARTED: Mutex<Option<Result<Option<String>, String>>> = Mutex::new(None);

fn initialise(home: Option<&str>) -> Result<Duration, EmbedError> {
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    match started.as_ref() {
        // A failed start is not retried: the interpreter may be half-initialised.
        Some(Err(why)) => return Err(EmbedError::Unavailable(why.clone())),
        Some(Ok(h)) if home.is_some() && h.as_deref() != home => {
            return Err(EmbedError::Unavailable(format!(
                "it already runs with the standard library of {}",
                h.as_deref().unwrap_or("its build prefix")
            )))
        }
        Some(Ok(_)) => return Ok(Duration::ZERO),
        None => {}
    }
    let t = Instant::now();
    let [major, minor, _] = version();
    if let Some(h) = home {
        let lib = format!("{h}/lib/python{major}.{minor}/os.py");
        if !std::path::Path::new(&lib).exists() {
            return Err(EmbedError::Unavailable(format!("no {lib}")));
        }
    }
    // SAFETY: the PyConfig API as documented: init, set, initialise, clear; called once, under the
    // lock, before anything else touches the interpreter. Isolated: no PYTHON* environment, no user
    // site, no signal handlers (the supervisor owns SIGINT/SIGTERM).
    let status = unsafe {
        let mut config = std::mem::MaybeUninit::<ffi::PyConfig>::zeroed();
        ffi::PyConfig_InitIsolatedConfig(config.as_mut_ptr());
        let mut config = config.assume_init();
        config.install_signal_handlers = 0;
        config.pathconfig_warnings = 0;
        if let Some(h) = home {
            let c = CString::new(h).map_err(|e| EmbedError::Unavailable(e.to_string()))?;
            let s = ffi::PyConfig_SetBytesString(&mut config, &mut config.home, c.as_ptr());
            if ffi::PyStatus_Exception(s) != 0 {
                ffi::PyConfig_Clear(&mut config);
                return Err(EmbedError::Unavailable(format!("home {h} refused")));
            }
        }
        let s = ffi::Py_InitializeFromConfig(&config);
        ffi::PyConfig_Clear(&mut config);
        s
    };
    // SAFETY: err_msg is null or a static C string.
    if unsafe { ffi::PyStatus_Exception(status) } != 0 {
        let msg = if status.err_msg.is_null() {
            "initialisation failed".to_string()
        } else {
            unsafe { CStr::from_ptr(status.err_msg) }
                .to_string_lossy()
                .into_owned()
        };
        let msg = format!("no usable Python {major}.{minor} standard library ({msg})");
        *started = Some(Err(msg.clone()));
        return Err(EmbedError::Unavailable(msg));
    }
    // Initialised on this thread with the GIL held: release it so any thread can attach.
    // SAFETY: the thread state is not used again by this thread except through pyo3.
    unsafe { ffi::PyEval_SaveThread() };
    *started = Some(Ok(home.map(String::from)));
    Ok(t.elapsed())
}

/// Run `schema(mode, arg)` of the flags module in-process and return its JSON text, with the time
/// the interpreter took to start (zero when it already ran).
pub fn schema(
    home: Option<&str>,
    sys_path: Option<&[String]>,
    mode: &str,
    arg: Option<&str>,
) -> Result<(String, Duration), EmbedError> {
    let started = initialise(home)?;
    Python::with_gil(|py| {
        let run = || -> PyResult<String> {
            if let Some(p) = sys_path {
                py.import("sys")?.setattr("path", PyList::new(py, p)?)?;
            }
            let code = CString::new(FLAGS_PY)?;
            let m = PyModule::from_code(py, &code, c"sglang_flags.py", c"sglang_flags")?;
            m.getattr("schema")?.call1((mode, arg))?.extract()
        };
        run().map(|s| (s, started)).map_err(|e| {
            // SystemExit carries our own one-line message; anything else: its type and text.
            let v = e.value(py);
            let text = v.str().map(|s| s.to_string()).unwrap_or_default();
            let clean = e.is_instance_of::<pyo3::exceptions::PySystemExit>(py);
            let message = if clean {
                text
            } else {
                format!(
                    "{}: {text}",
                    v.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                )
            };
            EmbedError::Failed { message, clean }
        })
    })
}
