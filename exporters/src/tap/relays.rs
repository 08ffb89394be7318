//! With the tap on every interface, a relay on this machine that listens on the server's port
//! (docker-proxy publishing a container's port to clients here, a load balancer in front of
//! servers elsewhere) opens a connection of its own to the server for each of its clients':
//! both cross the tap, and the same request would be measured on each. The client's is the one
//! its benchmark sees. The relay's onward leg is known by its owner, read from `/proc`: a
//! connection from one of this machine's addresses to another host's, whose socket belongs to
//! a process that also listens on the port here. Where `/proc` does not show it (another PID
//! namespace, no right to read another user's descriptors), both legs are measured, as before.
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::tcp::End;
use crate::own_addresses::OwnAddresses;

/// A connection's client and server ends.
type Ends = (End, End);

/// The state `/proc/net/tcp` gives a listening socket.
const LISTEN: u8 = 0x0a;
/// How old the list of this machine's addresses may be (a container's bridge comes and goes).
const OWN_FOR: Duration = Duration::from_secs(10);

/// A relay's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Relay {
    pub pid: i32,
    pub name: String,
}

/// One socket of `/proc/net/tcp` or `tcp6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Socket {
    local: End,
    remote: End,
    state: u8,
    inode: u64,
}

/// What tells a relay's onward legs, for one port, and the first one found until said.
#[derive(Debug)]
pub(super) struct Relays {
    port: u16,
    proc: PathBuf,
    own: OwnAddresses,
    /// This network namespace's TCP sockets, and when they were read.
    sockets: Vec<Socket>,
    read_at: Option<Instant>,
    /// The listening sockets on the port as last read, and the processes holding them.
    listening: Vec<u64>,
    holders: Vec<i32>,
    untold: Option<(Ends, Relay)>,
    told: bool,
}

impl Relays {
    pub fn new(port: u16) -> Relays {
        Relays::reading(port, "/proc".into(), OwnAddresses::new(OWN_FOR))
    }

    fn reading(port: u16, proc: PathBuf, own: OwnAddresses) -> Relays {
        Relays {
            port,
            proc,
            own,
            sockets: Vec::new(),
            read_at: None,
            listening: Vec::new(),
            holders: Vec::new(),
            untold: None,
            told: false,
        }
    }

    /// Whether a connection whose first segment was taken at `at` is a relay's onward leg. Only
    /// a connection from this machine to another host is looked up; the sockets are read again
    /// where the last reading predates the segment (once for a burst of new connections).
    pub fn onward(&mut self, key: Ends, at: Instant) -> Option<Relay> {
        let (client, server) = (key.0.ip.to_canonical(), key.1.ip.to_canonical());
        let own = self.own.get(Instant::now());
        if !own.contains(&client) || own.contains(&server) {
            return None;
        }
        if self.read_at.is_none_or(|read| read < at) {
            // from when the reading began: a socket made while the kernel wrote the table
            // (thousands of lines take milliseconds) may be missing from it
            let began = Instant::now();
            self.sockets = read_sockets(&self.proc);
            self.read_at = Some(began);
        }
        let inode = self
            .sockets
            .iter()
            .find(|s| s.local == canonical(key.0) && s.remote == canonical(key.1))?
            .inode;
        let mut listening: Vec<u64> = self
            .sockets
            .iter()
            .filter(|s| s.state == LISTEN && s.local.port == self.port)
            .map(|s| s.inode)
            .collect();
        listening.sort_unstable();
        if listening != self.listening {
            self.holders = holders(&self.proc, &listening);
            self.listening = listening;
        }
        let pid = *self
            .holders
            .iter()
            .find(|&&pid| holding(&self.proc, pid, &[inode]))?;
        let name = fs::read_to_string(self.proc.join(format!("{pid}/comm")))
            .map(|n| n.trim().to_string())
            .unwrap_or_default();
        let relay = Relay { pid, name };
        if !self.told {
            self.untold.get_or_insert((key, relay.clone()));
        }
        Some(relay)
    }

    /// The line saying the first onward leg found, once.
    pub fn tell(&mut self) -> Option<String> {
        let ((client, server), relay) = self.untold.take()?;
        self.told = true;
        let port = self.port;
        Some(format!(
            "tap: the connection from {} to {} was not measured: it is the onward leg of a relay \
             here ({} {}, listening on port {port}), whose clients' connections are measured; \
             such legs are counted in tap_relayed_connections_total",
            std::net::SocketAddr::new(client.ip, client.port),
            std::net::SocketAddr::new(server.ip, server.port),
            relay.pid,
            relay.name
        ))
    }
}

fn canonical(e: End) -> End {
    End {
        ip: e.ip.to_canonical(),
        port: e.port,
    }
}

