//! Strangers at the door: a hundred idle and garbage connections held open to the
//! coordinator's port and to every worker's port delay neither the rendezvous nor the
//! mesh, and a gate sheds what is beyond its bound.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use comm::collective::all_reduce_sum;
use comm::gate::{Gate, Limits};
use comm::transport::{TcpConfig, TcpMesh};
use comm::{ReduceMode, rendezvous};

/// Opens `n` connections to `addr`: half say nothing, half send garbage; all stay open
/// while the returned handles live.
fn crowd(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            if i % 2 == 1 {
                let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: steadfast\r\n\r\n\x00\xff\x13\x37");
            }
            s
        })
        .collect()
}

fn config() -> TcpConfig {
    TcpConfig {
        secret: b"gate-secret".to_vec(),
        max_frame: 1 << 20,
        // Strangers handled one at a time would each hold the port this long.
        connect_timeout: Duration::from_secs(30),
        write_timeout: Duration::from_secs(5),
        abort_grace: Duration::ZERO,
        shared_memory: None,
    }
}

#[test]
fn a_mesh_forms_and_reduces_at_once_beside_a_hundred_strangers_on_every_port() {
    let world = 3;
    let listeners: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    // The strangers connect first: their connections are ahead of the members' in every
    // queue.
    let _crowds: Vec<Vec<TcpStream>> = addrs.iter().map(|&a| crowd(a, 100)).collect();
    let started = Instant::now();
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let addrs = &addrs;
                s.spawn(move || {
                    let mesh = TcpMesh::connect(r, l, addrs, &config()).unwrap();
                    let mut v = vec![r as f32 + 1.0; 4];
                    all_reduce_sum(&mesh, &mut v, ReduceMode::Deterministic, Duration::from_secs(10)).unwrap();
                    v
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the strangers delayed the mesh: {took:?}");
    assert!(sums.iter().all(|v| v == &vec![6.0; 4]), "{sums:?}");
}

#[test]
fn the_rendezvous_admits_its_workers_at_once_beside_a_hundred_strangers() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let coordinator = listener.local_addr().unwrap();
    let _crowd = crowd(coordinator, 100);
    let secret = b"gate-secret";
    let started = Instant::now();
    let (formed, joined) = std::thread::scope(|s| {
        let serve = s.spawn(|| {
            rendezvous::serve(&listener, 2, secret, Duration::from_secs(60), Duration::from_secs(5)).unwrap()
        });
        let workers: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let me: SocketAddr = format!("127.0.0.1:{}", 40000 + rank).parse().unwrap();
                    rendezvous::join(coordinator, rank, me, secret, Duration::from_secs(60)).unwrap()
                })
            })
            .collect();
        let joined: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        (serve.join().unwrap(), joined)
    });
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the strangers delayed the rendezvous: {took:?}");
    assert_eq!(formed.table.len(), 2);
    assert!(joined.iter().all(|j| j.table == formed.table));
}

#[test]
fn a_gate_sheds_connections_beyond_its_bound_and_frees_a_slot_at_each_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits { deadline: Duration::from_secs(2), max_pending: 4 };
    let gate = Gate::open(listener, limits, |s: &mut TcpStream| {
        let mut word = [0u8; 5];
        s.read_exact(&mut word).map_err(|e| e.to_string())?;
        if &word == b"hello" { Ok(()) } else { Err("not a greeting".into()) }
    })
    .unwrap();
    let mut idle = crowd(addr, 1);
    idle.extend((0..9).map(|_| TcpStream::connect(addr).unwrap()));
    // The first four wait in admission; the gate closes the other six at once.
    let closed: Vec<bool> = idle
        .iter_mut()
        .rev()
        .map(|s| {
            s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            matches!(s.read(&mut [0u8; 1]), Ok(0))
        })
        .collect();
    assert_eq!(closed, [[true; 6].as_slice(), &[false; 4]].concat(), "newest first");
    // A member that knocks while the four hold every slot is shed too, and tries again
    // (as `rendezvous::join` does); it passes once their deadline has freed a slot.
    let opened = Instant::now();
    let admitted = loop {
        let mut member = TcpStream::connect(addr).unwrap();
        let _ = member.write_all(b"hello");
        if let Some(a) = gate.next(Instant::now() + Duration::from_millis(200)) {
            break Some(a);
        }
        if opened.elapsed() > Duration::from_secs(10) {
            break None;
        }
    };
    assert!(admitted.is_some(), "the member was never admitted");
    assert!(opened.elapsed() >= Duration::from_millis(1000), "a slot was free before the deadline");
    assert!(gate.next(Instant::now() + Duration::from_millis(100)).is_none(), "a stranger was admitted");
}

#[test]
fn a_rendezvous_of_some_slots_ranks_them_in_order_and_refuses_the_others() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let coordinator = listener.local_addr().unwrap();
    let secret = b"members-secret";
    let times = (Duration::from_secs(60), Duration::from_secs(5));
    let never = std::sync::atomic::AtomicBool::new(false);
    let (formed, joined, stranger) = std::thread::scope(|s| {
        let serve = s.spawn(|| {
            rendezvous::serve_members(&listener, (&[0, 2, 3, 4], &|s| s == 4), secret, times, &never).unwrap()
        });
        // Slot 1 was left out: the coordinator closes its connection.
        let stranger = s.spawn(move || {
            let me: SocketAddr = "127.0.0.1:41001".parse().unwrap();
            rendezvous::join(coordinator, 1, me, secret, Duration::from_secs(3))
        });
        let workers: Vec<_> = [3, 0, 2]
            .into_iter()
            .map(|slot| {
                s.spawn(move || {
                    let me: SocketAddr = format!("127.0.0.1:{}", 41000 + slot).parse().unwrap();
                    rendezvous::join(coordinator, slot, me, secret, Duration::from_secs(60)).unwrap()
                })
            })
            .collect();
        let joined: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        (serve.join().unwrap(), joined, stranger.join().unwrap())
    });
    assert_eq!(formed.slots, [0, 2, 3]);
    let ports: Vec<u16> = formed.table.iter().map(|a| a.port()).collect();
    assert_eq!(ports, [41000, 41002, 41003]);
    // Slots 3, 0 and 2 became ranks 2, 0 and 1; slot 4 was left out while they joined.
    assert_eq!(joined.iter().map(|j| j.rank).collect::<Vec<_>>(), [2, 0, 1]);
    assert!(joined.iter().all(|j| j.table == formed.table && j.slots == [0, 2, 3]));
    assert!(stranger.is_err());
    assert!(rendezvous::serve_members(&listener, (&[2, 1], &|_| false), secret, times, &never).is_err());
}
