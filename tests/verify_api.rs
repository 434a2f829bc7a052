//! `burn_spill::verify`: a user's program checked against the plain backend, bit for bit, with
//! a report that names the first difference.

mod common;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_spill::SpillConfig;
use burn_spill::verify::{Difference, Program, Snapshot, verify_against_plain};
use common::ExclusiveDevice;

/// Three steps of a two-layer perceptron trained by hand: random weights, a matmul chain, a
/// gather, the loss and the weights' gradients recorded each step.
struct Perceptron;

impl Program for Perceptron {
    fn run<X: Backend>(&mut self, device: &X::Device, out: &mut Snapshot) {
        type A<X> = Autodiff<X>;
        let mut w1 = Tensor::<A<X>, 2>::random([32, 64], Distribution::Default, device);
        let mut w2 = Tensor::<A<X>, 2>::random([64, 8], Distribution::Default, device);
        for step in 0..3 {
            let (p1, p2) = (w1.clone().require_grad(), w2.clone().require_grad());
            let x = Tensor::<A<X>, 2>::random([16, 32], Distribution::Normal(0.0, 1.0), device);
            let picks = Tensor::<A<X>, 1, Int>::arange(0..8, device);
            let hidden = x.matmul(p1.clone()).tanh();
            let logits = hidden.matmul(p2.clone()).select(1, picks);
            let loss = logits.powi_scalar(2).mean();
            let grads = loss.backward();
            out.gradient(format!("w1 gradient, step {step}"), &p1, &grads);
            out.gradient(format!("w2 gradient, step {step}"), &p2, &grads);
            let (g1, g2) = (p1.grad(&grads).unwrap(), p2.grad(&grads).unwrap());
            out.tensor(format!("loss, step {step}"), loss);
            w1 = Tensor::from_inner(p1.inner() - g1.mul_scalar(0.1));
            w2 = Tensor::from_inner(p2.inner() - g2.mul_scalar(0.1));
        }
        out.tensor("w1", w1).tensor("w2", w2);
    }
}

#[test]
fn a_program_matches_plain_at_every_budget_synchronous_and_not() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    for asynchronous in [true, false] {
        for budget in [None, Some(12 << 10), Some(0)] {
            let mut config = SpillConfig::default().asynchronous(asynchronous);
            if let Some(bytes) = budget {
                config = config.device_budget_bytes(bytes).host_limit_bytes(4 << 10);
            }
            let report = verify_against_plain::<Flex>(&device, config, 11, &mut Perceptron)
                .expect("a valid config");
            report.assert_identical();
            assert_eq!(report.compared, 3 * 3 + 2, "{report}");
            let stats = report.stats.expect("the spilled run's stats");
            assert_eq!(
                stats.device_to_host.count > 0,
                budget.is_some(),
                "budget {budget:?}: {stats:?}"
            );
        }
    }
    assert_eq!(
        burn_spill::SpillBackend::<Flex>::stats(&device).device_budget_bytes,
        None,
        "the device is left unconfigured"
    );
}

/// A program that is not the same on both backends (it records which backend ran it) is
/// caught, and the report names the entry and the element.
#[test]
fn a_difference_is_named_with_the_entry_and_element() {
    struct Telltale;
    impl Program for Telltale {
        fn run<X: Backend>(&mut self, device: &X::Device, out: &mut Snapshot) {
            let same = Tensor::<X, 1>::from_floats([1.0, 2.0], device);
            let name_length = X::name(device).len() as f32;
            let telltale = Tensor::<X, 2>::from_floats([[0.0, 0.0], [0.0, name_length]], device);
            out.tensor("same", same).tensor("telltale", telltale);
        }
    }
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let config = SpillConfig::default().device_budget_bytes(0);
    let report = verify_against_plain::<Flex>(&device, config, 1, &mut Telltale).unwrap();
    assert!(!report.is_identical());
    match &report.first_difference {
        Some(Difference::Value {
            name,
            element,
            differing,
            ..
        }) => {
            assert_eq!(
                (name.as_str(), element.as_slice(), *differing),
                ("telltale", &[1, 1][..], 1)
            );
        }
        other => panic!("expected a value difference, got {other:?}"),
    }
    let message = std::panic::catch_unwind(|| report.assert_identical()).unwrap_err();
    let message = common::panic_message(message);
    assert!(
        message.contains("`telltale` differs at element [1, 1]"),
        "{message}"
    );
}
