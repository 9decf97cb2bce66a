//! Shared helpers: a small deterministic state and shorthand for saving it.
#![allow(dead_code)]

use std::path::Path;

use ckpt::{Meta, Role, SaveOptions, TensorRef};

/// Tensors of a toy training state whose values are a function of `step`.
pub fn state(step: u64, sizes: &[usize]) -> Vec<(String, Role, Vec<usize>, Vec<f32>)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let role = if i % 2 == 0 { Role::Model } else { Role::Optim };
            let name = if role == Role::Model { format!("model.t{i}") } else { format!("optim.model.t{i}.exp_avg") };
            let data = (0..n).map(|j| (step as f32) * 0.5 + (i * 1000 + j) as f32 * 1e-3).collect();
            (name, role, vec![n], data)
        })
        .collect()
}

pub fn refs(state: &[(String, Role, Vec<usize>, Vec<f32>)]) -> Vec<TensorRef<'_>> {
    state.iter().map(|(n, r, s, d)| TensorRef { name: n, role: *r, shape: s, data: d }).collect()
}

pub fn meta(step: u64) -> Meta {
    Meta { step, epoch: step / 10, world_size: 1, config_hash: format!("{:016x}", 42), ..Meta::default() }
}

pub fn save(root: &Path, step: u64, sizes: &[usize], options: &SaveOptions) -> ckpt::SaveReport {
    let s = state(step, sizes);
    ckpt::store::save(root, &meta(step), &refs(&s), options).unwrap()
}

/// Loads the checkpoint `dir` and checks that it holds exactly `state(step)`.
pub fn assert_holds_step(dir: &Path, sizes: &[usize]) -> u64 {
    let c = ckpt::reader::open(dir).unwrap();
    let step = c.manifest.meta.step;
    let loaded = c.load().unwrap();
    let expected = state(step, sizes);
    assert_eq!(loaded.len(), expected.len());
    for (l, (name, role, shape, data)) in loaded.iter().zip(&expected) {
        assert_eq!((&l.name, l.role, &l.shape), (name, *role, shape));
        assert_eq!(l.data, ckpt::TensorData::F32(data.clone()), "{name} at step {step}");
    }
    step
}
