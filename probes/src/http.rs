//! The HTTP client of the probes (readiness, health, `/server_info`, the upstream `/metrics`):
//! hyper's HTTP/1.1 client, over TCP or TLS (rustls, the system's trusted roots).
//!
//! One connection per request, no pool, no retry: a probe is one GET whose answer (or failure)
//! must be exactly what the server said at that moment, within its timeout.
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, CONNECTION, HOST, USER_AGENT};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid URL {url:?}: {why} (expected http[s]://HOST[:PORT][/path])")]
    BadUrl { url: String, why: &'static str },
    #[error("GET {url}: {source}")]
    Io { url: String, source: std::io::Error },
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("GET {url}: {source} (is an HTTP server listening there?)")]
    BadResponse { url: String, source: hyper::Error },
}

/// `http[s]://host:port/path` split into what a request needs, with the server's API key when it
/// has one (SGLang's `--api-key` guards every path but /health* and /metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    pub path: String,
    pub bearer: Option<Bearer>,
    /// `https://`: the request goes over TLS.
    pub tls: bool,
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
        let uri: hyper::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("only http:// and https:// are supported")),
        };
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "user:password@ is not supported (use the server's API key)",
            ));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        // `http::Uri` accepts an empty or out-of-range port as "none"; a typo must not become 80.
        let port = match authority.as_str().rsplit_once(':') {
            Some((_, p)) if !p.ends_with(']') => {
                p.parse().map_err(|_| bad("port is not a number 0-65535"))?
            }
            _ if tls => 443,
            _ => 80,
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        Ok(HttpUrl {
            host: host.to_string(),
            port,
            path: if path.is_empty() { "/" } else { path }.to_string(),
            bearer: None,
            tls,
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
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.base(), self.path)
    }
}

/// One `GET`, returning the status code. The body is not read: readiness needs only the status.
pub async fn get_status(url: &HttpUrl, timeout: Duration) -> Result<u16, ProbeError> {
    within(url, timeout, async {
        Ok(send(url, None, None).await?.status().as_u16())
    })
    .await
}

/// One `GET` with its body (up to `max_bytes`; the rest is not read), for small documents such
/// as an upstream `/metrics`. Any framing HTTP/1.1 has (length, chunked, until close).
pub async fn get_body(
    url: &HttpUrl,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), ProbeError> {
    within(url, timeout, async {
        read_body(send(url, Some("text/plain"), None).await?, max_bytes).await
    })
    .await
}

/// One `POST` of a JSON body (an admin call such as SGLang's `/start_profile`), with the server's
/// key when it has one: the status and the answer's body (up to `max_bytes`).
pub async fn post_json(
    url: &HttpUrl,
    json: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), ProbeError> {
    within(url, timeout, async {
        read_body(send(url, None, Some(json)).await?, max_bytes).await
    })
    .await
}

async fn read_body(
    response: hyper::Response<hyper::body::Incoming>,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), Failure> {
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut out = Vec::new();
    while out.len() < max_bytes {
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Some(data) = frame.map_err(Failure::Http)?.data_ref() {
            out.extend_from_slice(data);
        }
    }
    out.truncate(max_bytes);
    Ok((status, out))
}

enum Failure {
    Io(std::io::Error),
    Http(hyper::Error),
    BadTarget,
}

/// `work` under `timeout`, its failure told with the URL.
async fn within<T>(
    url: &HttpUrl,
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, ProbeError> {
    let text = url.to_string();
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r.map_err(|e| match e {
            Failure::Io(source) => ProbeError::Io { url: text, source },
            Failure::Http(source) => ProbeError::BadResponse { url: text, source },
            Failure::BadTarget => ProbeError::BadUrl {
                url: text,
                why: "the path is not a valid request target",
            },
        }),
        Err(_) => Err(ProbeError::Timeout { url: text, timeout }),
    }
}

