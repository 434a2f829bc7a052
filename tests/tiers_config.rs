//! Configuration through `SpillBackend::configure`: fractional budgets, the `BURN_SPILL_*`
//! environment overrides and their errors, and a default config that moves nothing.
//!
//! Configuration and the environment are process-wide, so every test holds [`serial`]'s lock
//! for its whole run, starts and ends with no `BURN_SPILL_*` variable set, and resets the device
//! to `SpillConfig::default()` when it ends, panicking or not.

mod common;

use burn::tensor::Device;
use burn_spill::{
    ENV_BUDGET, ENV_DIR, ENV_HOST_LIMIT, ENV_POLICY, ENV_PRESET, SpillConfig, SpillError,
};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data, input};

const ALL_VARS: [&str; 5] = [ENV_BUDGET, ENV_HOST_LIMIT, ENV_DIR, ENV_POLICY, ENV_PRESET];

/// The device for one test, with the `BURN_SPILL_*` variables cleared before and after.
struct Serial {
    _device: ExclusiveDevice,
}

fn serial() -> Serial {
    let device = ExclusiveDevice::take();
    clear_env();
    Serial { _device: device }
}

impl Drop for Serial {
    fn drop(&mut self) {
        // Runs before the field's drop, so the device is reset without the variables.
        clear_env();
    }
}

fn set_env(name: &str, value: &str) {
    // SAFETY: every test of this binary holds the device lock (`ExclusiveDevice`) while it touches the environment or calls
    // `configure` (the only reader of these variables), so no other thread of this process reads
    // or writes the environment at the same time.
    unsafe { std::env::set_var(name, value) }
}

fn clear_env() {
    for name in ALL_VARS {
        // SAFETY: as in `set_env`: callers hold the device lock (`ExclusiveDevice`).
        unsafe { std::env::remove_var(name) }
    }
}

fn dev() -> Device<Spill> {
    Default::default()
}

fn mem_total_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn invalid_fractions_are_rejected_at_configure() {
    let _serial = serial();
    let device = dev();
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(4096)).unwrap();
    for fraction in [0.0, -0.1, 1.5] {
        let err = Spill::configure(
            &device,
            SpillConfig::default().device_budget_fraction(fraction),
        )
        .unwrap_err();
        match &err {
            SpillError::InvalidValue { field, value, .. } => {
                assert_eq!(*field, "device_budget", "{err}");
                assert!(value.contains(&fraction.to_string()), "{err}");
            }
            other => panic!("fraction {fraction}: expected InvalidValue, got {other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains("device_budget") && message.contains("(0, 1]"),
            "{message}"
        );
        assert_eq!(
            Spill::stats(&device).device_budget_bytes,
            Some(4096),
            "a rejected config leaves the previous one in force"
        );
    }
}

/// Flex has no allocator pool to report: the pool figures stay empty, never invented, and
/// returning pages is a no-op.
#[test]
fn a_backend_without_a_pool_reports_none() {
    let _serial = serial();
    let device = dev();
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(1 << 20)).unwrap();
    let x = input::<Spill>(1, 4, 4, &device).exp();
    <Spill as burn::tensor::backend::Backend>::memory_cleanup(&device);
    assert_eq!(Spill::stats(&device).pool, None);
    assert_eq!(Spill::inner_pool_usage(&device), None);
    drop(x);
}

#[test]
fn fraction_of_declared_device_memory() {
    let _serial = serial();
    let device = dev();
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_fraction(0.5)
            .device_memory_bytes(1 << 30),
    )
    .unwrap();
    assert_eq!(Spill::stats(&device).device_budget_bytes, Some(1 << 29));
}

#[test]
fn fraction_of_ram_on_a_cpu_backend() {
    let _serial = serial();
    let device = dev();
    Spill::configure(&device, SpillConfig::default().device_budget_fraction(0.5)).unwrap();
    let total = mem_total_bytes();
    let budget = Spill::stats(&device).device_budget_bytes.expect("a budget");
    assert!(budget > 0 && budget < total, "budget {budget}, RAM {total}");
    assert_eq!(budget, (total as f64 * 0.5) as u64, "half of MemTotal");
}

