//! The training framework and dataset kind the run's sampled stacks show: what the Next line's
//! advice is said in (`TrainingArguments(dataloader_num_workers=N)` for a Hugging Face
//! `Trainer`, the DataModule's DataLoader for Lightning, ...). Decided by the files of the
//! functions the stack samplers named (the training thread's and the DataLoader workers'): a
//! framework whose loop ran was sampled in it.
use serde::{Deserialize, Serialize};

/// What runs the training loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trainer {
    /// The user's own loop over a DataLoader (or no DataLoader at all).
    #[default]
    Plain,
    /// Hugging Face `transformers.Trainer` (its loop in `transformers/trainer.py`).
    HfTrainer,
    /// PyTorch Lightning's `Trainer` (`lightning/pytorch/`, `pytorch_lightning/`).
    Lightning,
    /// The user's loop around Hugging Face `accelerate` (`accelerate/`; a `transformers.Trainer`
    /// runs on accelerate too, and is that instead).
    Accelerate,
}

/// The kind of an iterable dataset the batches came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IterableDataset {
    /// Hugging Face `datasets.IterableDataset` (streaming, `to_iterable_dataset`): its workers
    /// split it by shards.
    Datasets,
    /// A `torch.utils.data.IterableDataset`: each worker runs the whole iterator unless the
    /// dataset splits itself by `get_worker_info()`.
    Torch,
}

/// The loop's framework and dataset (`steps.framework`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopFramework {
    pub trainer: Trainer,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterable_dataset: Option<IterableDataset>,
}

impl LoopFramework {
    /// A plain loop over a map-style dataset: what a summary leaves out.
    pub fn is_plain(&self) -> bool {
        *self == LoopFramework::default()
    }

    /// From the (function, file) pairs of the run's named functions.
    pub fn of<'a>(funcs: impl IntoIterator<Item = (&'a str, &'a str)>) -> LoopFramework {
        let (mut hf, mut lightning, mut accelerate) = (false, false, false);
        let mut iterable = None;
        for (function, file) in funcs {
            hf |= file.ends_with("transformers/trainer.py");
            lightning |=
                file.contains("/lightning/pytorch/") || file.contains("/pytorch_lightning/");
            accelerate |= file.contains("/accelerate/");
            if file.ends_with("datasets/iterable_dataset.py") {
                iterable = Some(IterableDataset::Datasets);
            } else if iterable.is_none()
                && file.ends_with(crate::engine::FETCH_FILE)
                && function.contains("_IterableDatasetFetcher")
            {
                iterable = Some(IterableDataset::Torch);
            }
        }
        let trainer = if hf {
            Trainer::HfTrainer
        } else if lightning {
            Trainer::Lightning
        } else if accelerate {
            Trainer::Accelerate
        } else {
            Trainer::Plain
        };
        LoopFramework {
            trainer,
            iterable_dataset: iterable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_framework_follows_the_sampled_files() {
        let site = "/venv/lib/python3.11/site-packages";
        let f = |pairs: &[(&str, &str)]| {
            let owned: Vec<(String, String)> = pairs
                .iter()
                .map(|(a, b)| (a.to_string(), format!("{site}/{b}")))
                .collect();
            LoopFramework::of(owned.iter().map(|(a, b)| (a.as_str(), b.as_str())))
        };
        assert_eq!(f(&[]), LoopFramework::default());
        let hf = f(&[
            ("Trainer._inner_training_loop", "transformers/trainer.py"),
            ("Accelerator.backward", "accelerate/accelerator.py"),
            ("IterableDataset.__iter__", "datasets/iterable_dataset.py"),
        ]);
        assert_eq!(hf.trainer, Trainer::HfTrainer);
        assert_eq!(hf.iterable_dataset, Some(IterableDataset::Datasets));
        assert_eq!(
            f(&[("_FitLoop.run", "lightning/pytorch/loops/fit_loop.py")]).trainer,
            Trainer::Lightning
        );
        assert_eq!(
            f(&[("DataLoaderShard.__iter__", "accelerate/data_loader.py")]).trainer,
            Trainer::Accelerate
        );
        let torch_iter = f(&[(
            "_IterableDatasetFetcher.fetch",
            "torch/utils/data/_utils/fetch.py",
        )]);
        assert_eq!(torch_iter.trainer, Trainer::Plain);
        assert_eq!(torch_iter.iterable_dataset, Some(IterableDataset::Torch));
        // A map-style fetcher is no iterable dataset.
        assert_eq!(
            f(&[(
                "_MapDatasetFetcher.fetch",
                "torch/utils/data/_utils/fetch.py"
            )])
            .iterable_dataset,
            None
        );
    }
}
