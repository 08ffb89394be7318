//! The probes' HTTP client (readiness, `/server_info`, the upstream `/metrics`) against the
//! replay server, which answers as a real SGLang does.
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::{fixture, free_port, replay_bin};
use sglang_probes::http::{get_body, get_status, Bearer, HttpUrl};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The replay server in a process group of its own: it starts workers (as SGLang does), and a
/// kill of the main process alone left them running after every test run.
struct Replay(std::process::Child);

impl Drop for Replay {
    fn drop(&mut self) {
        let group = i32::try_from(self.0.id()).unwrap();
        // SAFETY: kill(2) of the process group this test created
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn probes_read_health_guarded_paths_and_the_whole_metrics_document_from_sglang() {
    let port = free_port();
    let _server = Replay(
        Command::new(replay_bin())
            .args(["--port", &port.to_string(), "--speed", "1000"])
            .args(["--api-key", "k3y"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = HttpUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let health = base.with_path("/health");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let answer = get_status(&health, Duration::from_secs(3)).await;
        if let Ok(code) = answer {
            if seen.last() != Some(&code) {
                seen.push(code);
            }
            if code == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not healthy in 60 s: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen.last(), Some(&200));

    let info = base.with_path("/server_info");
    let (code, _) = get_body(&info, Duration::from_secs(3), 1 << 20)
        .await
        .unwrap();
    assert_eq!(code, 401, "/server_info is guarded by the API key");
    let keyed = HttpUrl {
        bearer: Some(Bearer("k3y".into())),
        ..info
    };
    let (code, body) = get_body(&keyed, Duration::from_secs(3), 4 << 20)
        .await
        .unwrap();
    assert_eq!(code, 200);
    let want = std::fs::read(fixture("B_decode_graph/server_info.json")).unwrap();
    assert_eq!(body, want);

    let (code, body) = get_body(
        &base.with_path("/metrics"),
        Duration::from_secs(3),
        16 << 20,
    )
    .await
    .unwrap();
    assert_eq!(code, 200);
    let want = std::fs::read(fixture("B_decode_graph/metrics.txt")).unwrap();
    assert_eq!(body, want, "the whole document, byte for byte");
}
