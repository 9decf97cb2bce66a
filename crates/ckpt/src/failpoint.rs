//! Named failpoints: places in the commit protocol where tests make the process fail.
//!
//! A failpoint is inert unless armed. It can be armed in-process ([`arm`], for tests that
//! want an error returned at that instant) or for a whole process through the environment
//! variable `STEADFAST_FAILPOINTS` (a comma-separated list of `name=error`,
//! `name=abort` or `name=sleep:MS`; `abort` kills the process on the spot, like a power
//! cut as far as the checkpoint directory is concerned, and `sleep` stalls the operation
//! there for MS milliseconds, like a slow disk). Unarmed, a failpoint costs one atomic load.
//!
//! The points of the commit protocol, in order:
//! `after_shard_write`, `after_manifest_write`, `before_rename`, `after_rename`,
//! `before_latest`, `after_latest`. One more point paces training: `step_begin`, passed at
//! the start of every step (`step_begin=sleep:MS` makes each step last at least MS
//! milliseconds, so that a test that acts on a job mid-run acts in time on any machine).

use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{CkptError, Result};

/// Every failpoint of the crate, in protocol order.
pub const POINTS: [&str; 6] =
    ["after_shard_write", "after_manifest_write", "before_rename", "after_rename", "before_latest", "after_latest"];

/// What an armed failpoint does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return [`CkptError::Failpoint`] from the operation.
    Error,
    /// Abort the process immediately.
    Abort,
    /// Wait this long, then go on.
    Sleep(Duration),
}

impl Action {
    /// The action an environment entry names (`error`, `sleep:MS`; anything else aborts,
    /// as a bare name does).
    fn parse(text: &str) -> Action {
        match text.strip_prefix("sleep:").map(str::parse::<u64>) {
            Some(Ok(ms)) => Action::Sleep(Duration::from_millis(ms)),
            _ if text == "error" => Action::Error,
            _ => Action::Abort,
        }
    }
}

static ANY_ARMED: AtomicBool = AtomicBool::new(false);
static ARMED: Mutex<Vec<(String, Action)>> = Mutex::new(Vec::new());
static FROM_ENV: OnceLock<()> = OnceLock::new();

fn load_env() {
    FROM_ENV.get_or_init(|| {
        if let Ok(spec) = std::env::var("STEADFAST_FAILPOINTS") {
            for item in spec.split(',').filter(|s| !s.is_empty()) {
                let (name, action) = item.split_once('=').unwrap_or((item, "abort"));
                arm(name, Action::parse(action));
            }
        }
    });
}

/// Arms failpoint `name` in this process.
pub fn arm(name: &str, action: Action) {
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    armed.retain(|(n, _)| n != name);
    armed.push((name.to_owned(), action));
    ANY_ARMED.store(true, Ordering::SeqCst);
}

/// Disarms every failpoint armed in-process.
pub fn disarm_all() {
    ARMED.lock().unwrap_or_else(|e| e.into_inner()).clear();
    ANY_ARMED.store(false, Ordering::SeqCst);
}

/// Passes failpoint `name`: returns an error, aborts or sleeps if it is armed.
pub fn hit(name: &'static str) -> Result<()> {
    load_env();
    if !ANY_ARMED.load(Ordering::SeqCst) {
        return Ok(());
    }
    let action = ARMED.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(n, _)| n == name).map(|(_, a)| *a);
    match action {
        None => Ok(()),
        Some(Action::Error) => Err(CkptError::Failpoint(name)),
        Some(Action::Abort) => std::process::abort(),
        Some(Action::Sleep(d)) => {
            std::thread::sleep(d);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_entries_name_their_action() {
        assert_eq!(Action::parse("error"), Action::Error);
        assert_eq!(Action::parse("abort"), Action::Abort);
        assert_eq!(Action::parse("sleep:250"), Action::Sleep(Duration::from_millis(250)));
        // A malformed delay is not a delay: the process stops there, as for a bare name.
        assert_eq!(Action::parse("sleep:soon"), Action::Abort);
    }
}
