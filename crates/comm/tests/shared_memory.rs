//! The mesh's shared-memory links between ranks of one host: the same bits as the
//! in-process network in every mode and at sizes that fit a ring's free room (sent
//! inline) or not (sent from a helper thread, wrapping the ring), nothing left in the
//! directory, TCP for a pair that cannot share memory, and every failure a link must
//! surface: a peer that leaves (before or while a rank waits), an abort, a silent peer.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use comm::ReduceMode;
use comm::collective::all_reduce_parts;
use comm::transport::{CommError, TcpConfig, TcpMesh, mem_network};
use common::{bits, mine, on_each};

fn parts(n: usize) -> Vec<Vec<f32>> {
    let mut s = repro::rng::Stream::new(5, 0);
    (0..4).map(|_| (0..n).map(|_| s.uniform_symmetric(1.0) * 2f32.powi(s.below(20) as i32 - 10)).collect()).collect()
}

/// A directory on the memory file system where there is one.
fn ring_dir() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn config(dir: Option<&Path>) -> TcpConfig {
    TcpConfig {
        secret: b"shm-test-secret".to_vec(),
        max_frame: 1 << 24,
        connect_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(10),
        abort_grace: Duration::ZERO,
        shared_memory: dir.map(Path::to_path_buf),
    }
}

/// A mesh on loopback whose rank `r` makes rings in `dirs[r]`.
fn meshes(dirs: &[Option<&Path>]) -> Vec<TcpMesh> {
    common::meshes(&dirs.iter().map(|d| config(*d)).collect::<Vec<_>>())
}

#[test]
fn rings_give_the_bits_of_the_in_process_network_in_every_mode() {
    let dir = ring_dir();
    let timeout = Duration::from_secs(20);
    // 1000 values fit a ring's room (sent inline); 1.5 M (6 MB) do not (a helper thread
    // sends while the ring wraps).
    for n in [1000, 1_500_000] {
        let all = parts(n);
        for world in [2, 3] {
            let ranks = meshes(&vec![Some(dir.path()); world]);
            for (r, m) in ranks.iter().enumerate() {
                let others: Vec<usize> = (0..world).filter(|&p| p != r).collect();
                assert_eq!(m.shared_memory_peers(), others, "rank {r} of {world}");
            }
            // Both sides mapped every region, so no file is left to attach to.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
            for mode in ReduceMode::ALL {
                let net = mem_network(world);
                let want = on_each(&net, |r, t| all_reduce_parts(t, &mine(&all, r, world), n, mode, timeout).unwrap());
                let want = &want[0];
                let got = on_each(&ranks, |r, t| all_reduce_parts(t, &mine(&all, r, world), n, mode, timeout).unwrap());
                for (r, g) in got.iter().enumerate() {
                    assert!(bits(g) == bits(want), "{mode}, {world} ranks, {n} values: rank {r} differs");
                }
            }
        }
    }
}

#[test]
fn a_rank_that_cannot_share_memory_pairs_over_tcp() {
    let dir = ring_dir();
    let ranks = meshes(&[None, Some(dir.path()), Some(dir.path())]);
    assert_eq!(ranks[0].shared_memory_peers(), &[] as &[usize]);
    assert_eq!(ranks[1].shared_memory_peers(), &[2]);
    assert_eq!(ranks[2].shared_memory_peers(), &[1]);
    let all = parts(5000);
    let got = on_each(&ranks, |r, t| {
        all_reduce_parts(t, &mine(&all, r, 3), 5000, ReduceMode::Reproducible, Duration::from_secs(10)).unwrap()
    });
    assert!(got.iter().all(|g| bits(g) == bits(&got[0])));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Rank 0's all-reduce, with a deadline far beyond what any failure below takes (so that
/// none of them can be a timeout), once `during(rank 1's mesh)` ran on another thread.
fn rank0_reduce_while(ranks: Vec<TcpMesh>, during: impl FnOnce(TcpMesh) + Send) -> (CommError, Duration) {
    let mut ranks = ranks;
    let one = ranks.pop().unwrap();
    let zero = ranks.pop().unwrap();
    let started = Instant::now();
    let err = std::thread::scope(|s| {
        s.spawn(move || during(one));
        all_reduce_parts(&zero, &[&[1.0f32; 64]], 64, ReduceMode::Reproducible, Duration::from_secs(60)).unwrap_err()
    });
    (err, started.elapsed())
}

#[test]
fn a_peer_that_leaves_is_lost_at_once_whether_or_not_a_rank_waits_for_it() {
    let dir = ring_dir();
    // Gone before rank 0 starts.
    let (err, took) = rank0_reduce_while(meshes(&[Some(dir.path()); 2]), drop);
    assert!(matches!(err, CommError::PeerLost { peer: 1, .. }), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Gone while rank 0 waits on the ring (past its spinning, into its sleeps).
    let (err, took) = rank0_reduce_while(meshes(&[Some(dir.path()); 2]), |m| {
        std::thread::sleep(Duration::from_millis(300));
        drop(m);
    });
    assert!(matches!(err, CommError::PeerLost { peer: 1, .. }), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn an_abort_wakes_a_rank_waiting_on_a_ring_and_a_silent_peer_times_out() {
    let dir = ring_dir();
    let ranks = meshes(&[Some(dir.path()); 2]);
    let started = Instant::now();
    let err = std::thread::scope(|s| {
        let zero = &ranks[0];
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            zero.abort("the coordinator lost rank 7".into());
        });
        all_reduce_parts(zero, &[&[1.0f32; 64]], 64, ReduceMode::Fast, Duration::from_secs(60)).unwrap_err()
    });
    assert!(matches!(&err, CommError::Aborted(r) if r.contains("rank 7")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Rank 1 is alive and says nothing: rank 0 gives up at its deadline.
    let ranks = meshes(&[Some(dir.path()); 2]);
    let started = Instant::now();
    let err =
        all_reduce_parts(&ranks[0], &[&[1.0f32; 64]], 64, ReduceMode::Fast, Duration::from_millis(400)).unwrap_err();
    assert!(matches!(err, CommError::Timeout { peer: 1, .. }), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(400) && started.elapsed() < Duration::from_secs(5));
}
