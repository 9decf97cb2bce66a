//! Collectives as a matrix over world sizes, modes and transports; and the failures they
//! must survive: a rank that dies in the middle, a rank that sends garbage.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use comm::ReduceMode;
use comm::collective::{Reducer, all_reduce_parts, barrier, broadcast};
use comm::transport::{CommError, TcpConfig, TcpMesh, Transport, mem_network};
use common::{bits, meshes, mine, on_each};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Six "micro-batch gradients" with values of very different magnitudes.
fn parts(n: usize) -> Vec<Vec<f32>> {
    let mut s = repro::rng::Stream::new(11, 0);
    (0..6).map(|_| (0..n).map(|_| s.uniform_symmetric(1.0) * 2f32.powi(s.below(30) as i32 - 15)).collect()).collect()
}

/// Runs `f(rank, transport)` on every rank of a fresh in-process network.
fn on_mem<R: Send>(world: usize, f: impl Fn(usize, &dyn Transport) -> R + Sync) -> Vec<R> {
    on_each(&mem_network(world), f)
}

#[test]
fn reproducible_all_reduce_gives_the_same_bits_for_every_world_size() {
    let all = parts(1001);
    let refs: Vec<&[f32]> = all.iter().map(|p| p.as_slice()).collect();
    let single = repro::batched::sum_parts(&refs, repro::batched::DEFAULT_HEADROOM);
    for world in 1..=5 {
        let out = on_mem(world, |r, t| {
            all_reduce_parts(t, &mine(&all, r, world), 1001, ReduceMode::Reproducible, TIMEOUT).unwrap()
        });
        for o in &out {
            assert_eq!(bits(o), bits(&single), "world {world}");
        }
    }
    // More ranks than parts: some ranks contribute nothing.
    let out =
        on_mem(8, |r, t| all_reduce_parts(t, &mine(&all, r, 8), 1001, ReduceMode::Reproducible, TIMEOUT).unwrap());
    assert!(out.iter().all(|o| bits(o) == bits(&single)));
    let fps = on_mem(3, |r, t| comm::collective::all_gather_u64(t, 100 + r as u64, TIMEOUT).unwrap());
    assert!(fps.iter().all(|f| f == &vec![100, 101, 102]));
}

#[test]
fn the_32_bit_reproducible_all_reduce_matches_the_local_sum_for_every_world_size() {
    let all = parts(1001);
    let refs: Vec<&[f32]> = all.iter().map(|p| p.as_slice()).collect();
    let local = comm::sum_parts(ReduceMode::Reproducible32, &refs);
    let mut narrow = vec![0.0; 1001];
    repro::batched::sum_parts_as::<i32, _>(&refs, 7, &mut narrow, &mut Default::default());
    assert_eq!(bits(&local), bits(&narrow));
    // A different sum from the 64-bit one: it rounds every term to the largest's last place.
    let wide = repro::batched::sum_parts(&refs, repro::batched::DEFAULT_HEADROOM);
    assert_ne!(bits(&local), bits(&wide));
    for world in 1..=5 {
        let out = on_mem(world, |r, t| {
            all_reduce_parts(t, &mine(&all, r, world), 1001, ReduceMode::Reproducible32, TIMEOUT).unwrap()
        });
        for o in &out {
            assert_eq!(bits(o), bits(&local), "world {world}");
        }
    }
}

