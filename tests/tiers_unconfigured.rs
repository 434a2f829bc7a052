//! A device that is never configured moves nothing and makes no disk tier. One test in its own
//! binary: nothing else in this process configures the device.

mod common;

use burn::tensor::backend::Backend;
use burn::tensor::{Device, TensorData};
use common::{Plain, Spill, assert_same_data, input};

fn program<B: Backend>(device: &B::Device) -> TensorData {
    let a = input::<B>(1, 32, 32, device);
    let b = input::<B>(2, 32, 32, device);
    let c = a.clone().matmul(b.clone()).tanh() + a;
    (c * b).sum_dim(1).into_data()
}

#[test]
fn unconfigured_device_moves_nothing() {
    let device: Device<Spill> = Default::default();
    let before = Spill::stats(&device);
    assert_eq!(
        (before.device_budget_bytes, before.host_limit_bytes),
        (None, None)
    );
    assert_same_data(
        &program::<Plain>(&Default::default()),
        &program::<Spill>(&device),
        "unconfigured",
    );
    let after = Spill::stats(&device);
    assert_eq!(after.device_to_host, before.device_to_host);
    assert_eq!(after.host_to_device, before.host_to_device);
    assert_eq!(after.host_to_disk, before.host_to_disk);
    assert_eq!(after.disk_to_device, before.disk_to_device);
    assert_eq!(after.device_to_host.count, 0);
    assert_eq!((after.over_budget_ops, after.disk_write_errors), (0, 0));
    assert_eq!((after.resident.host, after.resident.disk), (0, 0));
    assert!(
        after.peak.device > 0,
        "the ledger still counts device bytes"
    );
    assert_eq!(Spill::spill_file(&device), None);
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0));
}
