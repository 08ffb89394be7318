//! Files the subcommands read (reports, events, benchmark results, requests logs): only regular
//! files. Asked before opening: opening a FIFO blocks until a writer comes, and a device such as
//! /dev/zero never ends (a read to the end would take the machine's memory).
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// `path` opened for reading, or the error that it is not a regular file (one line).
pub fn open(path: &Path) -> io::Result<File> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    File::open(path)
}

/// The bytes of the regular file `path`.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The text of the regular file `path` (UTF-8, as `std::fs::read_to_string`).
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_a_fifo_and_a_directory_are_refused_without_reading_or_blocking() {
        let dir = std::env::temp_dir().join(format!("input-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        for p in [Path::new("/dev/zero"), &fifo, &dir] {
            let e = read(p).unwrap_err();
            assert_eq!(e.to_string(), "not a regular file", "{}", p.display());
        }
        let file = dir.join("f.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "{}");
        let missing = read(&dir.join("none")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
