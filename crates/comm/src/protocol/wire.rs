//! The step protocol's messages as frame payloads, for the TCP shells of
//! [`crate::control`].
//!
//! Integers are little-endian; an optional value is a presence byte and the value; a list
//! is a `u32` count and its items; an address is its text. [`decode`] never panics: a
//! payload that is short, long, or holds an unknown tag is a [`WireError`].

use std::net::SocketAddr;

use super::{Msg, Quorum, Saved, StageReplay, StageState, Status, WorkerId, WorkerState};

/// Frame kind of a protocol [`Msg`].
pub const KIND_MSG: u8 = 0xC1;
/// Frame kind of a worker's [`Hello`] to the coordinator.
pub const KIND_HELLO: u8 = 0xC2;
/// Frame kind of an address book: where each member of a quorum listens.
pub const KIND_BOOK: u8 = 0xC3;
/// Frame kind of the coordinator's [`Pulse`] to a worker.
pub const KIND_PULSE: u8 = 0xC4;

/// A payload that does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed protocol message: {0}")]
pub struct WireError(pub String);

/// What a worker says first on its connection to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Which process of its slot it is.
    pub incarnation: u64,
    /// Where it listens for its peers (the epoch's mesh, and state transfers).
    pub addr: SocketAddr,
}

/// What the coordinator sends every worker every heartbeat, whatever else it has to say:
/// proof that it runs (a coordinator in a running epoch has nothing else to say for as
/// long as the epoch lasts), and the bounds it runs with, so that a worker judges the
/// coordinator's silence by the job's flags (`--heartbeat-timeout`, `--quorum-timeout`)
/// rather than by defaults of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pulse {
    /// Silence after which the coordinator takes a worker for lost: a worker takes the
    /// coordinator for lost after as long.
    pub lost_after: std::time::Duration,
    /// How long the job waits for what it needs before it gives up: a worker waits as long
    /// for a lost coordinator to answer again.
    pub quorum_timeout: std::time::Duration,
}

#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn opt(&mut self, v: Option<u64>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
            None => self.u8(0),
        }
    }
    fn ids(&mut self, ids: &[WorkerId]) {
        self.u32(ids.len() as u32);
        for &id in ids {
            self.u32(id);
        }
    }
    fn u64s(&mut self, values: &[u64]) {
        self.u32(values.len() as u32);
        for &v in values {
            self.u64(v);
        }
    }
    fn text(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError(format!("{} bytes short", n - self.0.len())));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(WireError(format!("{b} is not a truth value"))),
        }
    }
    fn opt(&mut self) -> Result<Option<u64>, WireError> {
        Ok(if self.bool()? { Some(self.u64()?) } else { None })
    }
    fn count(&mut self, item: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        // A count the rest of the payload cannot hold is refused before anything is
        // allocated for it.
        if n.saturating_mul(item) > self.0.len() {
            return Err(WireError(format!("a list of {n} items in {} bytes", self.0.len())));
        }
        Ok(n)
    }
    fn ids(&mut self) -> Result<Vec<WorkerId>, WireError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn u64s(&mut self) -> Result<Vec<u64>, WireError> {
        let n = self.count(8)?;
        (0..n).map(|_| self.u64()).collect()
    }
    fn text(&mut self) -> Result<String, WireError> {
        let n = self.count(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| WireError("text is not UTF-8".into()))
    }
    fn addr(&mut self) -> Result<SocketAddr, WireError> {
        let t = self.text()?;
        t.parse().map_err(|_| WireError(format!("{t:?} is not an address")))
    }
    fn end(self) -> Result<(), WireError> {
        if self.0.is_empty() { Ok(()) } else { Err(WireError(format!("{} bytes too many", self.0.len()))) }
    }
}

const PHASES: [WorkerState; 7] = [
    WorkerState::Idle,
    WorkerState::Syncing,
    WorkerState::Synced,
    WorkerState::Stepping,
    WorkerState::Done,
    WorkerState::Finished,
    WorkerState::Stopped,
];

