//! With the tap on every interface, one request may cross it twice, on two connections to the
//! server's port: a port this machine publishes for a container is relayed (docker-proxy accepts
//! the client's connection and opens its own to the container) or translated (a DNAT rule: the
//! copy before translation, to this machine, and the one after, to the container). Each is
//! measured once, on the first connection seen; the other is a copy, not followed. Traffic
//! with no such first connection (a client here reaching a container straight through an
//! output DNAT rule, a server on another host) is followed as before. Each reader keeps its
//! own: with more than one, the kernel hashes the two connections apart as often as not, and
//! a copy on another reader than its first is measured too.
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::tcp::End;
use crate::host::OwnAddresses;

/// How soon after a client's connection to this machine its relay's onward leg is taken as
/// its copy (docker-proxy connects at once, in well under a millisecond).
const RELAY_WITHIN: Duration = Duration::from_secs(1);
/// How long a followed SYN is kept to find its translated copy by (the copies pass within
/// microseconds; a SYN sent again, a second later or so, is the same).
const SYN_KEPT: Duration = Duration::from_secs(10);
/// Bounds on what is kept: past them the oldest go (a copy then missed is measured twice,
/// as before).
const MAX_KEPT: usize = 1 << 16;
/// How often, at most, this machine's addresses are read again for an end not among them.
const OWN_READ_AGAIN: Duration = Duration::from_secs(1);

/// Why a connection is not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Copy {
    /// A relay's onward leg: from this machine to another host's end, just after a client's
    /// connection to this machine.
    Relayed,
    /// The same connection after address translation: its client's end and first sequence
    /// number, another server end.
    Translated,
}

/// The connections seen lately that a copy would repeat.
#[derive(Debug)]
pub(super) struct Copies {
    own: OwnAddresses,
    /// Followed SYNs: (client end, first sequence number) -> when.
    syns: HashMap<(End, u32), Instant>,
    syn_order: VecDeque<((End, u32), Instant)>,
    /// Connections to this machine's own ends (client end, first sequence number) not yet
    /// matched to an onward leg, oldest first.
    facing: VecDeque<((End, u32), Instant)>,
    /// Copies, by their first sequence number: their later segments are not taken for
    /// connections begun before the tap.
    skipped: HashMap<(End, End), u32>,
    /// The first copy, and why, until said.
    pub untold: Option<((End, End), Copy)>,
    told: bool,
}

impl Copies {
    pub fn new() -> Self {
        Copies::with(OwnAddresses::new(OWN_READ_AGAIN))
    }

    /// On a machine whose addresses are `own`.
    pub fn with(own: OwnAddresses) -> Self {
        Copies {
            own,
            syns: HashMap::new(),
            syn_order: VecDeque::new(),
            facing: VecDeque::new(),
            skipped: HashMap::new(),
            untold: None,
            told: false,
        }
    }

    /// At a client's SYN to the server's port, not one of a connection followed: `None` to
    /// follow it, or why it is a copy. The same SYN again (seen on a bridge and its port, or
    /// sent again) is asked of [`Copies::seen`] first.
    pub fn at_syn(&mut self, key: (End, End), isn: u32, now: Instant) -> Option<Copy> {
        let (client, server) = key;
        self.expire(now);
        let copy = if self.syns.contains_key(&(client, isn)) {
            // Translated on its way through, to another host: not relayed on from here.
            self.facing.retain(|(k, _)| *k != (client, isn));
            Some(Copy::Translated)
        } else if self.own.holds(server.ip, now) {
            if self.facing.len() < MAX_KEPT {
                self.facing.push_back(((client, isn), now));
            }
            None
        } else if self.own.holds(client.ip, now) && self.facing.pop_front().is_some() {
            Some(Copy::Relayed)
        } else {
            None
        };
        match copy {
            Some(why) => {
                if self.skipped.len() < MAX_KEPT {
                    self.skipped.insert(key, isn);
                }
                if !self.told {
                    self.untold.get_or_insert((key, why));
                }
            }
            None => {
                if self.syns.insert((client, isn), now).is_none() {
                    self.syn_order.push_back(((client, isn), now));
                }
            }
        }
        copy
    }

    /// Whether a segment of `key` is one of a copy's; its close (`ends`) forgets it.
    pub fn skipped(&mut self, key: &(End, End), ends: bool) -> bool {
        if ends {
            self.skipped.remove(key).is_some()
        } else {
            self.skipped.contains_key(key)
        }
    }

    /// Whether a SYN of `key` is the copy's own again; one of a new connection on the same
    /// ends (the copy's close unseen) forgets the copy.
    pub fn seen(&mut self, key: &(End, End), isn: u32) -> bool {
        match self.skipped.get(key) {
            Some(&was) if was == isn => true,
            Some(_) => {
                self.skipped.remove(key);
                false
            }
            None => false,
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(_, t)) = self.facing.front() {
            if now.saturating_duration_since(t) < RELAY_WITHIN {
                break;
            }
            self.facing.pop_front();
        }
        while let Some(&(k, t)) = self.syn_order.front() {
            if now.saturating_duration_since(t) < SYN_KEPT && self.syn_order.len() <= MAX_KEPT {
                break;
            }
            self.syn_order.pop_front();
            if self.syns.get(&k) == Some(&t) {
                self.syns.remove(&k);
            }
        }
    }

    /// The line saying the first copy, once.
    pub fn tell(&mut self, port: u16) -> Option<String> {
        let ((client, server), why) = self.untold.take()?;
        self.told = true;
        let (c, s) = (
            SocketAddr::new(client.ip, client.port),
            SocketAddr::new(server.ip, server.port),
        );
        let what = match why {
            Copy::Relayed => "a relay's onward leg (docker-proxy's, say) of a client's connection to this machine, measured there",
            Copy::Translated => "the address-translated copy (a DNAT rule's) of a connection measured already",
        };
        Some(format!(
            "tap: the connection from {c} to {s} was not measured: on every interface it is {what}; \
             such copies of connections to port {port} are counted in tap_copied_connections_total"
        ))
    }
}
