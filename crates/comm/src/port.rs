//! A worker's listening port in an elastic job: one address for the meshes of its epochs
//! and for the state transfers it serves.
//!
//! Every connection passes the [`Gate`]: the job secret's handshake, which names the
//! peer's worker id, then an introduction saying what the connection is for. A mesh
//! connection names its epoch; [`Port::mesh`] builds the epoch's [`TcpMesh`] from those,
//! dialling the members ranked below this worker and waiting for those ranked above, and
//! keeps connections of a newer epoch (a quorum this worker has not heard of yet) for
//! later. The workers that replay a pipeline's lost stage as an epoch begins meet on a
//! mesh of their own first ([`Intro::Replay`]), which comes before the epoch's in that
//! order. A transfer connection goes to the queue that the state server reads
//! ([`Port::transfers`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::frame::{read_frame, write_frame};
use crate::gate::{Gate, Limits};
use crate::handshake::handshake;
use crate::protocol::WorkerId;
use crate::transport::{CommError, DialError, TcpConfig, TcpMesh, dial};

const KIND_INTRO: u8 = 0xC4;

/// What a connection to a port is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intro {
    /// A link of the mesh of `epoch`.
    Mesh {
        /// The epoch.
        epoch: u64,
    },
    /// A link of the mesh of the workers that replay a stage as `epoch` begins.
    Replay {
        /// The epoch.
        epoch: u64,
    },
    /// Fetching state from this worker.
    Transfer,
}

impl Intro {
    fn encode(self) -> Vec<u8> {
        match self {
            Intro::Mesh { epoch } => [&[0u8][..], &epoch.to_le_bytes()].concat(),
            Intro::Transfer => vec![1],
            Intro::Replay { epoch } => [&[2u8][..], &epoch.to_le_bytes()].concat(),
        }
    }
    /// The order of the meshes a connection may be for: an epoch's replay mesh, then its
    /// mesh, then the next epoch's.
    fn mesh_key(self) -> Option<MeshKey> {
        match self {
            Intro::Replay { epoch } => Some((epoch, 0)),
            Intro::Mesh { epoch } => Some((epoch, 1)),
            Intro::Transfer => None,
        }
    }

    fn decode(b: &[u8]) -> Result<Intro, String> {
        match b {
            [0, rest @ ..] if rest.len() == 8 => {
                Ok(Intro::Mesh { epoch: u64::from_le_bytes(rest.try_into().expect("8 bytes")) })
            }
            [1] => Ok(Intro::Transfer),
            [2, rest @ ..] if rest.len() == 8 => {
                Ok(Intro::Replay { epoch: u64::from_le_bytes(rest.try_into().expect("8 bytes")) })
            }
            _ => Err(format!("malformed introduction of {} bytes", b.len())),
        }
    }
}

/// A mesh's place in the order meshes are built in: its epoch, then 0 for the replay's
/// and 1 for the epoch's own.
type MeshKey = (u64, u8);

/// A worker's port.
pub struct Port {
    id: WorkerId,
    addr: SocketAddr,
    secret: Vec<u8>,
    meshes: Receiver<(WorkerId, MeshKey, TcpStream)>,
    transfers: Option<Receiver<(WorkerId, TcpStream)>>,
    /// Mesh connections of meshes after the last one built.
    pending: Vec<(WorkerId, MeshKey, TcpStream)>,
    closed: Arc<AtomicBool>,
}

