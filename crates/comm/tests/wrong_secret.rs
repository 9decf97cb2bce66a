//! A process whose secret is not the job's stops at the first refusal, with an error that
//! says so: it does not dial the coordinator again and again for its deadline (which
//! flooded the coordinator's log with a line per attempt, hundreds a second). A
//! coordinator that is not listening yet is still waited for.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use comm::control::Link;
use comm::directory::Directory;
use comm::handshake::handshake;
use comm::protocol::Msg;
use comm::protocol::wire::Hello;
use comm::rendezvous::COORDINATOR_RANK;
use comm::transport::CommError;

const JOB_SECRET: &[u8] = b"the-job-secret";

/// Serves the job's handshake as the coordinator on `listener`, as its gate does, on every
/// connection; returns the count of connections so far.
fn serve_handshakes(listener: TcpListener) -> Arc<AtomicUsize> {
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&tries);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = handshake(&mut s, JOB_SECRET, COORDINATOR_RANK);
        }
    });
    tries
}

/// Connects worker 1 to the coordinators `addrs` with `secret`, trying for `patience`;
/// returns the error and how long it took to come.
fn connect(addrs: Vec<SocketAddr>, secret: &[u8], patience: Duration) -> (CommError, Duration) {
    let hello = Hello { incarnation: 0, addr: "127.0.0.1:9".parse().unwrap() };
    let started = Instant::now();
    let deadline = started + patience;
    let interrupt = Box::new(|_: &Msg| {});
    match Link::connect(&Directory::fixed(addrs), secret, 1, hello, Duration::from_secs(1), deadline, interrupt) {
        Ok((link, _)) => {
            link.close();
            panic!("a wrong secret was let in");
        }
        Err(e) => (e, started.elapsed()),
    }
}

#[test]
fn a_wrong_secret_fails_at_the_first_attempt_saying_that_the_secret_does_not_match() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let tries = serve_handshakes(listener);
    let (err, took) = connect(vec![addr], b"wrong", Duration::from_secs(10));
    assert!(matches!(err, CommError::Refused(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("the secret does not match the job's"), "{text}");
    assert!(text.contains(&addr.to_string()), "{text}");
    // Before, it dialled again for the whole deadline, about 600 times a second.
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 1, "dialled more than once");
}

#[test]
fn standby_coordinators_that_all_refuse_the_secret_are_each_dialled_once() {
    let listeners: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let tries: Vec<Arc<AtomicUsize>> = listeners.into_iter().map(serve_handshakes).collect();
    let (err, took) = connect(addrs, b"wrong", Duration::from_secs(10));
    assert!(matches!(err, CommError::Refused(_)), "{err:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(tries.iter().all(|t| t.load(Ordering::SeqCst) == 1), "{tries:?}");
}

#[test]
fn a_coordinator_not_listening_yet_is_waited_for_and_only_its_refusal_ends_the_dialling() {
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let late = Duration::from_millis(700);
    let tries = std::thread::spawn(move || {
        std::thread::sleep(late);
        serve_handshakes(TcpListener::bind(addr).unwrap())
    });
    let (err, took) = connect(vec![addr], b"wrong", Duration::from_secs(10));
    let tries = tries.join().unwrap();
    // "Connection refused" while nobody listens is tried again; the secret's refusal is not.
    assert!(matches!(err, CommError::Refused(_)), "{err:?}");
    // (The listener's thread started its wait a moment before the dialling was timed.)
    assert!(took >= late / 2 && took < late + Duration::from_secs(2), "took {took:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 1);
}
