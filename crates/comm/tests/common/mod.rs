//! What the collectives' tests share: who holds which parts, a vector's bits, a loopback
//! mesh, and running a closure on every rank at once.

use std::net::TcpListener;

use comm::transport::{TcpConfig, TcpMesh, Transport};

/// The parts that rank `rank` of `world` holds (round-robin).
pub fn mine(all: &[Vec<f32>], rank: usize, world: usize) -> Vec<&[f32]> {
    all.iter().enumerate().filter(|(i, _)| i % world == rank).map(|(_, p)| p.as_slice()).collect()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A TCP mesh on loopback whose rank `r` connects with `configs[r]`, each on a port the
/// system chose and that its listener holds from the bind to the mesh.
pub fn meshes(configs: &[TcpConfig]) -> Vec<TcpMesh> {
    let listeners: Vec<TcpListener> = configs.iter().map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .zip(configs)
            .enumerate()
            .map(|(r, (l, config))| {
                let addrs = &addrs;
                s.spawn(move || TcpMesh::connect(r, l, addrs, config).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `f(rank, transport)` on every rank, each on a thread of its own; returns the
/// results by rank.
pub fn on_each<T: Transport, R: Send>(ranks: &[T], f: impl Fn(usize, &dyn Transport) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, t)| {
                let f = &f;
                s.spawn(move || f(r, t))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