/// This network namespace's TCP sockets (none where they cannot be read).
fn read_sockets(proc: &Path) -> Vec<Socket> {
    ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|f| fs::read_to_string(proc.join(f)).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(parse_socket)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One line of `/proc/net/tcp(6)`: `sl local remote st tx:rx tr:when retrnsmt uid timeout
/// inode ...`, addresses in hex as the kernel holds them (32-bit words in this machine's byte
/// order), ports in hex.
fn parse_socket(line: &str) -> Option<Socket> {
    let mut f = line.split_whitespace();
    f.next()?;
    let local = parse_end(f.next()?)?;
    let remote = parse_end(f.next()?)?;
    let state = u8::from_str_radix(f.next()?, 16).ok()?;
    let inode = f.nth(5)?.parse().ok()?;
    Some(Socket {
        local,
        remote,
        state,
        inode,
    })
}

fn parse_end(s: &str) -> Option<End> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |k: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(8 * k..8 * k + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for k in 0..4 {
                b[4 * k..4 * k + 4].copy_from_slice(&word(k)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(End {
        ip: ip.to_canonical(),
        port,
    })
}

/// The processes holding one of `inodes` (a pass over every process's descriptors: made when
/// the listening sockets change).
fn holders(proc: &Path, inodes: &[u64]) -> Vec<i32> {
    if inodes.is_empty() {
        return Vec::new();
    }
    let Ok(dir) = fs::read_dir(proc) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| holding(proc, pid, inodes))
        .collect()
}

/// Whether process `pid` holds a socket of one of `inodes`.
fn holding(proc: &Path, pid: i32, inodes: &[u64]) -> bool {
    let Ok(fds) = fs::read_dir(proc.join(format!("{pid}/fd"))) else {
        return false;
    };
    fds.filter_map(|fd| fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .any(|inode: u64| inodes.contains(&inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_lines_are_read_in_this_machines_byte_order() {
        // 127.0.0.1:8000 listening; 10.1.2.3:40000 -> 172.17.0.2:8000, as this machine's kernel
        // writes them
        let hex = |ip: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(ip));
        let listen = format!(
            "   0: {}:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0",
            hex([127, 0, 0, 1])
        );
        let s = parse_socket(&listen).unwrap();
        assert_eq!(s.local.ip, IpAddr::from([127, 0, 0, 1]));
        assert_eq!((s.local.port, s.state, s.inode), (8000, LISTEN, 4242));
        let conn = format!(
            "   1: {}:9C40 {}:1F40 01 00000000:00000000 00:00000000 00000000  1000        0 777 1 0000000000000000 20 4 30 10 -1",
            hex([10, 1, 2, 3]),
            hex([172, 17, 0, 2])
        );
        let s = parse_socket(&conn).unwrap();
        assert_eq!(s.remote.ip, IpAddr::from([172, 17, 0, 2]));
        assert_eq!((s.local.port, s.remote.port, s.inode), (40000, 8000, 777));
        // IPv6, and IPv4 mapped into it (a dual-stack socket), read as IPv4
        let word = |w: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(w));
        let mapped = [[0; 4], [0; 4], [0, 0, 0xff, 0xff], [127, 0, 0, 1]]
            .map(word)
            .concat();
        let v6 = format!(
            "   2: {mapped}:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 100 0 0 10 0"
        );
        let s = parse_socket(&v6).unwrap();
        assert_eq!(s.local.ip, IpAddr::from([127, 0, 0, 1]));
        assert_eq!(s.inode, 99);
        for bad in ["", "  sl  local_address", "   0: 0100007F 00000000:0000 0A"] {
            assert_eq!(parse_socket(bad), None, "{bad:?}");
        }
    }

    fn connect(to: std::net::SocketAddr) -> (std::net::TcpStream, Ends) {
        let conn = std::net::TcpStream::connect(to).unwrap();
        let local = conn.local_addr().unwrap();
        let end = |a: std::net::SocketAddr| End {
            ip: a.ip(),
            port: a.port(),
        };
        (conn, (end(local), end(to)))
    }

    #[test]
    fn a_connection_from_here_to_elsewhere_by_a_process_listening_on_the_port_is_a_relays_leg() {
        // This test's process listens on a port and connects to it. To 127.0.0.1, one of this
        // machine's addresses: measured.
        let here = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (_c, key) = connect(here.local_addr().unwrap());
        let mut r = Relays::new(key.1.port);
        assert_eq!(r.onward(key, Instant::now()), None, "to this machine");
        // To 127.0.0.2, on no interface's list (as a container's address is not): its socket
        // is found, held by this process, which listens on the port: a relay's leg.
        let elsewhere = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let (_c, key) = connect(elsewhere.local_addr().unwrap());
        let mut r = Relays::new(key.1.port);
        let relay = r.onward(key, Instant::now()).unwrap();
        assert_eq!(relay.pid, std::process::id() as i32);
        let (from, to) = (key.0, key.1);
        assert!(r.tell().is_some_and(|l| l.contains(&format!(
            "from {}:{} to 127.0.0.2:{} was not measured",
            from.ip, from.port, to.port
        ))));
        assert_eq!(r.tell(), None, "said once");
        // Not listening on the port: no relay.
        let mut r = Relays::new(key.1.port.wrapping_add(1));
        assert_eq!(r.onward(key, Instant::now()), None);
        // A connection not in the table (closed, or never here) is none.
        let gone = (End { port: 1, ..from }, to);
        let mut r = Relays::new(key.1.port);
        assert_eq!(r.onward(gone, Instant::now()), None);
    }
}
