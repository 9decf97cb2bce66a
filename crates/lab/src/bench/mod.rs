//! Measurements that the scripts under `bench/` drive and compare with peers (`steadfast
//! bench`): checkpoint cost and all-reduce bandwidth. Each yields JSON rows, one per
//! configuration; the scripts put them side by side with the peers' figures.

pub mod collective;

use std::time::{Duration, Instant};

use serde_json::json;

use crate::LabError;

/// Flushes dirty pages and empties the page cache.
fn drop_caches() -> Result<(), LabError> {
    std::process::Command::new("sync").status().map_err(io("cannot run sync"))?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(io("cannot drop the page cache (root needed)"))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A state of `bytes` bytes in `n` f32 tensors of varied sizes, with non-repeating content.
fn make_state(bytes: u64, n: usize) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let weights: Vec<u64> = (0..n as u64).map(|i| i % 4 + 1).collect();
    let total_w: u64 = weights.iter().sum();
    let elements = bytes / 4;
    let mut out = Vec::with_capacity(n);
    let mut assigned = 0u64;
    for (i, w) in weights.iter().enumerate() {
        let len = if i + 1 == n { elements - assigned } else { elements * w / total_w };
        assigned += len;
        let data: Vec<f32> =
            (0..len).map(|j| ((j as u32 ^ i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 * 1e-7).collect();
        let role = if i % 3 == 0 { "model" } else { "optim" };
        out.push((format!("{role}.t{i:02}"), vec![len as usize], data));
    }
    out
}

/// What [`ckpt`] measures.
#[derive(Clone, Debug)]
pub struct CkptBench {
    /// Scratch directory (on the disk to measure); the last checkpoint of each size is
    /// left in `<dir>/<mb>mb` for peers to read.
    pub dir: std::path::PathBuf,
    /// State sizes in MB (10^6 bytes).
    pub mb: Vec<u64>,
    /// Shard counts to try.
    pub shards: Vec<usize>,
    /// Tensors the state is split into.
    pub tensors: usize,
    /// Repetitions per measurement (the median is reported).
    pub repeats: usize,
    /// Drop the page cache before each load, so loads read from the disk (needs root).
    pub drop_caches: bool,
}

/// Checkpoint persist bandwidth, training stall (against a plain copy of the same bytes)
/// and load time, per state size and shard count: one JSON row each, handed to `row` as
/// it is measured.
pub fn ckpt(b: &CkptBench, row: &mut dyn FnMut(serde_json::Value)) -> Result<(), LabError> {
    let repeats = b.repeats.max(1);
    for &mb in &b.mb {
        let bytes = mb * 1_000_000;
        let state = make_state(bytes, b.tensors.max(1));
        let refs: Vec<ckpt::TensorRef<'_>> = state
            .iter()
            .map(|(name, shape, data)| ckpt::TensorRef {
                name,
                role: ckpt::Role::of_name(name).unwrap_or(ckpt::Role::Model),
                shape,
                data,
            })
            .collect();

        // The floor for a snapshot: copying the same bytes into buffers that exist already.
        let mut dst: Vec<Vec<f32>> = state.iter().map(|(_, _, d)| vec![0.0; d.len()]).collect();
        let memcpy = median(
            (0..repeats)
                .map(|_| {
                    let t = Instant::now();
                    for (d, (_, _, s)) in dst.iter_mut().zip(&state) {
                        d.copy_from_slice(s);
                    }
                    t.elapsed()
                })
                .collect(),
        );
        drop(dst);

        for &shards in &b.shards {
            let root = b.dir.join(format!("{mb}mb"));
            if root.exists() {
                std::fs::remove_dir_all(&root).map_err(LabError::output(&root))?;
            }
            let options =
                ckpt::SaveOptions { shards, retention: ckpt::Retention { keep_last: Some(1), keep_every: None } };
            let mut saves = Vec::new();
            for step in 1..=repeats as u64 {
                let meta = ckpt::Meta { step, ..ckpt::Meta::default() };
                let t = Instant::now();
                ckpt::store::save(&root, &meta, &refs, &options)?;
                saves.push(t.elapsed());
            }
            let save = median(saves);

            // Two-phase: time only the snapshot (no persist in flight: each is waited for).
            let mut writer = ckpt::AsyncWriter::new(&root, options)?;
            let mut stalls = Vec::new();
            for step in 0..=repeats as u64 {
                let meta = ckpt::Meta { step: 1000 + step, ..ckpt::Meta::default() };
                let stall = writer.snapshot(meta, &refs)?;
                writer.finish()?;
                if step > 0 {
                    stalls.push(stall); // the first snapshot also allocates its buffers
                }
            }
            let stall = median(stalls);
            drop(writer);

            let dir = ckpt::reader::resolve(&root)?;
            let mut loads = Vec::new();
            for _ in 0..repeats {
                if b.drop_caches {
                    drop_caches()?;
                }
                let t = Instant::now();
                let c = ckpt::reader::open(&dir)?;
                let tensors = c.load()?;
                loads.push(t.elapsed());
                drop(tensors);
            }
            let load = median(loads);
            let mbps = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
            row(json!({
                    "mb": mb, "shards": shards, "tensors": state.len(), "repeats": repeats,
                    "save_seconds": save.as_secs_f64(), "save_mb_per_s": mbps(save),
                    "snapshot_stall_seconds": stall.as_secs_f64(), "memcpy_seconds": memcpy.as_secs_f64(),
                    "stall_over_memcpy": stall.as_secs_f64() / memcpy.as_secs_f64(),
                    "load_seconds": load.as_secs_f64(), "load_mb_per_s": mbps(load), "cold_load": b.drop_caches,
                    "checkpoint": dir,
            }));
        }
    }
    Ok(())
}

/// One-way loopback TCP bandwidth: one thread streams `bytes` in 4 MiB frames to another.
fn loopback_mb_per_s(bytes: usize) -> Result<f64, LabError> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("cannot listen"))?;
    let addr = listener.local_addr().map_err(io("cannot listen"))?;
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 22];
        let mut left = bytes;
        while left > 0 {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            left -= n.min(left);
        }
        s.write_all(b"k")
    });
    let stream = || -> std::io::Result<(std::net::TcpStream, f64)> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let chunk = vec![7u8; 1 << 22];
        let t = Instant::now();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n])?;
            left -= n;
        }
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack)?;
        Ok((s, t.elapsed().as_secs_f64()))
    };
    let (_, secs) = stream().map_err(io("loopback stream"))?;
    reader
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the reader panicked")))
        .map_err(io("loopback stream"))?;
    Ok(bytes as f64 / 1e6 / secs)
}

