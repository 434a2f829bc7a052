//! Faults of the host and disk tiers: a spill directory that cannot be made, spill-file writes
//! that fail, a corrupted record, the ledger and the spill file returning to zero, the private
//! directory's modes and strict mode. Every value read back is compared bit for bit with the same
//! program on plain Flex.
//!
//! Configuration is process-wide per device and Flex has one device, so every test holds
//! [`common::ExclusiveDevice`] for its whole run and resets the device to `SpillConfig::default()` when it
//! ends, panicking or not.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Device, Tensor, TensorData};
use burn_spill::{SpillConfig, SpillError, Tier};
use common::spill_file::{all_to_disk, find_record, id, tier};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data, input, panic_message};

fn dev() -> Device<Spill> {
    Default::default()
}

fn read<B: Backend>(t: &Tensor<B, 2>) -> TensorData {
    t.clone().into_data()
}

fn assert_same_tensors(plain: &[Tensor<Plain, 2>], spill: &[Tensor<Spill, 2>], what: &str) {
    assert_eq!(plain.len(), spill.len());
    for (i, (p, s)) in plain.iter().zip(spill).enumerate() {
        assert_same_data(&read(p), &read(s), &format!("{what}: tensor {i}"));
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|e| panic!("canonicalize {}: {e}", p.display()))
}

#[test]
fn uncreatable_spill_dir_is_reported_and_keeps_the_previous_config() {
    let _device = ExclusiveDevice::take();
    let device = dev();
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(12_345)).unwrap();
    assert_eq!(Spill::stats(&device).device_budget_bytes, Some(12_345));

    // As root, modes do not stop anyone: a directory under a regular file cannot be created.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let bad = file.join("spill");
    let err = Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0)
            .spill_dir(&bad),
    )
    .unwrap_err();
    match &err {
        SpillError::SpillDir { path, .. } => assert_eq!(path, &bad),
        other => panic!("expected SpillError::SpillDir, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&bad.display().to_string()),
        "the message names the path: {message}"
    );
    assert!(
        message.contains("spill_dir"),
        "the message names the field: {message}"
    );

    // The previous configuration is still in force.
    let stats = Spill::stats(&device);
    assert_eq!(stats.device_budget_bytes, Some(12_345));
    assert_eq!(stats.host_limit_bytes, None);
}

#[test]
fn failed_disk_writes_keep_tensors_on_the_host_and_lose_nothing() {
    let _device = ExclusiveDevice::take();
    let device = dev();
    let tmp = tempfile::tempdir().unwrap();
    // Synchronous, so that one pass over the host tier meets all three tensors: asynchronously
    // the I/O worker may write a and b (both failing) before the transfer worker has evicted c,
    // and the pass queued after c's eviction then retries them and succeeds. That loses
    // nothing either, but it is not the outcome this test counts.
    Spill::configure(&device, all_to_disk(tmp.path()).asynchronous(false)).unwrap();

    let program_a = |d: &Device<Plain>| (input::<Plain>(1, 4, 8, d), input::<Plain>(2, 4, 8, d));
    let (pa, pb) = program_a(&Default::default());
    let a = input::<Spill>(1, 4, 8, &device);
    let b = input::<Spill>(2, 4, 8, &device);
    assert_eq!((tier(&a), tier(&b)), (Tier::Disk, Tier::Disk));

    let before = Spill::stats(&device);
    Spill::fail_next_disk_writes(&device, 6);
    // The op restores a and b; afterwards a, b and c are evicted. The host tier (limit 0) has
    // no room, so each goes straight on to disk: three writes fail and leave them on the host.
    // The overflow pass after the op tries each once more: three more failures.
    let c = a.clone() + b.clone();
    let pc = pa.clone() + pb.clone();
    let after = Spill::stats(&device);
    assert_eq!(
        after.disk_write_errors - before.disk_write_errors,
        6,
        "exactly the injected failures are counted"
    );
    let tiers = [tier(&a), tier(&b), tier(&c)];
    assert_eq!(
        tiers,
        [Tier::Host; 3],
        "tiers after the failed writes: {tiers:?}"
    );
    assert_eq!(after.host_limit_bytes, Some(0));
    assert_eq!(
        after.resident.host,
        3 * 4 * 8 * 4,
        "the tensors stay on the host, over the limit 0"
    );
    assert_eq!(after.resident.device, 0);

    // Nothing was lost: every value reads back as plain Flex computes it (reads restore and
    // re-spill; the hook is spent, so those writes succeed).
    assert_same_tensors(
        &[pa.clone(), pb.clone(), pc.clone()],
        &[a.clone(), b.clone(), c.clone()],
        "after failed writes",
    );

    // With the hook exhausted, the next op's spills reach disk, host tier included.
    let d = c.clone() * 2.0;
    let pd = pc.clone() * 2.0;
    let last = Spill::stats(&device);
    assert_eq!(
        last.disk_write_errors, after.disk_write_errors,
        "no more failures"
    );
    assert!(last.host_to_disk.count > after.host_to_disk.count);
    assert_eq!(
        last.resident.host, 0,
        "the host tier is back under its limit"
    );
    for (name, t) in [("a", &a), ("b", &b), ("c", &c), ("d", &d)] {
        assert_eq!(tier(t), Tier::Disk, "{name} ends on disk");
    }
    assert_same_tensors(&[pa, pb, pc, pd], &[a, b, c, d], "after the hook is spent");
}

