//! A writer whose persist is still running says so, and its persist runs below the
//! caller's scheduling priority. (One test: failpoints are process-wide.)

mod common;

use std::time::Duration;

use ckpt::failpoint::{self, Action};
use ckpt::{AsyncWriter, SaveOptions};
use common::assert_holds_step;

const SIZES: [usize; 3] = [300, 20, 100];

/// The calling thread's nice value, from the system's own record of it.
fn own_nice() -> i32 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // Fields after the command name (which may hold spaces) start at field 3; nice is 19.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(16).unwrap().parse().unwrap()
}

#[test]
fn a_slow_persist_keeps_the_writer_busy_and_runs_below_the_callers_priority() {
    let root = tempfile::tempdir().unwrap();
    let mut w = AsyncWriter::new(root.path(), SaveOptions::default()).unwrap();
    w.set_persist_nice(7);
    assert!(!w.busy().unwrap(), "a new writer is idle");

    // The disk is slow: the persist stalls after writing its shards.
    failpoint::arm("after_shard_write", Action::Sleep(Duration::from_millis(1500)));
    let s = common::state(1, &SIZES);
    let stall = w.snapshot(common::meta(1), &common::refs(&s)).unwrap();
    assert!(stall < Duration::from_millis(1000), "the snapshot waited for the persist: {stall:?}");
    assert!(w.busy().unwrap(), "the persist is still sleeping");
    assert_eq!(w.durable(), 0, "nothing is durable yet");
    let last = w.finish().unwrap().unwrap();
    failpoint::disarm_all();
    assert!(!w.busy().unwrap());
    assert_eq!((w.durable(), assert_holds_step(&last.dir, &SIZES)), (1, 1));
    assert_eq!(w.stats().persist_nice, Some((own_nice() + 7).min(19)), "the persist ran 7 below the caller");

    // At an increment of 0 it runs at the caller's priority.
    w.set_persist_nice(0);
    let s = common::state(2, &SIZES);
    w.snapshot(common::meta(2), &common::refs(&s)).unwrap();
    w.finish().unwrap();
    assert_eq!(w.stats().persist_nice, Some(own_nice()));
}
