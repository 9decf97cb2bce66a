//! `steadfast coordinator`: the rendezvous point of a job whose workers run on several
//! hosts ([`launch::coordinator`]). It waits for `--world-size` workers that know the job secret, hands each the
//! address table, then keeps membership by heartbeat until every worker has finished or
//! been lost; it exits with 1 if any was lost.
//!
//! With `--elastic` it coordinates a job that survives the loss of workers (the step
//! protocol of `comm::protocol`) until the job finishes or stops. It keeps nothing on
//! disk: killed and started again on the same address with a higher `--generation`, it
//! rebuilds the membership from the workers' reports, and the job goes on.

use std::net::TcpListener;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use launch::coordinator::{ElasticSettings, Standalone};

const EXAMPLES: &str = "\
Examples:
  # On host A (the secret is any string shared by the job, e.g. from `openssl rand -hex 32`):
  STEADFAST_SECRET=... steadfast coordinator --bind 10.0.0.1:29500 --world-size 2
  # On hosts A and B:
  STEADFAST_SECRET=... steadfast train --rank 0 --world-size 2 --coordinator 10.0.0.1:29500 --bind 10.0.0.1
  STEADFAST_SECRET=... steadfast train --rank 1 --world-size 2 --coordinator 10.0.0.1:29500 --bind 10.0.0.2

  # An elastic job: workers may die, be replaced, or join later (any --rank not in use)
  STEADFAST_SECRET=... steadfast coordinator --elastic --bind 10.0.0.1:29500 --world-size 2
  STEADFAST_SECRET=... steadfast train --elastic --rank 0 --world-size 2 --coordinator 10.0.0.1:29500 --bind 10.0.0.1
  # The coordinator itself may be killed and started again, one generation on:
  STEADFAST_SECRET=... steadfast coordinator --elastic --bind 10.0.0.1:29500 --world-size 2 --generation 1
  # Or elected in etcd: standbys on other hosts take the role when the holder is lost
  STEADFAST_SECRET=... steadfast coordinator --elastic --bind 10.0.0.1:0 --world-size 2 --rendezvous etcd://e:2379/j
  STEADFAST_SECRET=... steadfast train --elastic --rank 0 --world-size 2 --rendezvous etcd://e:2379/j";

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
    /// Coordinate an elastic job (one that survives the loss of workers).
    #[arg(long)]
    elastic: bool,
    /// Elastic: the fewest workers the job goes on with.
    #[arg(long, default_value_t = 1)]
    min_world: usize,
    /// Elastic: how many coordinators of this job were started before this one (its
    /// epochs are numbered above all of theirs).
    #[arg(long, default_value_t = 0)]
    generation: u64,
    /// Elastic: seconds the job waits for enough workers before it stops.
    #[arg(long, default_value_t = 60.0)]
    quorum_timeout: f64,
    /// Elastic: campaign for the coordinator role in etcd (`etcd://HOST:PORT/JOB`) and
    /// serve once elected; the election's count replaces --generation.
    #[arg(long, value_name = "etcd://HOST:PORT/JOB")]
    rendezvous: Option<launch::Target>,
}

/// Runs `steadfast coordinator`.
pub fn run(args: CoordinatorArgs) -> anyhow::Result<()> {
    if !(args.quorum_timeout.is_finite() && args.quorum_timeout > 0.0) {
        anyhow::bail!("--quorum-timeout must be a positive number of seconds");
    }
    let job = Standalone {
        world: args.world_size,
        join_timeout: Duration::from_secs_f64(args.timeout.max(1.0)),
        heartbeat_timeout: Duration::from_secs_f64(args.heartbeat_timeout.max(0.05)),
        elastic: args.elastic.then(|| ElasticSettings {
            min_world: args.min_world,
            generation: args.generation,
            quorum_timeout: Duration::from_secs_f64(args.quorum_timeout),
            rendezvous: args.rendezvous,
        }),
    };
    let secret = std::env::var("STEADFAST_SECRET").context("STEADFAST_SECRET must hold the job secret")?;
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    // The first line of output, always: who started the coordinator on port 0 reads the
    // port here.
    println!("coordinator listening on {}", listener.local_addr()?);
    Ok(launch::coordinator::serve(listener, secret.as_bytes(), &job, &mut |line| println!("{line}"))?)
}
