//! Writing a result file (`--report`, `--report-html`, `report -o`) so a reader never sees half
//! of it, without destroying what the path names: a symlink keeps pointing where it did, and a
//! device node or FIFO (`/dev/stdout`, `/dev/null`, a named pipe) is written into, never
//! renamed over.
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// More links than this in a chain is a loop (Linux's own limit, MAXSYMLINKS).
const MAX_LINKS: usize = 40;

/// Write `bytes` to `path`: a regular file (or a new one) is replaced atomically through a
/// temporary file beside it; through a symlink it is the link's target that is replaced; a path
/// that is neither (a character or block device, a FIFO, a socket) is opened and written.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => {
            // Opened by its own path, not the resolved one: `/dev/stdout` is a link to
            // `/proc/self/fd/1`, whose "target" (`pipe:[…]`) only the kernel can follow. No
            // truncation: a device or pipe has no contents to cut.
            let mut f = OpenOptions::new().write(true).open(path)?;
            f.write_all(bytes)?;
            f.flush()
        }
        // A regular file, a missing one, or a directory (the rename then says why it cannot).
        _ => replace(&resolve_links(path)?, bytes),
    }
}

/// The path a chain of symlinks ends at (which may not exist yet: a dangling link's target is
/// created, as `>` in a shell does). Not `canonicalize`, which fails on a dangling link.
fn resolve_links(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let next = fs::read_link(&p)?;
                // A relative target is relative to the link's directory, not ours.
                p = match p.parent() {
                    Some(dir) if next.is_relative() => dir.join(next),
                    _ => next,
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is a chain of more than {MAX_LINKS} symlinks (a loop?)",
            path.display()
        ),
    ))
}

/// Temporary file in the same directory (a rename does not cross file systems), then rename.
fn replace(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file", target.display()),
        )
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = target.with_file_name(tmp_name);
    let written = (|| {
        // create_new: never follow or reuse something already at the temporary path.
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.flush()?;
        drop(f);
        fs::rename(&tmp, target)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sglsup-atomic-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_regular_file_is_replaced_whole_and_no_temporary_file_is_left() {
        let d = temp_dir("regular");
        let p = d.join("report.json");
        fs::write(&p, "old contents, longer than the new ones").unwrap();
        write(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        write(&d.join("fresh.json"), b"first").unwrap();
        assert_eq!(fs::read(d.join("fresh.json")).unwrap(), b"first");
        assert_eq!(names_in(&d), ["fresh.json", "report.json"]);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn writing_through_a_symlink_keeps_the_link_and_replaces_its_target() {
        let d = temp_dir("symlink");
        fs::create_dir(d.join("real")).unwrap();
        let target = d.join("real/report.json");
        fs::write(&target, "old").unwrap();
        // Relative, as `ln -s real/report.json latest.json` makes it.
        let link = d.join("latest.json");
        std::os::unix::fs::symlink("real/report.json", &link).unwrap();
        write(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("real/report.json"));
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(names_in(&d.join("real")), ["report.json"]);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_dangling_symlink_gets_its_target_created() {
        let d = temp_dir("dangling");
        let link = d.join("latest.json");
        std::os::unix::fs::symlink(d.join("later.json"), &link).unwrap();
        write(&link, b"made").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(d.join("later.json")).unwrap(), b"made");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_symlink_loop_is_an_error_not_a_hang() {
        let d = temp_dir("loop");
        std::os::unix::fs::symlink(d.join("b"), d.join("a")).unwrap();
        std::os::unix::fs::symlink(d.join("a"), d.join("b")).unwrap();
        let e = write(&d.join("a"), b"x").unwrap_err();
        assert!(e.to_string().contains("symlinks"), "{e}");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_fifo_gets_the_bytes_and_stays_a_fifo() {
        let d = temp_dir("fifo");
        let fifo = d.join("report.pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || fs::read(fifo).unwrap())
        };
        write(&fifo, b"through the pipe").unwrap();
        assert_eq!(reader.join().unwrap(), b"through the pipe");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert_eq!(names_in(&d), ["report.pipe"]);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_link_the_kernel_resolves_to_a_pipe_gets_the_bytes() {
        // /dev/stdout → /proc/self/fd/1 → "pipe:[…]": the path `report -o /dev/stdout` names.
        let mut fds = [0; 2];
        // Close-on-exec: a child another test spawns meanwhile must not hold the write end open,
        // or the read to the end below waits for that child.
        // SAFETY: a fresh pipe; both ends are owned below and closed exactly once.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (r, w) = unsafe {
            use std::os::fd::FromRawFd;
            (
                fs::File::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        let magic = PathBuf::from(format!("/proc/self/fd/{}", fds[1]));
        write(&magic, b"to the pipe").unwrap();
        drop(w);
        let mut got = Vec::new();
        io::Read::read_to_end(&mut { r }, &mut got).unwrap();
        assert_eq!(got, b"to the pipe");
    }

    #[test]
    fn dev_null_is_written_into_and_stays_a_character_device() {
        let null = Path::new("/dev/null");
        write(null, b"discarded").unwrap();
        let m = fs::symlink_metadata(null).unwrap();
        assert!(m.file_type().is_char_device(), "{m:?}");
    }
}
