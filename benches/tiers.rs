//! Throughput of the host and disk tiers of `SpillBackend<Flex>` against plain copies and plain
//! file I/O of the same number of bytes, and with `--features remote` of the remote tier against
//! a plain Redis client's SET and GET to the same server, measured in the same run. Prints a markdown table of
//! the ratios at the end (the target is spill / baseline >= 0.8 in every direction).
//!
//! ```text
//! cargo bench --bench tiers            # full run, about a minute
//! cargo bench --bench tiers -- --test  # smoke run, seconds
//! ```
//!
//! What is measured:
//! - The engine side is the engine's own per-direction timing (`SpillStats::device_to_host`,
//!   `host_to_device`, `host_to_disk`, `disk_to_device`: wall time inside the move, bytes moved),
//!   taken as deltas around one use of the tensor. With a device budget of 0 every use restores
//!   the tensor (host or disk -> device) and the eviction after the op spills it again
//!   (device -> host, and with a host limit of 0 on to disk).
//! - The baseline is timed in the same round, right before or after (the order alternates), and
//!   the summary ratio is the median over rounds of the per-round throughput ratio, so that
//!   drift on a shared machine hits both sides alike.
//! - Criterion groups `host_roundtrip` and `disk_roundtrip` time one whole use end to end
//!   (restore + op + re-evict, with all the bookkeeping) against the same bytes moved plainly.
//!
//! The spill directory and the baseline file are in the same fresh temp directory (under
//! `$TMPDIR`, or `BURN_SPILL_BENCH_DIR` if set); neither side fsyncs, as the engine does not.

#[cfg(feature = "remote")]
#[path = "../tests/redis_server/mod.rs"]
mod redis_server;

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData};
use burn_spill::{MoveStats, SpillBackend, SpillConfig, Tier};
use criterion::{BenchmarkId, Criterion, Throughput};

type Spill = SpillBackend<Flex>;

const MIB: usize = 1 << 20;
const SIZES_MIB: [usize; 2] = [16, 64];

/// A float tensor of `bytes` bytes (f32) and the same bytes as a host buffer for the baselines.
fn tensor_and_bytes(bytes: usize) -> (Tensor<Spill, 1>, Vec<u8>) {
    let n = bytes / 4;
    let values: Vec<f32> = (0..n).map(|i| (i % 1021) as f32 * 0.5).collect();
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = Tensor::from_data(TensorData::new(values, [n]), &Default::default());
    (t, raw)
}

fn tier(t: &Tensor<Spill, 1>) -> Tier {
    t.clone().into_primitive().tensor().residency()
}

/// One use of the tensor: the op must restore its input; its output is one element, so almost
/// all bytes moved are the input's. With budget 0 the settle after the op spills the input again
/// (and the 4-byte output, which is dropped right away). On Flex the output is a view of the
/// input's buffer, so the input's buffer is shared when it is spilled, as it is for any tensor
/// that has views.
fn use_once(t: &Tensor<Spill, 1>) {
    drop(black_box(t.clone().slice(0..1)));
}

/// The baseline for device <-> host moves: `to_vec` and drop.
///
/// Why `to_vec` and not `copy_from_slice` into a preallocated buffer: every spill produces a new
/// host buffer that the host tier then owns (there is no arena to reuse), and every move frees
/// the buffer it came from (the device buffer after a spill; for a restore on a real device the
/// host buffer), so one move is "allocate + copy + free". `to_vec` + drop is exactly that, page
/// faults of a fresh large allocation included. The preallocated copy is the bare bandwidth
/// ceiling; it is printed for context, not used for the ratio.
fn memcpy_fresh(src: &[u8]) -> Duration {
    let start = Instant::now();
    let copy = black_box(src.to_vec());
    drop(copy);
    start.elapsed()
}

fn memcpy_prealloc(src: &[u8], dst: &mut [u8]) -> Duration {
    let start = Instant::now();
    dst.copy_from_slice(src);
    black_box(&mut *dst);
    start.elapsed()
}

/// The baseline file, in the same directory as the spill directory, used as the engine uses its
/// spill file: the record is written into an empty file at offset 0 and, once read back, the
/// file is truncated to nothing again (the engine frees the record, and a free extent at the end
/// of the file shrinks it). No fsync on either side.
struct BaselineFile(File);

