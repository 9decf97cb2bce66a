//! A worker whose coordinator is gone, or was never there, says so by the job's own bounds:
//!
//! - a coordinator that runs pulses every worker every heartbeat with its heartbeat and
//!   quorum timeouts, so a worker that hears nothing else (a long epoch) does not take it
//!   for lost, and one whose coordinator dies gives up on those bounds, measured from the
//!   last word it heard (it used to wait a fixed 420 s from the coordinator's last protocol
//!   message, whatever the flags said);
//! - a worker that finds nobody at the coordinator's address says where it looked, for
//!   how long, and that the job may be over (it used to end on a bare "Connection
//!   refused");
//! - a coordinator whose job is over tells a process that joins late that the job
//!   finished (it used to close its port, leaving the process to dial for its deadline).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use comm::control::{Incoming, Link, MembershipEvent, Requests, coordinate};
use comm::directory::Directory;
use comm::protocol::coordinator::JobState;
use comm::protocol::wire::Hello;
use comm::protocol::{Action, Checks, Coordinator, Event, Msg, Node, Timing, Worker, WorkerId};

const SECRET: &[u8] = b"coordinator-gone-secret";

/// Serves a coordinator of a job of `world` workers on a free loopback port.
fn serve(world: usize, timing: Timing) -> (SocketAddr, Arc<Requests>, JoinHandle<JobState>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Requests::default());
    let machine = Coordinator::new(0, world, 1, timing, Instant::now());
    let served = Arc::clone(&requests);
    let thread = std::thread::spawn(move || {
        coordinate(listener, SECRET, machine, timing, &served, &mut |_: MembershipEvent| {}).unwrap()
    });
    (addr, requests, thread)
}

/// Connects worker `id` to the coordinator at `addr`, trying for `patience`.
fn connect(addr: SocketAddr, id: WorkerId, patience: Duration) -> Result<(Link, Receiver<Incoming>), String> {
    let hello = Hello { incarnation: 0, addr: "127.0.0.1:9".parse().unwrap() };
    let heartbeat = Duration::from_millis(50);
    let deadline = Instant::now() + patience;
    Link::connect(&Directory::fixed(vec![addr]), SECRET, id, hello, heartbeat, deadline, Box::new(|_: &Msg| {}))
        .map_err(|e| e.to_string())
}

#[test]
fn a_worker_gives_up_on_a_dead_coordinator_after_its_heartbeat_and_quorum_timeouts_from_the_last_word() {
    // The coordinator's bounds: a worker silent for 0.2 s is lost, and the job waits 0.3 s
    // for what it needs. (It gathers for a minute: it has nothing to say to the worker.)
    let (lost_after, quorum_timeout) = (Duration::from_millis(200), Duration::from_millis(300));
    let timing = Timing::for_coordinator(lost_after, Duration::from_secs(60), quorum_timeout);
    let (addr, requests, thread) = serve(1, timing);
    let (link, _incoming) = connect(addr, 0, Duration::from_secs(5)).unwrap();
    // A second of protocol silence, five times the bounds: the pulses say the coordinator
    // runs.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(link.gave_up(), None, "a live coordinator with nothing to say is not lost");
    // The coordinator goes (its port closes with it: nothing answers there any more).
    requests.shutdown.store(true, Ordering::Relaxed);
    thread.join().unwrap();
    let gone = Instant::now();
    let reason = loop {
        if let Some(reason) = link.gave_up() {
            break reason;
        }
        let waited = gone.elapsed();
        assert!(waited < Duration::from_secs(5), "still waiting {waited:?} after the coordinator went");
        std::thread::sleep(Duration::from_millis(10));
    };
    let waited = gone.elapsed();
    // 0.2 + 0.3 s after the last pulse (at most a pulse interval, 40 ms, before it went),
    // not the defaults' 70 s, and not the 420 s of before.
    // (The coordinator took up to a tenth of a second to close once told.)
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500), "gave up after {waited:?}");
    assert!(reason.starts_with(&format!("no word from the coordinator at {addr} for 0.")), "{reason}");
    assert!(reason.contains(": its connection closed 0."), "{reason}");
    assert!(reason.contains("past its heartbeat timeout (0.2 s) and quorum timeout (0.3 s)"), "{reason}");
    link.close();
}

