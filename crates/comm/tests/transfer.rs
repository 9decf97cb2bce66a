//! State transfer from several live replicas: every chunk arrives, checked, even when a
//! source refuses (it holds another state) or dies part-way.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use comm::port::Port;
use comm::transfer::{CHUNK_ELEMENTS, Want, chunk_for, fetch, serve};

const SECRET: &[u8] = b"transfer-test";

/// A source worker `id` serving `state` as step `step`; it closes every connection after
/// `serve_at_most` chunks (a source that dies part-way), and then raises `died`. With
/// `after`, it serves nothing until that flag is raised (by another source's death).
fn source(
    id: u32,
    state: Arc<Vec<f32>>,
    step: u64,
    serve_at_most: u64,
    died: Arc<AtomicBool>,
    after: Option<Arc<AtomicBool>>,
) -> Port {
    let mut port = Port::open(TcpListener::bind("127.0.0.1:0").unwrap(), SECRET, id).unwrap();
    let incoming = port.transfers().unwrap();
    std::thread::spawn(move || {
        while let Ok((_, stream)) = incoming.recv() {
            let (state, died, after) = (Arc::clone(&state), Arc::clone(&died), after.clone());
            std::thread::spawn(move || {
                let served = AtomicU64::new(0);
                let wake = stream.try_clone().unwrap();
                serve(stream, Duration::from_secs(10), &mut |want, range, out| {
                    if want.step != step {
                        return Err(format!("holds step {step}"));
                    }
                    let waiting = Instant::now();
                    while after.as_ref().is_some_and(|a| !a.load(Ordering::Acquire))
                        && waiting.elapsed() < Duration::from_secs(10)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if served.fetch_add(1, Ordering::Relaxed) >= serve_at_most {
                        let _ = wake.shutdown(std::net::Shutdown::Both);
                        died.store(true, Ordering::Release);
                        return Err("dying".into());
                    }
                    out.extend_from_slice(bytemuck::cast_slice(&state[range]));
                    Ok(step)
                });
            });
        }
    });
    port
}

#[test]
fn a_state_of_the_largest_chunks_arrives_whole_though_one_source_refuses_and_one_dies() {
    // Enough elements that chunks reach their largest size.
    let n = 17 * CHUNK_ELEMENTS + 123;
    assert_eq!(chunk_for(n as u64), CHUNK_ELEMENTS);
    let state: Arc<Vec<f32>> = Arc::new((0..n).map(|i| i as f32 * 0.5).collect());
    // The healthy source waits for the dying one's death, so that the dying one is asked
    // for a third chunk whatever the scheduling, and that chunk must be fetched again.
    let death = Arc::new(AtomicBool::new(false));
    let healthy = source(1, Arc::clone(&state), 9, u64::MAX, Arc::default(), Some(Arc::clone(&death)));
    let stale = source(2, Arc::clone(&state), 8, u64::MAX, Arc::default(), None);
    let dying = source(3, Arc::clone(&state), 9, 2, death, None);
    let fetcher = Port::open(TcpListener::bind("127.0.0.1:0").unwrap(), SECRET, 0).unwrap();
    let dialer = fetcher.dialer();
    let deadline = Instant::now() + Duration::from_secs(30);
    let connect = |peer, addr| dialer.transfer(peer, addr, deadline);
    let want = Want { step: 9, fingerprint: 1, layout: 2, elements: n as u64 };
    let mut into = vec![0f32; n];
    let mut seen = vec![false; n];
    let sources = [(1, healthy.addr()), (2, stale.addr()), (3, dying.addr())];
    let fetched = fetch(&sources, &connect, &want, Duration::from_secs(30), &mut |range, bytes| {
        for (i, b) in range.zip(bytes.chunks_exact(4)) {
            assert!(!seen[i], "element {i} arrived twice");
            seen[i] = true;
            into[i] = f32::from_le_bytes(b.try_into().unwrap());
        }
    })
    .unwrap();
    assert!(seen.iter().all(|&s| s));
    assert_eq!(into, *state);
    assert_eq!(fetched.updates, 9);
    assert_eq!(fetched.bytes, 4 * n as u64);
    let by_source: Vec<u64> = fetched.chunks.iter().map(|&(_, c)| c).collect();
    assert_eq!(by_source[1], 0, "the stale source gave nothing");
    assert!(by_source[2] <= 2, "the dying source gave at most its two chunks: {by_source:?}");
    assert!(fetched.retried >= 2, "both failures were retried elsewhere: {fetched:?}");
}

#[test]
fn a_fetch_that_no_source_can_serve_fails_naming_each() {
    let state: Arc<Vec<f32>> = Arc::new(vec![1.0; 10_000]);
    let stale = source(2, Arc::clone(&state), 8, u64::MAX, Arc::default(), None);
    let fetcher = Port::open(TcpListener::bind("127.0.0.1:0").unwrap(), SECRET, 0).unwrap();
    let dialer = fetcher.dialer();
    let deadline = Instant::now() + Duration::from_secs(10);
    let connect = |peer, addr| dialer.transfer(peer, addr, deadline);
    let want = Want { step: 9, fingerprint: 1, layout: 2, elements: 10_000 };
    let e = fetch(&[(2, stale.addr())], &connect, &want, Duration::from_secs(10), &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("worker 2: refused: holds step 8"), "{e}");
}
