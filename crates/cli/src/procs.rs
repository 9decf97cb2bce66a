//! Process supervision shared by the launchers: the job secret, the workers' output
//! forwarded line by line, the launcher's timed lines, and how long a worker may outlive
//! its job.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::thread::JoinHandle;
use std::time::Duration;

/// One line of the launcher's, timed from the start of the job like the coordinator's.
macro_rules! say {
    ($started:expr, $($arg:tt)*) => {
        println!("[launcher]    {:>7.2} s  {}", $started.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

pub(crate) use say;

/// How long workers may outlive the end of a job (the coordinator's last member, or the
/// loss bound after a failure) before they are killed.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(3);

/// A fresh random secret for a job, as hex.
pub(crate) fn job_secret() -> anyhow::Result<String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("cannot draw the job secret: {e}"))?;
    Ok(secret.iter().map(|b| format!("{b:02x}")).collect())
}

/// Forwards a worker's standard output and error (piped) to ours, each line prefixed with
/// `[slot]` and written whole.
pub(crate) fn forward_output(slot: usize, child: &mut Child) -> [JoinHandle<()>; 2] {
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    [
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let text = format!("[{slot}] {line}");
                println!("{text}");
            }
        }),
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                // One write per line: unbuffered, a formatted line goes out in pieces.
                let text = format!("[{slot}] {line}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes());
            }
        }),
    ]
}
