//! Where an elastic job's coordinator is found: a fixed list of addresses (the first, then
//! standbys that an operator may start), or one kept up to date by whoever knows better
//! (the holder of the coordinator role published in etcd, `etcd::elastic::follow`).
//!
//! A worker's [`Link`](crate::control::Link) dials the addresses it holds, and when the
//! directory changes (a new coordinator was elected elsewhere) it drops the connection it
//! has and dials the new one, instead of waiting for the old one to fall silent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// The coordinator's addresses and how many times they changed, shared between the
/// thread that keeps them and the links that dial them.
#[derive(Clone, Debug, Default)]
pub struct Directory {
    inner: Arc<Mutex<Entry>>,
}

#[derive(Debug, Default)]
struct Entry {
    version: u64,
    addrs: Vec<SocketAddr>,
}

impl Directory {
    /// A directory that never changes.
    pub fn fixed(addrs: Vec<SocketAddr>) -> Directory {
        Directory { inner: Arc::new(Mutex::new(Entry { version: 0, addrs })) }
    }

    /// Replaces the addresses (empty: no coordinator is known now); the version moves on
    /// only when they differ.
    pub fn set(&self, addrs: Vec<SocketAddr>) {
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if e.addrs != addrs {
            e.addrs = addrs;
            e.version += 1;
        }
    }

    /// The addresses now, and the version they are.
    pub fn get(&self) -> (u64, Vec<SocketAddr>) {
        let e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (e.version, e.addrs.clone())
    }

    /// The version now.
    pub fn version(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_moves_only_when_the_addresses_change() {
        let a: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let d = Directory::fixed(vec![a]);
        assert_eq!(d.get(), (0, vec![a]));
        d.set(vec![a]);
        assert_eq!(d.version(), 0);
        let shared = d.clone();
        shared.set(vec![b]);
        assert_eq!(d.get(), (1, vec![b]));
        d.set(Vec::new());
        assert_eq!(d.get(), (2, Vec::new()));
    }
}
