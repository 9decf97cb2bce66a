//! `steadfast coordinator`: the rendezvous point of a job whose workers run on several
//! hosts. It waits for `--world-size` workers that know the job secret, hands each the
//! address table, then keeps membership by heartbeat until every worker has finished or
//! been lost; it exits with 1 if any was lost.

use std::net::TcpListener;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

const EXAMPLES: &str = "\
Examples:
  # On host A (the secret is any string shared by the job, e.g. from `openssl rand -hex 32`):
  STEADFAST_SECRET=... steadfast coordinator --bind 10.0.0.1:29500 --world-size 2
  # On hosts A and B:
  STEADFAST_SECRET=... steadfast train --rank 0 --world-size 2 --coordinator 10.0.0.1:29500 --bind 10.0.0.1
  STEADFAST_SECRET=... steadfast train --rank 1 --world-size 2 --coordinator 10.0.0.1:29500 --bind 10.0.0.2";

/// Arguments of `steadfast coordinator`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct CoordinatorArgs {
    /// Address to listen on (loopback unless told otherwise). With port 0 the system
    /// picks a free port; the first line of output names the address bound.
    #[arg(long, default_value = "127.0.0.1:29500")]
    bind: String,
    /// Number of workers in the job.
    #[arg(long)]
    world_size: usize,
    /// Seconds to wait for every worker to join.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Seconds of silence after which a worker is declared lost.
    #[arg(long, default_value_t = 10.0)]
    heartbeat_timeout: f64,
}

/// Runs `steadfast coordinator`.
pub fn run(args: CoordinatorArgs) -> anyhow::Result<()> {
    if args.world_size == 0 {
        anyhow::bail!("--world-size must be at least 1");
    }
    let secret = std::env::var("STEADFAST_SECRET").context("STEADFAST_SECRET must hold the job secret")?;
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    // The first line of output, always: who started the coordinator on port 0 reads the
    // port here.
    println!("coordinator listening on {}", listener.local_addr()?);
    let heartbeat = Duration::from_secs_f64(args.heartbeat_timeout.max(0.05));
    let job = comm::rendezvous::serve(
        &listener,
        args.world_size,
        secret.as_bytes(),
        Duration::from_secs_f64(args.timeout.max(1.0)),
        heartbeat,
    )?;
    for (rank, addr) in job.table.iter().enumerate() {
        println!("rank {rank} at {addr}");
    }
    let membership = comm::supervisor::supervise(job.streams, heartbeat, &mut |event| println!("{event}"));
    let lost = membership.lost();
    if lost.is_empty() {
        println!("all {} workers finished", args.world_size);
        Ok(())
    } else {
        anyhow::bail!("{} of {} workers were lost", lost.len(), args.world_size)
    }
}
