//! The reference hop for the proxy's acceptance on a real server (scripts/gpu/proxy_acceptance.sh):
//! forwards every connection's bytes both ways unchanged and reads nothing, one blocking thread per
//! direction. What a run through it loses against a direct one is the cost of any extra hop; what
//! the proxy loses beyond that is the proxy's own.
//! usage: tcp-relay LISTEN_ADDR UPSTREAM_ADDR
use std::net::{Shutdown, TcpListener, TcpStream};

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

fn relay(client: TcpStream, upstream: &str) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    std::thread::spawn(move || pipe(c2, s2));
    std::thread::spawn(move || pipe(server, client));
    Ok(())
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 3 {
        eprintln!("usage: tcp-relay LISTEN_ADDR UPSTREAM_ADDR");
        std::process::exit(2);
    }
    let listener = match TcpListener::bind(&a[1]) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tcp-relay: cannot listen on {}: {e}", a[1]);
            std::process::exit(1);
        }
    };
    for conn in listener.incoming().flatten() {
        if let Err(e) = relay(conn, &a[2]) {
            eprintln!("tcp-relay: upstream {}: {e}", a[2]);
        }
    }
}