/// Connect (TCP, then TLS for https) and send the one GET (a POST of `json` when given); the
/// response's head is in.
async fn send(
    url: &HttpUrl,
    accept: Option<&str>,
    json: Option<&str>,
) -> Result<hyper::Response<hyper::body::Incoming>, Failure> {
    let method = if json.is_some() {
        hyper::Method::POST
    } else {
        hyper::Method::GET
    };
    let mut request = Request::builder()
        .method(method)
        .uri(url.path.as_str())
        .header(HOST, format!("{}:{}", url.host, url.port))
        .header(USER_AGENT, "sglang-supervisor")
        .header(CONNECTION, "close");
    if let Some(accept) = accept {
        request = request.header(ACCEPT, accept);
    }
    if let Some(b) = &url.bearer {
        request = request.header(AUTHORIZATION, format!("Bearer {}", b.0));
    }
    if json.is_some() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let body = Full::new(Bytes::from(json.unwrap_or_default().to_string()));
    let request = request.body(body).map_err(|_| Failure::BadTarget)?;
    let host = url.host.trim_start_matches('[').trim_end_matches(']');
    let addrs = crate::resolve::resolve(host, url.port)
        .await
        .map_err(Failure::Io)?;
    let tcp = TcpStream::connect(&addrs[..]).await.map_err(Failure::Io)?;
    tcp.set_nodelay(true).map_err(Failure::Io)?;
    if url.tls {
        let stream = tls::connect(host, tcp).await.map_err(Failure::Io)?;
        exchange(stream, request).await
    } else {
        exchange(tcp, request).await
    }
}

#[cfg(not(feature = "https"))]
mod tls {
    pub async fn connect(
        _host: &str,
        _tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio::net::TcpStream> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this build has no https (cargo feature `https` of sglang-probes); use http://",
        ))
    }
}

async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(Failure::Http)?;
    // The connection's I/O runs beside us; it ends when the response (and its body) is dropped.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("probe connection: {e}");
        }
    });
    sender.send_request(request).await.map_err(Failure::Http)
}

#[cfg(feature = "https")]
mod tls {
    //! TLS for `https://` probes: rustls (ring), trusting the system's roots (and `SSL_CERT_FILE`
    //! / `SSL_CERT_DIR`, so a server with its own CA can be trusted without code).
    use std::io;
    use std::sync::{Arc, OnceLock};
    use tokio::net::TcpStream;
    use tokio_rustls::rustls::{self, pki_types::ServerName};

