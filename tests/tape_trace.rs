//! `BURN_SPILL_TRACE=path`: a child process records a step and exits normally; the JSON, DOT and
//! Perfetto files of its last step must be there and parse.

use std::process::Command;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use burn_spill::SpillBackend;

const CHILD: &str = "BURN_SPILL_TEST_TRACE_CHILD";

#[test]
fn child_records_a_step_and_exits() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let device = Default::default();
    for _ in 0..2 {
        let _step = SpillBackend::<Flex>::step(&device);
        let x = Tensor::<SpillBackend<Flex>, 1>::from_data(
            TensorData::new(vec![1.0f32; 8], [8]),
            &device,
        );
        let _ = (x.clone() * x).sum();
    }
}

#[test]
fn the_trace_variable_writes_the_last_step_at_exit() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_records_a_step_and_exits",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("BURN_SPILL_TRACE", &path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tape = burn_spill::tape::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let names: Vec<&str> = tape.ops.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["float_from_data", "float_mul", "float_sum"]);
    let dot = std::fs::read_to_string(dir.path().join("trace.json.dot")).unwrap();
    assert!(dot.contains("float_mul"));
    let trace = std::fs::read_to_string(dir.path().join("trace.json.perfetto.json")).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&trace).unwrap();
    assert!(
        trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["ph"] == "X")
    );
}
