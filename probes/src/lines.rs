//! Lines of a file read one at a time, each held only up to a cap: the readers of the files
//! a run leaves (power CSV, requests log) hold what they keep of a line, never a file, and a
//! file without newlines (a sparse or garbage one) costs at most the cap.
use std::io::{self, BufRead};

/// One line, its end taken off, invalid UTF-8 replaced; or a line longer than the cap, skipped
/// to its end without being held. A line ends at "\n", "\r\n" or a lone "\r", as Python's
/// csv module reads a file opened with `newline=""` (InferenceX's `aggregate_power.py`, the
/// referee of the power CSV): so "a\r\r\n" is "a" and an empty line.
#[derive(Debug, PartialEq)]
pub enum Line {
    Text(String),
    TooLong,
}

/// Where a CSV record's scan stands, as Python's csv module reads one (`skipinitialspace`):
/// a quote opens a field only at its start, after spaces; inside, "" is a quote, and a line end
/// is part of the field, not the record's end.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Quoting {
    /// Not a CSV file: every line end is one.
    Off,
    FieldStart,
    Unquoted,
    Quoted,
    /// A quote inside a quoted field: an escaped quote if another follows, else the field's end.
    QuoteInQuoted,
}

impl Quoting {
    /// The state after `b`, and whether `b` ends the record.
    fn after(self, b: u8) -> (Quoting, bool) {
        use Quoting::*;
        let ends = b == b'\n' || b == b'\r';
        match (self, b) {
            (Off, _) => (Off, ends),
            (Quoted, b'"') => (QuoteInQuoted, false),
            (Quoted, _) => (Quoted, false),
            (QuoteInQuoted, b'"') => (Quoted, false),
            (FieldStart, b'"') => (Quoted, false),
            (FieldStart, b' ') => (FieldStart, false),
            (_, b',') => (FieldStart, false),
            _ if ends => (FieldStart, true),
            _ => (Unquoted, false),
        }
    }
}

/// The lines of `reader`, each at most `cap` bytes.
pub struct CappedLines<R> {
    reader: R,
    cap: usize,
    buf: Vec<u8>,
    /// The last line ended at a "\r": a "\n" right after it belongs to that end.
    after_cr: bool,
    quoting: Quoting,
}

impl<R: BufRead> CappedLines<R> {
    pub fn new(reader: R, cap: usize) -> Self {
        CappedLines {
            reader,
            cap,
            buf: Vec::new(),
            after_cr: false,
            quoting: Quoting::Off,
        }
    }

    /// A CSV file's records: a line end inside a quoted field is kept in it, as Python's csv
    /// reads it (a record then spans lines), instead of ending the record.
    pub fn csv(reader: R, cap: usize) -> Self {
        CappedLines {
            quoting: Quoting::FieldStart,
            ..CappedLines::new(reader, cap)
        }
    }
}

/// Where in `chunk` the line ends (the index of its end byte), the CSV scan's state carried in
/// `quoting` from chunk to chunk.
fn end_in(quoting: &mut Quoting, chunk: &[u8]) -> Option<usize> {
    if *quoting == Quoting::Off {
        return memchr::memchr2(b'\n', b'\r', chunk);
    }
    for (i, &b) in chunk.iter().enumerate() {
        let (next, ends) = quoting.after(b);
        *quoting = next;
        if ends {
            return Some(i);
        }
    }
    None
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
            if std::mem::take(&mut self.after_cr) && chunk[0] == b'\n' {
                self.reader.consume(1);
                continue;
            }
            any = true;
            let (part, done) = match end_in(&mut self.quoting, chunk) {
                Some(i) => {
                    self.after_cr = chunk[i] == b'\r';
                    (&chunk[..i], Some(i + 1))
                }
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

    #[test]
    fn a_lone_cr_ends_a_line_as_pythons_csv_reads_it_and_a_crlf_split_across_reads_is_one_end() {
        let t = |s: &str| Line::Text(s.into());
        assert_eq!(lines(b"ab\rcd\r", 8), [t("ab"), t("cd")]);
        assert_eq!(lines(b"ab\r\r\ncd", 8), [t("ab"), t(""), t("cd")]);
        // "abc\r" fills the 4-byte buffer: the "\n" comes in the next read
        assert_eq!(lines(b"abc\r\nd\n\r", 8), [t("abc"), t("d"), t("")]);
        assert_eq!(lines(b"\r\n\r\n", 8), [t(""), t("")]);
        // a line over the cap ends at a lone CR too
        assert_eq!(lines(b"123456789\rok", 8), [Line::TooLong, t("ok")]);
    }

    #[test]
    fn a_csv_record_keeps_a_line_end_inside_quotes_as_pythons_csv_does() {
        let csv = |bytes: &[u8]| -> Vec<Line> {
            CappedLines::csv(io::BufReader::with_capacity(4, bytes), 64)
                .map(|l| l.unwrap())
                .collect()
        };
        let t = |s: &str| Line::Text(s.into());
        assert_eq!(
            csv(b"a, \"x\r\ny\"\nb,\"\"\"\n\"\rc"),
            [t("a, \"x\r\ny\""), t("b,\"\"\"\n\""), t("c")]
        );
        // a quote past a field's start is a character, and one after a closing quote too
        assert_eq!(csv(b"a\"b\nc\n"), [t("a\"b"), t("c")]);
        assert_eq!(csv(b"\"a\"b\nc\n"), [t("\"a\"b"), t("c")]);
        // "" inside quotes is a quote: the field goes on over the line end
        assert_eq!(csv(b"\"a\"\"\nb\"\n"), [t("\"a\"\"\nb\"")]);
        // not a CSV: every line end is one, quotes or not
        assert_eq!(lines(b"\"a\nb\"\n", 8), [t("\"a"), t("b\"")]);
    }
}
