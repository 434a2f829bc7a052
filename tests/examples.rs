//! The `resnet` and `transformer` examples, run as a user runs them, in tiny configurations:
//! spilled and plain must match bit for bit (`--verify`), the report, plot and trace must be
//! written, and bad flags must give one line naming the flag and exit code 2.
//!
//! `cargo test` builds the examples next to the test binaries (target/<profile>/examples/);
//! a run of this file alone (`cargo test --test examples`) does not, so build them first with
//! `cargo build --examples`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn_spill::policy::recompute::EarlyRoom;
use burn_spill::{PolicyKind, Preset, RecomputeMode};

/// target/<profile>/deps/examples-<hash> -> target/<profile>/examples/<name>
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples; with `--test examples` alone, run \
         `cargo build --examples` first",
        path.display()
    );
    path
}

fn run(name: &str, args: &[&str]) -> Output {
    run_with_env(name, args, &[])
}

/// [`run`] with `env` set on top of a clean environment.
fn run_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = clean_command(name, args);
    command.envs(env.iter().copied());
    command.output().expect("the example starts")
}

/// The example with `args`, its `BURN_SPILL_*` and log variables removed from the environment.
fn clean_command(name: &str, args: &[&str]) -> Command {
    let mut command = Command::new(example(name));
    command.args(args);
    // These replace the examples' flags, and RUST_LOG their log filter: a developer's shell
    // must not change the tests.
    for var in [
        burn_spill::ENV_BUDGET,
        burn_spill::ENV_HOST_LIMIT,
        burn_spill::ENV_DIR,
        burn_spill::ENV_POLICY,
        burn_spill::ENV_PRESET,
        burn_spill::ENV_VERIFY,
        burn_spill::ENV_RECOMPUTE,
        burn_spill::ENV_REBUILD_PROFILE,
        burn_spill::ENV_EARLY_ROOM,
        "BURN_SPILL_TRACE",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A ResNet-18 small enough for a test.
const RESNET_TINY: &[&str] = &[
    "--batch",
    "4",
    "--image-size",
    "8",
    "--width",
    "4",
    "--classes",
    "3",
];

/// A GPT small enough for a test.
const GPT_TINY: &[&str] = &[
    "--batch",
    "2",
    "--layers",
    "2",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--seq-len",
    "8",
    "--vocab",
    "12",
];

/// Runs a tiny configuration with `--verify`, a report and a trace, and checks all three.
fn verify_tiny(name: &str, model_args: &[&str], steps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("out/report.json");
    let trace = dir.path().join("out/trace.json");
    let tape = dir.path().join("out/step.json");
    let spill_dir = dir.path().join("spill");
    let steps_arg = steps.to_string();
    let mut args = model_args.to_vec();
    args.extend([
        "--steps",
        &steps_arg,
        "--verify",
        "--verify-restores",
        // A small budget and no host tier: most tensors go through the spill file.
        "--budget",
        "30%",
        "--host-limit",
        "0",
        "--spill-dir",
        spill_dir.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--save-tape",
        tape.to_str().unwrap(),
        "--plan",
        "h200-pcie5",
    ]);
    let out = run(name, &args);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{name} {args:?} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(stdout.contains("identical:"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let verify = &report["verify"];
    assert_eq!(verify["losses_match"], true, "{verify}");
    assert_eq!(verify["parameters_match"], true, "{verify}");
    assert_eq!(verify["steps_compared"], steps);
    assert!(verify["parameters_compared"].as_u64().unwrap() > 0);
    assert_eq!(report["spilled"]["losses"].as_array().unwrap().len(), steps);
    // The budget was 30% of the plain peak, and the tiers were used.
    let plain_peak = report["plain_peak_device_bytes"].as_u64().unwrap();
    let budget = report["budget_bytes"].as_u64().unwrap();
    assert_eq!(budget, (plain_peak as f64 * 0.3) as u64);
    assert!(
        report["stats"]["peak"]["disk"].as_u64().unwrap() > 0,
        "the disk tier was used"
    );

    let plot = std::fs::read_to_string(report_path_with(&report, "plot")).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("<polyline"),
        "{plot}"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(
        !trace["traceEvents"].as_array().unwrap().is_empty(),
        "the trace has events"
    );
    // The spill directory is removed when the spilled run ends.
    assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 0);

    // `--plan` printed the prediction for the recorded step, and the saved tape (the training
    // step, not the reads after it) is what the `plan` example reads.
    assert!(stdout.contains("predicted on h200-pcie5"), "{stdout}");
    let saved = burn_spill::tape::from_json(&std::fs::read_to_string(&tape).unwrap()).unwrap();
    assert!(saved.ops.len() > 50, "{} ops", saved.ops.len());
    plan_predicts(&tape);
}

/// The `plan` example on a saved tape: one budget, a sweep with its SVG, and the batch search
/// on the tape and itself scaled (a program at two "batch sizes" whose shapes do not change).
fn plan_predicts(tape: &Path) {
    let tape_arg = tape.to_str().unwrap();
    let out = run(
        "plan",
        &[tape_arg, "--device", "a100-pcie4", "--budget", "50%"],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("predicted on a100-pcie4") && stdout.contains("50%"),
        "{stdout}"
    );
    // A training step: the prediction is also split into its phases.
    assert!(
        ["phase", "forward", "backward", "optimizer", "floor"]
            .iter()
            .all(|word| stdout.contains(word)),
        "{stdout}"
    );
    let svg = tape.with_extension("svg");
    let svg_arg = svg.to_str().unwrap();
    let out = run("plan", &[tape_arg, "--sweep", "--svg", svg_arg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("100%") && stdout.contains("wrote"),
        "{stdout}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("<polyline"),
        "{plot}"
    );
    let out = run(
        "plan",
        &[
            tape_arg,
            tape_arg,
            "--batches",
            "1,2",
            "--max-batch",
            "--overhead",
            "10%",
            "--budget",
            "50%",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("largest batch") || stdout.contains("no batch"),
        "{stdout}"
    );
}

#[test]
fn the_plan_example_refuses_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let op = |name: &str| {
        format!(
            r#"{{"name":"{name}","inputs":[1],"outputs":[2],"start_ns":0,"duration_ns":10,"thread":1}}"#
        )
    };
    let tape_with = |name: &str| {
        format!(
            r#"{{"version":1,"step":1,"marked":true,"ops":[{}],"tensors":[{{"id":1,"bytes":4096,"dtype":"F32","shape":[1024],"role":"other","producer":null}},{{"id":2,"bytes":4096,"dtype":"F32","shape":[1024],"role":"other","producer":{{"op":0,"output":0}}}}],"drops":[],"duration_ns":20}}"#,
            op(name)
        )
    };
    let good = write("good.json", &tape_with("float_exp"));
    let other = write("other.json", &tape_with("float_log"));
    let garbage = write("garbage.json", "{ not json");
    let future = write(
        "future.json",
        &tape_with("float_exp").replace(r#""version":1"#, r#""version":99"#),
    );
    let mut profile: serde_json::Value =
        serde_json::to_value(burn_spill::plan::DeviceProfile::builtin("a100-pcie4").unwrap())
            .unwrap();
    profile["hbm_gb_per_s"] = serde_json::json!(-5);
    let negative = write("negative.json", &profile.to_string());

    // A tape that is fine runs.
    let out = run("plan", &[&good, "--budget", "8KiB"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    bad("plan", &[&garbage], &["garbage.json", "malformed"]);
    bad("plan", &[&future], &["version 99", "reads version 1"]);
    bad("plan", &["/no/such/tape.json"], &["cannot read the tape"]);
    bad(
        "plan",
        &[&good, "--device", "tpu-v5"],
        &["--device", "tpu-v5", "h200-pcie5"],
    );
    bad(
        "plan",
        &[&good, "--device", &negative],
        &["hbm_gb_per_s", "positive"],
    );
    bad(
        "plan",
        &[&good, "--budget", "lots"],
        &["--budget", "lots", "accepted"],
    );
    bad(
        "plan",
        &[&good, "--budget", "4KiB"],
        &["float_exp", "8192 bytes"],
    );
    bad(
        "plan",
        &[&good, "--max-batch"],
        &["--max-batch", "two tapes"],
    );
    bad(
        "plan",
        &[&good, &other, "--batches", "1,2", "--max-batch"],
        &["float_log", "same program"],
    );
    bad(
        "plan",
        &[&good, "--batches", "2,1"],
        &["--batches", "SMALL,LARGE"],
    );
}

fn report_path_with(report: &serde_json::Value, key: &str) -> PathBuf {
    PathBuf::from(
        report[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} in the report")),
    )
}

#[test]
fn resnet_tiny_run_verifies() {
    verify_tiny("resnet", RESNET_TINY, 3);
}

#[test]
fn resnet_bottleneck_tiny_run_verifies() {
    verify_tiny(
        "resnet",
        &[
            "--depth",
            "50",
            "--batch",
            "2",
            "--image-size",
            "8",
            "--width",
            "2",
            "--classes",
            "3",
        ],
        2,
    );
}

#[test]
fn transformer_tiny_run_verifies() {
    verify_tiny("transformer", GPT_TINY, 3);
}

/// Whether a wgpu adapter opens here (a Vulkan driver such as lavapipe).
#[cfg(feature = "wgpu")]
fn wgpu_opens() -> bool {
    use burn::tensor::Tensor;
    type W = burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
    let opened = std::panic::catch_unwind(|| {
        let device = Default::default();
        Tensor::<W, 1>::from_floats([1.0], &device)
            .into_data()
            .to_vec::<f32>()
            .unwrap()
    });
    let ok = matches!(opened, Ok(v) if v == [1.0]);
    if !ok {
        eprintln!("SKIPPED: no wgpu adapter opens here (install mesa-vulkan-drivers)");
    }
    ok
}

/// Both examples on wgpu (fused under the `fusion` feature) in tiny configurations with
/// `--verify`; the report carries the allocator's figures for both runs.
#[cfg(feature = "wgpu")]
#[test]
fn examples_verify_on_wgpu_and_report_the_pool() {
    if !wgpu_opens() {
        return;
    }
    let runs: [(&str, &[&str]); 2] = [("resnet", RESNET_TINY), ("transformer", GPT_TINY)];
    for (name, model) in runs {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("report.json");
        let mut args = model.to_vec();
        args.extend([
            "--backend",
            "wgpu",
            "--pool-pages",
            "exclusive",
            "--steps",
            "3",
            "--verify",
            "--budget",
            "30%",
            "--report",
            report.to_str().unwrap(),
        ]);
        let out = run(name, &args);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{name} {args:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
            text(&out.stderr)
        );
        assert!(stdout.contains("identical:"), "{stdout}");
        assert!(stdout.contains("peak reserved (allocator)"), "{stdout}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert!(
            report["plain_peak_reserved_bytes"].as_u64().unwrap() > 0,
            "{report}"
        );
        let pool = &report["stats"]["pool"];
        assert!(pool["peak_reserved"].as_u64().unwrap() >= pool["peak_in_use"].as_u64().unwrap());
    }
}

/// Runs a bad command line and checks the one-line error and exit code 2.
fn bad(name: &str, args: &[&str], expected: &[&str]) {
    let out = run(name, args);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{name} {args:?}: {stderr}{}",
        text(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{name} {args:?}: one line, got {stderr:?}");
    for needle in expected {
        assert!(
            lines[0].contains(needle),
            "{name} {args:?}: {needle:?} missing in {:?}",
            lines[0]
        );
    }
}

#[test]
fn bad_values_name_the_flag_and_the_accepted_values() {
    bad(
        "resnet",
        &["--backend", "tpu"],
        &["--backend", "tpu", "flex, ndarray, wgpu, cuda"],
    );
    bad(
        "transformer",
        &["--preset", "huge"],
        &["--preset", "huge", Preset::ACCEPTED],
    );
    bad(
        "resnet",
        &["--policy", "random"],
        &["--policy", "random", PolicyKind::ACCEPTED],
    );
    bad(
        "transformer",
        &["--budget", "lots"],
        &["--budget", "lots", "512MiB", "30%"],
    );
    bad(
        "resnet",
        &["--host-limit", "12parsecs"],
        &["--host-limit", "12parsecs", "accepted"],
    );
    bad(
        "resnet",
        &["--depth", "20"],
        &["--depth", "18, 34, 50, 101, 152"],
    );
    bad("transformer", &["--heads", "3"], &["--heads", "--d-model"]);
    bad("resnet", &["--frobnicate"], &["--frobnicate"]);
    bad(
        "resnet",
        &["--pool-pages", "tiled"],
        &["--pool-pages", "tiled", "sliced, exclusive"],
    );
    bad(
        "transformer",
        &["--backend", "flex", "--pool-pages", "exclusive"],
        &["--pool-pages", "wgpu"],
    );
    bad(
        "transformer",
        &["--recompute", "sometimes"],
        &["--recompute", "sometimes", RecomputeMode::ACCEPTED],
    );
    bad(
        "resnet",
        &["--early-room", "soon"],
        &["--early-room", "soon", EarlyRoom::ACCEPTED],
    );
    bad(
        "transformer",
        &["--rebuild-profile", "abacus"],
        &["--rebuild-profile", "abacus"],
    );
}

/// `--recompute` reaches the spilled run (by flag, or by `BURN_SPILL_RECOMPUTE` in its place):
/// it drops and rebuilds tensors, trains bit for bit as plain, and its plan chooses a behaviour
/// of the mode asked for, which the report and the table show. The run by variable asks for no
/// report (nothing else that marks the steps): it marks them all the same, since the example
/// leaves the tape off in unmarked runs, and without a tape nothing is dropped.
#[test]
fn the_examples_recompute_when_asked_and_train_identically() {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("report.json");
    let report_file = report_path.to_str().unwrap();
    let args = [
        GPT_TINY,
        &[
            "--steps",
            "4",
            "--verify",
            "--budget",
            "30%",
            "--report",
            report_file,
        ],
    ]
    .concat();
    let flag = [
        args.as_slice(),
        &[
            "--recompute",
            "recompute",
            "--rebuild-profile",
            "h200-pcie5",
        ],
    ]
    .concat();
    // Run one at a time, the report read after the run that writes it.
    let recompute_by_flag = || run("transformer", &flag);
    let unreported = &args[..args.len() - 2];
    assert_eq!(unreported.last(), Some(&"30%"));
    let both_by_variable = || {
        run_with_env(
            "transformer",
            unreported,
            &[(burn_spill::ENV_RECOMPUTE, "both")],
        )
    };
    let runs: [(&str, &dyn Fn() -> Output); 2] = [
        ("recompute", &recompute_by_flag),
        ("both", &both_by_variable),
    ];
    for (mode, run_it) in runs {
        let out = run_it();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "{mode}: stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(stdout.contains("identical:"), "{mode}: {stdout}");
        assert!(
            stdout.contains(&format!("recompute ({mode})")),
            "{mode}: {stdout}"
        );
        if mode == "recompute" {
            let report: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
            let recompute = &report["stats"]["recompute"];
            assert!(
                recompute["rebuilt"].as_u64().unwrap() > 0,
                "{mode}: nothing rebuilt: {recompute}"
            );
            assert_eq!(
                recompute["behaviour"]["victims"], "recompute",
                "{mode}: {recompute}"
            );
        } else {
            let row = stdout
                .lines()
                .find(|line| line.contains("recompute (both)"))
                .unwrap_or_else(|| panic!("{mode}: no recompute row: {stdout}"));
            let rebuilt: u64 = row
                .split("rebuilt ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|count| count.parse().ok())
                .unwrap_or_else(|| panic!("{mode}: no rebuilt count in {row}"));
            assert!(rebuilt > 0, "{mode}: nothing rebuilt: {row}");
            assert!(row.contains("chose:"), "{mode}: {row}");
            assert!(
                stderr.contains("note: BURN_SPILL_RECOMPUTE=both replaces its flag"),
                "{stderr}"
            );
        }
    }
}

#[test]
fn a_spill_dir_that_cannot_be_created_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let below_file = file.join("spill");
    bad(
        "resnet",
        &["--spill-dir", below_file.to_str().unwrap()],
        &["--spill-dir", "cannot create", "accepted"],
    );
}

#[test]
fn a_backend_not_compiled_in_names_the_feature() {
    let missing = [
        ("flex", cfg!(feature = "flex")),
        ("ndarray", cfg!(feature = "ndarray")),
        ("wgpu", cfg!(feature = "wgpu")),
        ("cuda", cfg!(feature = "cuda")),
    ]
    .into_iter()
    .find(|(_, compiled)| !compiled);
    if let Some((name, _)) = missing {
        let feature = format!("--features {name}");
        bad(
            "transformer",
            &["--backend", name],
            &["--backend", "not compiled", &feature],
        );
    }
}

#[test]
fn help_exits_zero() {
    for name in ["resnet", "transformer"] {
        let out = run(name, &["--help"]);
        assert!(out.status.success());
        assert!(text(&out.stdout).contains("--budget"));
    }
}

/// The `BURN_SPILL_*` variables replace their flags for the spilled run only: the plain peak is
/// still measured unlimited, and the budget is the variable's, read as its flag is (a
/// percentage of the plain peak). burn-spill's warnings reach stderr through the examples' log
/// subscriber: at budget 0 every op runs over it.
#[test]
fn environment_overrides_apply_to_the_spilled_run_only_and_warnings_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("report.json");
    let report_file = report_path.to_str().unwrap();
    let mut args = RESNET_TINY.to_vec();
    args.extend([
        "--steps",
        "2",
        "--verify",
        "--budget",
        "unlimited",
        "--report",
        report_file,
    ]);
    let out = run_with_env(
        "resnet",
        &args,
        &[
            (burn_spill::ENV_BUDGET, "0"),
            (burn_spill::ENV_POLICY, "next_use"),
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("identical:"), "{stdout}");
    assert!(
        stderr.contains("note: BURN_SPILL_BUDGET=0 replaces its flag"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARN") && stderr.contains("runs over it"),
        "the over-budget warning is shown: {stderr}"
    );
    let read_report = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap()
    };
    let report = read_report();
    assert_eq!(report["budget_bytes"], 0, "{report}");
    assert_eq!(report["policy"], "next_use", "{report}");
    assert!(
        report["plain_peak_device_bytes"].as_u64().unwrap() > 0,
        "the plain peak was measured without the override: {report}"
    );

    // A percentage is of the plain peak, as with `--budget 30%`.
    let out = run_with_env(
        "transformer",
        &[GPT_TINY, &["--steps", "2", "--report", report_file]].concat(),
        &[(burn_spill::ENV_BUDGET, "30%")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = read_report();
    let plain_peak = report["plain_peak_device_bytes"].as_u64().unwrap();
    assert_eq!(
        report["budget_bytes"].as_u64().unwrap(),
        (plain_peak as f64 * 0.3) as u64
    );
}

/// A bad value in a variable is a usage error naming the variable, as a bad flag names the flag.
#[test]
fn a_bad_environment_override_names_the_variable() {
    for (var, value, accepted) in [
        (burn_spill::ENV_BUDGET, "lots", "30%"),
        (burn_spill::ENV_VERIFY, "maybe", "`on`"),
        (
            burn_spill::ENV_RECOMPUTE,
            "sometimes",
            RecomputeMode::ACCEPTED,
        ),
        (burn_spill::ENV_EARLY_ROOM, "soon", EarlyRoom::ACCEPTED),
    ] {
        let out = run_with_env("resnet", &[], &[(var, value)]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap();
        assert!(
            last.starts_with(&format!("error: {var}:"))
                && last.contains(value)
                && last.contains(accepted),
            "{stderr}"
        );
    }
}

/// How long one side may run under the cap: a process whose allocations fail can hang in its
/// panic handler instead of exiting, and is killed then.
#[cfg(target_os = "linux")]
const SIDE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(180);

/// What a capped side did: finished with a status, or was killed at the deadline.
#[cfg(target_os = "linux")]
struct SideRun {
    finished: Option<std::process::ExitStatus>,
    json: serde_json::Value,
    stderr: String,
}

#[cfg(target_os = "linux")]
impl SideRun {
    fn succeeded(&self) -> bool {
        self.finished.is_some_and(|s| s.success())
    }

    fn describe(&self) -> String {
        match self.finished {
            Some(status) => format!("{status}"),
            None => format!("killed after {SIDE_DEADLINE:?} without finishing"),
        }
    }
}

/// One side of the resnet example alone (`--only`), spilled to disk at budget 0 and host limit
/// 0, optionally under a data-segment cap (`RLIMIT_DATA`).
#[cfg(target_os = "linux")]
fn resnet_side(side: &str, cap: Option<u64>) -> SideRun {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let args = [
        "--batch",
        "64",
        "--steps",
        "3",
        "--only",
        side,
        "--budget",
        "0",
        "--host-limit",
        "0",
    ];
    let mut command = clean_command("resnet", &args);
    if let Some(bytes) = cap {
        let limit = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: between fork and exec the closure only calls setrlimit, which is
        // async-signal-safe, on a value it owns.
        unsafe {
            command.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_DATA, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = std::time::Instant::now();
    let finished = loop {
        if let Some(status) = child.try_wait().expect("waiting for the example") {
            break Some(status);
        }
        if started.elapsed() > SIDE_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let json = text(&stdout.join().unwrap())
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or(serde_json::Value::Null);
    SideRun {
        finished,
        json,
        stderr: text(&stderr.join().unwrap()),
    }
}

/// The design brief's "half the hardware", made physical on a CPU backend, where device memory
/// is the process's own: under a cap of half the plain run's resident peak (`RLIMIT_DATA`, on
/// the heap and anonymous mappings), plain Flex fails to allocate, and the same training
/// spilled with budget 0 and host limit 0 (every tensor on disk between ops) completes with
/// the plain run's losses, bit for bit. Skipped, saying so, where the cap is not enforced.
/// `scripts/ram-capped.sh` runs this and prints the peaks.
#[cfg(target_os = "linux")]
#[test]
fn under_half_the_memory_plain_needs_the_resnet_trains_spilled_to_disk() {
    let mib = |v: &serde_json::Value| v.as_u64().map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64);
    let plain = resnet_side("plain", None);
    assert!(plain.succeeded(), "plain, uncapped: {}", plain.stderr);
    let plain_peak = plain.json["resident_peak_bytes"]
        .as_u64()
        .expect("Linux reports VmHWM");
    let cap = plain_peak / 2;

    let capped = resnet_side("plain", Some(cap));
    if capped.succeeded() {
        eprintln!(
            "skipped: a {:.1} MiB RLIMIT_DATA cap did not stop plain training, whose resident \
             peak is {:.1} MiB: this machine does not enforce the limit",
            cap as f64 / (1 << 20) as f64,
            plain_peak as f64 / (1 << 20) as f64
        );
        return;
    }
    let spilled = resnet_side("spilled", Some(cap));
    eprintln!(
        "resident peaks: plain {:.1} MiB uncapped; spilled (budget 0, host limit 0) {:.1} MiB under \
         a {:.1} MiB data cap, {:.1} MiB on disk at peak; plain under the cap: {}",
        mib(&plain.json["resident_peak_bytes"]),
        mib(&spilled.json["resident_peak_bytes"]),
        cap as f64 / (1 << 20) as f64,
        mib(&spilled.json["stats"]["peak"]["disk"]),
        capped.describe(),
    );
    assert!(
        capped.stderr.contains("memory allocation of")
            || capped.stderr.contains("Resource temporarily unavailable"),
        "plain under the cap stopped for another reason: {}",
        capped.stderr
    );
    assert!(
        spilled.succeeded(),
        "spilled under the cap: {}\n{}",
        spilled.describe(),
        spilled.stderr
    );
    assert_eq!(
        spilled.json["losses"], plain.json["losses"],
        "the losses differ"
    );
    assert_eq!(plain.json["losses"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        spilled.json["stats"]["peak"]["host"], 0,
        "host limit 0 kept the host tier empty"
    );
}
