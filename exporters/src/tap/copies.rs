//! With the tap on every interface, a connection that this machine translates on its way
//! through crosses it twice: before translation and after. A DNAT rule publishing a
//! container's port to clients on other hosts rewrites the server end; a masquerade or SNAT
//! rule (Docker's hairpin) the client's address too, and its port where that port is taken
//! (often, with many clients behind one address) or picked at random (`--random-fully`, as
//! kube-proxy does). Both copies carry the same first sequence number and the same timestamp
//! option (TSval), which NAT leaves alone, and mostly the same client port: a SYN that shares
//! either with one followed, with other ends, is its copy (a SYN sent again carries a new
//! timestamp, kept as one more). A SYN without a timestamp (Windows' default) is known by its
//! client port alone, so a copy whose port was changed is then measured twice.
//! The first seen is measured, the other is a copy, not followed. A connection begun before
//! the tap is known by the request it is joined at: both copies carry it at the same sequence
//! number and timestamp, which stand for the first. That identity is exact (random 32-bit
//! numbers, within seconds), so nothing else is taken for a copy: a relay's onward leg
//! (docker-proxy's, for clients on this machine) is a connection of its own, measured as one
//! on `any` (the tap on `lo` sees only the client's). The SYNs followed are shared by every
//! reader: a copy may be hashed to another reader than its original.
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::tcp::{End, KeyHasher, Segment};

/// How long a followed SYN is kept to find its translated copy by: the copies pass within
/// microseconds, and a SYN sent again a few seconds later is the same.
const SYN_KEPT: Duration = Duration::from_secs(10);
/// A copy that carried nothing but its handshake for this long is forgotten (a SYN flood, a
/// client retrying a server that is down): longer than a SYN is sent again for (1, 3, 7, 15,
/// 31 and 63 s after the first), so that the last is still known as a copy. One that carried
/// bytes is forgotten after the tap's idle time for a connection.
const SYN_ONLY_KEPT: Duration = Duration::from_secs(130);
/// Bounds on what is kept: past them the oldest go (a copy then missed is measured twice).
const MAX_KEPT: usize = 1 << 16;

/// A copy not followed.
#[derive(Debug, Clone, Copy)]
struct Skipped {
    isn: u32,
    last_seen: Instant,
    /// Whether bytes came after its handshake.
    used: bool,
    /// Which sides have closed (a FIN): forgotten when both have, or at a reset.
    client_closed: bool,
    server_closed: bool,
}

/// A connection's client and server ends.
type Ends = (End, End);

/// What both copies of a connection carry besides its first sequence number: the SYN's (or
/// the joined request's) timestamp, or the client's port (which NAT may change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Tag {
    Stamp(u32),
    Port(u16),
}

/// A connection as both its copies may show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Id(u32, Tag);

/// A connection's ids: by its timestamp where the segment has one (a SYN sent again carries
/// another), and by its client's port.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ids {
    stamp: Option<Id>,
    port: Id,
}

impl Ids {
    /// A client's segment (a SYN, or the request a connection is joined at) whose connection's
    /// first sequence number is `first`.
    pub fn of(first: u32, seg: &Segment<'_>) -> Ids {
        Ids {
            stamp: seg.timestamp().map(|ts| Id(first, Tag::Stamp(ts))),
            port: Id(first, Tag::Port(seg.src.port)),
        }
    }

    fn each(self) -> impl Iterator<Item = Id> {
        self.stamp.into_iter().chain([self.port])
    }
}

/// Whether `key` is a copy of the connection `first` that shares an id with it: other ends,
/// except another port from the same address to the same server (one host's SYNs to one server
/// in the same millisecond share a timestamp; their sequence numbers differ but for chance).
fn copy_of(first: Ends, key: Ends) -> bool {
    first != key && !(first.0.ip == key.0.ip && first.0.port != key.0.port && first.1 == key.1)
}

