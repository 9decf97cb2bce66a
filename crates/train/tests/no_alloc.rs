//! The step's own phases allocate nothing once warm: the local reduction into the reused
//! sum buffer, the check the vote reads, and the optimizer's update over flat views. (The
//! model's forward and backward allocate inside burn; that is not ours to count.)
//!
//! A counting allocator wraps the system's for this test binary alone. It counts what the
//! calling thread allocates (the step's own code runs there; the optimizer's element-wise
//! chunks run on the thread pool), after ten warm-up steps in which the scratch buffers
//! grow. The calling thread is itself a worker of a thread pool: a thread outside the pool
//! hands its parallel work to the pool through a shared queue that allocates a new block
//! every few dozen tasks, an allocation of the thread pool's and not of the step's, which
//! would show up in the count whenever the tasks before the loop leave the queue near the
//! end of a block. A worker queues its tasks on its own deque, which stops growing once warm.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use comm::ReduceMode;
use train::driver::{Alone, Driver};
use train::model::ModelKind;
use train::schedule::{self, Op};
use train::step::{NoHooks, SumCheck};
use train::trainer::Prepared;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    ALLOCATIONS.with(|c| c.set(c.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds the
// contract; the counter is a const-initialised thread-local that touches no heap memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's layout is passed on as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout (through `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as for `dealloc`, and the new size is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn reduce_check_and_update_allocate_nothing_after_the_first_step() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    pool.install(counted_steps);
}

fn counted_steps() {
    for (reduce, optimizer) in [
        (ReduceMode::Deterministic, train::optim::OptimKind::AdamW),
        (ReduceMode::Reproducible, train::optim::OptimKind::AdamW),
        (ReduceMode::Fast, train::optim::OptimKind::Sgd),
    ] {
        let mut config = common::tiny(ModelKind::Mlp);
        config.reduce = reduce;
        config.optimizer = optimizer;
        let prepared = Prepared::load(&config).unwrap();
        let (mut state, mut engine) = prepared.start(&config);
        let ops = schedule::data_parallel(engine.sampler().micro_batches(), 0, 1);
        let reduce = ops.iter().position(|o| *o == Op::Reduce).unwrap();
        let mut driver = Driver::new(&engine, 0);
        driver.run(&ops[..reduce], 0, &mut engine, &mut state, &mut NoHooks, &mut Alone).unwrap();
        assert_eq!(driver.micro().len(), 4, "four micro-batches");
        // The first steps grow the scratch buffers; the later ones reduce, vote and
        // update through the driver, with the same micro-batch gradients.
        for _ in 0..10 {
            driver.run(&ops, reduce, &mut engine, &mut state, &mut NoHooks, &mut Alone).unwrap();
        }
        let start = state.fingerprint();
        let before = allocations();
        let mut finite = true;
        for _ in 0..20 {
            driver.run(&ops, reduce, &mut engine, &mut state, &mut NoHooks, &mut Alone).unwrap();
            finite &= SumCheck::of(driver.sum()).finite;
        }
        let allocated = allocations() - before;
        assert_eq!(allocated, 0, "{reduce} / {optimizer}: {allocated} allocations in 20 warm steps");
        assert!(finite);
        assert_eq!(state.step, 30);
        assert_ne!(state.fingerprint(), start, "the updates were applied");
    }
}