#[test]
fn a_sum_in_the_callers_integers_matches_the_local_sum_for_every_world_size_and_refuses_what_they_cannot_hold() {
    use comm::collective::FixedPoint;
    let all = parts(1001);
    let refs: Vec<&[f32]> = all.iter().map(|p| p.as_slice()).collect();
    // 32-bit lanes with 3 bits of headroom (the fewest for six parts, as PyTorch's hook
    // picks): neither mode's integers, and the local sum's bits at every world size.
    let narrow = FixedPoint { wide: false, headroom: 3 };
    let mut local = vec![0.0; 1001];
    repro::batched::sum_parts_as::<i32, _>(&refs, 3, &mut local, &mut Default::default());
    assert_ne!(bits(&local), bits(&comm::sum_parts(ReduceMode::Reproducible32, &refs)));
    for world in 1..=5 {
        let out = on_mem(world, |r, t| {
            let mut out = vec![f32::NAN; 1001];
            Reducer::default().sum_fixed(t, &mine(&all, r, world), &mut out, narrow, TIMEOUT).unwrap();
            out
        });
        assert!(out.iter().all(|o| bits(o) == bits(&local)), "world {world}");
    }
    // A mode's own integers give the mode's bits.
    let wide = FixedPoint::of(ReduceMode::Reproducible).unwrap();
    let out = on_mem(3, |r, t| {
        let mut out = vec![0.0; 1001];
        Reducer::default().sum_fixed(t, &mine(&all, r, 3), &mut out, wide, TIMEOUT).unwrap();
        out
    });
    assert!(out.iter().all(|o| bits(o) == bits(&comm::sum_parts(ReduceMode::Reproducible, &refs))));
    // Nine parts over 3 bits of headroom, refused on every rank; a headroom the lanes lack.
    let nine: Vec<&[f32]> = vec![&all[0][..]; 3];
    let out = on_mem(3, |_, t| Reducer::default().sum_fixed(t, &nine, &mut [0.0; 1001], narrow, TIMEOUT));
    assert!(out.iter().all(|o| o.as_ref().unwrap_err().to_string().contains("9 parts over 3 ranks exceed the 8")));
    let too_much = FixedPoint { wide: false, headroom: 8 };
    let out = on_mem(2, |_, t| Reducer::default().sum_fixed(t, &nine, &mut [0.0; 1001], too_much, TIMEOUT));
    assert!(out.iter().all(|o| o.as_ref().unwrap_err().to_string().contains("headroom of 8 bits in 32-bit lanes")));
}

/// The local sum of every part in `mode` (what an all-reduce of them must give).
fn local_sum(mode: ReduceMode, all: &[Vec<f32>]) -> Vec<f32> {
    let refs: Vec<&[f32]> = all.iter().map(|p| p.as_slice()).collect();
    comm::sum_parts(mode, &refs)
}

#[test]
fn one_reducer_sums_one_vector_per_rank_across_modes_sizes_and_world_sizes() {
    // `Reducer::sum` (one vector per rank, reduced in place), its buffers reused from call
    // to call as sizes and modes change; sizes below the world size leave chunks empty.
    let sizes = [1001, 2, 0, 3 * comm::collective::SEGMENT_BYTES / 8 + 7, 5];
    let modes = [ReduceMode::Reproducible, ReduceMode::Reproducible32, ReduceMode::Reproducible];
    let inputs: Vec<Vec<Vec<f32>>> = sizes.iter().map(|&n| parts(n)).collect();
    for world in 1..=4 {
        let want: Vec<Vec<Vec<f32>>> =
            inputs.iter().map(|all| modes.iter().map(|&m| local_sum(m, &all[..world])).collect()).collect();
        let run = |r: usize, t: &dyn Transport| {
            let mut reducer = Reducer::default();
            let mut got = Vec::new();
            for all in &inputs {
                for &mode in &modes {
                    let mut data = all[r].clone();
                    reducer.sum(t, &mut data, mode, TIMEOUT).unwrap();
                    got.push(data);
                }
            }
            got
        };
        for (net, out) in [("memory", on_mem(world, run)), ("tcp", on_tcp(world, run))] {
            for rank in &out {
                assert_eq!(rank.len(), sizes.len() * modes.len());
                let want = want.iter().flatten();
                for (((data, want), n), mode) in
                    rank.iter().zip(want).zip(sizes.iter().flat_map(|n| [n; 3])).zip(modes.iter().cycle())
                {
                    assert_eq!(bits(data), bits(want), "{net}, world {world}, {n} elements, {mode}");
                }
            }
        }
    }
}

