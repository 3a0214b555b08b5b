//! The input pipeline's knobs in the vocabulary of the user's framework (`steps.framework`): a
//! Hugging Face `Trainer` user sets `TrainingArguments(dataloader_num_workers=N)`, never builds a
//! DataLoader; a Lightning user sets them in the DataModule's `train_dataloader()`; an accelerate
//! user on the DataLoader handed to `accelerator.prepare()`. The table is docs/advice.md's.
use crate::summary::{IterableDataset, LoopFramework, Summary, Trainer};

/// How the Next line names the loader's settings for one run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Knobs(LoopFramework);

impl Knobs {
    pub(super) fn of(s: &Summary) -> Knobs {
        Knobs(s.steps.framework)
    }

    /// Where the loader's settings go: "TrainingArguments(…)", "DataLoader(…)".
    fn place(self, args: &str) -> String {
        match self.0.trainer {
            Trainer::Plain => format!("DataLoader({args})"),
            Trainer::HfTrainer => format!("TrainingArguments({args})"),
            Trainer::Lightning => {
                format!("DataLoader({args}) in the DataModule's train_dataloader()")
            }
            Trainer::Accelerate => {
                format!("DataLoader({args}) that you pass to accelerator.prepare()")
            }
        }
    }

    /// One setting's name: `num_workers` or `dataloader_num_workers`.
    fn name(self, setting: &str) -> String {
        match self.0.trainer {
            Trainer::HfTrainer => format!("dataloader_{setting}"),
            _ => setting.to_owned(),
        }
    }

    /// The workers setting with a value: "TrainingArguments(dataloader_num_workers=4)".
    pub(super) fn workers(self, value: &str) -> String {
        self.place(&format!("{}={value}", self.name("num_workers")))
    }

    /// "prefetch_factor" / "dataloader_prefetch_factor".
    pub(super) fn prefetch(self) -> String {
        self.name("prefetch_factor")
    }

    /// "persistent_workers=True" / "dataloader_persistent_workers=True".
    pub(super) fn persistent(self) -> String {
        format!("{}=True", self.name("persistent_workers"))
    }

    /// "pin_memory=True" / "dataloader_pin_memory=True" (the Trainer's default is True).
    pub(super) fn pin(self) -> String {
        format!("{}=True", self.name("pin_memory"))
    }

    /// What an iterable dataset asks of more workers, as a clause to append ("; …"), or "".
    pub(super) fn shards(self) -> &'static str {
        match self.0.iterable_dataset {
            Some(IterableDataset::Datasets) => {
                "; the dataset is a datasets IterableDataset: workers split it by shards, so \
                 give it at least as many shards as workers (to_iterable_dataset(num_shards=N), \
                 or more files), or the extra workers get nothing"
            }
            Some(IterableDataset::Torch) => {
                "; the dataset is an IterableDataset: every worker runs its whole iterator unless \
                 __iter__ splits the data by torch.utils.data.get_worker_info()"
            }
            None => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_framework_names_its_own_knob() {
        let k = |trainer, iterable| {
            Knobs(LoopFramework {
                trainer,
                iterable_dataset: iterable,
            })
        };
        let plain = k(Trainer::Plain, None);
        assert_eq!(plain.workers("4"), "DataLoader(num_workers=4)");
        assert_eq!(plain.pin(), "pin_memory=True");
        assert_eq!(plain.shards(), "");
        let hf = k(Trainer::HfTrainer, Some(IterableDataset::Datasets));
        assert_eq!(
            hf.workers("4"),
            "TrainingArguments(dataloader_num_workers=4)"
        );
        assert_eq!(hf.prefetch(), "dataloader_prefetch_factor");
        assert_eq!(hf.persistent(), "dataloader_persistent_workers=True");
        assert!(hf.shards().contains("num_shards"), "{}", hf.shards());
        assert!(
            k(Trainer::Lightning, None)
                .workers("N")
                .contains("train_dataloader()")
        );
        assert!(
            k(Trainer::Accelerate, None)
                .workers("N")
                .contains("accelerator.prepare()")
        );
        assert!(
            k(Trainer::Plain, Some(IterableDataset::Torch))
                .shards()
                .contains("get_worker_info")
        );
    }
}