/// The SYNs followed lately, by every reader (hashed as the connections' table is: their
/// ends come from remote clients), and whether a copy was said.
#[derive(Debug, Default)]
pub(super) struct Followed {
    /// A connection followed -> its ends, and when.
    syns: HashMap<Id, (Ends, Instant), KeyHasher>,
    order: VecDeque<(Id, Instant)>,
    told: bool,
}

impl Followed {
    /// `key`'s ids, each queued at every insert: the entry's time is what its turn to expire
    /// checks.
    fn insert(&mut self, ids: Ids, key: Ends, at: Instant) {
        for id in ids.each() {
            self.syns.insert(id, (key, at));
            self.order.push_back((id, at));
        }
    }

    /// [`Followed::insert`] of the ids not kept yet: the same SYN seen again (a bridge, then its
    /// port) adds nothing.
    fn insert_new(&mut self, ids: Ids, key: Ends, at: Instant) {
        for id in ids.each() {
            if let std::collections::hash_map::Entry::Vacant(e) = self.syns.entry(id) {
                e.insert((key, at));
                self.order.push_back((id, at));
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(k, t)) = self.order.front() {
            if now.saturating_duration_since(t) < SYN_KEPT && self.order.len() <= MAX_KEPT {
                break;
            }
            self.order.pop_front();
            if self.syns.get(&k).is_some_and(|&(_, at)| at == t) {
                self.syns.remove(&k);
            }
        }
    }
}

/// One reader's view: the SYNs followed (shared) and the copies it found. A copy's later
/// segments come to the reader its SYN came to (the kernel hashes a connection's segments,
/// both ways, to one reader).
#[derive(Debug, Default)]
pub(super) struct Copies {
    followed: Arc<Mutex<Followed>>,
    /// Copies: their later segments are not taken for connections begun before the tap.
    skipped: HashMap<(End, End), Skipped, KeyHasher>,
    /// The first copy, and the connection it repeats, until said.
    untold: Option<(Ends, Ends)>,
}

impl Copies {
    /// A reader's, sharing the SYNs `followed` with the others.
    pub fn sharing(followed: &Arc<Mutex<Followed>>) -> Copies {
        Copies {
            followed: followed.clone(),
            ..Copies::default()
        }
    }

    /// At a client's SYN to the server's port, not one of a connection followed: whether it is
    /// a copy (the same SYN again, seen on a bridge and its port or sent again, is too).
    /// `None`: a new connection, to follow; `Some(true)`: a new copy, to count.
    pub fn at_syn(&mut self, key: Ends, ids: Ids, at: Instant) -> Option<bool> {
        let isn = ids.port.0;
        if let Some(s) = self.skipped.get_mut(&key) {
            if s.isn == isn {
                s.last_seen = at;
                return Some(false);
            }
            // a new connection on the ends of a copy whose close went unseen
            self.skipped.remove(&key);
        }
        // The shared table alone under the lock: this reader's own copies are its own.
        let (first, told) = {
            // A reader that panicked holding it left nothing half-done that matters here.
            let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
            followed.expire(at);
            let first = ids
                .each()
                .filter_map(|id| followed.syns.get(&id).map(|&(first, _)| first))
                .find(|&first| copy_of(first, key));
            match first {
                Some(first) => (first, followed.told),
                None => {
                    followed.insert(ids, key, at);
                    return None;
                }
            }
        };
        if self.skipped.len() >= MAX_KEPT {
            // a flood of handshakes alone gives way to the copies that carry requests
            self.skipped.retain(|_, s| s.used);
            if self.skipped.len() >= MAX_KEPT {
                return None;
            }
        }
        let s = Skipped {
            isn,
            last_seen: at,
            used: false,
            client_closed: false,
            server_closed: false,
        };
        self.skipped.insert(key, s);
        if !told {
            self.untold.get_or_insert((key, first));
        }
        Some(true)
    }

