//! The words of the configuration: each kind (model, data set, optimizer) is one enum,
//! defined by the module that owns it, with one name per value. This module gives them
//! their text form once: parsing (`FromStr`, and serde for spec files), printing
//! (`Display`) and the list of words with a line of help each, which the command line
//! shows, through [`repro::words`]. The reduce mode and the divergence policy, owned by `comm`, are words too.

use repro::text_form;
pub use repro::words::{UnknownWord, Word};

use crate::config::{PipeSchedule, WhenBusy};
use crate::data::DataKind;
use crate::model::{KernelSet, ModelKind};
use crate::optim::OptimKind;

impl Word for ModelKind {
    const KIND: &'static str = "model";
    const ALL: &'static [Self] = &[ModelKind::Mlp, ModelKind::Cnn, ModelKind::Gpt];
    fn word(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Gpt => "gpt",
        }
    }
    fn help(self) -> &'static str {
        match self {
            ModelKind::Mlp => "perceptron, 784-W-W/2-10 (W = --width, 256 by default)",
            ModelKind::Cnn => "LeNet-5",
            ModelKind::Gpt => "character-level transformer",
        }
    }
}
text_form!(ModelKind);

impl Word for PipeSchedule {
    const KIND: &'static str = "pipeline schedule";
    const ALL: &'static [Self] = &[PipeSchedule::GPipe, PipeSchedule::OneFOneB];
    fn word(self) -> &'static str {
        match self {
            PipeSchedule::GPipe => "gpipe",
            PipeSchedule::OneFOneB => "1f1b",
        }
    }
    fn help(self) -> &'static str {
        match self {
            PipeSchedule::GPipe => "every forward pass, then every backward pass",
            PipeSchedule::OneFOneB => "one forward, one backward once the pipeline is full (the default; less memory)",
        }
    }
}
text_form!(PipeSchedule);

impl Word for KernelSet {
    const KIND: &'static str = "kernel set";
    const ALL: &'static [Self] = &[KernelSet::Fixed, KernelSet::Framework];
    fn word(self) -> &'static str {
        match self {
            KernelSet::Fixed => "fixed",
            KernelSet::Framework => "framework",
        }
    }
    fn help(self) -> &'static str {
        match self {
            KernelSet::Fixed => "fixed-order kernels: the same bits on every CPU kind (the default)",
            KernelSet::Framework => "the framework's kernels: bits depend on the CPU",
        }
    }
}
text_form!(KernelSet);

impl Word for DataKind {
    const KIND: &'static str = "data set";
    const ALL: &'static [Self] = &[DataKind::FashionMnist, DataKind::Fortunes, DataKind::Synthetic];
    fn word(self) -> &'static str {
        match self {
            DataKind::FashionMnist => "fashion-mnist",
            DataKind::Fortunes => "fortunes",
            DataKind::Synthetic => "synthetic",
        }
    }
    fn help(self) -> &'static str {
        match self {
            DataKind::FashionMnist => "Fashion-MNIST images",
            DataKind::Fortunes => "character-level text from fortunes",
            DataKind::Synthetic => "generated in memory from the seed",
        }
    }
}
text_form!(DataKind);

impl Word for OptimKind {
    const KIND: &'static str = "optimizer";
    const ALL: &'static [Self] = &[OptimKind::Sgd, OptimKind::AdamW];
    fn word(self) -> &'static str {
        match self {
            OptimKind::Sgd => "sgd",
            OptimKind::AdamW => "adamw",
        }
    }
    fn help(self) -> &'static str {
        match self {
            OptimKind::Sgd => "SGD with momentum and L2 weight decay",
            OptimKind::AdamW => "Adam with decoupled weight decay",
        }
    }
}
text_form!(OptimKind);

impl Word for WhenBusy {
    const KIND: &'static str = "busy-writer policy";
    const ALL: &'static [Self] = &[WhenBusy::Wait, WhenBusy::Defer];
    fn word(self) -> &'static str {
        match self {
            WhenBusy::Wait => "wait",
            WhenBusy::Defer => "defer",
        }
    }
    fn help(self) -> &'static str {
        match self {
            WhenBusy::Wait => "wait for the previous persist: a checkpoint after exactly every N steps",
            WhenBusy::Defer => {
                "put the checkpoint off until the previous persist ends: training never waits for the disk"
            }
        }
    }
}
text_form!(WhenBusy);

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Word + std::str::FromStr + std::fmt::Display + PartialEq + std::fmt::Debug>() {
        for &v in T::ALL {
            assert_eq!(v.to_string().parse::<T>().ok(), Some(v));
        }
    }

    #[test]
    fn every_word_round_trips_and_a_stranger_is_named() {
        round_trips::<ModelKind>();
        round_trips::<DataKind>();
        round_trips::<OptimKind>();
        round_trips::<crate::config::OnDivergence>();
        round_trips::<WhenBusy>();
        let e = "resnet".parse::<ModelKind>().unwrap_err();
        assert_eq!(e.to_string(), "unknown model \"resnet\": expected mlp, cnn, gpt");
    }

    #[test]
    fn spec_files_use_the_same_words() {
        #[derive(serde::Deserialize)]
        struct Run {
            model: ModelKind,
            data: DataKind,
            optimizer: OptimKind,
        }
        let r: Run = serde_json::from_str(r#"{"model": "cnn", "data": "fashion-mnist", "optimizer": "sgd"}"#).unwrap();
        assert_eq!((r.model, r.data, r.optimizer), (ModelKind::Cnn, DataKind::FashionMnist, OptimKind::Sgd));
        let e = serde_json::from_str::<Run>(r#"{"model": "cnn", "data": "mnist", "optimizer": "sgd"}"#).err().unwrap();
        assert!(e.to_string().contains("unknown data set \"mnist\""), "{e}");
    }
}