#[test]
fn corrupted_record_panics_naming_tensor_file_and_offset() {
    let _device = ExclusiveDevice::take();
    let device = dev();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_to_disk(tmp.path())).unwrap();

    let intact = input::<Spill>(3, 4, 8, &device);
    let victim = input::<Spill>(4, 4, 8, &device);
    let plain_intact = input::<Plain>(3, 4, 8, &Default::default());
    assert_eq!((tier(&intact), tier(&victim)), (Tier::Disk, Tier::Disk));

    let file = Spill::spill_file(&device).expect("the disk tier exists");
    let victim_id = id(&victim);
    let mut bytes = std::fs::read(&file).unwrap();
    let (record, payload, payload_len) = find_record(&bytes, victim_id);
    assert_eq!(payload_len, 4 * 8 * 4, "the payload is the tensor's bytes");
    let flip = payload + payload_len / 2;
    assert!(
        (payload..payload + payload_len).contains(&flip),
        "the flipped byte is payload"
    );
    bytes[flip] ^= 0xFF;
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.seek(SeekFrom::Start(flip as u64)).unwrap();
        f.write_all(&bytes[flip..flip + 1]).unwrap();
    }

    let result = catch_unwind(AssertUnwindSafe(|| (victim.clone() + 1.0).into_data()));
    let message = panic_message(result.expect_err("restoring a corrupted record must panic"));
    for needle in [
        format!("tensor {victim_id}"),
        file.display().to_string(),
        format!("offset {record}"),
        "CRC32".to_string(),
    ] {
        assert!(
            message.contains(&needle),
            "panic message lacks {needle:?}: {message}"
        );
    }
    // The record is kept (nothing overwritten): the tensor is still on disk, still corrupted.
    assert_eq!(tier(&victim), Tier::Disk);
    let again = catch_unwind(AssertUnwindSafe(|| victim.clone().into_data()));
    assert!(again.is_err(), "a second read fails the same way");

    // A tensor in an intact record still restores bit-identically.
    assert_same_data(&read(&plain_intact), &read(&intact), "intact record");
    assert_same_data(
        &read(&(plain_intact.clone() * 3.0)),
        &read(&(intact.clone() * 3.0)),
        "op on the intact tensor",
    );
    drop(victim);
    drop(intact);
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0));
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        0,
        "all records freed"
    );
}

/// A mixed program: adds, products, a matmul, activations; every result kept alive.
fn mixed_program<B: Backend>(device: &B::Device) -> Vec<Tensor<B, 2>> {
    let x: Vec<Tensor<B, 2>> = (0..6).map(|i| input::<B>(10 + i, 8, 8, device)).collect();
    let y1 = x[0].clone() + x[1].clone();
    let y2 = y1.clone() * x[2].clone();
    let y3 = y2.clone().matmul(x[3].clone());
    let y4 = (y3.clone() - x[4].clone()).tanh();
    let y5 = y4.clone() + x[5].clone() + x[0].clone();
    let y6 = y5.clone().exp().mul_scalar(0.5) - y1.clone();
    let mut all = x;
    all.extend([y1, y2, y3, y4, y5, y6]);
    all
}

#[test]
fn ledger_and_spill_file_return_to_zero() {
    let _device = ExclusiveDevice::take();
    let device = dev();
    let tmp = tempfile::tempdir().unwrap();
    // 8x8 f32 = 256 bytes: two fit the device, three the host, the rest goes to disk.
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(512)
            .host_limit_bytes(768)
            .spill_dir(tmp.path()),
    )
    .unwrap();
    let start = Spill::live(&device);
    assert_eq!(
        (start.tensors, start.bytes),
        (0, 0),
        "nothing alive before the test"
    );
    let before = Spill::stats(&device);

    let plain = mixed_program::<Plain>(&Default::default());
    let spill = mixed_program::<Spill>(&device);
    let mid = Spill::stats(&device);
    assert!(
        mid.device_to_host.count > before.device_to_host.count,
        "spilled to host"
    );
    assert!(
        mid.host_to_disk.count > before.host_to_disk.count,
        "spilled to disk"
    );
    assert!(
        mid.resident.host > 0 && mid.resident.host <= 768,
        "{:?}",
        mid.resident
    );
    assert!(mid.resident.disk > 0, "{:?}", mid.resident);
    assert!(mid.resident.device <= 512, "{:?}", mid.resident);
    assert_eq!(mid.live_tensors, 12);
    let file = Spill::spill_file(&device).expect("the disk tier exists");
    assert!(std::fs::metadata(&file).unwrap().len() > 0);

    assert_same_tensors(&plain, &spill, "mixed program");
    let read_back = Spill::stats(&device);
    assert!(
        read_back.disk_to_device.count > before.disk_to_device.count,
        "restored from disk"
    );
    assert!(
        read_back.host_to_device.count > before.host_to_device.count,
        "restored from host"
    );

    drop(spill);
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0), "{live:?}");
    let end = Spill::stats(&device);
    assert_eq!(end.live_tensors, 0);
    assert_eq!(
        (end.resident.device, end.resident.host, end.resident.disk),
        (0, 0, 0),
        "{:?}",
        end.resident
    );
    assert_eq!(
        (end.spilled_other_bytes, end.spilled_parameter_bytes),
        (0, 0)
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        0,
        "the spill file shrinks to nothing once every record is freed"
    );
}

