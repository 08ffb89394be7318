//! TCP segments read from their IP packets, and each direction's bytes put back in order.
//! Loopback seldom loses or reorders a connection's segments (a full receive backlog drops
//! them, and a sender that moves between CPUs can have two in different backlogs), and TCP sends
//! them again; the ring loses them when it is full. Segments are held behind a hole until it
//! fills, and one that is not filled soon is said as such, never read across.
use std::net::IpAddr;

/// One side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct End {
    pub ip: IpAddr,
    pub port: u16,
}

/// Hashes a connection's ends for the tap's table, looked up once per segment: a multiply-rotate
/// hash (rustc's FxHash) keyed per process. SipHash, the default, was 9 % of the tap's CPU
/// (BENCHMARKS.md, "The tap"); the random key keeps ends chosen by a remote client from being
/// made to collide ahead of time.
#[derive(Clone)]
pub struct KeyHasher(u64);

impl KeyHasher {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        KeyHasher(
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
                | 1,
        )
    }
}

impl Default for KeyHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = Fx;
    fn build_hasher(&self) -> Fx {
        Fx(self.0)
    }
}

pub struct Fx(u64);

impl Fx {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.add(n as u64);
    }
    fn write_u16(&mut self, n: u16) {
        self.add(n as u64);
    }
    fn write_u32(&mut self, n: u32) {
        self.add(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A TCP segment, read from an IPv4 or IPv6 packet.
#[derive(Debug)]
pub struct Segment<'a> {
    pub src: End,
    pub dst: End,
    pub seq: u32,
    pub syn: bool,
    pub ack: bool,
    pub fin: bool,
    pub rst: bool,
    /// The TCP header's options.
    pub options: &'a [u8],
    pub payload: &'a [u8],
}

impl Segment<'_> {
    /// The timestamp option's value (TSval), where the segment carries one: set by the
    /// sender, left alone by address translation.
    pub fn timestamp(&self) -> Option<u32> {
        let mut o = self.options;
        while let [kind, rest @ ..] = o {
            match kind {
                0 => return None,
                1 => o = rest,
                _ => {
                    let len = *rest.first()? as usize;
                    if len < 2 || o.len() < len {
                        return None;
                    }
                    if *kind == 8 && len == 10 {
                        return Some(u32::from_be_bytes([o[2], o[3], o[4], o[5]]));
                    }
                    o = &o[len..];
                }
            }
        }
        None
    }
}

/// Reads a TCP segment from an IP packet; None for anything else (or a packet cut short).
pub fn segment(ip: &[u8]) -> Option<Segment<'_>> {
    let (src, dst, tcp) = match ip.first()? >> 4 {
        4 => {
            let ihl = ((ip[0] & 0x0f) as usize) * 4;
            let total = u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]) as usize;
            // A fragment (more follow, or not the first) holds part of a segment: read as a
            // whole one its bytes would be spliced with the next segment's. The filter drops
            // later fragments only; the first came through as if whole.
            let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x3fff;
            if *ip.get(9)? != 6 || ihl < 20 || total < ihl || ip.len() < total || frag != 0 {
                return None;
            }
            let a = |o: usize| -> Option<IpAddr> {
                Some(IpAddr::from(<[u8; 4]>::try_from(ip.get(o..o + 4)?).ok()?))
            };
            (a(12)?, a(16)?, &ip[ihl..total])
        }
        6 => {
            let payload = u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]) as usize;
            if *ip.get(6)? != 6 || ip.len() < 40 + payload {
                return None;
            }
            let a = |o: usize| -> Option<IpAddr> {
                Some(IpAddr::from(<[u8; 16]>::try_from(ip.get(o..o + 16)?).ok()?))
            };
            (a(8)?, a(24)?, &ip[40..40 + payload])
        }
        _ => return None,
    };
    let off = ((*tcp.get(12)? >> 4) as usize) * 4;
    if off < 20 || tcp.len() < off {
        return None;
    }
    let flags = tcp[13];
    let port = |o: usize| u16::from_be_bytes([tcp[o], tcp[o + 1]]);
    Some(Segment {
        src: End {
            ip: src,
            port: port(0),
        },
        dst: End {
            ip: dst,
            port: port(2),
        },
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        syn: flags & 0x02 != 0,
        ack: flags & 0x10 != 0,
        fin: flags & 0x01 != 0,
        rst: flags & 0x04 != 0,
        options: &tcp[20..off],
        payload: &tcp[off..],
    })
}