/// `world` parts of `n` elements whose blocks test a sum's scales: any bit pattern of a
/// finite float (subnormals, zeros of either sign, the largest values), values that a
/// block's largest exponent leaves far behind, and in some blocks an infinity or a NaN
/// held by one rank only.
fn adversarial(n: usize, world: usize) -> Vec<Vec<f32>> {
    let mut s = repro::rng::Stream::new(5, n as u64);
    (0..world)
        .map(|_| {
            (0..n)
                .map(|_| match s.below(16) {
                    0 => f32::from_bits(s.next_u32() & 0x807F_FFFF), // a subnormal or a zero
                    1 => f32::from_bits(s.next_u32() & 0xFF7F_FFFF), // finite: exponent field at most 254
                    2 if s.below(40) == 0 => [f32::INFINITY, f32::NEG_INFINITY, f32::NAN][s.below(3) as usize],
                    _ => s.uniform_symmetric(1.0) * 2f32.powi(s.below(60) as i32 - 30),
                })
                .collect()
        })
        .collect()
}

#[test]
fn few_parts_on_every_rank_sum_at_the_chunks_owners_with_the_local_sums_bits() {
    // Ranks holding no more parts than their integers' bytes carry as floats (one in 32-bit
    // lanes, two in 64-bit) take the way of the owners' sums (comm::collective's docs);
    // the bits are the local sum's for every size (blocks and segments cut by the chunks or
    // not, chunks left empty), mode and world size, on both transports, one reducer reused
    // throughout. Rank 0 holds extra parts in some rounds: one more at 1001 elements (the
    // owners' way in 64-bit lanes, the ring's in 32-bit, after the other ranks' terms are
    // drained), two more at 65 (the ring's in both); the rounds after them find the links clean.
    let sizes = [0, 1, 63, 65, 1001, comm::collective::SEGMENT_BYTES / 2 + 4099];
    let extra_at = |n: usize| match n {
        1001 => 1,
        65 => 2,
        _ => 0,
    };
    let modes = [ReduceMode::Reproducible32, ReduceMode::Reproducible];
    for world in 2..=5 {
        let inputs: Vec<Vec<Vec<f32>>> = sizes.iter().map(|&n| adversarial(n, world + extra_at(n))).collect();
        let run = |r: usize, t: &dyn Transport| {
            let mut reducer = Reducer::default();
            let mut got = Vec::new();
            for (all, &n) in inputs.iter().zip(&sizes) {
                for &mode in &modes {
                    let mut out = vec![0.0; n];
                    let mut parts = vec![&all[r][..]];
                    if r == 0 {
                        parts.extend(all[world..].iter().map(|p| &p[..]));
                    }
                    reducer.sum_parts(t, &parts, &mut out, mode, TIMEOUT).unwrap();
                    got.push(out);
                }
            }
            got
        };
        let want: Vec<Vec<f32>> =
            inputs.iter().flat_map(|all| modes.iter().map(|&mode| local_sum(mode, all))).collect();
        for (net, out) in [("memory", on_mem(world, run)), ("tcp", on_tcp(world, run))] {
            for (rank, got) in out.iter().enumerate() {
                for (k, (got, want)) in got.iter().zip(&want).enumerate() {
                    let (n, mode) = (sizes[k / 2], modes[k % 2]);
                    assert_eq!(bits(got), bits(want), "{net}, world {world}, rank {rank}, {n} elements, {mode}");
                }
            }
        }
    }
}

