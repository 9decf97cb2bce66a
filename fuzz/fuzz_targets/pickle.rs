//! Any bytes given to the pickle reader produce a value or an error, never a panic, in
//! bounded time and memory; a value that decodes nests no deeper than the limit.
#![no_main]

use ckpt::foreign::pickle::{MAX_DEPTH, Value, parse};
use libfuzzer_sys::fuzz_target;

/// How deep `v` nests (1 for a scalar), without recursion.
fn depth(v: &Value) -> u32 {
    let mut deepest = 0;
    let mut todo = vec![(v, 1)];
    while let Some((v, d)) = todo.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Tuple(items) | Value::List(items) => todo.extend(items.iter().map(|i| (i, d + 1))),
            Value::Dict(items) => todo.extend(items.iter().flat_map(|(k, v)| [(k, d + 1), (v, d + 1)])),
            Value::Call(f, a) => todo.extend([(&**f, d + 1), (&**a, d + 1)]),
            Value::PersId(id) => todo.push((id, d + 1)),
            _ => {}
        }
    }
    deepest
}

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = parse(data) {
        assert!(depth(&v) <= MAX_DEPTH);
    }
});
