//! Membership over real sockets: the coordinator's supervisor and the workers' heartbeats.
//! A worker that drops its connection, or goes silent, is reported to every survivor; a
//! silent coordinator is noticed by the workers.

use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use comm::membership::LossReason;
use comm::rendezvous::{join, serve};
use comm::supervisor::{Heartbeat, Notice, supervise};

const SECRET: &[u8] = b"membership-test";
/// The heartbeat timeout of the tests that wait for it, or for its absence: long enough
/// that a healthy worker's pings (four per timeout) are not held up past it by a busy
/// machine, short enough to keep the tests quick.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A heartbeat timeout that no test reaches: what happens within it did not come from it.
const NEVER: Duration = Duration::from_secs(120);

/// The coordinator's supervision thread; its result: the lost ranks.
type Supervisor = std::thread::JoinHandle<Vec<(usize, LossReason)>>;

/// A job formed on loopback.
struct Job {
    supervisor: Supervisor,
    /// The supervisor's events, as text.
    events: mpsc::Receiver<String>,
    /// Each worker's connection to the coordinator, by rank.
    streams: Vec<TcpStream>,
    /// The listeners whose addresses the workers announced, held for the whole test.
    _announced: Vec<TcpListener>,
}

/// Forms a job of `world` workers, supervised with `heartbeat` as the timeout.
fn form(world: usize, heartbeat: Duration) -> Job {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let coordinator = listener.local_addr().unwrap();
    let (events_tx, events) = mpsc::channel();
    let supervisor = std::thread::spawn(move || {
        let job = serve(&listener, world, SECRET, Duration::from_secs(30), heartbeat).unwrap();
        supervise(job.streams, heartbeat, &mut |e| events_tx.send(e.to_string()).unwrap()).lost()
    });
    let workers: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let me = TcpListener::bind("127.0.0.1:0").unwrap();
                let joined =
                    join(coordinator, rank, me.local_addr().unwrap(), SECRET, Duration::from_secs(30)).unwrap();
                assert_eq!(joined.table.len(), world);
                assert_eq!(joined.heartbeat_timeout, heartbeat);
                (me, joined.coordinator)
            })
        })
        .collect();
    let (announced, streams) = workers.into_iter().map(|w| w.join().unwrap()).unzip();
    Job { supervisor, events, streams, _announced: announced }
}

fn start(stream: TcpStream, heartbeat: Duration) -> (Heartbeat, mpsc::Receiver<Notice>) {
    let (tx, rx) = mpsc::channel();
    let hb = Heartbeat::start(stream, heartbeat, move |n| {
        let _ = tx.send(n);
    })
    .unwrap();
    (hb, rx)
}

#[test]
fn healthy_workers_that_finish_leave_no_loss() {
    let job = form(3, HEARTBEAT);
    let beats: Vec<_> = job.streams.into_iter().map(|s| start(s, HEARTBEAT)).collect();
    // Several heartbeat timeouts pass with nothing to report. This wait is the condition
    // under test, not a synchronisation: nothing is expected to happen during it, and a
    // loss would fail the test at once.
    assert_eq!(job.events.recv_timeout(HEARTBEAT * 3), Err(RecvTimeoutError::Timeout));
    for (hb, notices) in beats {
        assert!(notices.try_recv().is_err());
        hb.finish();
    }
    assert!(job.supervisor.join().unwrap().is_empty());
    assert!(job.events.try_recv().is_err());
}

#[test]
fn a_worker_that_drops_its_connection_is_reported_to_every_survivor() {
    // With a timeout that no test reaches, a loss reported at all came from the closed
    // connection, however slowly the machine runs.
    let job = form(3, NEVER);
    let mut beats: Vec<_> = job.streams.into_iter().map(|s| start(s, NEVER)).collect();
    let started = Instant::now();
    let (dead, _) = beats.remove(1);
    drop(dead); // no goodbye: as a crashed process
    for (_, notices) in &beats {
        let n = notices.recv_timeout(NEVER).expect("a notice");
        assert_eq!(n, Notice::PeerLost { rank: 1, reason: LossReason::Disconnected.to_string() });
    }
    assert!(started.elapsed() < NEVER, "a closed connection needs no timeout: {:?}", started.elapsed());
    for (hb, _) in beats {
        hb.finish();
    }
    assert_eq!(job.supervisor.join().unwrap(), vec![(1, LossReason::Disconnected)]);
}

#[test]
fn a_silent_worker_is_lost_after_the_heartbeat_timeout() {
    // Taken before the job forms: the supervisor's clock starts later, so no loss can be
    // reported less than a timeout after it.
    let started = Instant::now();
    let mut job = form(3, HEARTBEAT);
    // Rank 2 keeps its connection open but never pings: a stopped process.
    let silent = job.streams.pop().unwrap();
    let beats: Vec<_> = job.streams.into_iter().map(|s| start(s, HEARTBEAT)).collect();
    for (_, notices) in &beats {
        match notices.recv_timeout(Duration::from_secs(10)).expect("a notice") {
            Notice::PeerLost { rank: 2, reason } => assert!(reason.starts_with("no heartbeat for"), "{reason}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let waited = started.elapsed();
    assert!(waited >= HEARTBEAT && waited < HEARTBEAT * 4, "{waited:?}");
    assert!(job.events.recv_timeout(Duration::from_secs(10)).unwrap().starts_with("rank 2 lost: no heartbeat"));
    for (hb, _) in beats {
        hb.finish();
    }
    drop(silent);
    let lost = job.supervisor.join().unwrap();
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
    let (_hb, notices) = start(stream, HEARTBEAT);
    let n = notices.recv_timeout(Duration::from_secs(10)).expect("a notice");
    assert!(matches!(n, Notice::CoordinatorLost(_)), "{n:?}");
    assert!(started.elapsed() >= HEARTBEAT);
}