impl BaselineFile {
    fn create(dir: &Path) -> Self {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join("baseline.bin"))
            .expect("create the baseline file");
        Self(file)
    }

    /// host -> disk: write the buffer sequentially and release it (a spill to disk releases the
    /// host buffer too); the buffer is a fresh copy made outside the timing.
    fn write(&mut self, src: &[u8]) -> Duration {
        let buf = src.to_vec();
        let start = Instant::now();
        self.0.seek(SeekFrom::Start(0)).unwrap();
        self.0.write_all(&buf).expect("write the baseline file");
        drop(buf);
        start.elapsed()
    }

    /// disk -> memory: read the file sequentially into a fresh buffer (as the engine does) and
    /// truncate it. The buffer outlives the timing (the engine hands it to the device tensor).
    fn read(&mut self, len: usize) -> (Duration, Vec<u8>) {
        let start = Instant::now();
        let mut buf = vec![0u8; len];
        self.0.seek(SeekFrom::Start(0)).unwrap();
        self.0.read_exact(&mut buf).expect("read the baseline file");
        self.0.set_len(0).unwrap();
        (start.elapsed(), black_box(buf))
    }
}

fn stats() -> burn_spill::SpillStats {
    Spill::stats(&Default::default())
}

/// Bytes and time of one direction between two snapshots.
fn delta(before: &MoveStats, after: &MoveStats) -> (u64, Duration) {
    (after.bytes - before.bytes, after.time - before.time)
}

