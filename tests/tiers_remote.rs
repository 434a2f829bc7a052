//! The remote cold tier against a real `redis-server` (cargo feature `remote`): training at 30%
//! with host limit 0 bit-identical to plain Flex, a server killed mid-run, a tampered value, a
//! server that refuses connections or wants a password, bad URLs and tier orders, and the keys'
//! expiry and clean-up. Every test skips, saying why, where `redis-server` is not installed.

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
#[path = "redis_server/mod.rs"]
mod redis_server;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::panic::{AssertUnwindSafe, catch_unwind};

use budgeted::{at_30_percent_with, cnn, gpt};
use burn::backend::{Autodiff, Flex};
use burn::tensor::Device;
use burn_spill::{SpillConfig, SpillError, Tier, TierOrder};
use common::spill_file::{id, tier};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data, input, panic_message};
use redis_server::RedisServer;

type PlainAd = Autodiff<Flex>;
type SpilledAd = Autodiff<Spill>;

/// Budget 0, host limit 0: every spilled tensor goes to the cold tiers, the remote one first.
fn all_remote(server: &RedisServer, spill_dir: &std::path::Path) -> SpillConfig {
    SpillConfig::default()
        .device_budget_bytes(0)
        .host_limit_bytes(0)
        .spill_dir(spill_dir)
        .remote_tier(server.url())
        .asynchronous(false)
}

/// A server, the device held for the test (bind every field: one left to `..` drops at once,
/// and the device guard with it) and configured by `shape(all_remote(..))`, and the
/// spill directory; `None` (the reason printed) without `redis-server`.
struct Remote {
    server: RedisServer,
    device: Device<Spill>,
    _spill_dir: tempfile::TempDir,
    _device: ExclusiveDevice,
}

fn remote_device(shape: impl FnOnce(SpillConfig) -> SpillConfig) -> Option<Remote> {
    let server = RedisServer::start()?;
    let guard = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    let spill_dir = tempfile::tempdir().unwrap();
    Spill::configure(&device, shape(all_remote(&server, spill_dir.path()))).unwrap();
    Some(Remote {
        server,
        device,
        _spill_dir: spill_dir,
        _device: guard,
    })
}

#[test]
fn cnn_and_transformer_train_identically_with_the_remote_tier() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    for (name, plain, spilled, batch) in [
        (
            "cnn",
            cnn::<PlainAd> as budgeted::Trainer,
            cnn::<SpilledAd> as budgeted::Trainer,
            8,
        ),
        ("transformer", gpt::<PlainAd>, gpt::<SpilledAd>, 4),
    ] {
        let stats = at_30_percent_with(plain, spilled, batch, &|config| {
            config.host_limit_bytes(0).remote_tier(url.clone())
        });
        let remote = &stats.cold_tiers[0];
        eprintln!("{name}: {remote:?}");
        assert!(remote.store.starts_with("redis "), "{remote:?}");
        assert!(
            remote.written.count > 0 && remote.read.count > 0,
            "{name}: {remote:?}"
        );
        assert_eq!(
            stats.cold_tiers[1].written.count, 0,
            "{name}: the spill file was not needed"
        );
        assert_eq!(stats.disk_write_errors, 0);
    }
    // The run's device guard put the device back to unlimited, which dropped the store.
    assert!(server.spill_keys().is_empty(), "every record was freed");
}

