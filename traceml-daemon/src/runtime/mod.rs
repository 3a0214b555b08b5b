//! The runtime: targets run as tasks on one thread. Each target is one task
//! ([`task::drive`]: the live attach and event loop of [`target`], folded into bounded folds)
//! with its [`sinks`] behind one trait (a recording, `/metrics`, summary files, the live
//! [`view`]); the ranks of a multi-rank job are one [`group`] with one hang check, whose job
//! summary goes to the job's sinks the same way (the job's files, its verdict on `/metrics`); a
//! [`supervisor`] holds a fixed set of targets (`--pid`), and [`serve`] adds a /proc scanner,
//! with its [`settings`] (flags, config file and defaults, validated once).

pub mod calibration;
pub mod group;
mod kernel;
mod options;
mod run;
pub mod serve;
pub mod settings;
pub mod sinks;
pub mod supervisor;
pub mod target;
pub mod task;
pub mod view;
pub mod workers;