/// Per-stream bandwidth of a ring of `world` raw loopback TCP streams all busy at once:
/// each rank sends `bytes` to its right neighbour while receiving as much from its left,
/// as every rank does in a ring all-reduce step. On a machine with fewer cores than
/// streams this, not the single-stream figure, bounds the bus bandwidth.
fn ring_loopback_mb_per_s(world: usize, bytes: usize) -> Result<f64, LabError> {
    ring_streams(world, bytes).map_err(io("loopback ring"))
}

fn ring_streams(world: usize, bytes: usize) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    let listeners: Vec<std::net::TcpListener> =
        (0..world).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?;
    // Rank r connects to its right neighbour and accepts from its left one.
    let outs: Vec<std::net::TcpStream> =
        (0..world).map(|r| std::net::TcpStream::connect(addrs[(r + 1) % world])).collect::<Result<_, _>>()?;
    let ins: Vec<std::net::TcpStream> =
        listeners.iter().map(|l| l.accept().map(|(s, _)| s)).collect::<Result<_, _>>()?;
    let barrier = std::sync::Barrier::new(2 * world);
    let t = std::sync::Mutex::new(None::<Instant>);
    let times: Vec<std::io::Result<Duration>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (mut out, mut inp) in outs.into_iter().zip(ins) {
            let (barrier, t) = (&barrier, &t);
            hs.push(s.spawn(move || -> std::io::Result<Duration> {
                out.set_nodelay(true)?;
                let chunk = vec![7u8; 1 << 20];
                barrier.wait();
                let started = *t.lock().expect("clock").get_or_insert_with(Instant::now);
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len());
                    out.write_all(&chunk[..n])?;
                    left -= n;
                }
                Ok(started.elapsed())
            }));
            hs.push(s.spawn(move || -> std::io::Result<Duration> {
                let mut buf = vec![0u8; 1 << 20];
                barrier.wait();
                let started = *t.lock().expect("clock").get_or_insert_with(Instant::now);
                let mut left = bytes;
                while left > 0 {
                    let n = inp.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    left -= n.min(left);
                }
                Ok(started.elapsed())
            }));
        }
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")))).collect()
    });
    let mut slowest = Duration::ZERO;
    for d in times {
        slowest = slowest.max(d?);
    }
    Ok(bytes as f64 / 1e6 / slowest.as_secs_f64())
}

/// What [`allreduce`] measures.
#[derive(Clone, Debug)]
pub struct AllreduceBench {
    /// Ranks (threads of this process, each with its own TCP mesh).
    pub world: usize,
    /// Message sizes in MB (10^6 bytes of f32).
    pub mb: Vec<u64>,
    /// Repetitions per size (the median is reported).
    pub repeats: usize,
    /// The reduce modes timed, taking turns repetition by repetition.
    pub modes: Vec<comm::ReduceMode>,
}

