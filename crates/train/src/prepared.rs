//! What a run loads once before its first step: its data, the shapes that follow from
//! it (the GPT's vocabulary, tokens per example), the batch shape checked against it, and
//! the kernels that compute the model. The trainer, a pipeline stage's recovery, and the
//! lab's campaigns and FPNA runs all start from it.

use burn::prelude::Device;

use crate::config::TrainConfig;
use crate::data::sampler::Sampler;
use crate::data::text::unigram_cross_entropy;
use crate::data::{DataSpec, Dataset, Modality, Split};
use crate::error::{ConfigError, TrainError};
use crate::model::{GptConfig, KernelSet, Kernels, Model, ModelKind};
use crate::optim::Optimizer;
use crate::step::{Engine, TrainState};

/// A run's data and the shapes that follow from it.
pub struct Prepared {
    /// The data set.
    pub data: Dataset,
    /// The GPT's shape (its vocabulary follows the text); unused by other models.
    pub gpt: GptConfig,
    /// Tokens per example (1 for images): the loss's denominator is `batch * tokens`.
    pub tokens_per_example: usize,
    /// Perplexity of a unigram model on the held-out text (text only).
    pub unigram_perplexity: Option<f64>,
    /// The batch shape of the configuration loaded, checked against the data.
    sampler: Sampler,
    /// The kernels that compute the model.
    pub kernels: Kernels,
}

impl Prepared {
    /// Loads the data of `config` and checks the batch shape against it.
    pub fn load(config: &TrainConfig) -> Result<Prepared, TrainError> {
        // Before anything large is allocated: a state that cannot fit is refused, not
        // grown until the allocator aborts.
        crate::footprint::check(config, crate::footprint::available())?;
        let modality = match config.model {
            ModelKind::Mlp | ModelKind::Cnn => Modality::Images,
            ModelKind::Gpt => Modality::Text,
        };
        let probe = config.gpt;
        let spec = DataSpec {
            kind: config.data,
            dir: config.data_dir.clone(),
            modality,
            context: probe.context,
            seed: config.seed,
        };
        let data = Dataset::load(&spec)?;
        let (gpt, tokens_per_example, unigram_perplexity) = match &data {
            Dataset::Text(t) => {
                (GptConfig { vocab: t.vocab.len(), ..config.gpt }, t.context, Some(unigram_cross_entropy(t).exp()))
            }
            Dataset::Images(_) => (probe, 1, None),
        };
        let sampler = Sampler::new(config.seed, data.len(Split::Train), config.batch, config.micro_batch)?;
        if sampler.micro_batches() as u64 > config.reduce.max_parts() {
            return Err(ConfigError::Invalid(format!(
                "{} micro-batches per step exceed the {} parts that the {} sum can hold",
                sampler.micro_batches(),
                config.reduce.max_parts(),
                config.reduce
            ))
            .into());
        }
        let kernels = resolve_kernels(config)?;
        Ok(Prepared { data, gpt, tokens_per_example, unigram_perplexity, sampler, kernels })
    }

    /// The freshly initialised state and the engine that steps it, with the batch shape
    /// (seed, batch, micro-batch) of the configuration that was loaded.
    pub fn start(&self, config: &TrainConfig) -> (TrainState, Engine<'_>) {
        let device = Device::flex().autodiff();
        let model = Model::new(config.model, config.seed, self.gpt, config.mlp_width, &device);
        let params = model.params();
        let optimizer = Optimizer::new(config.optimizer, config.optim, &params);
        let state = TrainState::new(params, optimizer);
        let denominator = self.sampler.batch() * self.tokens_per_example;
        (state, Engine::new(&self.data, model, device, self.sampler.clone(), config.reduce, denominator, self.kernels))
    }
}

/// The kernels of `config`: the set it names (or the default), and for the fixed-order
/// set the instruction set that `STEADFAST_ISA` names (or the best this CPU has).
fn resolve_kernels(config: &TrainConfig) -> Result<Kernels, TrainError> {
    Ok(match config.kernel_set() {
        KernelSet::Fixed => Kernels::Fixed(kernels::isa::from_env().map_err(|e| ConfigError::Invalid(e.to_string()))?),
        KernelSet::Framework => Kernels::Framework,
    })
}
