//! Hostile spill files and directories: a record whose header bytes were flipped, a truncated
//! file, two records swapped, a symlink planted in place of the spill file, and spill
//! directories another user could tamper with. Each ends in a panic or a `SpillError` that names
//! what was wrong, or (the symlink) changes nothing: never other values returned.
//!
//! Like `tiers_faults`, every test holds [`common::ExclusiveDevice`] for its whole run.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use burn::tensor::Tensor;
use burn_spill::{SpillConfig, SpillError, Tier};
use common::spill_file::{all_to_disk, find_record, id, settled_file, tier};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data, input, panic_message};

/// Overwrites `bytes` at `offset` of `file`.
fn patch(file: &Path, offset: usize, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(bytes, offset as u64).unwrap();
}

/// Restoring `t` must panic with every one of `needles` in the message; the tensor is left on
/// disk (its record kept) and fails the same way again.
fn assert_restore_panics(t: &Tensor<Spill, 2>, needles: &[String]) {
    let result = catch_unwind(AssertUnwindSafe(|| (t.clone() + 1.0).into_data()));
    let message = panic_message(result.expect_err("restoring a tampered record must panic"));
    for needle in needles {
        assert!(
            message.contains(needle.as_str()),
            "panic message lacks {needle:?}: {message}"
        );
    }
    assert_eq!(tier(t), Tier::Disk, "the record is kept");
    let again = catch_unwind(AssertUnwindSafe(|| t.clone().into_data()));
    assert!(again.is_err(), "a second read fails the same way");
}

#[test]
fn a_record_with_flipped_header_bytes_panics_naming_the_tensor() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_to_disk(tmp.path())).unwrap();
    // One tensor per header field that a flip can hit: the id, the payload length, the
    // checksum and the dtype/shape description.
    for (field, at) in [("id", 8), ("length", 20), ("checksum", 28), ("meta", 36)] {
        let t = input::<Spill>(20, 4, 8, &device);
        assert_eq!(tier(&t), Tier::Disk);
        let (file, bytes) = settled_file(&device);
        let (record, _, _) = find_record(&bytes, id(&t));
        patch(&file, record + at, &[bytes[record + at] ^ 0x5A]);
        let needles = [
            format!("tensor {}", id(&t)),
            file.display().to_string(),
            format!("offset {record}"),
            "corrupted".to_string(),
        ];
        eprintln!("flipped the {field} field");
        assert_restore_panics(&t, &needles);
    }
}

#[test]
fn a_truncated_spill_file_panics_naming_the_tensor() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_to_disk(tmp.path())).unwrap();
    let first = input::<Spill>(21, 4, 8, &device);
    let last = input::<Spill>(22, 4, 8, &device);
    let (file, bytes) = settled_file(&device);
    let (record, payload, len) = find_record(&bytes, id(&last));
    // Cut the last record in the middle of its payload.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len((payload + len / 2) as u64)
        .unwrap();
    assert_restore_panics(
        &last,
        &[
            format!("tensor {}", id(&last)),
            file.display().to_string(),
            format!("offset {record}"),
            "read failed".to_string(),
        ],
    );
    // The record before the cut is whole and reads back exactly.
    assert_same_data(
        &input::<Plain>(21, 4, 8, &Default::default()).into_data(),
        &first.into_data(),
        "the record before the cut",
    );
}

#[test]
fn swapped_records_panic_naming_the_tensor_each_belongs_to() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_to_disk(tmp.path())).unwrap();
    // Same dtype and shape, so the records have the same length and description: only the
    // tensor id in the header tells them apart.
    let a = input::<Spill>(23, 4, 8, &device);
    let b = input::<Spill>(24, 4, 8, &device);
    let (file, bytes) = settled_file(&device);
    let (at_a, payload_a, len) = find_record(&bytes, id(&a));
    let (at_b, _, _) = find_record(&bytes, id(&b));
    let extent = payload_a + len - at_a;
    let record_a = bytes[at_a..at_a + extent].to_vec();
    let record_b = bytes[at_b..at_b + extent].to_vec();
    patch(&file, at_a, &record_b);
    patch(&file, at_b, &record_a);
    assert_restore_panics(
        &a,
        &[
            format!("tensor {}", id(&a)),
            format!("header names tensor {}", id(&b)),
            format!("offset {at_a}"),
        ],
    );
    assert_restore_panics(
        &b,
        &[
            format!("tensor {}", id(&b)),
            format!("header names tensor {}", id(&a)),
        ],
    );
}