#[test]
fn a_server_killed_mid_run_sends_the_next_spills_to_disk() {
    let Some(Remote {
        mut server,
        device,
        _spill_dir: _dir,
        _device: _guard,
    }) = remote_device(|config| config)
    else {
        return;
    };
    let plain: Device<Plain> = Default::default();

    let before = input::<Spill>(60, 8, 8, &device);
    assert_eq!(tier(&before), Tier::Disk, "the cold tiers hold it");
    assert_eq!(
        Spill::stats(&device).cold_tiers[0].records,
        1,
        "on the server"
    );
    server.kill();

    // The next spills find the server gone and go to the spill file; nothing spilled after the
    // kill is lost.
    let after: Vec<_> = (0..3)
        .map(|i| input::<Spill>(61 + i, 8, 8, &device))
        .collect();
    let sum = after[0].clone() + after[1].clone();
    let stats = Spill::stats(&device);
    assert_eq!(
        stats.disk_write_errors, 0,
        "the spill file took every write"
    );
    assert!(stats.cold_tiers[1].records >= 4, "{:?}", stats.cold_tiers);
    for (i, t) in after.iter().enumerate() {
        assert_same_data(
            &input::<Plain>(61 + i, 8, 8, &plain).into_data(),
            &t.clone().into_data(),
            "spilled after the kill",
        );
    }
    assert_same_data(
        &(input::<Plain>(61, 8, 8, &plain) + input::<Plain>(62, 8, 8, &plain)).into_data(),
        &sum.into_data(),
        "computed after the kill",
    );
    // What was on the server is gone with it: its restore says so, naming the tensor and key.
    let result = catch_unwind(AssertUnwindSafe(|| before.clone().into_data()));
    let message = panic_message(result.expect_err("the record died with the server"));
    for needle in [
        format!("tensor {}", id(&before)),
        "redis".into(),
        "key burn-spill:".into(),
    ] {
        assert!(message.contains(&needle), "lacks {needle:?}: {message}");
    }
}

/// Disk first: the spill file takes the spills, and the remote store those the file fails to
/// write (a full disk, injected).
#[test]
fn disk_then_remote_sends_what_the_disk_fails_to_the_server() {
    let Some(Remote {
        server: _server,
        device,
        _spill_dir: _dir,
        _device: _guard,
    }) = remote_device(|config| config.tier_order(TierOrder::DiskThenRemote))
    else {
        return;
    };
    let plain: Device<Plain> = Default::default();
    let on_disk = input::<Spill>(80, 8, 8, &device);
    let stats = Spill::stats(&device);
    assert!(
        stats.cold_tiers[0].store.starts_with("spill file"),
        "{:?}",
        stats.cold_tiers
    );
    assert_eq!(
        (stats.cold_tiers[0].records, stats.cold_tiers[1].records),
        (1, 0)
    );
    Spill::fail_next_disk_writes(&device, 1);
    let on_server = input::<Spill>(81, 8, 8, &device);
    let stats = Spill::stats(&device);
    assert_eq!(
        (stats.cold_tiers[0].records, stats.cold_tiers[1].records),
        (1, 1)
    );
    assert_eq!(
        stats.disk_write_errors, 0,
        "the remote store took the write"
    );
    for (seed, t) in [(80, on_disk), (81, on_server)] {
        assert_same_data(
            &input::<Plain>(seed, 8, 8, &plain).into_data(),
            &t.into_data(),
            "either store",
        );
    }
}

#[test]
fn a_tampered_value_panics_naming_the_tensor_and_key() {
    let Some(Remote {
        server,
        device,
        _spill_dir: _dir,
        _device: _guard,
    }) = remote_device(|config| config)
    else {
        return;
    };
    let t = input::<Spill>(70, 8, 8, &device);
    let _ = Spill::stats(&device);
    let keys = server.spill_keys();
    let chunk = keys
        .iter()
        .find(|k| k.ends_with(":0"))
        .expect("the payload's first chunk");
    let _: () = redis::cmd("SETRANGE")
        .arg(chunk)
        .arg(17)
        .arg(&b"\xff"[..])
        .query(&mut server.client())
        .unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| (t.clone() + 1.0).into_data()));
    let message = panic_message(result.expect_err("a tampered record must panic"));
    let record_key = chunk.strip_suffix(":0").unwrap();
    for needle in [
        format!("tensor {}", id(&t)),
        format!("key {record_key}:h"),
        "CRC32".to_string(),
    ] {
        assert!(message.contains(&needle), "lacks {needle:?}: {message}");
    }
}

#[test]
fn keys_carry_a_time_to_live_and_are_deleted_when_freed() {
    let Some(Remote {
        server,
        device,
        _spill_dir: _dir,
        _device: _guard,
    }) = remote_device(|config| config)
    else {
        return;
    };
    // 5 MiB: three chunks and a header.
    let t = input::<Spill>(71, 1280, 1024, &device);
    let stats = Spill::stats(&device);
    let keys = server.spill_keys();
    assert_eq!(
        keys.len(),
        4,
        "{keys:?} {:?} {:?}",
        tier(&t),
        stats.cold_tiers
    );
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query(&mut server.client())
            .unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{key}: PTTL {ttl}");
    }
    assert_same_data(
        &input::<Plain>(71, 1280, 1024, &Default::default()).into_data(),
        &t.clone().into_data(),
        "a chunked record",
    );
    drop(t);
    let _ = Spill::stats(&device);
    assert!(server.spill_keys().is_empty(), "freed records are deleted");
}

