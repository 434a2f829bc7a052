//! The per-device ledger counts live handles and bytes and returns to zero when every handle is
//! gone. One test per binary: the ledger is process-wide, parallel tests would disturb the counts.

#[path = "../examples/common/small_models.rs"]
mod small_models;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{Tensor, TensorData};
use burn_spill::{SpillBackend, TensorRole};

type Spill = SpillBackend<Flex>;

#[test]
fn ledger_counts_handles_and_returns_to_zero() {
    let device = Default::default();
    let start = Spill::live(&device);
    assert_eq!((start.tensors, start.bytes), (0, 0));

    // Clones share one entry; bytes are elements x dtype size.
    let a = Spill::float_from_data(TensorData::from([[1.0f32, 2.0], [3.0, 4.0]]), &device);
    let a2 = a.clone();
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (1, 16));

    // An op consuming the only other clone leaves the original alive, plus its output.
    let b = Spill::float_exp(a2);
    assert_eq!(Spill::live(&device).tensors, 2);
    drop(a);
    // `b` is unique: the op moves its primitive out and the ledger drops it immediately.
    let c = Spill::float_add_scalar(b, 1.0.into());
    assert_eq!(
        (Spill::live(&device).tensors, Spill::live(&device).bytes),
        (1, 16)
    );
    drop(c);
    assert_eq!(
        (Spill::live(&device).tensors, Spill::live(&device).bytes),
        (0, 0)
    );

    // Parameters created inside memory_persistent_allocations are tagged.
    let p = Spill::memory_persistent_allocations(&device, (), |_| {
        Spill::float_from_data(TensorData::from([1.0f32, 2.0, 3.0]), &device)
    });
    let q = Spill::float_from_data(TensorData::from([1.0f32]), &device);
    assert_eq!(p.role(), TensorRole::Parameter);
    assert_eq!(q.role(), TensorRole::Other);
    assert_eq!(Spill::live(&device).parameter_bytes, 12);
    drop((p, q));

    // A whole training run under Autodiff, handles dropped on whichever thread: back to zero.
    let run = small_models::train_cnn::<Autodiff<Spill>>(&device, 3, 4);
    assert_eq!(run.losses.len(), 3);
    let _ = Tensor::<Autodiff<Spill>, 1>::from_floats([1.0], &device);
    let end = Spill::live(&device);
    assert_eq!(
        (
            end.tensors,
            end.bytes,
            end.parameter_tensors,
            end.parameter_bytes
        ),
        (0, 0, 0, 0)
    );
    assert!(end.peak_bytes > 0 && end.created_total > 100);
}
