//! Classification of what the probes see by name: a Python code object entered from C
//! ([`classify`], from its qualified name and file) and a torch `record_function` name
//! ([`classify_record`]). Pure string rules, no I/O; the only place that knows torch's file layout
//! and profiler names.
//!
//! Files are matched on whole trailing path components after normalising separators, so
//! `/venv/lib/python3.11/site-packages/torch/nn/modules/module.py`, a source checkout and the fake
//! `torch` package of the tests all match, while `mytorch/nn/modules/module.py` does not.
//!
//! Names are matched on the last dotted component of the qualified name, so the same rule covers
//! CPython 3.11+ (`co_qualname`, e.g. `_BaseDataLoaderIter.__next__`) and 3.9/3.10, where only
//! `co_name` (`__next__`) exists.
use crate::event::Class;

/// What a torch `record_function` name says about the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordClass {
    /// `enumerate(DataLoader)#<Iter>.__next__`: the DataLoader iterator producing a batch.
    DataLoaderNext,
    /// `Optimizer.step#<Optimizer>.step`: the optimizer update (with its pre/post hooks).
    OptimizerStep,
    /// `Optimizer.zero_grad#<Optimizer>.zero_grad`: gradient reset. Not a phase of its own: it
    /// carves its time out of the forward span (it is bookkeeping, counted as residual).
    ZeroGrad,
}

/// Record name prefix torch uses in `_BaseDataLoaderIter.__next__`.
pub const RECORD_DATALOADER: &str = "enumerate(DataLoader)#";
/// Record name prefix torch uses in `Optimizer.profile_hook_step`.
pub const RECORD_OPTIMIZER_STEP: &str = "Optimizer.step#";
/// Record name prefix torch uses in `Optimizer.zero_grad`.
pub const RECORD_OPTIMIZER_ZERO_GRAD: &str = "Optimizer.zero_grad#";

const DATALOADER_PY: &[&str] = &["torch", "utils", "data", "dataloader.py"];
const MODULE_PY: &[&str] = &["torch", "nn", "modules", "module.py"];
const OPTIMIZER_PY: &[&str] = &["torch", "optim", "optimizer.py"];
const TENSOR_PY: &[&str] = &["torch", "_tensor.py"];
const AUTOGRAD_INIT_PY: &[&str] = &["torch", "autograd", "__init__.py"];

/// Qualified-name suffix of the wrapper torch puts around every `Optimizer.step`
/// (`Optimizer.profile_hook_step.<locals>.wrapper` in torch 2.x,
/// `Optimizer._hook_for_profile.<locals>.profile_hook_step.<locals>.wrapper` in 1.x).
const OPTIMIZER_WRAPPER_QUALNAME: &str = "profile_hook_step.<locals>.wrapper";

/// Classifies a Python code object entered from C.
///
/// - `torch/utils/data/dataloader.py` `__next__` → [`Class::DataLoaderNext`]
/// - `torch/nn/modules/module.py` `_wrapped_call_impl` / `_call_impl` → [`Class::ModuleCall`]
/// - `torch/optim/optimizer.py` with a qualname ending in `profile_hook_step.<locals>.wrapper`
///   (3.11+) → [`Class::OptimizerStep`]. A bare `wrapper` (3.9/3.10, no `co_qualname`) is
///   ambiguous (the same file has other closures named `wrapper`, e.g. in
///   `_disable_dynamo_if_unsupported`), so it is [`Class::Ignore`]: the optimizer phase then comes
///   from the `Optimizer.step#` record, which torch always opens inside that wrapper.
/// - `torch/_tensor.py` `backward` or `torch/autograd/__init__.py` `backward` →
///   [`Class::Backward`]
/// - everything else → [`Class::Ignore`]
pub fn classify(qualname: &str, filename: &str) -> Class {
    let name = last_component(qualname);
    if path_ends_with(filename, DATALOADER_PY) && name == "__next__" {
        Class::DataLoaderNext
    } else if path_ends_with(filename, MODULE_PY)
        && matches!(name, "_wrapped_call_impl" | "_call_impl")
    {
        Class::ModuleCall
    } else if path_ends_with(filename, OPTIMIZER_PY)
        && qualname.ends_with(OPTIMIZER_WRAPPER_QUALNAME)
    {
        let prefix = &qualname[..qualname.len() - OPTIMIZER_WRAPPER_QUALNAME.len()];
        // Whole components only: `my_profile_hook_step.<locals>.wrapper` is something else.
        if prefix.is_empty() || prefix.ends_with('.') {
            Class::OptimizerStep
        } else {
            Class::Ignore
        }
    } else if (path_ends_with(filename, TENSOR_PY) || path_ends_with(filename, AUTOGRAD_INIT_PY))
        && name == "backward"
    {
        // `Tensor.backward` (3.11+) / `backward` (3.9/3.10), and the module-level function
        // `torch.autograd.backward`; a `backward` nested deeper (`X.<locals>.backward`) is not it.
        if qualname == "backward" || qualname == "Tensor.backward" {
            Class::Backward
        } else {
            Class::Ignore
        }
    } else {
        Class::Ignore
    }
}

