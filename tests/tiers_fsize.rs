//! A real write error from the operating system: with `RLIMIT_FSIZE` lowered (and `SIGXFSZ`
//! ignored, so the write fails with `EFBIG` instead of killing the process), spill-file writes
//! past the limit fail. burn-spill must keep those tensors on the host, count the errors, and
//! compute exactly what plain Flex computes. Its own binary: the limit is process-wide.
#![cfg(unix)]

mod common;

use burn::tensor::backend::Backend;
use burn::tensor::{Device, Tensor, TensorData};
use burn_spill::{SpillConfig, Tier};
use common::{Plain, Spill, assert_same_data};

const LIMIT: u64 = 64 << 10;

fn input<B: Backend>(seed: usize, device: &B::Device) -> Tensor<B, 2> {
    // 64 x 32 f32 = 8 KiB.
    let values: Vec<f32> = (0..64 * 32)
        .map(|i| ((seed * 31 + i * 7) % 23) as f32 * 0.125 - 1.25)
        .collect();
    Tensor::from_data(TensorData::new(values, [64, 32]), device)
}

fn program<B: Backend>(device: &B::Device) -> Vec<Tensor<B, 2>> {
    let xs: Vec<Tensor<B, 2>> = (0..8).map(|i| input::<B>(i, device)).collect();
    let mut out = xs.clone();
    for (i, x) in xs.iter().enumerate() {
        out.push(
            (x.clone() + xs[(i + 1) % xs.len()].clone())
                .mul_scalar(0.5)
                .tanh(),
        );
    }
    out
}

/// Lowers the soft file-size limit and ignores SIGXFSZ; restores both when dropped.
struct FsizeLimit {
    old_limit: libc::rlimit,
    old_handler: libc::sighandler_t,
}

impl FsizeLimit {
    fn set(bytes: u64) -> Self {
        // SAFETY: `signal` and `getrlimit`/`setrlimit` are called with valid arguments and a
        // pointer to a live, properly aligned `rlimit`; ignoring SIGXFSZ is async-signal-safe
        // and only changes how an oversized write fails (EFBIG instead of a killed process).
        unsafe {
            let old_handler = libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_ne!(old_handler, libc::SIG_ERR, "signal(SIGXFSZ)");
            let mut old_limit: libc::rlimit = std::mem::zeroed();
            assert_eq!(
                libc::getrlimit(libc::RLIMIT_FSIZE, &mut old_limit),
                0,
                "getrlimit"
            );
            let new = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: old_limit.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &new), 0, "setrlimit");
            Self {
                old_limit,
                old_handler,
            }
        }
    }
}

impl Drop for FsizeLimit {
    fn drop(&mut self) {
        // SAFETY: restores the values read in `set`, with valid pointers as there.
        unsafe {
            libc::setrlimit(libc::RLIMIT_FSIZE, &self.old_limit);
            libc::signal(libc::SIGXFSZ, self.old_handler);
        }
    }
}

struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        let _ = Spill::configure(&Default::default(), SpillConfig::default());
    }
}

#[test]
fn file_size_limit_write_errors_keep_tensors_on_the_host() {
    let _reset = Reset;
    let device: Device<Spill> = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let plain: Vec<TensorData> = program::<Plain>(&Default::default())
        .into_iter()
        .map(|t| t.into_data())
        .collect();

    let limit = FsizeLimit::set(LIMIT);
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0)
            .spill_dir(tmp.path()),
    )
    .unwrap();
    let file = Spill::spill_file(&device).unwrap();
    let before = Spill::stats(&device);
    // 16 tensors of 8 KiB: twice what the file may hold.
    let spill = program::<Spill>(&device);
    let stats = Spill::stats(&device);
    assert!(
        stats.disk_write_errors > before.disk_write_errors,
        "writes past RLIMIT_FSIZE fail: {stats:?}"
    );
    assert!(
        stats.resident.host > 0,
        "failed tensors stay on the host: {:?}",
        stats.resident
    );
    assert!(
        stats.resident.disk > 0 && stats.resident.disk <= LIMIT,
        "{:?}",
        stats.resident
    );
    assert!(std::fs::metadata(&file).unwrap().len() <= LIMIT);
    let tiers: Vec<Tier> = spill
        .iter()
        .map(|t| t.clone().into_primitive().tensor().residency())
        .collect();
    assert!(
        tiers.contains(&Tier::Host) && tiers.contains(&Tier::Disk),
        "{tiers:?}"
    );

    // Every value survives, wherever it was.
    for (i, (p, s)) in plain.iter().zip(&spill).enumerate() {
        assert_same_data(p, &s.clone().into_data(), &format!("tensor {i}"));
    }
    // And ops on tensors from both tiers still match.
    let total_plain = program::<Plain>(&Default::default())
        .into_iter()
        .reduce(|a, b| a + b)
        .unwrap()
        .into_data();
    let total_spill = spill
        .iter()
        .cloned()
        .reduce(|a, b| a + b)
        .unwrap()
        .into_data();
    assert_same_data(&total_plain, &total_spill, "sum of all");
    drop(limit);

    drop(spill);
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0);
}
