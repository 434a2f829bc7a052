//! Where a simulated step spends its time and its link traffic, by phase: forward, backward
//! and the optimizer. A budget's overhead usually comes from one of them (on a small batch,
//! the optimizer streaming its state over the link while its ops compute almost nothing), and
//! each phase's floor says how much of it any schedule of the same moves could hide.

use std::fmt;
use std::ops::Range;

use serde::Serialize;

use super::{DeviceProfile, DryRun, Simulated};
use crate::tape::{StepAnalysis, StepTape};

/// A phase of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// From the step's first op to the one before the root gradient.
    Forward,
    /// From the root gradient to the last op that reads a tensor the forward made and makes
    /// one of its own (see [`phase_ops`]).
    Backward,
    /// The rest: the optimizer's update (and whatever else the step does after backward).
    Optimizer,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        })
    }
}

/// The ops of each phase, in step order, or `None` when the step has no backward that
/// [`StepAnalysis`] can find (an inference step, or a backend without autodiff's root
/// gradient).
///
/// Backward begins at [`StepAnalysis::backward_start`]. It ends with the last op that reads
/// a non-parameter tensor the forward made and makes a tensor of its own: the backward reads
/// what autodiff saved, and the optimizer reads only gradients, parameters and its own state
/// (a read of the loss for a log line makes nothing, wherever it comes).
pub fn phase_ops(tape: &StepTape) -> Option<[(Phase, Range<usize>); 3]> {
    let analysis = StepAnalysis::new(tape);
    let backward = analysis.backward_start? as usize;
    let backward_end = analysis
        .tensors
        .iter()
        .filter(|t| !t.parameter && t.producer.is_some_and(|p| (p as usize) < backward))
        .flat_map(|t| t.uses.iter().map(|&u| u as usize))
        // A read that makes nothing (the loss read for a log line) is no data flow.
        .filter(|&u| tape.ops.get(u).is_some_and(|op| !op.outputs.is_empty()))
        .map(|u| u + 1)
        .max()
        .unwrap_or(backward)
        .max(backward);
    let ops = tape.ops.len();
    Some([
        (Phase::Forward, 0..backward),
        (Phase::Backward, backward..backward_end),
        (Phase::Optimizer, backward_end..ops),
    ])
}

/// One phase of a simulated step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// Which phase.
    pub phase: Phase,
    /// How many ops it ran.
    pub ops: usize,
    /// Seconds from its first op's start (stall included) to the next phase's.
    pub seconds: f64,
    /// Seconds its ops (and the rebuilds before them) ran.
    pub compute_seconds: f64,
    /// Seconds the stream waited in it, for inputs or room.
    pub stall_seconds: f64,
    /// Bytes its moves brought to the device (from the host tier or disk).
    pub to_device: u64,
    /// Bytes its moves took off the device (to the host tier or disk).
    pub to_host: u64,
    /// What the phase's own work needs at least on this device: its compute, or either link
    /// direction's bytes at that direction's full rate, whichever is longest. The moves are
    /// the phase's by when they were issued: one issued late in a phase lands in the next, so
    /// a phase can end before its floor (and the next one carries the rest).
    pub floor_seconds: f64,
}

/// The figures of each phase of `run`, a dry run of `tape` on `profile`, or `None` when the
/// step's phases are not found (see [`phase_ops`]). Their times add up to the step's, less
/// the host's gap after the last op.
pub fn phases(tape: &StepTape, run: &DryRun, profile: &DeviceProfile) -> Option<Vec<PhaseFigures>> {
    let ranges = phase_ops(tape)?;
    Some(
        ranges
            .into_iter()
            .map(|(phase, ops)| figures(&run.simulated, phase, ops, profile))
            .collect(),
    )
}