#[test]
fn env_overrides_take_effect_through_configure() {
    let _serial = serial();
    let device = dev();
    let tmp = tempfile::tempdir().unwrap();
    set_env(ENV_BUDGET, "1MiB");
    set_env(ENV_HOST_LIMIT, "0");
    set_env(ENV_PRESET, "gan");
    set_env(ENV_POLICY, "lru");
    set_env(ENV_DIR, tmp.path().to_str().unwrap());
    Spill::configure(&device, SpillConfig::default()).unwrap();
    clear_env();

    let stats = Spill::stats(&device);
    assert_eq!(stats.device_budget_bytes, Some(1 << 20));
    assert_eq!(stats.host_limit_bytes, Some(0));
    let file = Spill::spill_file(&device).expect("host limit 0 makes a disk tier");
    assert!(
        file.starts_with(tmp.path()),
        "spill file {} lies under BURN_SPILL_DIR {}",
        file.display(),
        tmp.path().display()
    );

    // The gan preset's watermarks (spill above 70% of the budget, down to 50%) are in force:
    // three 256 KiB tensors (75%) are brought down to two; without the preset all three fit.
    let tensors: Vec<_> = (0..3)
        .map(|i| input::<Spill>(i, 256, 256, &device))
        .collect();
    let stats = Spill::stats(&device);
    assert!(stats.resident.device <= 512 << 10, "{:?}", stats.resident);
    assert_eq!(stats.resident.disk, 256 << 10, "{:?}", stats.resident);
    for (i, t) in tensors.iter().enumerate() {
        assert_same_data(
            &input::<Plain>(i, 256, 256, &Default::default()).into_data(),
            &t.clone().into_data(),
            "tensor under the env config",
        );
    }
}

/// `configure_without_env` takes the config exactly as given, whatever the environment says.
#[test]
fn configure_without_env_ignores_the_overrides() {
    let _serial = serial();
    let device = dev();
    set_env(ENV_BUDGET, "1MiB");
    set_env(ENV_HOST_LIMIT, "0");
    set_env(ENV_POLICY, "not-a-policy");
    let result =
        Spill::configure_without_env(&device, SpillConfig::default().device_budget_bytes(4096));
    clear_env();
    result.unwrap();
    let stats = Spill::stats(&device);
    assert_eq!(stats.device_budget_bytes, Some(4096));
    assert_eq!(stats.host_limit_bytes, None);
    Spill::configure(&device, SpillConfig::default()).unwrap();
}

/// Configures with `name=value` set and returns the error's message, after checking it names the
/// variable, the value and `accepted`.
fn env_error(name: &str, value: &str, accepted: &str) {
    let device = dev();
    set_env(name, value);
    let result = Spill::configure(&device, SpillConfig::default());
    clear_env();
    let err = result.expect_err(&format!("{name}={value} must be rejected"));
    match &err {
        SpillError::InvalidValue {
            field, value: v, ..
        } => {
            assert_eq!(*field, name, "{err}");
            assert_eq!(v, value, "{err}");
        }
        other => panic!("{name}={value}: expected InvalidValue, got {other:?}"),
    }
    let message = err.to_string();
    for needle in [name, value, accepted] {
        assert!(
            message.contains(needle),
            "{name}={value}: message lacks {needle:?}: {message}"
        );
    }
}

#[test]
fn bad_env_values_name_variable_value_and_accepted() {
    let _serial = serial();
    let device = dev();
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(777)).unwrap();
    env_error(ENV_PRESET, "vae", "cnn, rnn, transformer, gan");
    env_error(ENV_POLICY, "mru", "lru");
    env_error(ENV_BUDGET, "lots", "512MiB");
    env_error(ENV_BUDGET, "150%", "50%");
    env_error(ENV_HOST_LIMIT, "plenty", "unlimited");
    assert_eq!(
        Spill::stats(&device).device_budget_bytes,
        Some(777),
        "rejected overrides leave the previous config in force"
    );
    assert!(
        std::env::var(ENV_BUDGET).is_err(),
        "variables are removed after each case"
    );
}