    /// A connection's SYN sent again (the first dropped on its way through, or waiting on a
    /// full listen queue): its new timestamp is one more id its copy may show.
    pub fn resent(&mut self, key: Ends, ids: Ids, at: Instant) {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        followed.expire(at);
        // an id another connection holds is left to it
        let taken = |id| followed.syns.get(&id).is_some_and(|&(ends, _)| ends != key);
        if ids.each().any(taken) {
            return;
        }
        followed.insert_new(ids, key, at);
    }

    /// A connection [`Copies::at_syn`] found new that could not be followed (no room on its
    /// reader): its copy, on a reader with room, is measured instead.
    pub fn refused(&mut self, key: Ends, ids: Ids) {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids.each() {
            if followed.syns.get(&id).is_some_and(|&(ends, _)| ends == key) {
                followed.syns.remove(&id);
            }
        }
    }

    /// Whether a segment of `key` (not a client's SYN) is one of a copy's. A reset, or both
    /// sides' FINs, forget it.
    pub fn skipped(
        &mut self,
        key: &(End, End),
        seg: &Segment<'_>,
        to_server: bool,
        at: Instant,
    ) -> bool {
        let Some(s) = self.skipped.get_mut(key) else {
            return false;
        };
        s.last_seen = at;
        s.used |= !seg.payload.is_empty();
        if to_server {
            s.client_closed |= seg.fin;
        } else {
            s.server_closed |= seg.fin;
        }
        if seg.rst || (s.client_closed && s.server_closed) {
            self.skipped.remove(key);
        }
        true
    }

    /// Forgets copies gone quiet: those with nothing but a SYN after [`SYN_ONLY_KEPT`], others
    /// after `idle` (the tap's time for a silent connection).
    pub fn forget_idle(&mut self, now: Instant, idle: Duration) {
        self.skipped.retain(|_, s| {
            let quiet = now.saturating_duration_since(s.last_seen);
            quiet < if s.used { idle } else { SYN_ONLY_KEPT }
        });
    }