/// Classifies a torch `record_function` name (as read by the probe: possibly truncated to 40
/// bytes, which always keeps the prefixes matched here).
///
/// `Optimizer.zero_grad#...` is deliberately not classified (`None`): zeroing gradients is a
/// handful of tiny kernels or pointer resets, not the update the optimizer phase is meant to
/// measure, so its time stays with whatever encloses it (usually residual).
pub fn classify_record(name: &str) -> Option<RecordClass> {
    if name.starts_with(RECORD_DATALOADER) {
        Some(RecordClass::DataLoaderNext)
    } else if name.starts_with(RECORD_OPTIMIZER_STEP) {
        Some(RecordClass::OptimizerStep)
    } else if name.starts_with(RECORD_OPTIMIZER_ZERO_GRAD) {
        Some(RecordClass::ZeroGrad)
    } else {
        None
    }
}

/// The last dotted component of a qualified name (`A.<locals>.f` → `f`).
fn last_component(qualname: &str) -> &str {
    qualname.rsplit('.').next().unwrap_or(qualname)
}

/// True when `path`'s trailing components are exactly `suffix` (separators `/` or `\`, empty and
/// `.` components ignored).
fn path_ends_with(path: &str, suffix: &[&str]) -> bool {
    let mut parts = path
        .split(['/', '\\'])
        .filter(|c| !c.is_empty() && *c != ".")
        .rev();
    suffix.iter().rev().all(|want| parts.next() == Some(*want))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "/usr/lib/python3.11/site-packages/";
    const FAKE: &str = "/home/user/traceml-daemon/tests/fake_torch/";

    fn both(rel: &str) -> [String; 2] {
        [format!("{SITE}{rel}"), format!("{FAKE}{rel}")]
    }

    #[test]
    fn dataloader_next_311_and_39() {
        for f in both("torch/utils/data/dataloader.py") {
            assert_eq!(
                classify("_BaseDataLoaderIter.__next__", &f),
                Class::DataLoaderNext
            );
            assert_eq!(classify("__next__", &f), Class::DataLoaderNext);
            assert_eq!(
                classify("_BaseDataLoaderIter._next_data", &f),
                Class::Ignore
            );
            assert_eq!(
                classify("_MultiProcessingDataLoaderIter.__iter__", &f),
                Class::Ignore
            );
        }
        assert_eq!(
            classify("__next__", "/x/mytorch/utils/data/dataloader.py"),
            Class::Ignore
        );
        assert_eq!(
            classify("__next__", "/x/torch/utils/data/sampler.py"),
            Class::Ignore
        );
    }

    #[test]
    fn module_call() {
        for f in both("torch/nn/modules/module.py") {
            assert_eq!(classify("Module._wrapped_call_impl", &f), Class::ModuleCall);
            assert_eq!(classify("Module._call_impl", &f), Class::ModuleCall);
            assert_eq!(classify("_wrapped_call_impl", &f), Class::ModuleCall);
            assert_eq!(classify("_call_impl", &f), Class::ModuleCall);
            assert_eq!(classify("Module.forward", &f), Class::Ignore);
            assert_eq!(classify("Module.__getattr__", &f), Class::Ignore);
        }
        assert_eq!(
            classify("Module._call_impl", "/x/torch/nn/modules/linear.py"),
            Class::Ignore
        );
    }

    #[test]
    fn optimizer_step_only_when_unambiguous() {
        for f in both("torch/optim/optimizer.py") {
            assert_eq!(
                classify("Optimizer.profile_hook_step.<locals>.wrapper", &f),
                Class::OptimizerStep
            );
            // torch 1.x nesting.
            assert_eq!(
                classify(
                    "Optimizer._hook_for_profile.<locals>.profile_hook_step.<locals>.wrapper",
                    &f
                ),
                Class::OptimizerStep
            );
            // 3.9/3.10: only co_name, ambiguous with other closures of the same file.
            assert_eq!(classify("wrapper", &f), Class::Ignore);
            assert_eq!(
                classify("_disable_dynamo_if_unsupported.<locals>.wrapper", &f),
                Class::Ignore
            );
            assert_eq!(
                classify("my_profile_hook_step.<locals>.wrapper", &f),
                Class::Ignore
            );
            assert_eq!(classify("Optimizer.zero_grad", &f), Class::Ignore);
        }
        assert_eq!(
            classify(
                "Optimizer.profile_hook_step.<locals>.wrapper",
                "/x/torch/optim/sgd.py"
            ),
            Class::Ignore
        );
    }

    #[test]
    fn backward() {
        for f in both("torch/_tensor.py") {
            assert_eq!(classify("Tensor.backward", &f), Class::Backward);
            assert_eq!(classify("backward", &f), Class::Backward);
            assert_eq!(classify("Tensor.register_hook", &f), Class::Ignore);
        }
        for f in both("torch/autograd/__init__.py") {
            assert_eq!(classify("backward", &f), Class::Backward);
            assert_eq!(classify("grad", &f), Class::Ignore);
            assert_eq!(classify("f.<locals>.backward", &f), Class::Ignore);
        }
        assert_eq!(
            classify("Function.backward", "/x/torch/autograd/function.py"),
            Class::Ignore
        );
        assert_eq!(
            classify("backward", "/x/torch/_tensor_str.py"),
            Class::Ignore
        );
    }

    #[test]
    fn everything_else_is_ignored() {
        assert_eq!(classify("main", "/home/u/train.py"), Class::Ignore);
        assert_eq!(classify("__next__", "/home/u/train.py"), Class::Ignore);
        assert_eq!(classify("", ""), Class::Ignore);
        assert_eq!(
            classify("<module>", "<frozen importlib._bootstrap>"),
            Class::Ignore
        );
    }

    #[test]
    fn paths_are_normalised() {
        assert_eq!(
            classify("__next__", "torch/utils/data/dataloader.py"),
            Class::DataLoaderNext
        );
        assert_eq!(
            classify("__next__", "./torch//utils/./data/dataloader.py"),
            Class::DataLoaderNext
        );
        assert_eq!(
            classify(
                "__next__",
                r"C:\py\Lib\site-packages\torch\utils\data\dataloader.py"
            ),
            Class::DataLoaderNext
        );
        assert_eq!(
            classify("__next__", "utils/data/dataloader.py"),
            Class::Ignore
        );
    }

    #[test]
    fn records() {
        assert_eq!(
            classify_record("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),
            Some(RecordClass::DataLoaderNext)
        );
        // Truncated to 40 bytes by the probe.
        let truncated = &"enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"[..40];
        assert_eq!(
            classify_record(truncated),
            Some(RecordClass::DataLoaderNext)
        );
        assert_eq!(
            classify_record("Optimizer.step#SGD.step"),
            Some(RecordClass::OptimizerStep)
        );
        assert_eq!(
            classify_record(&"Optimizer.step#MyVeryLongCustomOptimizerName.step"[..40]),
            Some(RecordClass::OptimizerStep)
        );
        assert_eq!(
            classify_record("Optimizer.zero_grad#SGD.zero_grad"),
            Some(RecordClass::ZeroGrad)
        );
        assert_eq!(classify_record("ProfilerStep#3"), None);
        assert_eq!(classify_record("## forward ##"), None);
        assert_eq!(classify_record(""), None);
    }
}