impl Drop for Port {
    /// Stops accepting: the gate closes within a second.
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

impl Port {
    /// Opens worker `id`'s port on `listener`.
    pub fn open(listener: TcpListener, secret: &[u8], id: WorkerId) -> Result<Port, CommError> {
        let addr = listener.local_addr().map_err(|e| CommError::Setup(format!("port address: {e}")))?;
        let key = secret.to_vec();
        let gate = Gate::open(listener, Limits::default(), move |stream| {
            crate::transport::keepalive(stream).map_err(|e| e.to_string())?;
            let peer = handshake(stream, &key, id).map_err(|e| e.to_string())?;
            let f = read_frame(stream, 64).map_err(|e| e.to_string())?;
            if f.kind != KIND_INTRO {
                return Err(format!("worker {peer} sent a frame of kind {:#x} instead of an introduction", f.kind));
            }
            Ok((peer, Intro::decode(&f.payload)?))
        })
        .map_err(|e| CommError::Setup(format!("port listener: {e}")))?;
        let (mesh_tx, meshes) = mpsc::channel();
        let (transfer_tx, transfers) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&closed);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Some(a) = gate.next(Instant::now() + Duration::from_secs(1)) else { continue };
                let (peer, intro) = a.value;
                let sent = match intro.mesh_key() {
                    Some(key) => mesh_tx.send((peer, key, a.stream)).is_ok(),
                    None => transfer_tx.send((peer, a.stream)).is_ok(),
                };
                if !sent {
                    return;
                }
            }
        });
        Ok(Port { id, addr, secret: secret.to_vec(), meshes, transfers: Some(transfers), pending: Vec::new(), closed })
    }

    /// Where the port listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The queue of transfer connections, for the state server (once).
    pub fn transfers(&mut self) -> Option<Receiver<(WorkerId, TcpStream)>> {
        self.transfers.take()
    }

    /// Builds the mesh `intro` names ([`Intro::Mesh`] of an epoch, or [`Intro::Replay`] of
    /// the workers that replay a stage as it begins) among `members` (in rank order; this
    /// worker among them), whose ports `book` lists, within `config.connect_timeout`.
    pub fn mesh(
        &mut self,
        intro: Intro,
        members: &[WorkerId],
        book: &BTreeMap<WorkerId, SocketAddr>,
        config: &TcpConfig,
    ) -> Result<TcpMesh, CommError> {
        let key = intro.mesh_key().ok_or_else(|| CommError::Setup("a transfer is no mesh".into()))?;
        let epoch = key.0;
        let setup = |what: String| CommError::Setup(format!("epoch {}: {what}", crate::control::epoch_text(epoch)));
        let rank = members.iter().position(|&m| m == self.id).ok_or_else(|| setup("not a member".into()))?;
        let deadline = Instant::now() + config.connect_timeout;
        let mut streams = HashMap::new();
        for (peer, &m) in members.iter().enumerate().take(rank) {
            let addr = *book.get(&m).ok_or_else(|| setup(format!("no address for worker {m}")))?;
            let configure = |s: &TcpStream| crate::transport::keepalive(s);
            let (mut s, got) = match dial(addr, &self.secret, self.id, deadline, &configure) {
                Ok(x) => x,
                Err(DialError::Unreachable(e)) => return Err(setup(format!("cannot reach worker {m}: {e}"))),
                Err(DialError::Refused(e)) => return Err(setup(format!("worker {m}: {e}"))),
            };
            if got != m {
                return Err(CommError::Protocol { peer, reason: format!("answered as worker {got}, not {m}") });
            }
            write_frame(&mut s, KIND_INTRO, &intro.encode())
                .map_err(|e| setup(format!("introducing to worker {m}: {e}")))?;
            streams.insert(peer, s);
        }
        let above = |id: WorkerId| members.iter().position(|&m| m == id).filter(|&r| r > rank);
        // Connections that arrived early for this mesh; older ones are of dead meshes.
        let mut keep = Vec::new();
        for (peer, e, s) in self.pending.drain(..) {
            match (e.cmp(&key), above(peer)) {
                (std::cmp::Ordering::Equal, Some(r)) => {
                    streams.insert(r, s);
                }
                (std::cmp::Ordering::Greater, _) => keep.push((peer, e, s)),
                _ => {}
            }
        }
        self.pending = keep;
        while streams.len() < members.len() - 1 {
            match self.meshes.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((peer, e, s)) if e == key => match above(peer) {
                    Some(r) => {
                        streams.insert(r, s);
                    }
                    None => {
                        tracing::warn!(peer, epoch = %crate::control::epoch_text(epoch), "a mesh connection from a worker not ranked above this one")
                    }
                },
                Ok((peer, e, s)) if e > key => self.pending.push((peer, e, s)),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    let missing: Vec<WorkerId> =
                        (rank + 1..members.len()).filter(|r| !streams.contains_key(r)).map(|r| members[r]).collect();
                    return Err(setup(format!("workers {missing:?} did not connect in time")));
                }
                Err(RecvTimeoutError::Disconnected) => return Err(setup("the port closed".into())),
            }
        }
        TcpMesh::from_streams(rank, members.len(), streams, config)
    }

    /// What opens this worker's transfer connections to other ports (from any thread).
    pub fn dialer(&self) -> Dialer {
        Dialer { id: self.id, secret: self.secret.clone() }
    }
}

/// Opens transfer connections to other workers' ports, as one worker.
#[derive(Clone, Debug)]
pub struct Dialer {
    id: WorkerId,
    secret: Vec<u8>,
}

impl Dialer {
    /// Opens a transfer connection to the port of worker `peer` at `addr`.
    pub fn transfer(&self, peer: WorkerId, addr: SocketAddr, deadline: Instant) -> Result<TcpStream, CommError> {
        let configure = |s: &TcpStream| {
            crate::transport::keepalive(s)?;
            s.set_nodelay(true)
        };
        let (mut s, got) = match dial(addr, &self.secret, self.id, deadline, &configure) {
            Ok(x) => x,
            Err(DialError::Unreachable(e)) => {
                return Err(CommError::PeerLost { peer: peer as usize, reason: format!("unreachable: {e}") });
            }
            Err(DialError::Refused(e)) => {
                return Err(CommError::Protocol { peer: peer as usize, reason: e.to_string() });
            }
        };
        if got != peer {
            return Err(CommError::Protocol { peer: peer as usize, reason: format!("answered as worker {got}") });
        }
        write_frame(&mut s, KIND_INTRO, &Intro::Transfer.encode())
            .map_err(|e| CommError::PeerLost { peer: peer as usize, reason: e.to_string() })?;
        Ok(s)
    }
}