#[cfg(unix)]
#[test]
fn private_dir_modes_and_spill_dir_in_use() {
    use std::os::unix::fs::PermissionsExt;
    let _device = ExclusiveDevice::take();
    let device = dev();
    let base = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_to_disk(base.path())).unwrap();

    let t = input::<Spill>(5, 4, 4, &device);
    assert_eq!(tier(&t), Tier::Disk);
    let file = Spill::spill_file(&device).expect("the disk tier exists");
    let dir = file.parent().unwrap().to_path_buf();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "spill dir {}", dir.display());
    assert_eq!(mode(&file), 0o600, "spill file {}", file.display());
    assert_eq!(
        canonical(dir.parent().unwrap()),
        canonical(base.path()),
        "the private directory lies directly under the configured base"
    );

    // Moving the directory while a record exists is refused, and the old config stays.
    let err = Spill::configure(&device, all_to_disk(other.path())).unwrap_err();
    match &err {
        SpillError::SpillDirInUse {
            current,
            requested,
            records,
        } => {
            assert_eq!(current, &dir);
            assert_eq!(requested, other.path());
            assert_eq!(*records, 1);
        }
        e => panic!("expected SpillDirInUse, got {e:?}"),
    }
    assert!(
        err.to_string()
            .contains(&other.path().display().to_string()),
        "{err}"
    );
    assert_eq!(Spill::spill_file(&device).as_ref(), Some(&file));
    assert_same_data(
        &read(&input::<Plain>(5, 4, 4, &Default::default())),
        &read(&t),
        "tensor in the old directory",
    );

    // Once the records are gone the move works, and the old directory is removed.
    drop(t);
    Spill::configure(&device, all_to_disk(other.path())).unwrap();
    let moved = Spill::spill_file(&device).expect("a new disk tier");
    assert_eq!(
        canonical(moved.parent().unwrap().parent().unwrap()),
        canonical(other.path())
    );
    assert!(!dir.exists(), "the old private directory is removed");
    assert_eq!(mode(moved.parent().unwrap()), 0o700);
    assert_eq!(mode(&moved), 0o600);
    let u = input::<Spill>(6, 4, 4, &device);
    assert_eq!(tier(&u), Tier::Disk);
    assert_same_data(
        &read(&input::<Plain>(6, 4, 4, &Default::default())),
        &read(&u),
        "new dir",
    );
}

#[test]
fn strict_mode_panics_and_lenient_mode_counts() {
    let _device = ExclusiveDevice::take();
    let device = dev();
    // 16 x 16 f32 = 1 KiB, created before the budget so that only the op itself is judged.
    let t = input::<Spill>(7, 16, 16, &device);
    let pt = input::<Plain>(7, 16, 16, &Default::default());
    Spill::configure(
        &device,
        SpillConfig::default().device_budget_bytes(16).strict(true),
    )
    .unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| t.clone() + 1.0));
    let message = panic_message(result.expect_err("strict mode must panic"));
    for needle in ["float_add_scalar", "1024", "16 bytes", "strict"] {
        assert!(
            message.contains(needle),
            "strict panic lacks {needle:?}: {message}"
        );
    }
    let live = Spill::live(&device);
    assert_eq!(live.tensors, 1, "the failed op left nothing behind");

    // Not strict: the op runs over the budget, is counted, and computes the same values.
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(16)).unwrap();
    let before = Spill::stats(&device).over_budget_ops;
    let u = t.clone() + 1.0;
    let after = Spill::stats(&device).over_budget_ops;
    assert!(after > before, "over_budget_ops {before} -> {after}");
    assert_same_data(
        &read(&(pt.clone() + 1.0)),
        &read(&u),
        "non-strict op over the budget",
    );
    assert_same_data(&read(&pt), &read(&t), "input");
}
