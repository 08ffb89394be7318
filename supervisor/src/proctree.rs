//! The process table as *our* PID namespace numbers it, and which of its processes belong to the
//! server's tree. Teardown and the sentinel both ask here, so they agree on what "the tree" is.
//!
//! A process belongs to the tree if it descends from the root (we are a subreaper, so setsid'd
//! grandchildren still do), is in the server's process group, carries this run's marker variable
//! in its environment (every process we start gets it, and children inherit it even after the
//! supervisor died and they were re-parented away), was seen in the tree before (same pid *and*
//! start time), or descends from any of those.
//!
//! Inside a PID namespace whose /proc is the host's (`unshare -p -f` without remounting /proc),
//! /proc numbers processes differently from kill(2): there every process is translated through
//! its `NSpid` line, and processes of other namespaces are not seen at all.
use memchr::memmem;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// One process, in our namespace's numbers.
#[derive(Debug, Clone, Copy)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub state: u8,
    /// Clock ticks since boot at its start: a pid with another start time is another process.
    pub start: u64,
    /// Its name (`comm`: the executable's name, at most 15 bytes).
    pub comm: Comm,
    /// CPU time so far, user and system, in clock ticks.
    pub cpu_ticks: u64,
    /// Its directory name in /proc (differs from `pid` under a foreign /proc).
    proc_pid: i32,
}

impl Proc {
    /// Not yet a plain zombie: running, or a zombie thread-group leader whose other threads
    /// still run (a GPU process tearing down its CUDA context, seen on a real H200).
    pub fn is_running(&self) -> bool {
        if self.state == b'Z' || self.state == b'X' {
            return std::fs::read_dir(format!("/proc/{}/task", self.proc_pid))
                .map_or(0, |d| d.count())
                > 1;
        }
        true
    }

    fn environ_has(&self, entry: &[u8]) -> bool {
        let Ok(env) = std::fs::read(format!("/proc/{}/environ", self.proc_pid)) else {
            return false;
        };
        // Entries are NUL-terminated: match a whole entry, not a suffix of another.
        env.starts_with(entry)
            || memmem::find_iter(&env, entry).any(|i| i > 0 && env.get(i - 1) == Some(&0))
    }
}

/// A process's `comm`, kept inline so that [`Proc`] stays `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 16],
    len: u8,
}

impl Comm {
    fn new(b: &[u8]) -> Comm {
        let mut bytes = [0u8; 16];
        let len = b.len().min(bytes.len());
        bytes[..len].copy_from_slice(&b[..len]);
        Comm {
            bytes,
            len: len as u8,
        }
    }

    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes[..usize::from(self.len)])
    }
}

/// How /proc relates to our PID namespace, found once.
enum View {
    /// /proc is our namespace's: its numbers are ours.
    Own,
    /// /proc belongs to an ancestor namespace: our pid is entry `depth - 1` of each `NSpid`, for
    /// processes in our namespace (`ns` is its /proc/self/ns/pid link).
    Foreign {
        depth: usize,
        ns: std::path::PathBuf,
    },
}

fn view() -> &'static View {
    static V: OnceLock<View> = OnceLock::new();
    V.get_or_init(|| {
        let me = nix::unistd::getpid().as_raw();
        let proc_self = std::fs::read_link("/proc/self")
            .ok()
            .and_then(|p| p.to_str()?.parse::<i32>().ok());
        if proc_self == Some(me) {
            return View::Own;
        }
        let depth = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| status_ids(&s, "NSpid:").map(|v| v.len()))
            .unwrap_or(1);
        let ns = std::fs::read_link("/proc/self/ns/pid").unwrap_or_default();
        tracing::debug!(
            depth,
            "/proc belongs to another PID namespace: translating its pids"
        );
        View::Foreign { depth, ns }
    })
}

/// Every process we can see, keyed by our pid.
pub struct Table {
    procs: HashMap<i32, Proc>,
}

impl Table {
    pub fn read() -> Table {
        let dirs: Vec<i32> = std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let procs = match view() {
            View::Own => dirs
                .into_iter()
                .filter_map(|p| {
                    let s = read_stat(p)?;
                    Some((
                        p,
                        Proc {
                            pid: p,
                            ppid: s.ppid,
                            pgid: s.pgid,
                            state: s.state,
                            start: s.start,
                            comm: s.comm,
                            cpu_ticks: s.cpu_ticks,
                            proc_pid: p,
                        },
                    ))
                })
                .collect(),
            View::Foreign { depth, ns } => foreign_table(dirs, *depth, ns),
        };
        Table { procs }
    }

    pub fn get(&self, pid: i32) -> Option<&Proc> {
        self.procs.get(&pid)
    }

