//! Test-side helpers shared by the integration tests and the benchmark programs: a plain HTTP/1.1
//! client that times a streamed response the way bench_serving does.
#![allow(clippy::disallowed_methods)]
pub mod fuzzing;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A timed response.
pub struct Timed {
    pub status: String,
    pub body: String,
    /// From the request being written to the first bytes carrying generated text (" tok").
    pub first_text: Option<Duration>,
    /// From the request being written to the last byte.
    pub total: Duration,
}

/// HTTP/1.1 chunked transfer coding taken off incrementally: the head, then each chunk's size
/// line, its data, and the CRLF after it.
#[derive(Default)]
pub struct Dechunk {
    /// Bytes of the size line (or of the head) seen so far.
    line: Vec<u8>,
    in_body: bool,
    /// Data bytes left in the current chunk, then 2 for its CRLF.
    left: usize,
    crlf: usize,
}

impl Dechunk {
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                out.extend_from_slice(&data[..n]);
                self.left -= n;
                data = &data[n..];
                if self.left == 0 {
                    self.crlf = 2;
                }
            } else if self.crlf > 0 {
                let n = self.crlf.min(data.len());
                self.crlf -= n;
                data = &data[n..];
            } else {
                let b = data[0];
                data = &data[1..];
                self.line.push(b);
                if !self.in_body {
                    if self.line.ends_with(b"\r\n\r\n") {
                        self.in_body = true;
                        self.line.clear();
                    }
                } else if self.line.ends_with(b"\r\n") {
                    let size = std::str::from_utf8(&self.line[..self.line.len() - 2])
                        .ok()
                        .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
                        .unwrap_or(0);
                    self.left = size;
                    self.line.clear();
                }
            }
        }
    }
}

/// A whole chunked body (after the head) with the framing taken off: what a client reads.
pub fn dechunked(body: &[u8]) -> Vec<u8> {
    let mut d = Dechunk {
        in_body: true,
        ..Dechunk::default()
    };
    let mut out = Vec::with_capacity(body.len());
    d.feed(body, &mut out);
    out
}

/// POST `body` to `path` on `addr` (HOST:PORT), `Connection: close`, and time the answer.
pub fn post_timed(addr: &str, path: &str, body: &str) -> std::io::Result<Timed> {
    post_on(TcpStream::connect(addr)?, path, body)
}

/// [`post_timed`] on a connection the caller opened (and set up).
pub fn post_on(mut s: TcpStream, path: &str, body: &str) -> std::io::Result<Timed> {
    s.set_nodelay(true)?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let t0 = Instant::now();
    s.write_all(req.as_bytes())?;
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    let mut first_text = None;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        if first_text.is_none() && memfind(&all, b" tok") {
            first_text = Some(t0.elapsed());
        }
    }
    let total = t0.elapsed();
    let text = String::from_utf8_lossy(&all).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok(Timed {
        status: head.lines().next().unwrap_or("").to_string(),
        body: body.to_string(),
        first_text,
        total,
    })
}

fn memfind(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// utime + stime, in clock ticks, from the text of a `/proc/PID/stat` (or a thread's
/// `/proc/PID/task/TID/stat`): the 14th and 15th fields, counted after the parenthesised name.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The median of a sample (0 for none).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One HTTP/1.1 request with an empty body (`Connection: close`): (status line, body).
pub fn http(addr: &str, method: &str, path: &str, headers: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n{headers}\r\n");
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
    let mut b = String::new();
    s.read_to_string(&mut b)
        .unwrap_or_else(|e| panic!("reading from {addr}: {e}"));
    let (head, body) = b.split_once("\r\n\r\n").unwrap_or((&b, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}
