//! Lines of a file read one at a time, each held only up to a cap: the readers of the files
//! a run leaves (power CSV, requests log) hold what they keep of a line, never a file, and a
//! file without newlines (a sparse or garbage one) costs at most the cap.
use std::io::{self, BufRead};

/// One line, its end ("\n" or "\r\n") taken off, invalid UTF-8 replaced; or a line longer
/// than the cap, skipped to its end without being held.
#[derive(Debug, PartialEq)]
pub enum Line {
    Text(String),
    TooLong,
}

/// The lines of `reader`, each at most `cap` bytes.
pub struct CappedLines<R> {
    reader: R,
    cap: usize,
    buf: Vec<u8>,
}

impl<R: BufRead> CappedLines<R> {
    pub fn new(reader: R, cap: usize) -> Self {
        CappedLines {
            reader,
            cap,
            buf: Vec::new(),
        }
    }
}

impl<R: BufRead> Iterator for CappedLines<R> {
    type Item = io::Result<Line>;

    fn next(&mut self) -> Option<io::Result<Line>> {
        self.buf.clear();
        let (mut any, mut too_long) = (false, false);
        loop {
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Some(Err(e)),
            };
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], Some(i + 1)),
                None => (chunk, None),
            };
            if !too_long && self.buf.len() + part.len() <= self.cap {
                self.buf.extend_from_slice(part);
            } else {
                too_long = true;
                self.buf.clear();
            }
            let used = done.unwrap_or(chunk.len());
            self.reader.consume(used);
            if done.is_some() {
                break;
            }
        }
        if !any {
            return None;
        }
        if too_long {
            return Some(Ok(Line::TooLong));
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        let text = match String::from_utf8(std::mem::take(&mut self.buf)) {
            Ok(t) => t,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        Some(Ok(Line::Text(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(bytes: &[u8], cap: usize) -> Vec<Line> {
        CappedLines::new(io::BufReader::with_capacity(4, bytes), cap)
            .map(|l| l.unwrap())
            .collect()
    }

    #[test]
    fn lines_end_as_str_lines_end_and_a_long_one_is_skipped_not_held() {
        let t = |s: &str| Line::Text(s.into());
        assert_eq!(
            lines(b"ab\r\ncd\n\nlast", 8),
            [t("ab"), t("cd"), t(""), t("last")]
        );
        assert_eq!(lines(b"", 8), []);
        assert_eq!(lines(b"x\n", 8), [t("x")]);
        // 9 bytes over a cap of 8, read 4 bytes at a time: skipped whole, the next line kept
        assert_eq!(lines(b"123456789\nok\n", 8), [Line::TooLong, t("ok")]);
        assert_eq!(lines(b"12345678\n", 8), [t("12345678")]);
        assert_eq!(lines(b"a\xffb\n", 8), [t("a\u{fffd}b")]);
    }
}