    /// The tree's members (see the module comment), without `exclude`, the root, and us.
    pub fn members(&self, t: &Tree<'_>) -> Vec<Proc> {
        let me = nix::unistd::getpid().as_raw();
        let skip = |p: i32| p == me || Some(p) == t.root || t.exclude.contains(&p);
        let known: HashMap<i32, u64> = t.known.iter().copied().collect();
        let marker = t.marker.map(|m| format!("{m}=1\0").into_bytes());
        let mut seeds: HashSet<i32> = self
            .procs
            .values()
            .filter(|p| {
                !skip(p.pid)
                    && (t.pgid.is_some_and(|g| g > 1 && p.pgid == g)
                        || known.get(&p.pid) == Some(&p.start)
                        || marker.as_deref().is_some_and(|m| p.environ_has(m)))
            })
            .map(|p| p.pid)
            .collect();
        seeds.extend(t.root);
        let mut out: Vec<Proc> = self
            .procs
            .values()
            .filter(|p| !skip(p.pid) && (seeds.contains(&p.pid) || self.descends(p, &seeds)))
            .copied()
            .collect();
        out.sort_unstable_by_key(|p| p.pid);
        out
    }

    fn descends(&self, p: &Proc, from: &HashSet<i32>) -> bool {
        let mut seen = HashSet::new();
        let mut q = p.ppid;
        // Up the parent chain to 0: the root may be PID 1 (we run as init).
        while q > 0 && seen.insert(q) {
            if from.contains(&q) {
                return true;
            }
            q = self.procs.get(&q).map_or(0, |s| s.ppid);
        }
        false
    }
}

/// What identifies the tree.
#[derive(Default)]
pub struct Tree<'a> {
    /// Descendants of this process belong (it is excluded itself).
    pub root: Option<i32>,
    pub pgid: Option<i32>,
    /// The marker variable's name (`NAME=1` in the environment).
    pub marker: Option<&'a str>,
    /// (pid, start time) of processes seen in the tree before.
    pub known: &'a [(i32, u64)],
    pub exclude: &'a [i32],
}

/// This run's marker variable: unique per supervisor process (pid and start time).
pub fn marker() -> &'static str {
    static M: OnceLock<String> = OnceLock::new();
    M.get_or_init(|| {
        let me = std::process::id();
        let start = read_stat(
            std::fs::read_link("/proc/self")
                .ok()
                .and_then(|p| p.to_str()?.parse().ok())
                .unwrap_or(me as i32),
        )
        .map_or(0, |s| s.start);
        format!("SGLANG_SUPERVISOR_TREE_{me}_{start}")
    })
}

struct Stat {
    ppid: i32,
    pgid: i32,
    state: u8,
    start: u64,
    comm: Comm,
    cpu_ticks: u64,
}

fn read_stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // comm is in parentheses and may contain anything: the fields follow the *last* ')'.
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(text.get(close + 2..)?).ok()?;
    let f: Vec<&str> = rest.split(' ').collect();
    // Fields 3.. of proc(5): state, ppid, pgrp, ..., utime 14, stime 15, starttime 22.
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        state: f.first()?.bytes().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        start: n(22)?,
        comm: Comm::new(text.get(open + 1..close)?),
        cpu_ticks: n(14)? + n(15)?,
    })
}

/// The ids on a `NSpid:`/`NSpgid:` line of /proc/PID/status, outermost namespace first.
fn status_ids(status: &str, key: &str) -> Option<Vec<i32>> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect()
}

fn foreign_table(dirs: Vec<i32>, depth: usize, ns: &std::path::Path) -> HashMap<i32, Proc> {
    // First pass: who is in our namespace, and their pids in it.
    let mut ours: HashMap<i32, (i32, i32, Stat)> = HashMap::new(); // proc pid -> (pid, pgid, stat)
    for p in dirs {
        if std::fs::read_link(format!("/proc/{p}/ns/pid"))
            .ok()
            .as_deref()
            != Some(ns)
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{p}/status")) else {
            continue;
        };
        let pid = status_ids(&status, "NSpid:").and_then(|v| v.get(depth - 1).copied());
        let pgid = status_ids(&status, "NSpgid:").and_then(|v| v.get(depth - 1).copied());
        if let (Some(pid), Some(pgid), Some(stat)) = (pid, pgid, read_stat(p)) {
            ours.insert(p, (pid, pgid, stat));
        }
    }
    // Second pass: parents translated; one outside our namespace is 0.
    let to_ours: HashMap<i32, i32> = ours.iter().map(|(&p, &(pid, _, _))| (p, pid)).collect();
    ours.into_iter()
        .map(|(p, (pid, pgid, st))| {
            let proc = Proc {
                pid,
                ppid: to_ours.get(&st.ppid).copied().unwrap_or(0),
                pgid,
                state: st.state,
                start: st.start,
                comm: st.comm,
                cpu_ticks: st.cpu_ticks,
                proc_pid: p,
            };
            (pid, proc)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_entry_is_read_with_a_start_time() {
        let me = std::process::id() as i32;
        let t = Table::read();
        let p = t.get(me).unwrap();
        assert!(p.ppid > 0 && p.pgid > 0 && p.start > 0);
        assert!(p.is_running());
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(p.comm.name(), comm.trim_end_matches('\n'));
    }

    #[test]
    fn names_are_kept_inline_and_odd_ones_read() {
        assert_eq!(Comm::new(b"cudafe++").name(), "cudafe++");
        assert_eq!(Comm::new(b"a) b (c").name(), "a) b (c");
        assert_eq!(Comm::new(&[b'x'; 20]).name().len(), 16);
    }

    #[test]
    fn the_marker_names_this_process() {
        assert!(marker().starts_with(&format!("SGLANG_SUPERVISOR_TREE_{}_", std::process::id())));
    }
}