#[test]
fn a_reproducible_sum_with_more_parts_than_its_integers_hold_fails_on_every_rank() {
    // 3 ranks with 50 parts each: 150 > 128 for the 32-bit sum (each rank alone is within).
    let one = [1.0f32; 10];
    let many: Vec<&[f32]> = vec![&one[..]; 50];
    let out = on_mem(3, |_, t| all_reduce_parts(t, &many, 10, ReduceMode::Reproducible32, TIMEOUT));
    for o in out {
        let err = o.unwrap_err().to_string();
        assert!(err.contains("150 parts over 3 ranks"), "{err}");
    }
    // The 64-bit sum holds them.
    let out = on_mem(3, |_, t| all_reduce_parts(t, &many, 10, ReduceMode::Reproducible, TIMEOUT).unwrap());
    assert!(out.iter().all(|o| o == &vec![150.0; 10]));
}

#[test]
fn deterministic_all_reduce_repeats_its_bits_for_a_fixed_world_size_and_differs_across_sizes() {
    let all = parts(777);
    let mut per_world = Vec::new();
    for world in [2, 3] {
        let a = on_mem(world, |r, t| {
            all_reduce_parts(t, &mine(&all, r, world), 777, ReduceMode::Deterministic, TIMEOUT).unwrap()
        });
        let b = on_mem(world, |r, t| {
            all_reduce_parts(t, &mine(&all, r, world), 777, ReduceMode::Deterministic, TIMEOUT).unwrap()
        });
        assert_eq!(a, b, "world {world}");
        assert!(a.iter().all(|o| bits(o) == bits(&a[0])), "ranks disagree at world {world}");
        per_world.push(a[0].clone());
    }
    // Float sums in another grouping round differently somewhere in 777 mixed-magnitude sums.
    assert_ne!(bits(&per_world[0]), bits(&per_world[1]));
}