    /// The line saying the first copy, once (over every reader). Which of the two was
    /// translated is not known: readers race, so the first read may be the copy.
    pub fn tell(&mut self, port: u16) -> Option<String> {
        let ((client, server), (first_client, first_server)) = self.untold.take()?;
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::replace(&mut followed.told, true) {
            return None;
        }
        let addr = |e: End| SocketAddr::new(e.ip, e.port);
        Some(format!(
            "tap: the connection from {} to {} was not measured: it is the one from {} to {}, \
             measured, seen again across an address translation (DNAT, SNAT or masquerade) on \
             every interface; such copies of connections to port {port} are counted in \
             tap_copied_connections_total",
            addr(client),
            addr(server),
            addr(first_client),
            addr(first_server)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(ip: [u8; 4], port: u16) -> End {
        End {
            ip: ip.into(),
            port,
        }
    }

    const CLIENT: [u8; 4] = [203, 0, 113, 9];
    const HERE: [u8; 4] = [198, 51, 100, 1];
    const THERE: [u8; 4] = [203, 0, 113, 2];

    impl Copies {
        /// A SYN without a timestamp.
        fn syn(&mut self, key: Ends, isn: u32, at: Instant) -> Option<bool> {
            self.at_syn(key, ids(key, isn, None), at)
        }
    }

    fn ids(key: Ends, isn: u32, ts: Option<u32>) -> Ids {
        Ids {
            stamp: ts.map(|ts| Id(isn, Tag::Stamp(ts))),
            port: Id(isn, Tag::Port(key.0.port)),
        }
    }

    fn keys(port: u16) -> ((End, End), (End, End)) {
        let c = end(CLIENT, port);
        ((c, end(HERE, 8000)), (c, end(THERE, 8000)))
    }

    #[test]
    fn only_the_same_client_port_and_sequence_number_to_other_addresses_is_a_copy() {
        let mut c = Copies::default();
        let t = Instant::now();
        let (first, translated) = keys(40001);
        assert_eq!(c.syn(first, 10, t), None);
        // the same SYN sent again to the same end: the connection followed, not a copy
        assert_eq!(c.syn(first, 10, t), None);
        assert_eq!(c.syn(translated, 11, t), None, "another sequence number");
        let (first, translated) = keys(40002);
        assert_eq!(c.syn(first, 20, t), None);
        assert_eq!(c.syn(translated, 20, t), Some(true));
        // seen again (a bridge, then its port): the same copy, not counted again
        assert_eq!(c.syn(translated, 20, t), Some(false));
        assert!(c.tell(8000).is_some_and(|l| l
            .contains("from 203.0.113.9:40002 to 203.0.113.2:8000 was not measured")
            && l.contains("it is the one from 203.0.113.9:40002 to 198.51.100.1:8000")));
        assert_eq!(c.tell(8000), None, "said once");
    }

    #[test]
    fn a_copy_whose_client_address_was_translated_too_is_a_copy() {
        let mut c = Copies::default();
        let t = Instant::now();
        let (first, _) = keys(40001);
        // masquerade after DNAT: the router's address for the client's, the port kept
        let gateway = end([198, 51, 100, 254], 40001);
        let both = (gateway, end(THERE, 8000));
        assert_eq!(c.syn(first, 10, t), None);
        assert_eq!(c.syn(both, 10, t), Some(true));
        assert!(c.tell(8000).is_some_and(|l| l
            .contains("from 198.51.100.254:40001 to 203.0.113.2:8000 was not measured")
            && l.contains("it is the one from 203.0.113.9:40001 to 198.51.100.1:8000")));
        // SNAT alone (a client in a container reaching a server elsewhere): the same server
        let (first, _) = keys(40002);
        assert_eq!(c.syn(first, 20, t), None);
        assert_eq!(c.syn((end(HERE, 40002), first.1), 20, t), Some(true));
        // a port NAT changed: without a timestamp, another connection (measured twice)...
        let (first, translated) = keys(40003);
        assert_eq!(c.syn(first, 30, t), None);
        let moved = (end([198, 51, 100, 254], 50003), translated.1);
        assert_eq!(c.syn(moved, 30, t), None);
        // ...with one, the same: the timestamp and sequence number stand for the port
        let (first, translated) = keys(40004);
        assert_eq!(c.at_syn(first, ids(first, 40, Some(77)), t), None);
        let moved = (end([198, 51, 100, 254], 50004), translated.1);
        assert_eq!(c.at_syn(moved, ids(moved, 40, Some(77)), t), Some(true));
        // another port from the same address to the same server is another connection (one
        // host's SYNs to one server in the same millisecond share a timestamp)...
        let (first, _) = keys(40005);
        assert_eq!(c.at_syn(first, ids(first, 50, Some(78)), t), None);
        let other = (end(CLIENT, 40006), first.1);
        assert_eq!(c.at_syn(other, ids(other, 50, Some(78)), t), None);
        // ...but to another server it is a copy (two DNAT fronts to one backend, the port
        // remapped where the first took it)
        let (first, translated) = keys(40007);
        assert_eq!(c.at_syn(first, ids(first, 60, Some(79)), t), None);
        let remapped = (end(CLIENT, 40008), translated.1);
        assert_eq!(
            c.at_syn(remapped, ids(remapped, 60, Some(79)), t),
            Some(true)
        );
    }

    #[test]
    fn a_syn_sent_again_with_a_new_timestamp_finds_its_copy_by_either() {
        let mut c = Copies::default();
        let t = Instant::now();
        // its first SYN dropped between the two sightings (conntrack full, NAT out of ports):
        // the copy shows only the second, with the new timestamp and, masqueraded, a new port
        let (first, translated) = keys(40001);
        assert_eq!(c.at_syn(first, ids(first, 10, Some(1000)), t), None);
        c.resent(first, ids(first, 10, Some(2000)), t);
        let moved = (end([198, 51, 100, 254], 50001), translated.1);
        assert_eq!(c.at_syn(moved, ids(moved, 10, Some(2000)), t), Some(true));
        // the port kept: known by the port and sequence number, whatever the timestamp
        let (first, translated) = keys(40002);
        assert_eq!(c.at_syn(first, ids(first, 20, Some(1000)), t), None);
        assert_eq!(
            c.at_syn(translated, ids(translated, 20, Some(3000)), t),
            Some(true)
        );
        // a resent SYN does not take an id another connection holds
        let (first, _) = keys(40003);
        assert_eq!(c.at_syn(first, ids(first, 30, Some(1000)), t), None);
        let (other, _) = keys(40004);
        c.resent(other, ids(other, 30, Some(1000)), t);
        let f = c.followed.lock().unwrap();
        assert_eq!(f.syns[&Id(30, Tag::Stamp(1000))].0, first);
        // a resend's ids already kept are not queued again
        let queued = f.order.len();
        drop(f);
        c.resent(first, ids(first, 30, Some(1000)), t);
        assert_eq!(c.followed.lock().unwrap().order.len(), queued);
    }

    #[test]
    fn a_connection_that_could_not_be_followed_leaves_its_copy_to_be_measured() {
        let mut c = Copies::default();
        let t = Instant::now();
        let (first, translated) = keys(40001);
        assert_eq!(c.syn(first, 10, t), None);
        c.refused(first, ids(first, 10, None));
        assert_eq!(c.syn(translated, 10, t), None);
    }

    #[test]
    fn a_copy_hashed_to_another_reader_is_a_copy_and_said_once_over_all() {
        let followed = Arc::new(Mutex::new(Followed::default()));
        let (mut one, mut two) = (Copies::sharing(&followed), Copies::sharing(&followed));
        let t = Instant::now();
        // whichever reader reads its SYN first follows it; the other's is the copy
        let (first, translated) = keys(40001);
        assert_eq!(two.syn(translated, 10, t), None);
        assert_eq!(one.syn(first, 10, t), Some(true));
        let (first, translated) = keys(40002);
        assert_eq!(one.syn(first, 20, t), None);
        assert_eq!(two.syn(translated, 20, t), Some(true));
        assert!(one.tell(8000).is_some());
        assert_eq!(two.tell(8000), None, "said once over every reader");
    }

    #[test]
    fn a_followed_syn_is_kept_ten_seconds_to_find_its_copy_by() {
        let mut c = Copies::default();
        let t = Instant::now();
        let (first, translated) = keys(40001);
        assert_eq!(c.syn(first, 10, t), None);
        let later = t + SYN_KEPT + Duration::from_millis(1);
        assert_eq!(c.syn(translated, 10, later), None);
        let f = c.followed.lock().unwrap();
        assert!(f.syns.len() == 1 && f.order.len() == 1, "{f:?}");
    }

    /// A segment of `key`'s connection: from its client (`to_server`) or its server.
    fn seg(key: (End, End), to_server: bool, fin: bool, rst: bool, payload: &[u8]) -> Segment<'_> {
        let (src, dst) = if to_server { key } else { (key.1, key.0) };
        Segment {
            src,
            dst,
            seq: 1,
            syn: false,
            ack: true,
            fin,
            rst,
            options: &[],
            payload,
        }
    }

    fn copy(c: &mut Copies, port: u16, isn: u32, t: Instant) -> (End, End) {
        let (first, translated) = keys(port);
        c.syn(first, isn, t);
        assert_eq!(c.syn(translated, isn, t), Some(true));
        translated
    }

    #[test]
    fn a_copy_is_forgotten_at_a_reset_or_both_fins_not_at_one() {
        let mut c = Copies::default();
        let t = Instant::now();
        let k = copy(&mut c, 40001, 10, t);
        assert!(c.skipped(&k, &seg(k, true, false, false, b"GET"), true, t));
        // the server's keep-alive close alone: a request racing it is still the copy's
        assert!(c.skipped(&k, &seg(k, false, true, false, b""), false, t));
        assert!(c.skipped(&k, &seg(k, true, false, false, b"GET"), true, t));
        assert!(c.skipped(&k, &seg(k, true, true, false, b""), true, t));
        assert!(
            !c.skipped(&k, &seg(k, true, false, false, b""), true, t),
            "both closed"
        );
        let k = copy(&mut c, 40002, 20, t);
        assert!(c.skipped(&k, &seg(k, false, false, true, b""), false, t));
        assert!(
            !c.skipped(&k, &seg(k, true, false, false, b"GET"), true, t),
            "reset"
        );
    }

    #[test]
    fn a_copy_is_forgotten_at_a_new_connection_on_its_ends_or_gone_quiet() {
        let mut c = Copies::default();
        let t = Instant::now();
        // its close unseen, a new connection on the same ends is not the copy
        let reused = copy(&mut c, 40002, 20, t);
        assert_eq!(c.syn(reused, 99, t), None);
        assert!(!c.skipped(&reused, &seg(reused, true, false, false, b"GET"), true, t));
        // quiet: a handshake alone (its server's SYN-ACK included) after the last time a SYN
        // is sent again, one that carried bytes after the idle time
        let syn_only = copy(&mut c, 40003, 30, t);
        assert!(c.skipped(
            &syn_only,
            &seg(syn_only, false, false, false, b""),
            false,
            t
        ));
        let used = copy(&mut c, 40004, 40, t);
        assert!(c.skipped(&used, &seg(used, true, false, false, b"GET"), true, t));
        let idle = Duration::from_secs(3600);
        c.forget_idle(t + Duration::from_secs(63), idle);
        assert_eq!(
            c.syn(syn_only, 30, t),
            Some(false),
            "its SYN sent again at 63 s"
        );
        c.forget_idle(t + SYN_ONLY_KEPT, idle);
        assert!(!c.skipped.contains_key(&syn_only));
        assert!(c.skipped.contains_key(&used));
        c.forget_idle(t + idle, idle);
        assert!(!c.skipped.contains_key(&used));
    }

    #[test]
    fn a_syn_followed_again_is_kept_from_its_last_sighting_and_then_forgotten() {
        let mut c = Copies::default();
        let t = Instant::now();
        let (first, translated) = keys(40001);
        c.syn(first, 10, t);
        let again = t + Duration::from_secs(5);
        c.syn(first, 10, again);
        assert_eq!(c.followed.lock().unwrap().order.len(), 2);
        // kept from its last sighting...
        assert_eq!(c.syn(translated, 10, t + SYN_KEPT), Some(true));
        // ...and gone once that too is older than the limit: no entry left behind
        let (other, _) = keys(40009);
        c.syn(other, 1, again + SYN_KEPT + Duration::from_secs(1));
        let f = c.followed.lock().unwrap();
        assert!(
            !f.syns.contains_key(&Id(10, Tag::Port(first.0.port))),
            "{f:?}"
        );
    }

    #[test]
    fn a_flood_of_handshakes_alone_gives_way_to_copies_that_carry_requests() {
        let mut c = Copies::default();
        let t = Instant::now();
        let used = copy(&mut c, 1, 7, t);
        assert!(c.skipped(&used, &seg(used, true, false, false, b"GET"), true, t));
        for n in 0..MAX_KEPT as u32 {
            let [_, a, b, d] = n.to_be_bytes();
            let client = End {
                ip: [10, a, b, d].into(),
                port: 5000,
            };
            let isn = 1000 + n;
            c.syn((client, end(HERE, 8000)), isn, t);
            c.syn((client, end(THERE, 8000)), isn, t);
        }
        // full: the next copy clears the handshakes alone and is still one
        let late = copy(&mut c, 2, 8, t);
        assert!(c.skipped.contains_key(&late) && c.skipped.contains_key(&used));
        assert!(c.skipped.len() < 10, "{}", c.skipped.len());
    }
}
