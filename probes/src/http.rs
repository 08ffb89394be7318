//! A deliberately tiny HTTP/1.1 client for readiness and health probes.
//!
//! Why not a full client: a probe needs one GET and a status code, over loopback, within
//! milliseconds of the ready line. A hand-written request avoids connection-pool state and keeps
//! the readiness path free of anything that could retry or buffer behind our back.
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid URL {url:?}: {why} (expected http://HOST:PORT[/path])")]
    BadUrl { url: String, why: &'static str },
    #[error("GET {url}: {source}")]
    Io { url: String, source: std::io::Error },
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("GET {url}: malformed HTTP status line {line:?}")]
    BadResponse { url: String, line: String },
}

/// `http://host:port/path` split into what a request needs, with the server's API key when it
/// has one (SGLang's `--api-key` guards every path but /health* and /metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    pub path: String,
    pub bearer: Option<Bearer>,
}

/// A secret sent as `Authorization: Bearer ...`; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Bearer(pub String);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

impl HttpUrl {
    pub fn parse(url: &str) -> Result<Self, ProbeError> {
        let bad = |why| ProbeError::BadUrl {
            url: url.to_string(),
            why,
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// is supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6.find(']').ok_or_else(|| bad("unclosed [ in IPv6 host"))?;
            let port = v6[end + 1..].strip_prefix(':').unwrap_or("80");
            (format!("[{}]", &v6[..end]), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (authority.to_string(), "80"),
            }
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let port = port
            .parse()
            .map_err(|_| bad("port is not a number 0-65535"))?;
        Ok(HttpUrl {
            host,
            port,
            path: path.to_string(),
            bearer: None,
        })
    }

    /// The same server with another path.
    pub fn with_path(&self, path: &str) -> Self {
        HttpUrl {
            path: path.to_string(),
            ..self.clone()
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}:{}{}", self.host, self.port, self.path)
    }
}

/// One `GET`, returning the status code. The body is not read: readiness needs only the status.
pub async fn get_status(url: &HttpUrl, timeout: Duration) -> Result<u16, ProbeError> {
    let text = url.to_string();
    match tokio::time::timeout(timeout, get_status_inner(url)).await {
        Ok(r) => r.map_err(|e| match e {
            Inner::Io(source) => ProbeError::Io { url: text, source },
            Inner::Bad(line) => ProbeError::BadResponse { url: text, line },
        }),
        Err(_) => Err(ProbeError::Timeout { url: text, timeout }),
    }
}

/// The one GET every probe sends, with the server's key when it has one.
fn get_request(url: &HttpUrl, extra_headers: &str) -> String {
    let auth = url
        .bearer
        .as_ref()
        .map(|b| format!("Authorization: Bearer {}\r\n", b.0))
        .unwrap_or_default();
    format!(
        "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: sglang-supervisor\r\n{extra_headers}{auth}Connection: close\r\n\r\n",
        url.path, url.host, url.port
    )
}

enum Inner {
    Io(std::io::Error),
    Bad(String),
}

async fn get_status_inner(url: &HttpUrl) -> Result<u16, Inner> {
    let host = url.host.trim_start_matches('[').trim_end_matches(']');
    let mut stream = TcpStream::connect((host, url.port))
        .await
        .map_err(Inner::Io)?;
    stream.set_nodelay(true).map_err(Inner::Io)?;
    stream
        .write_all(get_request(url, "").as_bytes())
        .await
        .map_err(Inner::Io)?;
    // The status line fits in the first read in practice; keep reading until it is complete.
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await.map_err(Inner::Io)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.contains(&b'\n') || buf.len() > 4096 {
            break;
        }
    }
    parse_status_line(&buf).ok_or_else(|| {
        let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
        Inner::Bad(String::from_utf8_lossy(line).into_owned())
    })
}

/// One `GET` with its body (up to `max_bytes`), for small documents such as an upstream `/metrics`.
/// Handles `Content-Length`, chunked and read-to-close bodies.
pub async fn get_body(
    url: &HttpUrl,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), ProbeError> {
    exchange(
        url,
        get_request(url, "Accept: text/plain\r\n"),
        timeout,
        max_bytes,
    )
    .await
}

/// One `POST` of a JSON body (an admin call such as SGLang's `/start_profile`), with the server's
/// key when it has one; the status and the answer's body (up to `max_bytes`).
pub async fn post_json(
    url: &HttpUrl,
    json: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), ProbeError> {
    let auth = url
        .bearer
        .as_ref()
        .map(|b| format!("Authorization: Bearer {}\r\n", b.0))
        .unwrap_or_default();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: sglang-supervisor\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}Connection: close\r\n\r\n{json}",
        url.path,
        url.host,
        url.port,
        json.len()
    );
    exchange(url, request, timeout, max_bytes).await
}

/// Send `request`, read the whole answer (to close), split status and body.
async fn exchange(
    url: &HttpUrl,
    request: String,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), ProbeError> {
    let text = url.to_string();
    let fut = async {
        let host = url.host.trim_start_matches('[').trim_end_matches(']');
        let mut stream = TcpStream::connect((host, url.port))
            .await
            .map_err(Inner::Io)?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(Inner::Io)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut chunk).await.map_err(Inner::Io)?;
            if n == 0 || buf.len() > max_bytes + 64 * 1024 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let status = parse_status_line(&buf).ok_or_else(|| {
            Inner::Bad(String::from_utf8_lossy(&buf[..buf.len().min(80)]).into_owned())
        })?;
        let head_end = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| Inner::Bad("no end of headers".into()))?;
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let mut body = buf.split_off(head_end + 4);
        if head.contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        body.truncate(max_bytes);
        Ok((status, body))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map_err(|e| match e {
            Inner::Io(source) => ProbeError::Io { url: text, source },
            Inner::Bad(line) => ProbeError::BadResponse { url: text, line },
        }),
        Err(_) => Err(ProbeError::Timeout { url: text, timeout }),
    }
}

/// Undo HTTP/1.1 chunked transfer coding (whatever is malformed ends the body).
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let Ok(size) = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

fn parse_status_line(buf: &[u8]) -> Option<u16> {
    let line = buf.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_with_and_without_path_and_port() {
        let u = HttpUrl::parse("http://127.0.0.1:30000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 30000, "/")
        );
        let u = HttpUrl::parse("http://localhost/health").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("localhost", 80, "/health")
        );
        let u = HttpUrl::parse("http://[::1]:8080/ready").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("[::1]", 8080, "/ready")
        );
        assert!(HttpUrl::parse("https://x").is_err());
        assert!(HttpUrl::parse("http://x:notaport/").is_err());
    }

    #[test]
    fn status_line_parsing_rejects_garbage() {
        assert_eq!(parse_status_line(b"HTTP/1.1 404 Not Found\r\n"), Some(404));
        assert_eq!(parse_status_line(b"HTTP/1.0 200\r\n"), Some(200));
        assert_eq!(parse_status_line(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(parse_status_line(b""), None);
    }

    #[tokio::test]
    async fn get_status_reads_the_status_from_a_real_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b).await.unwrap();
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
        });
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/health")).unwrap();
        assert_eq!(get_status(&url, Duration::from_secs(2)).await.unwrap(), 503);
    }

    #[test]
    fn chunked_bodies_are_reassembled() {
        assert_eq!(
            dechunk(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            b"hello world"
        );
        assert_eq!(dechunk(b"zz\r\n"), b"");
    }

    #[tokio::test]
    async fn get_status_refused_connection_is_an_io_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        assert!(matches!(
            get_status(&url, Duration::from_secs(2)).await,
            Err(ProbeError::Io { .. })
        ));
    }
}