/// `msg` as a payload of kind [`KIND_MSG`].
pub fn encode(msg: &Msg) -> Vec<u8> {
    let mut o = Out::default();
    match msg {
        Msg::Report(s) => {
            o.u8(0);
            o.u64(s.incarnation);
            o.u8(PHASES.iter().position(|&p| p == s.phase).expect("every phase is listed") as u8);
            o.u64(s.epoch);
            o.u64(s.step);
            o.u64(s.fingerprint);
            o.opt(s.last_commit);
            o.opt(s.unapplied);
            o.u8(u8::from(s.suspect));
            o.u64s(&s.saved);
            o.opt(s.unreplayable);
            o.u64(s.unlogged);
        }
        Msg::Quorum(q) => {
            o.u8(1);
            o.u64(q.epoch);
            o.ids(&q.members);
            o.u64(q.step);
            o.u32(q.stages.len() as u32);
            for stage in &q.stages {
                o.opt(stage.fingerprint);
                o.opt(stage.commit);
                o.ids(&stage.sources);
                o.u8(u8::from(stage.restore));
                match &stage.replay {
                    None => o.u8(0),
                    Some(r) => {
                        o.u8(1);
                        o.u64(r.from);
                        o.ids(&r.workers);
                        o.u8(u8::from(r.with_next));
                    }
                }
            }
        }
        Msg::Start { epoch } => {
            o.u8(2);
            o.u64(*epoch);
        }
        Msg::Reconfigure { epoch } => {
            o.u8(3);
            o.u64(*epoch);
        }
        Msg::Finish => o.u8(4),
        Msg::Stop { reason } => {
            o.u8(5);
            o.text(reason);
        }
        Msg::Ballot { epoch, step, ok, digest, saved } => {
            o.u8(6);
            o.u64(*epoch);
            o.u64(*step);
            o.u8(u8::from(*ok));
            o.u64(*digest);
            o.u64(saved.durable);
            o.u8(u8::from(saved.locked));
            o.u64(saved.written);
            o.u64(saved.print);
        }
    }
    o.0
}

/// The message in a payload of kind [`KIND_MSG`].
pub fn decode(bytes: &[u8]) -> Result<Msg, WireError> {
    let mut i = In(bytes);
    let msg = match i.u8()? {
        0 => {
            let incarnation = i.u64()?;
            let phase = *PHASES.get(i.u8()? as usize).ok_or_else(|| WireError("unknown phase".into()))?;
            Msg::Report(Status {
                incarnation,
                phase,
                epoch: i.u64()?,
                step: i.u64()?,
                fingerprint: i.u64()?,
                last_commit: i.opt()?,
                unapplied: i.opt()?,
                suspect: match i.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(WireError("a suspect flag is 0 or 1".into())),
                },
                saved: i.u64s()?,
                unreplayable: i.opt()?,
                unlogged: i.u64()?,
            })
        }
        1 => {
            let (epoch, members, step) = (i.u64()?, i.ids()?, i.u64()?);
            // A stage takes at least 8 bytes: three presence bytes, a count and a flag.
            let n = i.count(8)?;
            if n == 0 {
                return Err(WireError("a quorum of no stage".into()));
            }
            let stages = (0..n)
                .map(|_| {
                    let (fingerprint, commit, sources) = (i.opt()?, i.opt()?, i.ids()?);
                    let restore = i.bool()?;
                    let replay = match i.u8()? {
                        0 => None,
                        1 => Some(StageReplay { from: i.u64()?, workers: i.ids()?, with_next: i.bool()? }),
                        _ => return Err(WireError("a replay's presence byte is 0 or 1".into())),
                    };
                    Ok(StageState { fingerprint, commit, sources, restore, replay })
                })
                .collect::<Result<_, WireError>>()?;
            Msg::Quorum(Quorum { epoch, members, step, stages })
        }
        2 => Msg::Start { epoch: i.u64()? },
        3 => Msg::Reconfigure { epoch: i.u64()? },
        4 => Msg::Finish,
        5 => Msg::Stop { reason: i.text()? },
        6 => Msg::Ballot {
            epoch: i.u64()?,
            step: i.u64()?,
            ok: i.bool()?,
            digest: i.u64()?,
            saved: Saved { durable: i.u64()?, locked: i.bool()?, written: i.u64()?, print: i.u64()? },
        },
        t => return Err(WireError(format!("unknown message tag {t}"))),
    };
    i.end()?;
    Ok(msg)
}

/// A [`Hello`] as a payload of kind [`KIND_HELLO`].
pub fn encode_hello(h: &Hello) -> Vec<u8> {
    let mut o = Out::default();
    o.u64(h.incarnation);
    o.text(&h.addr.to_string());
    o.0
}

/// The [`Hello`] in a payload of kind [`KIND_HELLO`].
pub fn decode_hello(bytes: &[u8]) -> Result<Hello, WireError> {
    let mut i = In(bytes);
    let h = Hello { incarnation: i.u64()?, addr: i.addr()? };
    i.end()?;
    Ok(h)
}