/// Run by [`a_process_that_exits_deletes_its_keys`] in a child process: leaves a tensor on the
/// server and exits normally.
#[test]
#[ignore = "run as a child process by a_process_that_exits_deletes_its_keys"]
fn child_leaves_a_record_and_exits() {
    let url = std::env::var("BURN_SPILL_TEST_REDIS").expect("the parent test sets the URL");
    let device: Device<Spill> = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0)
            .spill_dir(tmp.path())
            .remote_tier(url),
    )
    .unwrap();
    let t = input::<Spill>(72, 8, 8, &device);
    assert_eq!(Spill::stats(&device).cold_tiers[0].records, 1);
    println!("LEFT ON THE SERVER");
    std::mem::forget(t);
}

#[test]
fn a_process_that_exits_deletes_its_keys() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_leaves_a_record_and_exits",
            "--ignored",
            "--nocapture",
        ])
        .env("BURN_SPILL_TEST_REDIS", server.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("LEFT ON THE SERVER"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        server.spill_keys().is_empty(),
        "the exit hook deleted the child's keys: {:?}",
        server.spill_keys()
    );
}

#[test]
fn a_server_that_refuses_connections_is_a_spill_error_naming_the_url() {
    let _device = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let config = SpillConfig::default()
        .device_budget_bytes(0)
        .remote_tier(&url);
    let err = Spill::configure(&device, config).unwrap_err();
    assert!(
        matches!(&err, SpillError::RemoteTier { url: u, .. } if *u == url),
        "{err:?}"
    );
    assert!(err.to_string().contains(&url), "{err}");
    assert_eq!(
        Spill::stats(&device).device_budget_bytes,
        None,
        "the old config stays"
    );
}

#[test]
fn bad_remote_input_names_the_field_the_value_and_what_is_accepted() {
    let _device = ExclusiveDevice::take();
    let device: Device<Spill> = Default::default();
    for url in [
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "redis://",
        "rediss://127.0.0.1:6379",
    ] {
        let config = SpillConfig::default()
            .device_budget_bytes(0)
            .remote_tier(url);
        let err = Spill::configure(&device, config).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                SpillError::InvalidValue {
                    field: "remote_tier",
                    ..
                }
            ) && text.contains(url)
                && text.contains("redis://[[user]:password@]host"),
            "{text}"
        );
    }
    for order in ["host,tape,disk", "disk", "remote,host,disk"] {
        let err = order.parse::<TierOrder>().unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tier_order") && text.contains(order) && text.contains("disk,remote"),
            "{text}"
        );
    }
    assert_eq!(
        "device,host,disk,remote".parse::<TierOrder>().unwrap(),
        TierOrder::DiskThenRemote
    );
    assert_eq!(
        " Remote , Disk ".parse::<TierOrder>().unwrap(),
        TierOrder::RemoteThenDisk
    );
    let lookup = |name: &str| (name == burn_spill::ENV_TIER_ORDER).then(|| "tape".to_string());
    let err = SpillConfig::default()
        .with_overrides_from(lookup)
        .unwrap_err();
    assert!(err.to_string().contains("BURN_SPILL_TIER_ORDER"), "{err}");

    // A server that wants a password: without it, an error that says so; with it, accepted.
    let Some(server) = RedisServer::start_with(Some("s3cret")) else {
        return;
    };
    let config = SpillConfig::default()
        .device_budget_bytes(0)
        .remote_tier(server.url_without_password());
    let err = Spill::configure(&device, config).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, SpillError::RemoteTier { .. }) && text.contains("password"),
        "{text}"
    );
    let tmp = tempfile::tempdir().unwrap();
    Spill::configure(&device, all_remote(&server, tmp.path())).unwrap();
    let t = input::<Spill>(73, 4, 4, &device);
    assert_same_data(
        &input::<Plain>(73, 4, 4, &Default::default()).into_data(),
        &t.into_data(),
        "through an authenticated server",
    );
    assert!(
        !Spill::stats(&device).cold_tiers[0].store.contains("s3cret"),
        "the password never shows in stats or messages"
    );
}
