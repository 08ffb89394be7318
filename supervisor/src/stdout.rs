//! The one way a command prints its result. `print!` panics when standard output cannot be
//! written (a full disk, a closed descriptor); here that is an error the command reports.
use std::io::Write;

/// Standard output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing to standard output: {0}; free space where it goes, or send it elsewhere")]
pub struct StdoutError(std::io::Error);

/// Write `text` to standard output and flush it, so a failure is seen here, not lost at exit.
pub fn print(text: impl AsRef<[u8]>) -> Result<(), StdoutError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_ref())
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// `text` and a newline, as `println!`.
pub fn println(text: impl AsRef<[u8]>) -> Result<(), StdoutError> {
    let mut line = text.as_ref().to_vec();
    line.push(b'\n');
    print(line)
}