/// An address book as a payload of kind [`KIND_BOOK`].
pub fn encode_book(book: &[(WorkerId, SocketAddr)]) -> Vec<u8> {
    let mut o = Out::default();
    o.u32(book.len() as u32);
    for (id, addr) in book {
        o.u32(*id);
        o.text(&addr.to_string());
    }
    o.0
}

/// The address book in a payload of kind [`KIND_BOOK`].
pub fn decode_book(bytes: &[u8]) -> Result<Vec<(WorkerId, SocketAddr)>, WireError> {
    let mut i = In(bytes);
    let n = i.count(5)?;
    let book = (0..n).map(|_| Ok((i.u32()?, i.addr()?))).collect::<Result<Vec<_>, WireError>>()?;
    i.end()?;
    Ok(book)
}

/// A [`Pulse`] as a payload of kind [`KIND_PULSE`] (milliseconds).
pub fn encode_pulse(p: &Pulse) -> Vec<u8> {
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut o = Out::default();
    o.u64(millis(p.lost_after));
    o.u64(millis(p.quorum_timeout));
    o.0
}

/// The [`Pulse`] in a payload of kind [`KIND_PULSE`].
pub fn decode_pulse(bytes: &[u8]) -> Result<Pulse, WireError> {
    let mut i = In(bytes);
    let millis = std::time::Duration::from_millis;
    let p = Pulse { lost_after: millis(i.u64()?), quorum_timeout: millis(i.u64()?) };
    i.end()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pulse_round_trips_and_a_cut_one_is_an_error() {
        let p = Pulse {
            lost_after: std::time::Duration::from_millis(2500),
            quorum_timeout: std::time::Duration::from_secs(60),
        };
        let bytes = encode_pulse(&p);
        assert_eq!(decode_pulse(&bytes).unwrap(), p);
        for n in 0..bytes.len() {
            assert!(decode_pulse(&bytes[..n]).is_err(), "cut at {n}");
        }
    }

    fn every_message() -> Vec<Msg> {
        vec![
            Msg::Report(Status {
                incarnation: 3,
                phase: WorkerState::Syncing,
                epoch: 1 << 40 | 7,
                step: 12,
                fingerprint: 0xdead_beef,
                last_commit: Some(5),
                unapplied: None,
                suspect: true,
                saved: vec![9, 6],
                unreplayable: Some(12),
                unlogged: 0b101,
            }),
            Msg::Quorum(Quorum::of_replicas((9, vec![0, 2, 5]), (40, u64::MAX, None), vec![2])),
            Msg::Quorum(Quorum {
                epoch: 10,
                members: vec![0, 1, 2, 3],
                step: 7,
                stages: vec![
                    StageState {
                        fingerprint: Some(1),
                        commit: Some(2),
                        sources: vec![0, 2],
                        restore: false,
                        replay: None,
                    },
                    StageState { fingerprint: None, commit: None, sources: vec![], restore: true, replay: None },
                    StageState {
                        replay: Some(StageReplay { from: 3, workers: vec![2, 0], with_next: true }),
                        ..StageState::unknown()
                    },
                ],
            }),
            Msg::Start { epoch: 4 },
            Msg::Reconfigure { epoch: 5 },
            Msg::Finish,
            Msg::Stop { reason: "too few workers: ü".into() },
            Msg::Ballot {
                epoch: 1,
                step: 2,
                ok: false,
                digest: 3,
                saved: Saved { durable: 4, locked: true, written: 5, print: 6 },
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in every_message() {
            assert_eq!(decode(&encode(&m)).unwrap(), m);
        }
        let h = Hello { incarnation: 2, addr: "127.0.0.1:4000".parse().unwrap() };
        assert_eq!(decode_hello(&encode_hello(&h)).unwrap(), h);
        let book = vec![(0, "127.0.0.1:1".parse().unwrap()), (7, "[::1]:2".parse().unwrap())];
        assert_eq!(decode_book(&encode_book(&book)).unwrap(), book);
    }

    #[test]
    fn every_truncation_and_extension_is_an_error() {
        for m in every_message() {
            let bytes = encode(&m);
            for n in 0..bytes.len() {
                assert!(decode(&bytes[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(decode(&long).unwrap_err().0.contains("too many"));
        }
        assert!(decode(&[9]).unwrap_err().0.contains("unknown message tag"));
        // A list claiming more items than the payload holds is refused without allocating.
        let mut huge = vec![1u8];
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).unwrap_err().0.contains("items"));
        assert!(decode_hello(b"\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00abc").is_err());
    }
}
