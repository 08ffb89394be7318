//! This machine's own addresses, as read from its interfaces: what tells a client on this
//! machine from one elsewhere (the run's count of requests it could not measure).
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The addresses of this machine's interfaces (getifaddrs), IPv6 link-local ones without their
/// scope, as a server's log gives them. Not "what can be bound": with
/// `net.ipv4.ip_nonlocal_bind` any address can.
pub fn own_addresses() -> Vec<IpAddr> {
    read_own().unwrap_or_default()
}

/// [`own_addresses`], or None where they cannot be listed (out of file descriptors, say).
fn read_own() -> Option<Vec<IpAddr>> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        tracing::debug!("cannot list this machine's addresses: every address counts as elsewhere");
        return None;
    };
    let addrs = addrs
        .filter_map(|a| {
            let s = a.address?;
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .map(|ip| ip.to_canonical())
        .collect();
    Some(addrs)
}

/// [`own_addresses`], read again once they are `max_age` old: an address may come or go in a
/// run (a container's bridge, a lease renewed).
#[derive(Debug)]
pub struct OwnAddresses {
    addrs: Vec<IpAddr>,
    read_at: Option<Instant>,
    max_age: Duration,
}

impl OwnAddresses {
    /// Nothing read yet: the first use reads them.
    pub fn new(max_age: Duration) -> Self {
        OwnAddresses {
            addrs: Vec::new(),
            read_at: None,
            max_age,
        }
    }

    /// These addresses, never read again: a machine whose addresses are known (tests).
    pub fn these(addrs: Vec<IpAddr>) -> Self {
        OwnAddresses {
            addrs,
            read_at: Some(Instant::now()),
            max_age: Duration::MAX,
        }
    }

    fn stale(&self, now: Instant) -> bool {
        self.read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= self.max_age)
    }

    /// A list that cannot be read keeps the last one read.
    fn read(&mut self, now: Instant) {
        if let Some(addrs) = read_own() {
            self.addrs = addrs;
        }
        self.read_at = Some(now);
    }

    /// The addresses, read again where they are `max_age` old.
    pub fn get(&mut self, now: Instant) -> &[IpAddr] {
        if self.stale(now) {
            self.read(now);
        }
        &self.addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_addresses_are_read_again_once_they_are_a_max_age_old() {
        let mut own = OwnAddresses::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert!(own.get(t0).contains(&IpAddr::from([127, 0, 0, 1])));
        // 203.0.113.0/24 is for documentation: on no machine's interface.
        assert!(!own.get(t0).contains(&"203.0.113.77".parse().unwrap()));
        // Taken off the list as read: not read again within the age...
        own.addrs.clear();
        assert!(own.get(t0 + Duration::from_millis(500)).is_empty());
        // ...and read again once the list is a max age old.
        assert!(!own.get(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(own.read_at, Some(t0 + Duration::from_secs(1)));
    }
}