#[test]
fn a_worker_that_finds_no_coordinator_says_where_for_how_long_and_that_the_job_may_be_over() {
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let started = Instant::now();
    let err = match connect(addr, 1, Duration::from_secs(1)) {
        Ok((link, _)) => {
            link.close();
            panic!("nobody listens at {addr}")
        }
        Err(e) => e,
    };
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    assert!(err.contains(&format!("no coordinator answers at {addr} after 1.")), "{err}");
    assert!(err.contains("s of trying (the last attempt: "), "{err}");
    assert!(err.contains("the job may have finished, or not started yet; check the address"), "{err}");
}

/// Runs worker `id` of a job of no steps (its state is the final one) to its finish.
fn finish(link: &Link, incoming: &Receiver<Incoming>, id: WorkerId) {
    let (mut worker, first) =
        Worker::new((id, 0), 0, (0, 0xfeed), (Timing::default(), Checks::default()), Instant::now());
    let mut queue: VecDeque<Action> = first.into();
    let started = Instant::now();
    loop {
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send { to: Node::Coordinator, msg } => link.report(&msg),
                Action::Finished => return,
                other => panic!("a job of no steps asks for {other:?}"),
            }
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the job did not finish");
        match incoming.recv_timeout(Duration::from_millis(20)) {
            Ok(Incoming::Msg(m)) => {
                queue.extend(worker.step(Instant::now(), Event::Message { from: Node::Coordinator, msg: m }))
            }
            Ok(Incoming::Book(_)) => {}
            Err(_) => queue.extend(worker.step(Instant::now(), Event::Tick)),
        }
    }
}

#[test]
fn a_coordinator_whose_job_finished_tells_a_late_joiner_so_until_its_owner_shuts_it_down() {
    let timing = Timing::for_coordinator(Duration::from_secs(2), Duration::from_secs(10), Duration::from_secs(10));
    let (addr, requests, thread) = serve(1, timing);
    let (link, incoming) = connect(addr, 0, Duration::from_secs(5)).unwrap();
    finish(&link, &incoming, 0);
    assert_eq!(thread.join().unwrap(), JobState::Finished);
    link.close();
    // The job is over, and its owner (a launcher whose workers still evaluate the final
    // state) has not shut the coordinator down: a process that joins now is told.
    let (late, told) = connect(addr, 1, Duration::from_secs(5)).expect("the coordinator still answers");
    match told.recv_timeout(Duration::from_secs(5)) {
        Ok(Incoming::Msg(Msg::Stop { reason })) => {
            assert!(reason.contains("it had finished before this process joined"), "{reason}")
        }
        other => panic!("the late joiner was told {other:?}"),
    }
    late.close();
    requests.shutdown.store(true, Ordering::Relaxed);
}

#[test]
fn a_coordinator_whose_job_stopped_tells_a_late_joiner_why() {
    let timing = Timing::for_coordinator(Duration::from_secs(2), Duration::from_secs(10), Duration::from_secs(10));
    let (addr, requests, thread) = serve(2, timing);
    *requests.stop.lock().unwrap() = Some("too few workers remain".into());
    assert!(matches!(thread.join().unwrap(), JobState::Stopped { .. }));
    let (late, told) = connect(addr, 1, Duration::from_secs(5)).expect("the coordinator still answers");
    match told.recv_timeout(Duration::from_secs(5)) {
        Ok(Incoming::Msg(Msg::Stop { reason })) => {
            assert_eq!(reason, "too few workers remain (before this process joined: the job is over)")
        }
        other => panic!("the late joiner was told {other:?}"),
    }
    late.close();
    requests.shutdown.store(true, Ordering::Relaxed);
}