/// All-reduce bus bandwidth over loopback TCP in each of `b.modes` (each named once),
/// against the loopback's own bandwidth (one stream, and a ring of streams all busy at
/// once), with the CPU time each mode takes: one JSON row per message size.
pub fn allreduce(b: &AllreduceBench) -> Result<Vec<serde_json::Value>, LabError> {
    let world = b.world.max(2);
    let mut modes: Vec<comm::ReduceMode> = Vec::new();
    for &m in &b.modes {
        if !modes.contains(&m) {
            modes.push(m);
        }
    }
    let modes = &modes;
    let per_second = |f: &dyn Fn() -> Result<f64, LabError>| -> Result<f64, LabError> {
        let times =
            (0..3).map(|_| f().map(|mbps| Duration::from_secs_f64(1.0 / mbps))).collect::<Result<_, LabError>>()?;
        Ok(1.0 / median(times).as_secs_f64())
    };
    let loopback_mbps = per_second(&|| loopback_mb_per_s(256 << 20))?;
    let ring_mbps = per_second(&|| ring_loopback_mb_per_s(world, 128 << 20))?;
    let listeners: Vec<std::net::TcpListener> = (0..world)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(io("cannot listen"))?;
    let addrs: Vec<_> =
        listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>().map_err(io("cannot listen"))?;
    let config = comm::transport::TcpConfig {
        secret: b"bench".to_vec(),
        max_frame: comm::frame::DEFAULT_MAX_FRAME,
        connect_timeout: Duration::from_secs(30),
        write_timeout: Duration::from_secs(60),
        abort_grace: Duration::ZERO,
        shared_memory: comm::local::default_dir(),
    };
    let timeout = Duration::from_secs(120);
    let results: Vec<Result<Vec<serde_json::Value>, comm::transport::CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let (addrs, config) = (&addrs, &config);
                s.spawn(move || -> Result<Vec<serde_json::Value>, comm::transport::CommError> {
                    // Each rank works on one thread, as each process of a job with a rank
                    // per core does: otherwise the ranks' local sums would all queue on
                    // one shared pool.
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(1)
                        .build()
                        .map_err(|e| comm::transport::CommError::Setup(format!("cannot start a rank's pool: {e}")))?;
                    pool.install(|| -> Result<Vec<serde_json::Value>, comm::transport::CommError> {
                        let mesh = comm::transport::TcpMesh::connect(rank, l, addrs, config)?;
                        let mut reducer = comm::collective::Reducer::default();
                        let mut rows = Vec::new();
                        for &mb in &b.mb {
                            let n = (mb * 1_000_000 / 4) as usize;
                            let data: Vec<f32> = (0..n).map(|i| ((i * (rank + 1)) % 1000) as f32 * 1e-3).collect();
                            let mut out = vec![0f32; n];
                            let mut row = json!({
                                "world": world, "mb": mb, "loopback_mb_per_s": loopback_mbps,
                                "ring_loopback_mb_per_s": ring_mbps,
                            });
                            // The modes take turns, repetition by repetition, so that a slow
                            // spell of this noisy machine falls on all of them alike.
                            let mut times = vec![Vec::new(); modes.len()];
                            let mut cpu = vec![Vec::new(); modes.len()];
                            let mut spans = vec![Vec::new(); modes.len()];
                            for _ in 0..b.repeats.max(1) {
                                for (k, mode) in modes.iter().enumerate() {
                                    comm::collective::barrier(&mesh, timeout)?;
                                    let (t, c) = (Instant::now(), process_cpu());
                                    // As a training step sums its gradient: the rank's part
                                    // read, the sum written beside it.
                                    reducer.sum_parts(&mesh, &[&data[..]], &mut out, *mode, timeout)?;
                                    times[k].push(t.elapsed());
                                    // Every rank's CPU time (they are threads of this process),
                                    // once all of them are done, over the wall time of the same
                                    // span.
                                    comm::collective::barrier(&mesh, timeout)?;
                                    cpu[k].push(process_cpu().saturating_sub(c));
                                    spans[k].push(t.elapsed());
                                }
                            }
                            for (k, mode) in modes.iter().enumerate() {
                                let (cpu, span) = (median(cpu[k].clone()), median(spans[k].clone()));
                                row[format!("{mode}_cpu_seconds")] = json!(cpu.as_secs_f64());
                                row[format!("{mode}_cores_busy")] = json!(cpu.as_secs_f64() / span.as_secs_f64());
                                let times = times[k].clone();
                                let secs = median(times).as_secs_f64();
                                // Bus bandwidth as NCCL defines it: 2(W-1)/W of the message per second.
                                let bus = 2.0 * (world as f64 - 1.0) / world as f64 * (mb as f64) / secs;
                                row[format!("{mode}_seconds")] = json!(secs);
                                row[format!("{mode}_bus_mb_per_s")] = json!(bus);
                            }
                            rows.push(row);
                        }
                        Ok(rows)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(comm::transport::CommError::Setup("a rank panicked".into()))))
            .collect()
    });
    let mut results = results.into_iter();
    let rows = results.next().expect("at least two ranks").map_err(bench_err)?;
    for r in results {
        r.map_err(bench_err)?;
    }
    Ok(rows)
}

