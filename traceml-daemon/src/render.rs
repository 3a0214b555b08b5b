//! Presentation: renderers of the [`Summary`](crate::summary::Summary) model and of a
//! [`crate::compare::Comparison`]. [`card`] is the verdict card (text, 80–100 columns as the
//! caller asks, ANSI color only on request); [`json`] writes pretty JSON (arrays of numbers kept on
//! one line so per-step samples stay compact), [`html`] the self-contained HTML report with
//! [`svg`] charts, [`compare`] the comparison of two runs, [`sweep`] a sweep of many and [`top`]
//! the live view. They write to any `impl Write`; nothing here reads a clock or the terminal.
//!
//! Presentation sits on top: it reads the model (and the rules' constants), nothing below it
//! imports it.
pub mod card;
pub mod compare;
pub mod files;
#[cfg(test)]
mod hostile_tests;
pub mod html;
pub mod json;
pub mod svg;
pub mod sweep;
pub mod top;

pub use card::*;
pub use compare::{render_compare, render_compare_json, render_compare_text};
pub use html::{render_html, to_html};
pub use json::{render_json, to_json};
pub use sweep::{render_sweep, render_sweep_json};