#[cfg(unix)]
#[test]
fn a_symlink_planted_in_place_of_the_spill_file_is_never_followed() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let decoy_dir = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_to_disk(tmp.path())).unwrap();
    let t = input::<Spill>(25, 4, 8, &device);
    let (file, mut forged) = settled_file(&device);
    // A decoy holding what looks like the same spill file with other values.
    let decoy = decoy_dir.path().join("decoy.spill");
    let (_, payload, len) = find_record(&forged, id(&t));
    forged[payload..payload + len].fill(0x42);
    std::fs::write(&decoy, &forged).unwrap();
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&decoy, &file).unwrap();

    // Reads and writes go through the descriptor opened at creation: the values are the
    // tensor's own, and new records never reach the decoy.
    let plain = input::<Plain>(25, 4, 8, &Default::default());
    assert_same_data(&plain.clone().into_data(), &t.clone().into_data(), "read");
    let u = t.clone() * 2.0;
    assert_eq!(tier(&u), Tier::Disk);
    assert_same_data(
        &(plain * 2.0).into_data(),
        &u.clone().into_data(),
        "new record",
    );
    assert_eq!(
        std::fs::read(&decoy).unwrap(),
        forged,
        "the decoy is untouched"
    );

    // Removing the spill directory removes the link, not what it points to.
    let dir = file.parent().unwrap().to_path_buf();
    drop((t, u));
    Spill::configure(&device, SpillConfig::default()).unwrap();
    assert!(!dir.exists(), "the private directory is removed");
    assert_eq!(std::fs::read(&decoy).unwrap(), forged, "the decoy survives");
}

/// Configuring a disk tier under `base` fails with a `SpillError::SpillDir` naming it and
/// saying `why`; the device keeps working without that directory.
#[cfg(unix)]
fn assert_spill_dir_refused(base: &Path, why: &str) {
    let device = Default::default();
    let err = Spill::configure(&device, all_to_disk(base)).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(&err, SpillError::SpillDir { path, .. } if path == base),
        "{err:?}"
    );
    assert!(message.contains(why), "{message}");
    assert!(
        message.contains(&format!("{base:?}")),
        "the message names the directory: {message}"
    );
    assert!(
        std::fs::read_dir(base).unwrap().next().is_none(),
        "nothing was made inside {}",
        base.display()
    );
}

#[cfg(unix)]
#[test]
fn a_spill_dir_others_can_write_needs_the_sticky_bit() {
    use std::os::unix::fs::PermissionsExt;
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("shared");
    for mode in [0o777, 0o775, 0o757] {
        std::fs::create_dir_all(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(mode)).unwrap();
        assert_spill_dir_refused(&base, "writable by other users");
    }
    // With the sticky bit (as on /tmp) only a directory's owner may rename it: accepted.
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).unwrap();
    Spill::configure(&device, all_to_disk(&base)).unwrap();
    let t = input::<Spill>(26, 4, 8, &device);
    assert_eq!(tier(&t), Tier::Disk);
    assert_same_data(
        &input::<Plain>(26, 4, 8, &Default::default()).into_data(),
        &t.into_data(),
        "under a sticky shared directory",
    );
    Spill::configure(&device, SpillConfig::default()).unwrap();
}

#[cfg(unix)]
#[test]
fn a_spill_dir_owned_by_another_user_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let _device = ExclusiveDevice::take();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("theirs");
    std::fs::create_dir(&base).unwrap();
    // Only root can give a directory away; elsewhere this case cannot be set up.
    if let Err(e) = std::os::unix::fs::chown(&base, Some(65534), Some(65534)) {
        eprintln!("skipped: cannot chown a directory to another user here ({e}); run as root");
        return;
    }
    assert_eq!(std::fs::metadata(&base).unwrap().uid(), 65534);
    assert_spill_dir_refused(&base, "owned by uid 65534");
}
