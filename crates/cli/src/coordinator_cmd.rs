//! `steadfast coordinator`: the rendezvous point of a job whose workers run on several
//! hosts. It waits for `--world-size` workers that know the job secret, hands each the
//! address table, and exits.

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
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:29500")]
    bind: String,
    /// Number of workers in the job.
    #[arg(long)]
    world_size: usize,
    /// Seconds to wait for every worker to join.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
}

/// Runs `steadfast coordinator`.
pub fn run(args: CoordinatorArgs) -> anyhow::Result<()> {
    if args.world_size == 0 {
        anyhow::bail!("--world-size must be at least 1");
    }
    let secret = std::env::var("STEADFAST_SECRET").context("STEADFAST_SECRET must hold the job secret")?;
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    println!("coordinator listening on {}", listener.local_addr()?);
    let table = comm::rendezvous::serve(
        &listener,
        args.world_size,
        secret.as_bytes(),
        Duration::from_secs_f64(args.timeout.max(1.0)),
    )?;
    for (rank, addr) in table.iter().enumerate() {
        println!("rank {rank} at {addr}");
    }
    Ok(())
}
