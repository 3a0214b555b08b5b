//! traceml-daemon: attach to a running training process with eBPF, infer its steps and phases,
//! and say why its GPU waits.
//!
//! Pipeline: probes (`traceml-ebpf`) → ring buffer of [`traceml_common::RawEvent`] → [`event`]
//! decoder → event stream ([`record`] can write and replay it) → [`engine`] (events → steps) →
//! [`analysis`] (steps + [`sample`]s → aggregates) → [`diagnosis`] rules → [`summary`] model →
//! [`render`] (card, JSON, [`compare`] output).
//!
//! Imports go one way, down these layers (checked by `tests/layers.rs`): presentation
//! ([`render`]) → [`sweep`] → [`compare`] → [`analysis`] (builds the model and runs the rules) →
//! [`diagnosis`] (rules that read the model) → [`summary`] (the model's types) → [`engine`] →
//! [`event`] → [`sample`]; [`units`], [`text`], [`stats`] and [`sanitize`] (target-derived text
//! made safe to show) at the bottom. The rules sit above
//! the model's types because they read a whole `Summary`; nothing below `render` formats output.
//!
//! Around the pure core, the shell in three rooms: [`cli`] (arguments and the config file into
//! one validated settings value, typed errors with exit codes), [`host`] (`/proc`, users through
//! NSS, identity, policy, job discovery, end reasons, safe output files) and [`runtime`] (one
//! task per target with its sinks, multi-rank groups, the `--pid` supervisor and `serve`'s
//! scanner). Imports run cli → runtime → core → host helpers; `tests/layers.rs` checks every
//! module.
//!
//! Everything from the event stream on is pure and tested from recorded traces without root;
//! only `attach`, `runtime` and `sampler` touch the kernel or the target. `attach`, `runtime`
//! and the NVML sampler exist only with the `live` feature (on by default): without it the
//! crate builds with stable Rust and no eBPF toolchain, and the binary offers `replay` and
//! `compare`.

pub mod analysis;
#[cfg(feature = "live")]
pub mod attach;
pub mod classify;
pub mod cli;
pub mod compare;
pub mod diagnosis;
pub mod engine;
pub mod event;
pub mod host;
pub mod ledgers;
pub mod metrics;
pub mod overhead;
pub mod phase;
pub mod pipeline;
pub mod profile;
pub mod ranks;
pub mod record;
pub mod render;
#[cfg(feature = "live")]
pub mod runtime;
pub mod sample;
pub mod sampler;
pub mod sanitize;
pub mod stats;
pub mod summary;
pub mod sweep;
/// Synthetic runs for the unit tests of every layer (test builds only).
#[cfg(test)]
pub(crate) mod testkit;
pub mod text;
pub mod tunables;
pub mod units;
pub mod whatif;

/// The compiled eBPF object, built by `build.rs`.
#[cfg(feature = "live")]
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/traceml"));
