//! The handle: metadata from the cache, the ledger back to zero, in-place reuse preserved.

mod common;

use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, Shape, TensorData, TensorMetadata};
use common::{Coverage, Spill, read_float};

#[test]
fn smoke_diff_add() {
    let cov = Coverage::default();
    diff!(cov, [float_add], |B, dev| {
        let a = B::float_from_data(TensorData::from([1.0f32, 2.0]), dev);
        let b = B::float_from_data(TensorData::from([3.0f32, 4.0]), dev);
        vec![read_float::<B>(B::float_add(a, b))]
    });
    cov.assert_covers(&["float_add"]);
}

#[test]
fn metadata_comes_from_the_handle() {
    let dev = Default::default();
    let t = Spill::float_from_data(TensorData::from([[1.0f32, 2.0, 3.0]]), &dev);
    assert_eq!(t.shape(), Shape::new([1, 3]));
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.bytes(), 12);
    let c = t.clone();
    assert_eq!(c.id(), t.id());
    let _ = Spill::float_device(&t);
}

#[test]
fn the_harness_catches_a_difference() {
    use std::panic::catch_unwind;
    let one = || vec![TensorData::from([1.0f32])];
    let other = || vec![TensorData::from([1.0f32 + f32::EPSILON])];
    assert!(catch_unwind(|| common::compare("values", one, other)).is_err());
    let f16 = || vec![TensorData::from([1.0f32]).convert::<burn::tensor::f16>()];
    assert!(catch_unwind(|| common::compare("dtype", one, f16)).is_err());
    let boom = || -> Vec<TensorData> { panic!("rejected") };
    assert!(catch_unwind(|| common::compare("one side panics", one, boom)).is_err());
    let other_boom = || -> Vec<TensorData> { panic!("rejected differently") };
    assert!(catch_unwind(|| common::compare("different panics", boom, other_boom)).is_err());
    common::compare("same panic", boom, boom);
}