    fn config() -> Arc<rustls::ClientConfig> {
        static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
        CONFIG
            .get_or_init(|| {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::debug!("trusted certificates: {e}");
                }
                let (added, _ignored) = roots.add_parsable_certificates(found.certs);
                tracing::debug!("{added} trusted certificates for https probes");
                let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(roots).with_no_client_auth());
                // ring supports every safe default protocol version: this does not fail.
                Arc::new(config.unwrap_or_else(|e| {
                    tracing::error!("TLS configuration: {e}");
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth()
                }))
            })
            .clone()
    }

    pub async fn connect(
        host: &str,
        tcp: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        tokio_rustls::TlsConnector::from(config())
            .connect(name, tcp)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn parses_urls_with_and_without_path_and_port() {
        let u = HttpUrl::parse("http://127.0.0.1:30000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str(), u.tls),
            ("127.0.0.1", 30000, "/", false)
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
        let u = HttpUrl::parse("https://gpu-node/v1/models?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str(), u.tls),
            ("gpu-node", 443, "/v1/models?x=1", true)
        );
        assert_eq!(u.to_string(), "https://gpu-node:443/v1/models?x=1");
        for bad in [
            "ftp://x",
            "x:80",
            "http://x:notaport/",
            "http://x:99999/",
            "http://x:/",
            "http://u:p@x/",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }

    /// A one-shot server: reads the request, answers `response`, closes; returns the URL and what
    /// it was sent.
    async fn answer_once(response: &'static [u8]) -> (HttpUrl, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut b = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut b).await.unwrap();
                assert!(n > 0, "request ended early");
                request.extend_from_slice(&b[..n]);
            }
            let _ = s.write_all(response).await;
            let _ = s.shutdown().await;
            String::from_utf8(request).unwrap()
        });
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/health")).unwrap();
        (url, got)
    }

    #[tokio::test]
    async fn get_status_reads_the_status_and_sends_the_key() {
        let (url, got) =
            answer_once(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n").await;
        let url = HttpUrl {
            bearer: Some(Bearer("s3cret".into())),
            ..url
        };
        assert_eq!(get_status(&url, Duration::from_secs(2)).await.unwrap(), 503);
        let request = got.await.unwrap().to_ascii_lowercase();
        assert!(request.starts_with("get /health http/1.1\r\n"), "{request}");
        assert!(
            request.contains("authorization: bearer s3cret\r\n"),
            "{request}"
        );
        assert!(request.contains(&format!("host: 127.0.0.1:{}\r\n", url.port)));
    }

    #[tokio::test]
    async fn chunked_bodies_are_reassembled() {
        let (url, _) = answer_once(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        )
        .await;
        let (status, body) = get_body(&url, Duration::from_secs(2), 1 << 20)
            .await
            .unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"hello world"[..]));
    }

    #[tokio::test]
    async fn a_body_until_close_is_read_and_cut_at_the_limit() {
        let (url, _) = answer_once(b"HTTP/1.0 200 OK\r\n\r\n0123456789").await;
        let (_, body) = get_body(&url, Duration::from_secs(2), 1 << 20)
            .await
            .unwrap();
        assert_eq!(body, b"0123456789");
        let (url, _) =
            answer_once(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789").await;
        let (_, body) = get_body(&url, Duration::from_secs(2), 4).await.unwrap();
        assert_eq!(body, b"0123");
    }

    #[tokio::test]
    async fn a_chunked_body_cut_short_is_an_error_not_a_short_document() {
        let (url, _) =
            answer_once(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel").await;
        assert!(matches!(
            get_body(&url, Duration::from_secs(2), 1 << 20).await,
            Err(ProbeError::BadResponse { .. })
        ));
    }

    #[tokio::test]
    async fn something_that_is_not_http_is_a_bad_response() {
        let (url, _) = answer_once(b"SSH-2.0-OpenSSH_9.2\r\n\r\n").await;
        let e = get_status(&url, Duration::from_secs(2)).await.unwrap_err();
        assert!(matches!(e, ProbeError::BadResponse { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_silent_server_is_a_timeout_at_the_given_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = HttpUrl::parse(&format!(
            "http://127.0.0.1:{}/",
            listener.local_addr().unwrap().port()
        ))
        .unwrap();
        let t = std::time::Instant::now();
        let e = get_status(&url, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, ProbeError::Timeout { .. }), "{e}");
        assert!((0.29..1.0).contains(&t.elapsed().as_secs_f64()));
        drop(listener);
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

    #[cfg(feature = "https")]
    #[tokio::test]
    async fn https_to_a_plain_http_server_fails_with_the_tls_error() {
        trust_test_ca();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // What an HTTP server answers to a TLS hello.
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        let url = HttpUrl::parse(&format!("https://localhost:{port}/")).unwrap();
        let e = get_status(&url, Duration::from_secs(2)).await.unwrap_err();
        assert!(matches!(e, ProbeError::Io { .. }), "{e}");
    }

    /// A TLS server configuration with a certificate for `localhost` from its own CA, which the
    /// probes trust through `SSL_CERT_FILE` (as a user with a private CA would). Set before any
    /// test builds the client's TLS configuration.
    #[cfg(feature = "https")]
    fn trust_test_ca() -> std::sync::Arc<tokio_rustls::rustls::ServerConfig> {
        use tokio_rustls::rustls;
        static SERVER: std::sync::OnceLock<std::sync::Arc<rustls::ServerConfig>> =
            std::sync::OnceLock::new();
        SERVER
            .get_or_init(|| {
                let ca_key = rcgen::KeyPair::generate().unwrap();
                let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
                ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                let ca = ca.self_signed(&ca_key).unwrap();
                let key = rcgen::KeyPair::generate().unwrap();
                let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
                    .unwrap()
                    .signed_by(&key, &ca, &ca_key)
                    .unwrap();
                let pem =
                    std::env::temp_dir().join(format!("probes-test-ca-{}.pem", std::process::id()));
                std::fs::write(&pem, ca.pem()).unwrap();
                std::env::set_var("SSL_CERT_FILE", &pem);
                let server = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![leaf.der().clone()],
                    rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
                )
                .unwrap();
                std::sync::Arc::new(server)
            })
            .clone()
    }

    #[cfg(feature = "https")]
    #[tokio::test]
    async fn https_reads_status_and_body_from_a_tls_server_with_a_trusted_ca() {
        let acceptor = tokio_rustls::TlsAcceptor::from(trust_test_ca());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
                    .await;
                let _ = s.shutdown().await;
            }
        });
        let url = HttpUrl::parse(&format!("https://localhost:{port}/metrics")).unwrap();
        let (status, body) = get_body(&url, Duration::from_secs(5), 1024).await.unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));
        assert_eq!(get_status(&url, Duration::from_secs(5)).await.unwrap(), 200);
        // A name the certificate does not have is refused.
        let wrong = HttpUrl::parse(&format!("https://127.0.0.1:{port}/")).unwrap();
        let e = get_status(&wrong, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, ProbeError::Io { .. }), "{e}");
    }
}