fn figures(
    sim: &Simulated,
    phase: Phase,
    ops: Range<usize>,
    profile: &DeviceProfile,
) -> PhaseFigures {
    let (Some(first), Some(end)) = (sim.marks.get(ops.start), sim.marks.get(ops.end)) else {
        // The run recorded no marks (its tape had no ops): nothing happened in any phase.
        return PhaseFigures {
            phase,
            ops: 0,
            seconds: 0.0,
            compute_seconds: 0.0,
            stall_seconds: 0.0,
            to_device: 0,
            to_host: 0,
            floor_seconds: 0.0,
        };
    };
    let to_device = end.to_device - first.to_device;
    let to_host = end.to_host - first.to_host;
    let compute_seconds = end.compute_seconds - first.compute_seconds;
    let link = |bytes: u64, gb_per_s: f64| bytes as f64 / (gb_per_s * 1e9);
    PhaseFigures {
        phase,
        ops: ops.len(),
        seconds: end.clock - first.clock,
        compute_seconds,
        stall_seconds: end.stall_seconds - first.stall_seconds,
        to_device,
        to_host,
        floor_seconds: compute_seconds
            .max(link(to_device, profile.host_to_device_gb_per_s))
            .max(link(to_host, profile.device_to_host_gb_per_s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SpillConfig;
    use crate::plan::dry_run;
    use crate::tape::analysis::tests::{TapeBuilder, linear_step};

    #[test]
    fn backward_ends_with_the_last_read_of_what_the_forward_made() {
        let tape = linear_step();
        let [forward, backward, optimizer] = phase_ops(&tape).expect("the step has a backward");
        assert_eq!(forward, (Phase::Forward, 0..4));
        // x, made by op 0, is read last by op 7 (the weight's gradient).
        assert_eq!(backward, (Phase::Backward, 4..8));
        assert_eq!(optimizer, (Phase::Optimizer, 8..10));
    }

    #[test]
    fn a_step_without_backward_has_no_phases() {
        let mut tape = linear_step();
        tape.ops.truncate(4);
        assert!(phase_ops(&tape).is_none());
    }

    /// A forward of two exps over a 1 KiB batch whose outputs the backward reads, an
    /// optimizer update of a 1 KiB parameter, and the loss read for a log line.
    fn saved_for_backward() -> StepTape {
        let v: &[usize] = &[256];
        let mut b = TapeBuilder::new();
        b.param(10, v);
        b.op("float_from_data", &[], &[(1, v)], 1_000)
            .op("float_exp", &[1], &[(2, v)], 1_000)
            .op("float_exp", &[2], &[(3, v)], 1_000)
            .op("float_sum", &[3], &[(4, &[1])], 1_000)
            .op("float_ones", &[], &[(5, &[1])], 1_000)
            .op("float_mul", &[5, 3], &[(6, v)], 1_000)
            .drop_now(3)
            .op("float_mul", &[6, 2], &[(7, v)], 1_000)
            .drop_now(2)
            .drop_now(6)
            .op("float_mul", &[7, 1], &[(8, v)], 1_000)
            .drop_now(1)
            .drop_now(7)
            .op("float_sub", &[10, 8], &[(11, v)], 1_000)
            .drop_now(8)
            .drop_now(10)
            // The loss, read for a log line.
            .op("float_read", &[4], &[], 1_000);
        b.build()
    }

    #[test]
    fn each_phase_counts_its_own_time_and_moves() {
        let tape = saved_for_backward();
        let ranges = phase_ops(&tape).unwrap();
        assert_eq!(ranges.map(|(_, r)| r), [0..4, 4..8, 8..10]);
        let profile = DeviceProfile::builtin("a100-pcie4").unwrap();
        // Room for three of the 1 KiB tensors: the forward must send what the backward reads
        // to the host, and the backward bring it back.
        let config = SpillConfig::default()
            .device_budget_bytes(3 * 1024 + 8)
            .prefetch_window(1);
        let run = dry_run(&tape, &profile, &config).unwrap();
        let p = phases(&tape, &run, &profile).unwrap();
        let s = &run.simulated;
        assert!(p[0].to_host > 0, "the forward evicts: {p:?}");
        assert!(p[1].to_device > 0, "the backward restores: {p:?}");
        assert_eq!(p.iter().map(|p| p.ops).collect::<Vec<_>>(), [4, 4, 2]);
        // A modelled GPU has no host gaps: the phases add up to the step.
        let sum = |f: fn(&PhaseFigures) -> f64| p.iter().map(f).sum::<f64>();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 + 1e-9 * b.abs();
        assert!(close(sum(|p| p.seconds), s.step_seconds));
        assert!(close(sum(|p| p.compute_seconds), s.compute_seconds));
        assert!(close(sum(|p| p.stall_seconds), s.stall_seconds));
        let moved = |f: fn(&PhaseFigures) -> u64| p.iter().map(f).sum::<u64>();
        assert_eq!(
            moved(|p| p.to_device),
            s.traffic.host_to_device + s.traffic.disk_to_device
        );
        assert_eq!(
            moved(|p| p.to_host),
            s.traffic.device_to_host + s.traffic.device_to_disk
        );
        for p in &p {
            assert!(
                p.seconds >= p.compute_seconds + p.stall_seconds - 1e-12,
                "{p:?}"
            );
            assert!(p.floor_seconds >= p.compute_seconds, "{p:?}");
        }
    }
}