/// Segments held ahead of a hole, at most: past it the hole is taken for a loss.
const MAX_HELD: usize = 4096;
/// Bytes held ahead of a hole, at most.
const MAX_HELD_BYTES: usize = 8 << 20;

/// One direction's byte stream: where the next byte is, and what came ahead of a hole.
#[derive(Debug, Default)]
pub struct Stream {
    next: Option<u32>,
    held: Vec<(u32, Vec<u8>, bool)>,
    held_bytes: usize,
    /// The sender's FIN has been read in order.
    pub closed: bool,
}

/// A hole that will not be filled: bytes of this direction were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

/// `a - b` in sequence space (RFC 1982: within half the space).
fn diff(a: u32, b: u32) -> i64 {
    a.wrapping_sub(b) as i32 as i64
}

impl Stream {
    /// The SYN: the stream starts after it.
    pub fn start(&mut self, isn: u32) {
        self.next = Some(isn.wrapping_add(1));
    }

    pub fn started(&self) -> bool {
        self.next.is_some()
    }

    /// A segment's bytes: those next in order go to `on` (and any held that follow them); a
    /// retransmission's old bytes are skipped; bytes past a hole wait for it to fill.
    pub fn accept(
        &mut self,
        seq: u32,
        data: &[u8],
        fin: bool,
        on: &mut impl FnMut(&[u8]),
    ) -> Result<(), Lost> {
        let Some(next) = self.next else {
            return Ok(());
        };
        if data.is_empty() && !fin {
            return Ok(());
        }
        let ahead = diff(seq, next);
        if ahead > 0 {
            self.held_bytes += data.len();
            self.held.push((seq, data.to_vec(), fin));
            if self.held.len() > MAX_HELD || self.held_bytes > MAX_HELD_BYTES {
                return Err(Lost);
            }
            return Ok(());
        }
        self.take(seq, data, fin, on);
        while let Some(i) = self.held.iter().position(|(s, d, f)| {
            let next = self.next.unwrap_or(*s);
            diff(*s, next) <= 0 && (diff(s.wrapping_add(d.len() as u32), next) > 0 || *f)
        }) {
            let (s, d, f) = self.held.swap_remove(i);
            self.held_bytes -= d.len();
            self.take(s, &d, f, on);
        }
        // What is left behind the new position is old: drop it.
        let next = self.next.unwrap_or(0);
        self.held.retain(|(s, d, f)| {
            diff(s.wrapping_add(d.len() as u32), next) > 0 || (*f && diff(*s, next) >= 0)
        });
        self.held_bytes = self.held.iter().map(|(_, d, _)| d.len()).sum();
        Ok(())
    }

    /// Bytes that start at or before the next position.
    fn take(&mut self, seq: u32, data: &[u8], fin: bool, on: &mut impl FnMut(&[u8])) {
        let Some(next) = self.next else { return };
        let skip = diff(next, seq) as usize;
        if skip < data.len() {
            on(&data[skip..]);
            self.next = Some(seq.wrapping_add(data.len() as u32));
        }
        if fin && skip <= data.len() && !self.closed {
            self.closed = true;
            self.next = Some(seq.wrapping_add(data.len() as u32).wrapping_add(1));
        }
    }

    /// Bytes wait behind a hole.
    pub fn has_hole(&self) -> bool {
        !self.held.is_empty()
    }

    /// Where the stream waits, when bytes wait behind a hole there.
    pub fn hole_at(&self) -> Option<u32> {
        self.next.filter(|_| self.has_hole())
    }

