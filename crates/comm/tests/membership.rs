//! Membership over real sockets: the coordinator's supervisor and the workers' heartbeats.
//! A worker that drops its connection, or goes silent, is reported to every survivor; a
//! silent coordinator is noticed by the workers.

use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use comm::membership::LossReason;
use comm::rendezvous::{join, serve};
use comm::supervisor::{Heartbeat, Notice, supervise};

const SECRET: &[u8] = b"membership-test";
const HEARTBEAT: Duration = Duration::from_millis(400);

/// Forms a job of `world` workers on loopback; returns the coordinator's supervision
/// thread (its result: the lost ranks) and each worker's coordinator connection.
type Supervisor = std::thread::JoinHandle<Vec<(usize, LossReason)>>;

fn form(world: usize) -> (Supervisor, mpsc::Receiver<String>, Vec<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let coordinator = listener.local_addr().unwrap();
    let (events_tx, events) = mpsc::channel();
    let supervisor = std::thread::spawn(move || {
        let job = serve(&listener, world, SECRET, Duration::from_secs(10), HEARTBEAT).unwrap();
        supervise(job.streams, HEARTBEAT, &mut |e| events_tx.send(e.to_string()).unwrap()).lost()
    });
    let workers: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let me = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
                let joined = join(coordinator, rank, me, SECRET, Duration::from_secs(10)).unwrap();
                assert_eq!(joined.table.len(), world);
                assert_eq!(joined.heartbeat_timeout, HEARTBEAT);
                joined.coordinator
            })
        })
        .collect();
    let streams = workers.into_iter().map(|w| w.join().unwrap()).collect();
    (supervisor, events, streams)
}

fn start(stream: TcpStream) -> (Heartbeat, mpsc::Receiver<Notice>) {
    let (tx, rx) = mpsc::channel();
    let hb = Heartbeat::start(stream, HEARTBEAT, move |n| {
        let _ = tx.send(n);
    })
    .unwrap();
    (hb, rx)
}

#[test]
fn healthy_workers_that_finish_leave_no_loss() {
    let (supervisor, events, streams) = form(3);
    let beats: Vec<_> = streams.into_iter().map(start).collect();
    // Several heartbeat timeouts pass with nothing to report.
    std::thread::sleep(HEARTBEAT * 3);
    for (hb, notices) in beats {
        assert!(notices.try_recv().is_err());
        hb.finish();
    }
    assert!(supervisor.join().unwrap().is_empty());
    assert!(events.try_recv().is_err());
}

#[test]
fn a_worker_that_drops_its_connection_is_reported_to_every_survivor() {
    let (supervisor, _events, streams) = form(3);
    let mut beats: Vec<_> = streams.into_iter().map(start).collect();
    let started = Instant::now();
    let (dead, _) = beats.remove(1);
    drop(dead); // no goodbye: as a crashed process
    for (_, notices) in &beats {
        let n = notices.recv_timeout(Duration::from_secs(5)).expect("a notice");
        assert_eq!(n, Notice::PeerLost { rank: 1, reason: LossReason::Disconnected.to_string() });
    }
    assert!(started.elapsed() < HEARTBEAT, "a closed connection needs no timeout: {:?}", started.elapsed());
    for (hb, _) in beats {
        hb.finish();
    }
    assert_eq!(supervisor.join().unwrap(), vec![(1, LossReason::Disconnected)]);
}

#[test]
fn a_silent_worker_is_lost_after_the_heartbeat_timeout() {
    let (supervisor, events, mut streams) = form(3);
    // Rank 2 keeps its connection open but never pings: a stopped process.
    let silent = streams.pop().unwrap();
    let beats: Vec<_> = streams.into_iter().map(start).collect();
    let started = Instant::now();
    for (_, notices) in &beats {
        match notices.recv_timeout(Duration::from_secs(10)).expect("a notice") {
            Notice::PeerLost { rank: 2, reason } => assert!(reason.starts_with("no heartbeat for"), "{reason}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let waited = started.elapsed();
    assert!(waited >= HEARTBEAT && waited < HEARTBEAT * 4, "{waited:?}");
    assert!(events.recv().unwrap().starts_with("rank 2 lost: no heartbeat"));
    for (hb, _) in beats {
        hb.finish();
    }
    drop(silent);
    let lost = supervisor.join().unwrap();
    assert_eq!(lost.len(), 1);
    assert!(matches!(lost[0], (2, LossReason::Silent(_))));
}

#[test]
fn a_silent_coordinator_is_noticed_by_the_worker() {
    // A "coordinator" that accepts and then says nothing.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let _held = listener.accept().unwrap();
    let started = Instant::now();
    let (_hb, notices) = start(stream);
    let n = notices.recv_timeout(Duration::from_secs(10)).expect("a notice");
    assert!(matches!(n, Notice::CoordinatorLost(_)), "{n:?}");
    assert!(started.elapsed() >= HEARTBEAT);
}
