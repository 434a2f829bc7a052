//! Spill files do not outlive the process: a child process spills to disk and exits normally
//! with its engine still alive (engines live in a static, which Rust never drops); the exit
//! hook must remove the private directory.

use std::process::Command;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig, Tier};

const CHILD: &str = "BURN_SPILL_TEST_EXIT_CHILD";

/// Runs in the child: spill a tensor to disk, print the spill file, return (the harness exits).
#[test]
fn child_spills_to_disk_and_exits() {
    let Ok(base) = std::env::var(CHILD) else {
        return;
    };
    let device = Default::default();
    SpillBackend::<Flex>::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0)
            .spill_dir(&base),
    )
    .unwrap();
    let t = Tensor::<SpillBackend<Flex>, 1>::from_data(
        TensorData::new(vec![1.0f32; 1024], [1024]),
        &device,
    );
    let u = t.clone() + 1.0; // an op: afterwards everything not in use is on disk
    assert_eq!(t.clone().into_primitive().tensor().residency(), Tier::Disk);
    let file = SpillBackend::<Flex>::spill_file(&device).unwrap();
    assert!(std::fs::metadata(&file).unwrap().len() > 0);
    println!("SPILL_FILE={}", file.display());
    // Keep the tensors alive until the process exits.
    std::mem::forget((t, u));
}

#[test]
fn spill_directory_is_removed_at_normal_exit() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_spills_to_disk_and_exits",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, base.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = stdout
        .lines()
        .find_map(|l| l.split_once("SPILL_FILE=").map(|(_, path)| path.trim()))
        .expect("the child printed its spill file");
    let file = std::path::Path::new(file);
    assert!(
        file.starts_with(base.path()),
        "spill file {file:?} is under the configured base"
    );
    assert!(!file.exists(), "spill file {file:?} outlived the process");
    assert!(
        !file.parent().unwrap().exists(),
        "private spill directory outlived the process"
    );
    assert_eq!(
        std::fs::read_dir(base.path()).unwrap().count(),
        0,
        "nothing left in the base"
    );
}
