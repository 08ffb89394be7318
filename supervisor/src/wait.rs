//! `wait`: for recipes that keep their own launch. Follows a supervisor's `--events` file, or
//! polls a server's URL, until the server is ready (exit 0), failed (non-zero, the diagnosis on
//! stderr) or the timeout passed (124).
use crate::cli::WaitArgs;
use anyhow::{Context, Result};
use serde_json::Value;
use sglang_probes::http::{get_status, HttpUrl};
use std::io::{BufRead, Seek, SeekFrom};
use std::time::{Duration, Instant};

pub const EXIT_TIMEOUT: i32 = 124;

pub async fn run(args: &WaitArgs) -> Result<i32> {
    let deadline = Instant::now() + args.timeout;
    if let Some(path) = &args.events {
        return follow_events(path, deadline).await;
    }
    let Some(url) = &args.url else {
        anyhow::bail!("give --events FILE or --url URL")
    };
    let base = HttpUrl::parse(url).with_context(|| format!("--url {url:?}"))?;
    while Instant::now() < deadline {
        // `/ready` (0.5.20+) is cheap; older servers answer 404 there and get `/health`.
        let ready = match get_status(&base.with_path("/ready"), Duration::from_secs(3)).await {
            Ok(200) => true,
            Ok(404) => matches!(
                get_status(&base.with_path("/health"), Duration::from_secs(3)).await,
                Ok(200)
            ),
            _ => false,
        };
        if ready {
            eprintln!("ready: {}", base.base());
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "not ready within {}: {}",
        humantime::format_duration(args.timeout),
        base.base()
    );
    Ok(EXIT_TIMEOUT)
}

/// Read new lines of the events file as they come; the file may not exist yet.
async fn follow_events(path: &std::path::Path, deadline: Instant) -> Result<i32> {
    let mut offset = 0u64;
    let mut partial = String::new();
    let mut fatal: Option<String> = None;
    while Instant::now() < deadline {
        if let Ok(mut f) = std::fs::File::open(path) {
            f.seek(SeekFrom::Start(offset))
                .with_context(|| format!("reading {}", path.display()))?;
            let mut reader = std::io::BufReader::new(f);
            loop {
                let mut line = String::new();
                let n = reader
                    .read_line(&mut line)
                    .with_context(|| format!("reading {}", path.display()))?;
                if n == 0 {
                    break;
                }
                offset += n as u64;
                partial.push_str(&line);
                if !partial.ends_with('\n') {
                    continue; // the writer is mid-line: finish it next round
                }
                let ev: Value = match serde_json::from_str(partial.trim()) {
                    Ok(v) => v,
                    Err(_) => {
                        partial.clear();
                        continue;
                    }
                };
                partial.clear();
                match ev["event"].as_str() {
                    Some("ready") => {
                        eprintln!(
                            "ready after {} s: {}",
                            ev["elapsed_s"],
                            ev["url"].as_str().unwrap_or("")
                        );
                        return Ok(0);
                    }
                    Some("fatal") if fatal.is_none() => {
                        fatal = Some(format!(
                            "{}: {}",
                            ev["reason"].as_str().unwrap_or("fatal"),
                            ev["excerpt"].as_str().unwrap_or("")
                        ));
                    }
                    Some("exited") => {
                        eprintln!(
                            "the server exited before it was ready: {}",
                            fatal.as_deref().unwrap_or("no diagnosis in the events")
                        );
                        let status = ev["exit_status"].as_i64().unwrap_or(1) as i32;
                        return Ok(if status == 0 { 1 } else { status });
                    }
                    _ => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "not ready before the timeout ({}){}",
        path.display(),
        fatal.map(|f| format!("; {f}")).unwrap_or_default()
    );
    Ok(EXIT_TIMEOUT)
}