#[test]
fn default_config_moves_nothing() {
    let _serial = serial();
    let device = dev();
    // Another test of this binary may have made a disk tier earlier: a default config removes
    // it (it holds no records), and nothing moves or is written afterwards.
    Spill::configure(&device, SpillConfig::default()).unwrap();
    assert_eq!(
        Spill::spill_file(&device),
        None,
        "an empty disk tier is removed"
    );
    let before = Spill::stats(&device);
    assert_eq!(
        (before.device_budget_bytes, before.host_limit_bytes),
        (None, None)
    );

    let program = |d: &Device<Spill>| {
        let a = input::<Spill>(1, 32, 32, d);
        let b = input::<Spill>(2, 32, 32, d);
        let c = a.clone().matmul(b.clone()).tanh() + a;
        (c * b).sum_dim(1).into_data()
    };
    let plain = {
        let d = Default::default();
        let a = input::<Plain>(1, 32, 32, &d);
        let b = input::<Plain>(2, 32, 32, &d);
        let c = a.clone().matmul(b.clone()).tanh() + a;
        (c * b).sum_dim(1).into_data()
    };
    assert_same_data(&plain, &program(&device), "default config");

    let after = Spill::stats(&device);
    assert_eq!(after.device_to_host, before.device_to_host);
    assert_eq!(after.host_to_device, before.host_to_device);
    assert_eq!(after.host_to_disk, before.host_to_disk);
    assert_eq!(after.disk_to_device, before.disk_to_device);
    assert_eq!(after.over_budget_ops, before.over_budget_ops);
    assert_eq!(after.disk_write_errors, before.disk_write_errors);
    assert_eq!((after.resident.host, after.resident.disk), (0, 0));
    assert_eq!(Spill::spill_file(&device), None, "no disk tier made");
}

#[test]
fn unlimited_again_while_records_are_on_disk_in_a_custom_dir() {
    let _serial = serial();
    let device = dev();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0)
            .spill_dir(tmp.path()),
    )
    .unwrap();
    let t = input::<Spill>(3, 4, 4, &device);
    let _ = t.clone() + 1.0;
    assert_eq!(
        t.clone().into_primitive().tensor().residency(),
        burn_spill::Tier::Disk
    );
    // Turning the budget off must work although a record sits in the custom directory...
    Spill::configure(&device, SpillConfig::default()).unwrap();
    assert_eq!(Spill::stats(&device).device_budget_bytes, None);
    // ...and the record stays readable until the tensor comes back.
    let file = Spill::spill_file(&device).expect("the store stays while it holds a record");
    assert!(file.starts_with(tmp.path()));
    let plain = input::<Plain>(3, 4, 4, &Default::default());
    assert_same_data(
        &plain.into_data(),
        &t.into_data(),
        "restored after unconfigure",
    );
    Spill::configure(&device, SpillConfig::default()).unwrap();
    assert_eq!(
        Spill::spill_file(&device),
        None,
        "the emptied store is removed"
    );
    assert!(!file.exists());
}

/// Tensors made while memory is ample are only listed, not indexed: when an op finds memory
/// short, every one of them is indexed before anything is evicted, so the coldest can leave and
/// the budget holds. Nothing is lost on the way.
#[test]
fn tensors_made_while_memory_was_ample_are_evicted_once_it_runs_short() {
    use burn::tensor::TensorData;
    use burn::tensor::ops::FloatTensorOps;
    use burn_spill::Tier;
    let _serial = serial();
    let device = dev();
    let data = |seed: usize| {
        let values: Vec<f32> = (0..64 * 64)
            .map(|i| ((seed * 31 + i * 7) % 23) as f32 * 0.5)
            .collect();
        TensorData::new(values, [64, 64])
    };
    let one = 64 * 64 * 4;
    let config = SpillConfig::default()
        .device_budget_bytes(3 * one)
        .asynchronous(false);
    Spill::configure(&device, config).unwrap();
    let before = Spill::stats(&device);
    assert_eq!(before.resident.device, 0, "the device starts empty");
    let a = Spill::float_from_data(data(1), &device);
    let _b = Spill::float_from_data(data(2), &device);
    let _c = Spill::float_from_data(data(3), &device);
    assert!(
        !Spill::stats(&device).ops_tracked,
        "three tensors fit the budget: ops run untracked"
    );
    assert_eq!(a.residency(), Tier::Device);

    // A fourth does not fit: ops are tracked from here, and the coldest tensor, made while
    // ops were untracked, leaves for the host.
    let _d = Spill::float_from_data(data(4), &device);
    let stats = Spill::stats(&device);
    assert!(stats.ops_tracked);
    assert_eq!(a.residency(), Tier::Host);
    assert!(
        stats.peak.device <= 3 * one,
        "device peak {} over the budget",
        stats.peak.device
    );
    assert_eq!(stats.over_budget_ops, before.over_budget_ops);
    assert_same_data(
        &data(1),
        &common::read_float::<Spill>(a),
        "the evicted tensor",
    );
}

