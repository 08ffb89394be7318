//! Host names to addresses without tokio's resolver, which runs on tokio's blocking pool and
//! panics when the OS refuses that pool its first thread (at the limit on threads): an address
//! given as an IP is used as it is; a name is looked up on a thread of ours
//! ([`off_runtime`](crate::sync::off_runtime)), and the answer kept a second, so that a proxy
//! opening a connection per request does not start a thread per request.
use crate::sync::{lock, off_runtime};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a looked-up name's addresses are reused: short, so a name that moves is followed.
const KEEP: Duration = Duration::from_secs(1);
/// Names kept at once; past it the list starts again (a run names one or two).
const NAMES: usize = 16;

/// What a lookup gave: its addresses, or its error (kind and text), kept alike so that a name
/// that fails is not looked up again by every connection of the next second.
type Answer = Result<Vec<SocketAddr>, (io::ErrorKind, String)>;
type Found = HashMap<(String, u16), (Instant, Answer)>;
static FOUND: Mutex<Option<Found>> = Mutex::new(None);
/// One lookup at a time: connections that miss together wait for the first one's answer
/// instead of each starting a thread (a slow resolver would otherwise pile them up).
static LOOKING_UP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn kept(key: &(String, u16)) -> Option<Answer> {
    lock(&FOUND)
        .as_ref()
        .and_then(|f| f.get(key))
        .filter(|(at, _)| at.elapsed() < KEEP)
        .map(|(_, answer)| answer.clone())
}

/// The addresses of `host` (a name, an IP, or an IPv6 address in brackets) at `port`.
pub async fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let key = (bare.to_string(), port);
    let answer = match kept(&key) {
        Some(a) => a,
        None => {
            let _one = LOOKING_UP.lock().await;
            // Another connection may have looked it up while this one waited.
            match kept(&key) {
                Some(a) => a,
                None => remember(key, look_up(bare, port).await),
            }
        }
    };
    answer.map_err(|(kind, text)| io::Error::new(kind, text))
}

/// Keep `answer` for `key` (a second) and give it back.
fn remember(key: (String, u16), answer: Answer) -> Answer {
    let mut found = lock(&FOUND);
    let map = found.get_or_insert_with(HashMap::new);
    if map.len() >= NAMES {
        map.clear();
    }
    map.insert(key, (Instant::now(), answer.clone()));
    answer
}

async fn look_up(host: &str, port: u16) -> Answer {
    let name = (host.to_string(), port);
    let found = off_runtime(move || name.to_socket_addrs().map(Iterator::collect::<Vec<_>>))
        .await
        .unwrap_or_else(|| Err(io::Error::other("looking the name up panicked")));
    match found {
        Ok(addrs) if addrs.is_empty() => Err((
            io::ErrorKind::NotFound,
            format!("{host}: the name has no address"),
        )),
        Ok(addrs) => Ok(addrs),
        Err(e) => Err((e.kind(), e.to_string())),
    }
}

/// The addresses of `host:port` (`[v6]:port` for IPv6), as [`resolve`] finds them.
pub async fn resolve_addr(addr: &str) -> io::Result<Vec<SocketAddr>> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr}: not host:port"),
            )
        })?;
    resolve(host, port).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_ip_is_used_as_it_is_and_a_name_is_looked_up_and_kept() {
        let v6 = resolve("[::1]", 80).await.unwrap();
        assert_eq!(v6, vec!["[::1]:80".parse().unwrap()]);
        assert_eq!(
            resolve_addr("127.0.0.1:30000").await.unwrap(),
            vec!["127.0.0.1:30000".parse().unwrap()]
        );
        let local = resolve_addr("localhost:30000").await.unwrap();
        assert!(
            local
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 30000),
            "{local:?}"
        );
        assert!(kept(&("localhost".to_string(), 30000)).is_some_and(|a| a.is_ok()));
        assert!(resolve_addr("localhost").await.is_err());
        let first = resolve("no-such-host.invalid", 1).await.unwrap_err();
        // A failure is kept too: the second answer is the first one's, looked up once.
        assert!(kept(&("no-such-host.invalid".to_string(), 1)).is_some_and(|a| a.is_err()));
        let again = resolve("no-such-host.invalid", 1).await.unwrap_err();
        assert_eq!(
            (first.kind(), first.to_string()),
            (again.kind(), again.to_string())
        );
    }
}
