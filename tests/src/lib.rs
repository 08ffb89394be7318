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

/// POST `body` to `path` on `addr` (HOST:PORT), `Connection: close`, and time the answer.
pub fn post_timed(addr: &str, path: &str, body: &str) -> std::io::Result<Timed> {
    let mut s = TcpStream::connect(addr)?;
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
