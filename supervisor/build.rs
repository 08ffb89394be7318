//! With the embedded interpreter linked statically, the extension modules of a Python standard
//! library (lib-dynload/*.so) resolve the C API from the executable: export those symbols.
fn main() {
    if std::env::var_os("CARGO_FEATURE_EMBEDDED_PYTHON").is_some() {
        // Debian's libpython3.11.a is not position-independent: link these binaries as non-PIE.
        println!("cargo:rustc-link-arg-bins=-no-pie");
        println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=Py*,--export-dynamic-symbol=_Py*");
    }
}