fn throughput(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64().max(1e-12)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One row of the summary: medians over the rounds.
struct Row {
    tier: &'static str,
    direction: &'static str,
    mib: usize,
    engine_bps: f64,
    baseline: &'static str,
    baseline_bps: f64,
    ratio: f64,
}

/// Per-round samples of one direction.
#[derive(Default)]
struct Samples {
    engine: Vec<f64>,
    baseline: Vec<f64>,
    ratio: Vec<f64>,
}

impl Samples {
    fn push(&mut self, engine_bps: f64, baseline_bps: f64) {
        self.engine.push(engine_bps);
        self.baseline.push(baseline_bps);
        self.ratio.push(engine_bps / baseline_bps);
    }

    fn row(
        self,
        tier: &'static str,
        direction: &'static str,
        mib: usize,
        baseline: &'static str,
    ) -> Row {
        Row {
            tier,
            direction,
            mib,
            engine_bps: median(self.engine),
            baseline,
            baseline_bps: median(self.baseline),
            ratio: median(self.ratio),
        }
    }
}

fn configure(base: &Path, host_limit: Option<u64>, verify_restores: bool) {
    let config = SpillConfig::default()
        .device_budget_bytes(0)
        .verify_restores(verify_restores)
        .spill_dir(base);
    let config = match host_limit {
        Some(limit) => config.host_limit_bytes(limit),
        None => config.unlimited_host(),
    };
    Spill::configure(&Default::default(), config).expect("configure the spill device");
}

/// One (engine, baseline) pair per round, the order alternating so that drift hits both alike:
/// each side returns (spill, restore); the engine's as (bytes, time) it measured, the
/// baseline's as the time it took for `bytes`. Returns the spill and restore samples.
fn paired_rounds(
    warmup: usize,
    rounds: usize,
    bytes: u64,
    mut engine: impl FnMut() -> ((u64, Duration), (u64, Duration)),
    mut baseline: impl FnMut() -> (Duration, Duration),
) -> (Samples, Samples) {
    let (mut spill, mut restore) = (Samples::default(), Samples::default());
    for round in 0..warmup + rounds {
        let ((out, back), (plain_out, plain_back)) = if round % 2 == 0 {
            let e = engine();
            (e, baseline())
        } else {
            let b = baseline();
            (engine(), b)
        };
        if round >= warmup {
            spill.push(throughput(out.0, out.1), throughput(bytes, plain_out));
            restore.push(throughput(back.0, back.1), throughput(bytes, plain_back));
        }
    }
    (spill, restore)
}

/// Host tier: device -> host and host -> device against `to_vec`, paired per round.
fn paired_host(
    mib: usize,
    t: &Tensor<Spill, 1>,
    src: &[u8],
    warmup: usize,
    rounds: usize,
) -> [Row; 2] {
    let engine = || {
        let before = stats();
        use_once(t);
        let after = stats();
        assert_eq!(
            tier(t),
            Tier::Host,
            "the tensor is spilled to host again after each use"
        );
        (
            delta(&before.device_to_host, &after.device_to_host),
            delta(&before.host_to_device, &after.host_to_device),
        )
    };
    let baseline = || (memcpy_fresh(src), memcpy_fresh(src));
    let (spill, restore) = paired_rounds(warmup, rounds, src.len() as u64, engine, baseline);
    [
        spill.row("host", "spill device->host", mib, "to_vec"),
        restore.row("host", "restore host->device", mib, "to_vec"),
    ]
}

/// Disk tier: host -> disk and disk -> device against a plain write and read of the same bytes
/// in a file in the same directory, paired per round.
fn paired_disk(
    mib: usize,
    t: &Tensor<Spill, 1>,
    src: &[u8],
    file: &mut BaselineFile,
    warmup: usize,
    rounds: usize,
) -> [Row; 2] {
    let engine = || {
        let before = stats();
        use_once(t);
        let after = stats();
        assert_eq!(
            tier(t),
            Tier::Disk,
            "the tensor is spilled to disk again after each use"
        );
        (
            delta(&before.host_to_disk, &after.host_to_disk),
            delta(&before.disk_to_device, &after.disk_to_device),
        )
    };
    let baseline = || {
        let w = file.write(src);
        let (r, buf) = file.read(src.len());
        assert_eq!(buf.len(), src.len());
        (w, r)
    };
    let (spill, restore) = paired_rounds(warmup, rounds, src.len() as u64, engine, baseline);
    [
        spill.row("disk", "spill host->disk", mib, "file write"),
        restore.row("disk", "restore disk->device", mib, "file read"),
    ]
}

/// Remote tier (feature `remote`): the store's own timing of its pipelined writes and reads
/// (`SpillStats::cold_tiers`), against a plain client's SET and GET of the same bytes to the
/// same server, paired per round.
#[cfg(feature = "remote")]
fn paired_remote(
    mib: usize,
    t: &Tensor<Spill, 1>,
    src: &[u8],
    server: &redis_server::RedisServer,
    warmup: usize,
    rounds: usize,
) -> [Row; 2] {
    let mut client = server.client();
    let remote = |s: &burn_spill::SpillStats| s.cold_tiers[0].clone();
    let engine = || {
        let before = remote(&stats());
        use_once(t);
        let after = remote(&stats());
        (
            delta(&before.written, &after.written),
            delta(&before.read, &after.read),
        )
    };
    let baseline = || {
        let start = Instant::now();
        let _: () = redis::cmd("SET")
            .arg("bench:plain")
            .arg(src)
            .query(&mut client)
            .expect("SET");
        let set = start.elapsed();
        let start = Instant::now();
        let got: Vec<u8> = redis::cmd("GET")
            .arg("bench:plain")
            .query(&mut client)
            .expect("GET");
        assert_eq!(got.len(), src.len());
        (set, start.elapsed())
    };
    let (spill, restore) = paired_rounds(warmup, rounds, src.len() as u64, engine, baseline);
    [
        spill.row("remote", "spill to redis", mib, "client SET"),
        restore.row("remote", "restore from redis", mib, "client GET"),
    ]
}

/// The steps the engine's moves are made of on Flex, each timed alone (median GB/s over `reps`),
/// to tell where a direction that misses its target loses its time.
fn breakdown(mib: usize, src: &[u8], reps: usize) -> Vec<(usize, &'static str, f64)> {
    let bytes = src.len();
    let n = bytes / 4;
    let plain = Tensor::<Flex, 1>::from_data(
        TensorData::from_bytes_vec(src.to_vec(), [n], DType::F32),
        &Default::default(),
    );
    let time = |f: &mut dyn FnMut() -> Duration| {
        median((0..reps).map(|_| throughput(bytes as u64, f())).collect())
    };
    let mut rows = vec![(
        mib,
        "to_vec + drop (the host baseline)",
        time(&mut || memcpy_fresh(src)),
    )];
    rows.push((
        mib,
        "Flex into_data, buffer shared (eviction reads a clone)",
        time(&mut || {
            let shared = plain.clone();
            let start = Instant::now();
            let data = black_box(shared.into_data());
            let took = start.elapsed();
            drop(data);
            took
        }),
    ));
    rows.push((
        mib,
        "Flex into_data, buffer unique (zero-copy path)",
        time(&mut || {
            let unique = Tensor::<Flex, 1>::from_data(
                TensorData::from_bytes_vec(src.to_vec(), [n], DType::F32),
                &Default::default(),
            );
            let start = Instant::now();
            let data = black_box(unique.into_data());
            let took = start.elapsed();
            drop(data);
            took
        }),
    ));
    rows.push((
        mib,
        "TensorData::from_bytes_vec(Vec<u8>) (realigning copy)",
        time(&mut || {
            let v = src.to_vec();
            let start = Instant::now();
            let data = black_box(TensorData::from_bytes_vec(v, [n], DType::F32));
            let took = start.elapsed();
            drop(data);
            took
        }),
    ));
    rows.push((
        mib,
        "crc32fast::hash",
        time(&mut || {
            let start = Instant::now();
            black_box(crc32fast::hash(black_box(src)));
            start.elapsed()
        }),
    ));
    rows.push((
        mib,
        "vec![0u8; n] + drop (fresh read buffer)",
        time(&mut || {
            let start = Instant::now();
            let mut v = vec![0u8; bytes];
            // Touch every page, as a read into it does.
            for i in (0..bytes).step_by(4096) {
                v[i] = 1;
            }
            black_box(&v);
            drop(v);
            start.elapsed()
        }),
    ));
    rows
}

/// Reads criterion's point estimate (mean, ns) of one benchmark from this run's output.
fn mean_ns(id: &str) -> Option<f64> {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = format!("{dir}/criterion/{id}/new/estimates.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

fn gbps(bps: f64) -> String {
    format!("{:.2}", bps / 1e9)
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test");
    let (warmup, rounds) = if test_mode { (0, 1) } else { (3, 31) };
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));

    let base = match std::env::var_os("BURN_SPILL_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("a temp directory for the spill file and the baseline file");
    let mut rows = Vec::new();
    let mut prealloc = Vec::new();
    let mut steps = Vec::new();

    // Host tier: budget 0, host unlimited. The tensor is spilled to host right after the op that
    // creates it; each use restores it and spills it again.
    configure(base.path(), None, false);
    for mib in SIZES_MIB {
        let bytes = mib * MIB;
        let (t, src) = tensor_and_bytes(bytes);
        assert_eq!(
            tier(&t),
            Tier::Host,
            "budget 0 spills the new tensor to host"
        );
        let mut dst = vec![0u8; bytes];
        memcpy_prealloc(&src, &mut dst);
        let samples = (0..if test_mode { 1 } else { 15 })
            .map(|_| throughput(bytes as u64, memcpy_prealloc(&src, &mut dst)))
            .collect();
        prealloc.push((mib, median(samples)));
        steps.extend(breakdown(mib, &src, if test_mode { 1 } else { 9 }));
        rows.extend(paired_host(mib, &t, &src, warmup, rounds));

        let mut group = c.benchmark_group("host_roundtrip");
        group.throughput(Throughput::Bytes(2 * bytes as u64));
        group.bench_function(BenchmarkId::new("spill", format!("{mib}MiB")), |b| {
            b.iter(|| use_once(&t))
        });
        group.bench_function(BenchmarkId::new("memcpy_x2", format!("{mib}MiB")), |b| {
            b.iter(|| {
                memcpy_fresh(&src);
                memcpy_fresh(&src)
            })
        });
        group.finish();
    }

    // The host tier again with restores verified (`SpillConfig::verify_restores`): a CRC32 of
    // the host copy at eviction and another before the upload.
    configure(base.path(), None, true);
    for mib in SIZES_MIB {
        let (t, src) = tensor_and_bytes(mib * MIB);
        for mut row in paired_host(mib, &t, &src, warmup, rounds) {
            row.tier = "host, verified";
            rows.push(row);
        }
    }

    // Disk tier: budget 0, host limit 0. Each use restores the tensor from disk and the settle
    // after the op copies it off the device and writes it straight to disk.
    configure(base.path(), Some(0), false);
    let mut file = BaselineFile::create(base.path());
    for mib in SIZES_MIB {
        let bytes = mib * MIB;
        let (t, src) = tensor_and_bytes(bytes);
        assert_eq!(
            tier(&t),
            Tier::Disk,
            "host limit 0 sends the spilled tensor to disk"
        );
        rows.extend(paired_disk(mib, &t, &src, &mut file, warmup, rounds));

        let mut group = c.benchmark_group("disk_roundtrip");
        group.throughput(Throughput::Bytes(2 * bytes as u64));
        group.bench_function(BenchmarkId::new("spill", format!("{mib}MiB")), |b| {
            b.iter(|| use_once(&t))
        });
        // The same work done plainly: copy off the "device", write, read back.
        group.bench_function(
            BenchmarkId::new("copy_write_read", format!("{mib}MiB")),
            |b| {
                b.iter(|| {
                    memcpy_fresh(&src);
                    file.write(&src);
                    file.read(bytes).1
                })
            },
        );
        group.finish();
    }
    // Remote tier: budget 0, host limit 0, a redis-server of its own, remote before disk.
    #[cfg(feature = "remote")]
    match redis_server::RedisServer::start() {
        Some(server) => {
            let config = SpillConfig::default()
                .device_budget_bytes(0)
                .host_limit_bytes(0)
                .spill_dir(base.path())
                .remote_tier(server.url());
            Spill::configure(&Default::default(), config).expect("configure the remote tier");
            for mib in SIZES_MIB {
                let (t, src) = tensor_and_bytes(mib * MIB);
                assert_eq!(
                    stats().cold_tiers[0].records,
                    1,
                    "the tensor is on the server"
                );
                rows.extend(paired_remote(mib, &t, &src, &server, warmup, rounds));
            }
            Spill::configure(&Default::default(), SpillConfig::default()).expect("unconfigure");
        }
        None => println!("remote rows skipped: no redis-server"),
    }
    c.final_summary();
    // Back to unlimited so that the spill directory may go.
    Spill::configure(&Default::default(), SpillConfig::default()).expect("unconfigure");

    println!(
        "\nTier throughput, SpillBackend<Flex>, f32 tensors; spill dir and baseline file in {}",
        base.path().display()
    );
    println!(
        "engine = SpillStats per-direction bytes / time (the engine's own timing of each move); \
         baseline timed in the same round; median over {rounds} rounds; GB/s = 1e9 bytes/s.\n"
    );
    println!(
        "| tier | direction | size | engine (GB/s) | baseline | baseline (GB/s) | ratio spill/baseline | >= 0.8 |"
    );
    println!("|---|---|---:|---:|---|---:|---:|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} MiB | {} | {} | {} | {:.3} | {} |",
            r.tier,
            r.direction,
            r.mib,
            gbps(r.engine_bps),
            r.baseline,
            gbps(r.baseline_bps),
            r.ratio,
            if r.ratio >= 0.8 { "yes" } else { "NO" }
        );
    }
    println!(
        "\nWhere the time goes: the steps of the moves, each timed alone on plain buffers (median GB/s)\n"
    );
    println!("| step | size | GB/s |");
    println!("|---|---:|---:|");
    for (mib, bps) in prealloc {
        println!(
            "| copy_from_slice into a preallocated buffer (bandwidth ceiling) | {mib} MiB | {} |",
            gbps(bps)
        );
    }
    for (mib, step, bps) in steps {
        println!("| {step} | {mib} MiB | {} |", gbps(bps));
    }

    if !test_mode {
        println!(
            "\nEnd to end (criterion means): one use = restore + op + re-evict, against the same bytes moved plainly"
        );
        println!("\n| group | size | spill (ms) | plain (ms) | plain | ratio plain/spill |");
        println!("|---|---:|---:|---:|---|---:|");
        for (group, plain) in [
            ("host_roundtrip", "memcpy_x2"),
            ("disk_roundtrip", "copy_write_read"),
        ] {
            for mib in SIZES_MIB {
                if let (Some(spill), Some(base)) = (
                    mean_ns(&format!("{group}/spill/{mib}MiB")),
                    mean_ns(&format!("{group}/{plain}/{mib}MiB")),
                ) {
                    println!(
                        "| {group} | {mib} MiB | {:.2} | {:.2} | {plain} | {:.3} |",
                        spill / 1e6,
                        base / 1e6,
                        base / spill
                    );
                }
            }
        }
    }
}