    /// Bytes held behind a hole.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// The stream is not read any more: what was held behind a hole goes.
    pub fn forget(&mut self) {
        self.held = Vec::new();
        self.held_bytes = 0;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn feed(s: &mut Stream, segs: &[(u32, &[u8], bool)]) -> (Vec<u8>, Result<(), Lost>) {
        let mut got = Vec::new();
        let mut r = Ok(());
        for (seq, d, fin) in segs {
            r = r.and(s.accept(*seq, d, *fin, &mut |b| got.extend_from_slice(b)));
        }
        (got, r)
    }

    #[test]
    fn bytes_come_out_in_order_whatever_order_and_repeats_the_segments_came_in() {
        let isn = u32::MAX - 3; // the sequence numbers wrap inside the stream
        let parts: [(u32, &[u8]); 4] = [
            (isn.wrapping_add(1), b"hel"),
            (isn.wrapping_add(4), b"lo, "),
            (isn.wrapping_add(8), b"wor"),
            (isn.wrapping_add(11), b"ld"),
        ];
        let orders: [[usize; 6]; 4] = [
            [0, 1, 2, 3, 3, 0],
            [3, 2, 1, 0, 1, 2],
            [1, 0, 0, 3, 2, 1],
            [2, 3, 0, 1, 1, 3],
        ];
        for order in orders {
            let mut s = Stream::default();
            s.start(isn);
            let segs: Vec<(u32, &[u8], bool)> = order
                .iter()
                .map(|&i| (parts[i].0, parts[i].1, false))
                .collect();
            let (got, r) = feed(&mut s, &segs);
            assert_eq!(r, Ok(()));
            assert_eq!(got, b"hello, world", "{order:?}");
            assert!(!s.has_hole(), "{order:?}");
        }
        // A retransmission that overlaps what was read gives only its new bytes.
        let mut s = Stream::default();
        s.start(0);
        let (got, _) = feed(&mut s, &[(1, b"abc", false), (2, b"bcdef", true)]);
        assert_eq!(got, b"abcdef");
        assert!(s.closed);
    }

    #[test]
    fn a_hole_that_is_never_filled_is_a_loss_not_a_splice() {
        let mut s = Stream::default();
        s.start(0);
        let mut segs = vec![(1, &b"a"[..], false)];
        // the segment at 2 is lost; what follows piles up behind the hole
        for k in 0..=MAX_HELD as u32 {
            segs.push((3 + k, b"x", false));
        }
        let (got, r) = feed(&mut s, &segs);
        assert_eq!(got, b"a");
        assert_eq!(r, Err(Lost));
        // Before it is given up, the hole is known.
        let mut s = Stream::default();
        s.start(0);
        let (_, r) = feed(&mut s, &[(1, b"a", false), (3, b"c", true)]);
        assert_eq!(r, Ok(()));
        assert!(s.has_hole() && !s.closed);
    }

    #[test]
    fn segments_are_read_from_ipv4_and_ipv6_packets() {
        let tcp = |sport: u16, dport: u16, flags: u8| {
            let mut t = vec![0u8; 20];
            t[0..2].copy_from_slice(&sport.to_be_bytes());
            t[2..4].copy_from_slice(&dport.to_be_bytes());
            t[4..8].copy_from_slice(&7u32.to_be_bytes());
            t[12] = 5 << 4;
            t[13] = flags;
            t.extend_from_slice(b"payload");
            t
        };
        let mut v4 = vec![
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 2,
        ];
        v4.extend(tcp(40000, 30000, 0x18));
        let len = v4.len() as u16;
        v4[2..4].copy_from_slice(&len.to_be_bytes());
        v4.extend_from_slice(b"pad"); // beyond the total length: not payload
        let s = segment(&v4).unwrap();
        assert_eq!((s.src.port, s.dst.port, s.seq), (40000, 30000, 7));
        assert_eq!(s.dst.ip, IpAddr::from([127, 0, 0, 2]));
        assert_eq!((s.syn, s.ack, s.fin, s.rst), (false, true, false, false));
        assert_eq!(s.payload, b"payload");
        let t = tcp(30000, 40000, 0x12);
        let mut v6 = vec![0x60, 0, 0, 0];
        v6.extend_from_slice(&(t.len() as u16).to_be_bytes());
        v6.extend_from_slice(&[6, 64]);
        v6.extend_from_slice(&[0; 15]);
        v6.push(1);
        v6.extend_from_slice(&[0; 15]);
        v6.push(1);
        v6.extend(t);
        let s = segment(&v6).unwrap();
        assert!(s.syn && s.ack);
        assert_eq!(s.src.ip, "::1".parse::<IpAddr>().unwrap());
        assert!(segment(&v6[..50]).is_none(), "cut short");
        let mut first_fragment = v4.clone();
        first_fragment[6] = 0x20; // more fragments follow
        assert!(
            segment(&first_fragment).is_none(),
            "a fragment is no segment"
        );
        assert!(segment(&[0x45]).is_none());
    }

    #[test]
    fn a_segments_timestamp_is_read_from_its_options_wherever_it_stands() {
        let with = |options: &[u8]| {
            let mut p = vec![
                0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ];
            let mut t = vec![0u8; 20];
            t[2..4].copy_from_slice(&8000u16.to_be_bytes());
            t[12] = ((20 + options.len() as u8) / 4) << 4;
            t[13] = 0x02;
            t.extend_from_slice(options);
            p.extend(t);
            let len = p.len() as u16;
            p[2..4].copy_from_slice(&len.to_be_bytes());
            segment(&p).map(|s| (s.timestamp(), s.payload.len()))
        };
        let ts = [8, 10, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0];
        // Linux's SYN: MSS, SACK permitted, timestamps, a no-operation, window scale
        let mut syn = vec![2, 4, 0xff, 0xd7, 4, 2];
        syn.extend(ts);
        syn.extend([1, 3, 3, 7]);
        assert_eq!(with(&syn), Some((Some(0xdead_beef), 0)));
        // a data segment's: two no-operations first
        let mut data = vec![1, 1];
        data.extend(ts);
        assert_eq!(with(&data), Some((Some(0xdead_beef), 0)));
        // none, an end of the list before it, a length that runs past the header or is 0
        assert_eq!(with(&[2, 4, 0xff, 0xd7]), Some((None, 0)));
        assert_eq!(
            with(&[0, 0, 0, 0, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0])
                .unwrap()
                .0,
            None
        );
        assert_eq!(with(&[1, 1, 8, 12]).unwrap().0, None);
        assert_eq!(with(&[3, 0, 0, 0]).unwrap().0, None);
    }

    /// xorshift64*: the same inputs on every run.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    #[test]
    fn segment_reads_any_bytes_without_panic() {
        let mut rng = Rng(0x5eed);
        let valid = {
            let mut v = vec![
                0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1,
            ];
            v.extend_from_slice(&[0x9c, 0x40, 0x75, 0x30, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18]);
            v.extend_from_slice(&[0; 6]);
            v.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            let n = v.len() as u16;
            v[2..4].copy_from_slice(&n.to_be_bytes());
            v
        };
        for _ in 0..200_000 {
            let mut b = if rng.below(4) == 0 {
                (0..rng.below(80)).map(|_| rng.next() as u8).collect()
            } else {
                valid.clone()
            };
            for _ in 0..rng.below(4) {
                let i = rng.below(b.len());
                if let Some(x) = b.get_mut(i) {
                    *x = rng.next() as u8;
                }
            }
            b.truncate(rng.below(b.len() + 8));
            if let Some(s) = segment(&b) {
                assert!(s.payload.len() + s.options.len() <= b.len());
                let _ = s.timestamp();
            }
        }
    }

    /// Pieces of one stream in any order, repeated, overlapping, with FINs and far-off junk:
    /// what comes out is always the stream's start, never bytes spliced across a hole.
    #[test]
    fn a_stream_gives_only_its_own_prefix_whatever_segments_come() {
        let mut rng = Rng(42);
        let data: Vec<u8> = (0..4000).map(|i| (i % 251) as u8).collect();
        for round in 0..2000 {
            let isn = rng.next() as u32;
            let mut s = Stream::default();
            s.start(isn);
            let mut got = Vec::new();
            let mut lost = false;
            for _ in 0..rng.below(300) {
                let from = rng.below(data.len());
                let to = (from + rng.below(1500)).min(data.len());
                let fin = to == data.len() && rng.below(2) == 0;
                let junk = round % 2 == 0 && rng.below(20) == 0;
                let seq = match junk {
                    true => rng.next() as u32,
                    false => isn.wrapping_add(1).wrapping_add(from as u32),
                };
                let r = s.accept(seq, &data[from..to], fin, &mut |b| got.extend_from_slice(b));
                lost |= r.is_err();
                assert_eq!(
                    s.held_bytes(),
                    s.held.iter().map(|(_, d, _)| d.len()).sum::<usize>()
                );
                if lost {
                    break;
                }
            }
            // Junk at a sequence number that happens to be in order cannot be told from the
            // stream's bytes: only rounds without it are checked byte for byte.
            if round % 2 == 1 {
                assert!(got.len() <= data.len(), "round {round}");
                assert_eq!(got[..], data[..got.len()], "round {round}");
            }
        }
    }
}
