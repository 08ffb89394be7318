//! Who holds a TCP port: named in the one-line error (or warning) when a listener cannot bind,
//! so "address in use" says "held by dcgm-exporter (pid 812)". Two /proc reads, only on that
//! failure path; a whole crate (procfs) for them would cost more than it saves.
use std::path::Path;

/// The program's name: `comm`, or the file name of its first argument when `comm` is cut at
/// the kernel's 15 characters ("sglang-supervis").
fn process_name(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let comm = comm.trim();
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|c| {
            let first = c.split(|&b| b == 0).next()?;
            let name = Path::new(std::str::from_utf8(first).ok()?).file_name()?;
            Some(name.to_string_lossy().into_owned())
        });
    match argv0 {
        Some(name) if comm.len() >= 15 && name.starts_with(comm) => name,
        _ => comm.to_string(),
    }
}

/// Who holds the port of `addr` (`HOST:PORT`), when binding it failed because it is in use.
pub fn holder_of(addr: &str, in_use: bool) -> Option<String> {
    let port = addr.rsplit(':').next().and_then(|p| p.parse().ok());
    port.filter(|_| in_use).and_then(holder)
}

/// `NAME (pid N)` of a process listening on `port` (TCP, IPv4 or IPv6, this network namespace),
/// or a sentence saying it is someone we cannot see; None when no listener is found.
pub fn holder(port: u16) -> Option<String> {
    let inodes: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let owner = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            owns_socket(&entry.path(), &inodes).then_some(pid)
        });
    Some(match owner {
        Some(pid) => {
            if pid == std::process::id() {
                // --metrics-addr and --proxy-addr given one port: not another process's doing
                format!("this supervisor itself (pid {pid}: --metrics-addr and --proxy-addr must differ)")
            } else {
                format!("{} (pid {pid})", process_name(pid))
            }
        }
        None => "a process this user cannot see".to_string(),
    })
}

/// Inodes of the sockets in LISTEN state (`0A`) on `port` in a /proc/net/tcp{,6} table.
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port && *f.get(3)? == "0A")
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

fn owns_socket(proc_dir: &Path, inodes: &[u64]) -> bool {
    let Ok(fds) = std::fs::read_dir(proc_dir.join("fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let t = target.to_string_lossy();
            t.strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|i| inodes.contains(&i))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_of_this_process_is_named_as_this_supervisor_itself() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let who = holder(port).unwrap();
        assert!(
            who.starts_with(&format!(
                "this supervisor itself (pid {}",
                std::process::id()
            )),
            "{who}"
        );
        drop(l);
        assert_eq!(holder(port), None);
    }

    #[test]
    fn only_listening_sockets_of_the_port_count() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:24C8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n\
   1: 0100007F:24C8 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n\
   2: 0100007F:24C9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0\n";
        assert_eq!(listening_inodes(table, 0x24C8), vec![111]);
        assert_eq!(
            listening_inodes("garbage\nnot a table", 1),
            Vec::<u64>::new()
        );
    }
}