/// CPU time of this whole process (every thread, user and system) so far.
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn bench_err(e: comm::transport::CommError) -> LabError {
    LabError::Bench(format!("all-reduce: {e}"))
}

/// Wraps an I/O error of a measurement.
fn io(what: &'static str) -> impl Fn(std::io::Error) -> LabError {
    move |e| LabError::Bench(format!("{what}: {e}"))
}

/// What [`transfer`] measures.
#[derive(Clone, Debug)]
pub struct TransferBench {
    /// State sizes in MB (10^6 bytes of f32).
    pub mb: Vec<u64>,
    /// Numbers of sources to fetch from at once.
    pub sources: Vec<usize>,
    /// Repetitions per configuration (the median is reported).
    pub repeats: usize,
}

/// State transfer throughput ([`comm::transfer`], over authenticated loopback TCP through
/// each worker's [`Port`](comm::port::Port)) from 1..N sources into one fetcher, against
/// the loopback's one-stream bandwidth measured by the same run: one JSON row per size and
/// number of sources. Every fetch is checked: the fetched state equals the sources'.
pub fn transfer(b: &TransferBench) -> Result<Vec<serde_json::Value>, LabError> {
    use std::sync::Arc;

    let err = |e: comm::transport::CommError| LabError::Bench(format!("transfer: {e}"));
    let loopback_mbps = {
        let times = (0..3)
            .map(|_| loopback_mb_per_s(256 << 20).map(|mbps| Duration::from_secs_f64(1.0 / mbps)))
            .collect::<Result<_, LabError>>()?;
        1.0 / median(times).as_secs_f64()
    };
    let secret = b"bench".to_vec();
    let most = b.sources.iter().copied().max().unwrap_or(1).max(1);
    let mut rows = Vec::new();
    for &mb in &b.mb {
        let n = (mb * 1_000_000 / 4) as usize;
        let state: Arc<Vec<f32>> = Arc::new((0..n).map(|i| (i % 4093) as f32 * 0.25).collect());
        let want = comm::transfer::Want { step: 7, fingerprint: 0x5eed, layout: 1, elements: n as u64 };
        // The sources: a port each, serving the one shared state.
        let mut addrs = Vec::new();
        let mut ports = Vec::new();
        for id in 1..=most as u32 {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("cannot listen"))?;
            let mut port = comm::port::Port::open(listener, &secret, id).map_err(err)?;
            addrs.push((id, port.addr()));
            let incoming = port.transfers().expect("fresh port");
            let state = Arc::clone(&state);
            std::thread::spawn(move || {
                while let Ok((_, stream)) = incoming.recv() {
                    let state = Arc::clone(&state);
                    std::thread::spawn(move || {
                        comm::transfer::serve(stream, Duration::from_secs(60), &mut |w, range, out| {
                            if *w != want {
                                return Err("another state".into());
                            }
                            out.extend_from_slice(bytemuck::cast_slice(&state[range]));
                            Ok(7)
                        })
                    });
                }
            });
            ports.push(port);
        }
        let fetcher = comm::port::Port::open(
            std::net::TcpListener::bind("127.0.0.1:0").map_err(io("cannot listen"))?,
            &secret,
            0,
        )
        .map_err(err)?;
        let dialer = fetcher.dialer();
        let mut into = vec![0f32; n];
        for &count in &b.sources {
            let mut times = Vec::new();
            for _ in 0..b.repeats.max(1) {
                into.fill(0.0);
                let deadline = Instant::now() + Duration::from_secs(60);
                let connect = |peer, addr| dialer.transfer(peer, addr, deadline);
                let fetched = comm::transfer::fetch(
                    &addrs[..count.clamp(1, most)],
                    &connect,
                    &want,
                    Duration::from_secs(60),
                    &mut |range, bytes| {
                        for (d, s) in into[range].iter_mut().zip(bytes.chunks_exact(4)) {
                            *d = f32::from_le_bytes(s.try_into().expect("4 bytes"));
                        }
                    },
                )
                .map_err(err)?;
                if into != *state {
                    return Err(LabError::Bench("the fetched state differs from the sources'".into()));
                }
                times.push(fetched.elapsed);
            }
            let secs = median(times).as_secs_f64();
            rows.push(json!({
                "mb": mb, "sources": count, "seconds": secs, "mb_per_s": mb as f64 / secs,
                "loopback_mb_per_s": loopback_mbps,
            }));
        }
        drop(ports);
    }
    Ok(rows)
}
