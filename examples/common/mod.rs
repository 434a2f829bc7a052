//! Pieces shared by the `resnet` and `transformer` examples and the `budgets` benchmark, one job
//! per file. Each example mounts this folder with `mod common;` (the benchmark with `#[path]`),
//! and each uses only part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod backends;
pub mod cli;
pub mod experiment;
pub mod gpt_model;
pub mod learner;
pub mod logging;
pub mod plan_report;
pub mod report;
pub mod resnet_model;
pub mod small_models;
pub mod step_log;
pub mod svg;
pub mod synthetic;
pub mod trainers;
pub mod units;
pub mod usage;
