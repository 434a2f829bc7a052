//! Integrity on every restore (`SpillConfig::verify_restores`): a host copy is checksummed when
//! it leaves the device and checked before it is uploaded again or written to disk. A copy that
//! changed panics on restore naming the tensor, the tier and the buffer; it is never written to
//! the spill file, where it would get a checksum of its own and pass.
//!
//! Like `tiers_faults`, every test holds [`common::ExclusiveDevice`] for its whole run.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::tensor::backend::Backend;
use burn::tensor::{Device, Tensor};
use burn_spill::{SpillConfig, Tier};
use common::spill_file::{id, tier};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data, input, panic_message};

/// Budget 0 (every tensor spilled after each op), restores verified, synchronous so that each
/// test sees its moves in order.
fn verified() -> SpillConfig {
    SpillConfig::default()
        .device_budget_bytes(0)
        .asynchronous(false)
        .verify_restores(true)
}

fn corrupt(t: &Tensor<Spill, 2>) {
    assert!(
        t.clone()
            .into_primitive()
            .tensor()
            .corrupt_host_copy_for_tests(),
        "the tensor is on the host"
    );
}

/// Restoring `t` panics naming the tensor, the host tier and the checksum, and the copy stays
/// on the host (nothing overwritten): a second restore fails the same way.
fn assert_restore_reports(t: &Tensor<Spill, 2>) {
    let result = catch_unwind(AssertUnwindSafe(|| (t.clone() * 2.0).into_data()));
    let message = panic_message(result.expect_err("restoring a changed host copy must panic"));
    for needle in [
        format!("tensor {} failed its integrity check", id(t)),
        "host tier".to_string(),
        "CRC32".to_string(),
        "host buffer at 0x".to_string(),
    ] {
        assert!(
            message.contains(&needle),
            "panic message lacks {needle:?}: {message}"
        );
    }
    assert_eq!(tier(t), Tier::Host);
    assert!(catch_unwind(AssertUnwindSafe(|| t.clone().into_data())).is_err());
}

#[test]
fn a_changed_host_copy_panics_on_restore_naming_tensor_and_tier() {
    let _device = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    let plain: Device<Plain> = Default::default();
    Spill::configure(&device, verified()).unwrap();

    // 320 KiB: evicted alone, into a host buffer of its own.
    let large = input::<Spill>(30, 256, 320, &device);
    let untouched = input::<Spill>(31, 256, 320, &device);
    assert_eq!(tier(&large), Tier::Host);
    corrupt(&large);
    assert_restore_reports(&large);
    assert_same_data(
        &input::<Plain>(31, 256, 320, &plain).into_data(),
        &untouched.into_data(),
        "a verified copy restores exactly",
    );

    // Small tensors restored by one op leave together after it: one batch buffer, a slice each.
    let (a, b) = (
        input::<Spill>(32, 4, 8, &device),
        input::<Spill>(33, 4, 8, &device),
    );
    let sum = a.clone() + b.clone();
    let before = Spill::stats(&device);
    assert!(
        before.eviction_batches > 0,
        "the small tensors went as a batch"
    );
    assert_eq!(
        (tier(&a), tier(&b), tier(&sum)),
        (Tier::Host, Tier::Host, Tier::Host)
    );
    corrupt(&a);
    assert_restore_reports(&a);
    let plain_sum = input::<Plain>(32, 4, 8, &plain) + input::<Plain>(33, 4, 8, &plain);
    assert_same_data(
        &plain_sum.into_data(),
        &sum.into_data(),
        "the batch's other slices",
    );
    assert_same_data(
        &input::<Plain>(33, 4, 8, &plain).into_data(),
        &b.into_data(),
        "the batch's other slices",
    );
}

/// The check is what catches it: unverified, the same change comes back as other values.
#[test]
fn unverified_a_changed_host_copy_goes_unnoticed() {
    let _device = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    Spill::configure(&device, verified().verify_restores(false)).unwrap();
    let large = input::<Spill>(34, 256, 320, &device);
    corrupt(&large);
    let expected = input::<Plain>(34, 256, 320, &Default::default()).into_data();
    assert_ne!(expected.as_bytes(), large.into_data().as_bytes());
}

#[test]
fn a_changed_host_copy_is_never_written_to_disk() {
    let _device = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(&device, verified().spill_dir(tmp.path())).unwrap();
    let t = input::<Spill>(35, 256, 320, &device);
    assert_eq!(tier(&t), Tier::Host);
    corrupt(&t);
    // Capping the host tier at 0 moves every host copy on to disk at the next op's end.
    Spill::configure(
        &device,
        verified().spill_dir(tmp.path()).host_limit_bytes(0),
    )
    .unwrap();
    let other = input::<Spill>(36, 4, 8, &device);
    let _ = other.clone() + 1.0;
    assert_eq!(tier(&other), Tier::Disk, "the overflow pass ran");
    assert_eq!(tier(&t), Tier::Host, "the changed copy stayed on the host");
    assert_eq!(Spill::stats(&device).disk_write_errors, 0);
    assert_restore_reports(&t);
}

/// Matmuls, elementwise ops and a reduction over small tensors (batched) and a large one.
fn program<B: Backend>(d: &B::Device) -> Vec<Tensor<B, 2>> {
    let x: Vec<_> = (0..6).map(|i| input::<B>(40 + i, 16, 16, d)).collect();
    let big = input::<B>(50, 256, 320, d);
    let y = x[0].clone().matmul(x[1].clone()) + x[2].clone();
    let z = (y.clone() * x[3].clone()).tanh() - x[4].clone() + x[5].clone();
    let w = big.clone().sum_dim(1).reshape([16, 16]) + z.clone();
    vec![y, z, w, big]
}

/// Verified, every tier restores exactly: host, disk, and batch slices, synchronous and not.
#[test]
fn verified_restores_are_exact_from_every_tier() {
    let _device = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    let plain: Device<Plain> = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    for asynchronous in [false, true] {
        for host_limit in [None, Some(0), Some(4 << 10)] {
            let mut config = verified().asynchronous(asynchronous).spill_dir(tmp.path());
            if let Some(limit) = host_limit {
                config = config.host_limit_bytes(limit);
            }
            Spill::configure(&device, config).unwrap();
            let spilled = program::<Spill>(&device);
            let expected = program::<Plain>(&plain);
            for (i, (p, s)) in expected.into_iter().zip(spilled).enumerate() {
                assert_same_data(
                    &p.into_data(),
                    &s.into_data(),
                    &format!("asynchronous {asynchronous}, host limit {host_limit:?}: result {i}"),
                );
            }
        }
    }
    let stats = Spill::stats(&device);
    assert!(stats.host_to_device.count > 0 && stats.disk_to_device.count > 0);
}