#[test]
fn a_rank_that_dies_mid_all_reduce_fails_every_survivor_within_the_timeout() {
    let all = parts(100_000);
    let net = mem_network(3);
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let results: Vec<Result<Vec<f32>, CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = net
            .iter()
            .enumerate()
            .map(|(r, t)| {
                let all = &all;
                s.spawn(move || {
                    if r == 2 {
                        // Take part in the first exchange only, then die.
                        t.send(0, 1, &[0u8; 4]).ok();
                        t.kill();
                        return Err(CommError::Setup("killed".into()));
                    }
                    all_reduce_parts(t, &mine(all, r, 3), 100_000, ReduceMode::Reproducible, timeout)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    for (r, res) in results.iter().enumerate().take(2) {
        let err = res.as_ref().unwrap_err();
        assert!(
            matches!(err, CommError::PeerLost { .. } | CommError::Timeout { .. } | CommError::Protocol { .. }),
            "rank {r}: {err}"
        );
    }
}

fn tcp_config() -> TcpConfig {
    TcpConfig {
        secret: b"test-secret".to_vec(),
        max_frame: 1 << 24,
        connect_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(5),
        abort_grace: Duration::ZERO,
        shared_memory: None,
    }
}

/// A TCP mesh of `world` ranks on loopback.
fn tcp_meshes(world: usize) -> Vec<TcpMesh> {
    meshes(&vec![tcp_config(); world])
}

/// Runs `f` on every rank of a fresh TCP mesh; the meshes close once every rank returned.
fn on_tcp<R: Send>(world: usize, f: impl Fn(usize, &dyn Transport) -> R + Sync) -> Vec<R> {
    on_each(&tcp_meshes(world), f)
}

#[test]
fn tcp_mesh_all_reduce_broadcast_and_barrier_match_the_in_process_network() {
    let all = parts(50_000);
    let refs: Vec<&[f32]> = all.iter().map(|p| p.as_slice()).collect();
    let single = repro::batched::sum_parts(&refs, repro::batched::DEFAULT_HEADROOM);
    let out = on_tcp(3, |r, t| {
        barrier(t, TIMEOUT).unwrap();
        let mut msg = if r == 1 { b"from rank 1".to_vec() } else { Vec::new() };
        broadcast(t, &mut msg, 1, TIMEOUT).unwrap();
        assert_eq!(msg, b"from rank 1");
        all_reduce_parts(t, &mine(&all, r, 3), 50_000, ReduceMode::Reproducible, TIMEOUT).unwrap()
    });
    for o in out {
        assert_eq!(bits(&o), bits(&single));
    }
}

#[test]
fn tcp_peer_that_sends_garbage_or_hangs_up_is_reported_not_a_hang() {
    // The deadline is far beyond what either failure takes: expiring it would be a
    // `Timeout`, so the errors below can only come from the fault itself.
    let deadline = Duration::from_secs(30);
    // A chunk of the wrong size, then silence: rank 1 stays connected, saying nothing,
    // until rank 0 has its answer (so that the hang-up below is not what rank 0 reports).
    // Both ways a segment arrives: into a buffer and then added (the float ring), and
    // straight into its place (the reproducible one).
    for mode in [ReduceMode::Deterministic, ReduceMode::Reproducible] {
        let answered = std::sync::Barrier::new(2);
        let out = on_tcp(2, |r, t| {
            if r == 1 {
                t.send(0, 1, &[1, 2, 3]).unwrap();
                answered.wait();
                return None;
            }
            let result = all_reduce_parts(t, &[&[1.0f32; 8]], 8, mode, deadline);
            answered.wait();
            Some(result)
        });
        let err = out[0].as_ref().unwrap().as_ref().unwrap_err();
        assert!(matches!(err, CommError::Protocol { peer: 1, .. }), "{mode}: {err}");
        assert!(err.to_string().contains("bytes"), "{mode}: {err}");
    }
    // A frame of the right length but of another kind: a reproducible sum opens with
    // each rank's count of parts, 4 bytes, to every other rank.
    let answered = std::sync::Barrier::new(2);
    let out = on_tcp(2, |r, t| {
        if r == 1 {
            t.send(0, 9, &[0; 4]).unwrap();
            answered.wait();
            return None;
        }
        let result = all_reduce_parts(t, &[&[1.0f32; 8]], 8, ReduceMode::Reproducible, deadline);
        answered.wait();
        Some(result)
    });
    let err = out[0].as_ref().unwrap().as_ref().unwrap_err();
    assert!(matches!(err, CommError::Protocol { peer: 1, .. }), "{err}");
    assert!(err.to_string().contains("kind 9"), "{err}");
    // A rank that says it holds one part (kind 4, a count of 1), then sends a segment of
    // its terms (kind 5) of the wrong length: read straight into its place, refused.
    let answered = std::sync::Barrier::new(2);
    let out = on_tcp(2, |r, t| {
        if r == 1 {
            t.send(0, 4, &1u32.to_le_bytes()).unwrap();
            t.send(0, 5, &[0; 12]).unwrap();
            answered.wait();
            return None;
        }
        let result = all_reduce_parts(t, &[&[1.0f32; 200]], 200, ReduceMode::Reproducible32, deadline);
        answered.wait();
        Some(result)
    });
    let err = out[0].as_ref().unwrap().as_ref().unwrap_err();
    assert!(matches!(err, CommError::Protocol { peer: 1, .. }), "{err}");
    assert!(err.to_string().contains("bytes"), "{err}");

    // Rank 1 hangs up before rank 0 starts its all-reduce.
    let mut meshes = tcp_meshes(2);
    drop(meshes.pop());
    let started = Instant::now();
    let err = all_reduce_parts(&meshes[0], &[&[1.0f32; 8]], 8, ReduceMode::Deterministic, deadline).unwrap_err();
    assert!(matches!(err, CommError::PeerLost { peer: 1, .. }), "{err}");
    assert!(started.elapsed() < deadline, "a closed connection needs no deadline");
}

#[test]
fn a_wrong_secret_cannot_join() {
    let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
    let l1 = TcpListener::bind("127.0.0.1:0").unwrap();
    let addrs = vec![l0.local_addr().unwrap(), l1.local_addr().unwrap()];
    let mut short = tcp_config();
    short.connect_timeout = Duration::from_millis(800);
    let (addrs, short) = (&addrs, &short);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(move || TcpMesh::connect(0, l0, addrs, short).map(|_| ()));
        let mut wrong = short.clone();
        wrong.secret = b"not-the-secret".to_vec();
        let b = s.spawn(move || TcpMesh::connect(1, l1, addrs, &wrong).map(|_| ()));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
    assert!(b.unwrap_err().to_string().contains("failed to prove"), "rank 1 should name the proof failure");
}

#[test]
fn the_commit_vote_refuses_a_step_on_every_rank_if_one_rank_disagrees_or_vetoes() {
    use comm::commit::{Ballot, Decision, vote};
    for world in 1..=4 {
        let out =
            on_mem(world, |r, t| vote(t, Ballot { ok: true, digest: 42, durable: 10 + r as u64 }, TIMEOUT).unwrap());
        for (decision, ballots) in &out {
            assert_eq!(*decision, Decision::Commit);
            assert_eq!(comm::commit::durable_everywhere(ballots), 10);
        }
    }
    // Rank 2's sum differs (a corrupted buffer); rank 0 found a non-finite gradient.
    let out = on_mem(4, |r, t| {
        let digest = if r == 2 { 43 } else { 42 };
        vote(t, Ballot { ok: r != 0, digest, durable: 0 }, TIMEOUT).unwrap().0
    });
    for d in out {
        assert_eq!(d, Decision::Abort { vetoed: vec![0], disagreeing: vec![2] });
    }
}

/// The id of the calling thread, as /proc/self/task names it (None without a Linux /proc).
fn thread_id() -> Option<String> {
    Some(std::fs::read_link("/proc/thread-self").ok()?.file_name()?.to_string_lossy().into_owned())
}

/// Waits until thread `tid` of this process sleeps in the kernel (state `S`), that is,
/// until it is blocked in a system call. A thread that said it is about to receive, and
/// takes no lock that anyone else holds on the way, is then blocked in its socket read.
fn wait_until_asleep(tid: &str, deadline: Instant) {
    let path = format!("/proc/self/task/{tid}/stat");
    loop {
        let stat = std::fs::read_to_string(&path).unwrap();
        // The state follows the command name, which is in parentheses and may hold spaces.
        if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S')) {
            return;
        }
        assert!(Instant::now() < deadline, "thread {tid} never blocked: {stat}");
        std::thread::yield_now();
    }
}

#[test]
fn an_aborted_mesh_fails_a_blocked_receive_at_once_with_the_reason() {
    let meshes = tcp_meshes(2);
    let started = Instant::now();
    let (about_to_receive, receiving) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let blocked = s.spawn(|| {
            about_to_receive.send(thread_id()).unwrap();
            meshes[0].recv(1, Instant::now() + Duration::from_secs(60))
        });
        // Abort once the receive is blocked in the kernel. (Without a Linux /proc to tell,
        // it may not be yet: an abort before the receive starts fails it the same way.)
        if let Some(tid) = receiving.recv_timeout(Duration::from_secs(30)).unwrap() {
            wait_until_asleep(&tid, Instant::now() + Duration::from_secs(30));
        }
        meshes[0].abort("rank 1 was lost: test".into());
        let err = blocked.join().unwrap().unwrap_err();
        assert!(matches!(&err, CommError::Aborted(r) if r == "rank 1 was lost: test"), "{err}");
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    // Later calls fail the same way, without touching the sockets.
    assert!(matches!(meshes[0].send(1, 1, b"x"), Err(CommError::Aborted(_))));
}

#[test]
fn float_sums_of_parts_equal_the_local_sum_then_the_ring_bit_for_bit() {
    // `sum_parts` in the float modes computes each rank's sum of its parts where the ring
    // needs it; the bits must be those of the local sum first and the ring after it (the
    // in-place `sum`), whatever the parts per rank and the message's segments and blocks
    // (a segment of more than one block sums them on the rayon pool where it has
    // several threads, a smaller one on the rank's own).
    let sizes = [1, 7, 3 * repro::batched::PAR_BLOCK + 5, 3 * comm::collective::SEGMENT_BYTES / 4 + 12_345];
    for n in sizes {
        let all = parts(n);
        for world in [2, 3, 4] {
            for mode in [ReduceMode::Fast, ReduceMode::Deterministic] {
                let run = |r: usize, t: &dyn Transport| {
                    let mine = mine(&all, r, world);
                    let mut reducer = Reducer::default();
                    let mut fused = vec![f32::NAN; n];
                    reducer.sum_parts(t, &mine, &mut fused, mode, TIMEOUT).unwrap();
                    let mut apart = comm::sum_parts(mode, &mine);
                    reducer.sum(t, &mut apart, mode, TIMEOUT).unwrap();
                    (fused, apart)
                };
                let mut out = on_mem(world, run);
                out.extend(on_tcp(world, run));
                for (fused, apart) in &out {
                    assert_eq!(bits(fused), bits(apart), "{n} elements, world {world}, {mode}");
                    assert_eq!(bits(fused), bits(&out[0].0), "every rank and run holds the same sum");
                }
            }
        }
    }
}

#[test]
fn messages_of_many_segments_reduce_exactly_as_small_ones() {
    // Chunks of several segments, with lengths that do not divide evenly.
    let n = 3 * comm::collective::SEGMENT_BYTES / 4 + 12_345;
    let all = parts(n);
    let refs: Vec<&[f32]> = all.iter().map(|p| p.as_slice()).collect();
    let single = repro::batched::sum_parts(&refs, repro::batched::DEFAULT_HEADROOM);
    for world in [2, 3] {
        let run = |r: usize, t: &dyn Transport| {
            let repro = all_reduce_parts(t, &mine(&all, r, world), n, ReduceMode::Reproducible, TIMEOUT).unwrap();
            let det = all_reduce_parts(t, &mine(&all, r, world), n, ReduceMode::Deterministic, TIMEOUT).unwrap();
            (repro, det)
        };
        // In memory every segment arrives as a frame and is copied into place; over TCP
        // the all-gathers and the reproducible reduce-scatters read them straight into it.
        let mut out = on_mem(world, run);
        out.extend(on_tcp(world, run));
        for (repro, det) in &out {
            assert_eq!(bits(repro), bits(&single), "world {world}");
            assert_eq!(bits(det), bits(&out[0].1), "every rank holds the same deterministic sum");
            for (i, (a, b)) in det.iter().zip(&single).enumerate() {
                let exact: f64 = all.iter().map(|p| f64::from(p[i])).sum();
                // A float sum of six terms errs by at most 6 ulps of the sum of magnitudes.
                let magnitude: f64 = all.iter().map(|p| f64::from(p[i].abs())).sum();
                let float_bound = 6.0 * f64::from(f32::EPSILON) * magnitude;
                assert!((f64::from(*a) - exact).abs() <= float_bound, "element {i}: {a} vs {exact}");
                // The reproducible sum: six truncations at 2^-46 of the block's largest
                // magnitude, and the final rounding.
                let block = i / repro::batched::EXP_BLOCK * repro::batched::EXP_BLOCK;
                let largest = all
                    .iter()
                    .flat_map(|p| &p[block..(block + repro::batched::EXP_BLOCK).min(n)])
                    .fold(0.0f64, |m, x| m.max(f64::from(x.abs())));
                let repro_bound = 6.0 * 2f64.powi(-46) * largest + 2f64.powi(-24) * f64::from(b.abs());
                assert!((f64::from(*b) - exact).abs() <= repro_bound, "element {i}: {b} vs {exact}");
            }
        }
    }
}
