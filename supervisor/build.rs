//! With the embedded interpreter linked statically, the extension modules of a Python standard
//! library (lib-dynload/*.so) resolve the C API from the executable: export those symbols.
//! And `--version` names the commit it was built from (`0.1.0 (abc123def456)`, `-dirty` for
//! uncommitted changes, `unknown` outside a git checkout).
#![allow(clippy::disallowed_methods)] // a build script runs git directly

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    if std::env::var_os("CARGO_FEATURE_EMBEDDED_PYTHON").is_some() {
        // Debian's libpython3.11.a is not position-independent: link these binaries as non-PIE.
        println!("cargo:rustc-link-arg-bins=-no-pie");
        println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=Py*,--export-dynamic-symbol=_Py*");
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=SGLANG_SUPERVISOR_COMMIT={commit}{suffix}");
    // Rebuilt on a commit or checkout (the reflog of this worktree's HEAD moves).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/logs/HEAD");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