/// An op whose output outgrows its inputs (an outer product, a linear layer widening its
/// input, a convolution adding channels) is sized from their shapes the first time it runs, before any size is learnt: room
/// is made for the whole output, so the budget holds on that first run too. With the largest
/// input as the estimate, each of these ran with 16 KiB more than the budget on the device.
#[test]
fn an_op_that_outgrows_its_inputs_fits_the_budget_on_its_first_run() {
    use burn::tensor::TensorData;
    use burn::tensor::ops::{FloatTensorOps, ModuleOps};
    use burn_spill::Tier;
    let _serial = serial();
    let device = dev();
    let data = |seed: usize, shape: [usize; 2]| {
        let values: Vec<f32> = (0..shape[0] * shape[1])
            .map(|i| ((seed * 31 + i * 7) % 23) as f32 * 0.25 - 2.0)
            .collect();
        TensorData::new(values, shape)
    };
    let one = 64 * 64 * 4;
    let budget = one + one / 4;
    let config = SpillConfig::default()
        .device_budget_bytes(budget)
        .asynchronous(false);
    Spill::configure(&device, config).unwrap();
    let before = Spill::stats(&device);
    let resident = Spill::float_from_data(data(1, [64, 64]), &device);
    let column = |seed| Spill::float_from_data(data(seed, [64, 1]), &device);
    let row = |seed| Spill::float_from_data(data(seed, [1, 64]), &device);

    // [64, 1] x [1, 64]: the output is 64 times each input.
    let outer = Spill::float_matmul(column(2), row(3));
    let stats = Spill::stats(&device);
    assert_eq!(
        resident.residency(),
        Tier::Host,
        "room was made for the product"
    );
    assert!(
        stats.peak.device <= budget,
        "device peak {} over the budget {budget} on the product's first run",
        stats.peak.device
    );
    // x [64, 1], weight [1, 64]: a linear layer from 1 to 64 features.
    let widened = Spill::linear(column(4), row(5), None);
    let stats = Spill::stats(&device);
    assert!(
        stats.peak.device <= budget,
        "device peak {} over the budget {budget} on the linear layer's first run",
        stats.peak.device
    );
    // 1 channel of 16x16 into 16 channels of 3x3 filters, padded: 16 times the image.
    let conv_options = || burn::tensor::ops::ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let image = |seed| {
        TensorData::new(
            data(seed, [16, 16]).to_vec::<f32>().unwrap(),
            [1, 1, 16, 16],
        )
    };
    let filters =
        |seed| TensorData::new(data(seed, [16, 9]).to_vec::<f32>().unwrap(), [16, 1, 3, 3]);
    let channels = Spill::conv2d(
        Spill::float_from_data(image(6), &device),
        Spill::float_from_data(filters(7), &device),
        None,
        conv_options(),
    );
    let stats = Spill::stats(&device);
    assert!(
        stats.peak.device <= budget,
        "device peak {} over the budget {budget} on the convolution's first run",
        stats.peak.device
    );
    assert_eq!(stats.estimate_misses, before.estimate_misses);
    assert_eq!(stats.over_budget_ops, before.over_budget_ops);

    let plain_device = Default::default();
    let plain = |seed, shape| Plain::float_from_data(data(seed, shape), &plain_device);
    let expected_outer = Plain::float_matmul(plain(2, [64, 1]), plain(3, [1, 64]));
    let expected_widened = Plain::linear(plain(4, [64, 1]), plain(5, [1, 64]), None);
    assert_same_data(
        &common::read_float::<Plain>(expected_outer),
        &common::read_float::<Spill>(outer),
        "the outer product",
    );
    assert_same_data(
        &common::read_float::<Plain>(expected_widened),
        &common::read_float::<Spill>(widened),
        "the linear layer",
    );
    let expected_channels = Plain::conv2d(
        Plain::float_from_data(image(6), &plain_device),
        Plain::float_from_data(filters(7), &plain_device),
        None,
        conv_options(),
    );
    assert_same_data(
        &common::read_float::<Plain>(expected_channels),
        &common::read_float::<Spill>(channels),
        "the convolution",
    );
    assert_same_data(
        &data(1, [64, 64]),
        &common::read_float::<Spill>(resident),
        "the evicted tensor",
    );
}
