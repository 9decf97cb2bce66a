//! The worker's side of [`LAUNCHER_PID`](crate::LAUNCHER_PID): a worker started by a
//! launcher ends when that launcher is gone.

use std::time::Duration;

/// A worker started by `launch` ends when its launcher is gone (killed with `kill -9`, it
/// could not take its workers along): a thread checks four times a second whether the
/// process has been handed to another parent. A stopped launcher is still its parent:
/// the job waits for it. Does nothing in a process that no launcher of ours started.
pub fn exit_with_launcher() {
    let Some(launcher) = std::env::var(crate::LAUNCHER_PID).ok().and_then(|v| v.parse::<u32>().ok()) else { return };
    if std::os::unix::process::parent_id() != launcher {
        // Started by something else with the variable set by hand: nothing to watch.
        return;
    }
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(250));
            if std::os::unix::process::parent_id() != launcher {
                // Not `eprintln!`: stderr was a pipe to the launcher, and writing to it now
                // fails, which would panic this thread instead of ending the process.
                let text = format!("error: the launcher (pid {launcher}) is gone: this worker ends\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
                std::process::exit(3);
            }
        }
    });
}
