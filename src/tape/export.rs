//! Export of a [`StepTape`]: versioned JSON, Graphviz DOT and Chrome/Perfetto traces.
//!
//! Each format answers a different question. JSON keeps the whole tape for other tools and for
//! reading it back ([`from_json`]); its schema is documented in `docs/tape-schema.md`. DOT shows
//! the step as a data-flow graph (which op feeds which, what the critical path is). The trace
//! shows it on a time line next to the bytes held in each tier, in `ui.perfetto.dev` or
//! `chrome://tracing`.
//!
//! All functions build a `String` and leave writing to [`write_file`], so a caller can send the
//! text elsewhere (a log, a socket) and so the formats are tested without touching the disk.
//! A round trip: `from_json(&to_json(&tape))? == tape`.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::model::{StepTape, TAPE_SCHEMA_VERSION, TensorRecord, TierSample};
use crate::SpillError;
use crate::engine::{TensorId, TensorRole};

// ---------------------------------------------------------------------------------------------
// JSON

/// The tape as JSON in the versioned schema of `docs/tape-schema.md` (compact, one line).
///
/// Compact because a real step has tens of thousands of ops; pipe it through `jq` to read it.
pub fn to_json(tape: &StepTape) -> String {
    // Every field is a number, string, bool, array or struct with string keys, so serde_json
    // cannot fail here; a failure would be a bug in the model's derives.
    serde_json::to_string(tape).expect("a StepTape always serialises to JSON")
}

/// Only the version, read first so that a tape of another schema version is reported as such
/// rather than as whichever field changed between versions.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

/// Reads a tape written by [`to_json`].
///
/// # Errors
/// [`SpillError::TapeVersion`] when the tape's `version` is not [`TAPE_SCHEMA_VERSION`];
/// [`SpillError::TapeJson`] when the text is not JSON or does not have the schema's structure.
pub fn from_json(json: &str) -> Result<StepTape, SpillError> {
    let VersionOnly { version } =
        serde_json::from_str(json).map_err(|source| SpillError::TapeJson { source })?;
    if version != TAPE_SCHEMA_VERSION {
        return Err(SpillError::TapeVersion {
            found: version,
            expected: TAPE_SCHEMA_VERSION,
        });
    }
    serde_json::from_str(json).map_err(|source| SpillError::TapeJson { source })
}

// ---------------------------------------------------------------------------------------------
// Graphviz DOT

/// Fill colour of forward ops (and of every op when the backward start is unknown).
const FORWARD_COLOR: &str = "#cfe2ff";
/// Fill colour of backward ops (index >= `backward_start`).
const BACKWARD_COLOR: &str = "#ffd8b1";
/// Fill colour of tensors from before the step.
const SOURCE_COLOR: &str = "#eeeeee";

/// Escapes `s` for a double-quoted DOT string. Newlines become `\n` (a centred line break in a
/// label) so that a name can never end the string or the statement early.
fn dot_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// A label of several lines, each escaped, joined by DOT's line break.
fn dot_label(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| dot_escape(l))
        .collect::<Vec<_>>()
        .join("\\n")
}

/// `[2, 3] F32`.
fn shape_and_dtype(t: &TensorRecord) -> String {
    format!("{:?} {}", t.shape, t.dtype)
}

/// Bytes with a binary unit, short enough for an edge label.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The step as a Graphviz digraph (render with `dot -Tsvg`).
///
/// - Each op is a node `op<i>` labelled with its index, name and duration in µs; ops with index
///   `>= backward_start` are filled in a second colour (all ops share one colour when
///   `backward_start` is `None`).
/// - Each tensor made by an op of the step is an edge from its producer to every op that read
///   it, labelled with shape, dtype and size. A tensor read by the same op twice is one edge.
/// - Each tensor from before the step (no producer) is a small node `t<id>` of its own, a box
///   for parameters and an ellipse otherwise, with an edge to every op that read it.
/// - `critical_path` lists op indices in path order: those nodes are bold, and so are the edges
///   between consecutive ops of the path.
///
/// Tensors that no op of the step read (the loss, say) have no edge. Indices out of range in
/// `critical_path` or in a producer are ignored rather than trusted, since the tape may come
/// from a file.
pub fn to_dot(tape: &StepTape, backward_start: Option<u32>, critical_path: &[u32]) -> String {
    let n_ops = tape.ops.len();
    let on_path: HashSet<u32> = critical_path.iter().copied().collect();
    let path_edges: HashSet<(u32, u32)> = critical_path.windows(2).map(|w| (w[0], w[1])).collect();
    let by_id: HashMap<TensorId, &TensorRecord> = tape.tensors.iter().map(|t| (t.id, t)).collect();
    let producer_of = |id: TensorId| -> Option<u32> {
        by_id
            .get(&id)
            .and_then(|t| t.producer)
            .map(|p| p.op)
            .filter(|&op| (op as usize) < n_ops)
    };

    let mut out = String::new();
    // `write!` into a String cannot fail, hence the ignored results below.
    let _ = writeln!(out, "digraph step_{} {{", tape.step);
    let _ = writeln!(
        out,
        "  graph [label=\"{}\", labelloc=t, fontname=\"Helvetica\"];",
        dot_escape(&format!("burn-spill step {}", tape.step))
    );
    let _ = writeln!(
        out,
        "  node [shape=ellipse, style=filled, fontname=\"Helvetica\", fontsize=10];"
    );
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=8];");

    for (i, op) in tape.ops.iter().enumerate() {
        let i = i as u32;
        let backward = backward_start.is_some_and(|b| i >= b);
        let color = if backward {
            BACKWARD_COLOR
        } else {
            FORWARD_COLOR
        };
        let label = dot_label(&[
            format!("#{i} {}", op.name),
            format!("{:.1} µs", op.duration_ns as f64 / 1000.0),
        ]);
        let bold = if on_path.contains(&i) {
            ", style=\"filled,bold\", penwidth=3"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  op{i} [label=\"{label}\", fillcolor=\"{color}\"{bold}];"
        );
    }

    // Source nodes: tensors an op read that no op of this step produced, each drawn once.
    let mut sources_drawn: HashSet<TensorId> = HashSet::new();
    for op in &tape.ops {
        for &id in &op.inputs {
            if producer_of(id).is_some() || !sources_drawn.insert(id) {
                continue;
            }
            let (shape, label) = match by_id.get(&id) {
                Some(t) => {
                    let (shape, kind) = match t.role {
                        TensorRole::Parameter => ("box", "param"),
                        TensorRole::Other => ("ellipse", "tensor"),
                    };
                    let label = dot_label(&[
                        format!("{kind} {id}"),
                        shape_and_dtype(t),
                        human_bytes(t.bytes),
                    ]);
                    (shape, label)
                }
                // Not in `tensors`: a malformed tape, but still worth drawing.
                None => ("ellipse", dot_label(&[format!("tensor {id}")])),
            };
            let _ = writeln!(
                out,
                "  t{id} [shape={shape}, label=\"{label}\", fillcolor=\"{SOURCE_COLOR}\", fontsize=8, \
                 height=0.2, margin=\"0.05,0.02\"];"
            );
        }
    }

    for (consumer, op) in tape.ops.iter().enumerate() {
        let consumer = consumer as u32;
        let mut seen: HashSet<TensorId> = HashSet::new();
        for &id in &op.inputs {
            if !seen.insert(id) {
                continue;
            }
            match producer_of(id) {
                Some(producer) => {
                    let t = by_id[&id];
                    let label = dot_label(&[shape_and_dtype(t), human_bytes(t.bytes)]);
                    let bold = if path_edges.contains(&(producer, consumer)) {
                        ", style=bold, penwidth=3"
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        out,
                        "  op{producer} -> op{consumer} [label=\"{label}\"{bold}];"
                    );
                }
                None => {
                    let _ = writeln!(out, "  t{id} -> op{consumer};");
                }
            }
        }
    }
    out.push_str("}\n");
    out
}

// ---------------------------------------------------------------------------------------------
// Chrome / Perfetto trace

/// The trace's single process id: one trace shows one step of one device.
const PID: u64 = 1;

/// Nanoseconds to the format's microseconds; fractions keep sub-µs ops visible.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The step in the Chrome Trace Event Format, for `ui.perfetto.dev` or `chrome://tracing`.
///
/// Emits, in this order:
/// - metadata (`"ph":"M"`) naming the process `burn-spill step N` and each op thread
///   `thread T`;
/// - one complete event (`"ph":"X"`) per op, on `tid` = the op's thread, with `ts` and `dur`
///   in microseconds and `args` {`index`, `inputs`, `outputs`} (tensor ids); sorted by start
///   (the tape lists ops in the order they finished), longer first on ties so nested ops stack
///   under the op that contains them;
/// - a counter (`"ph":"C"`) `resident bytes` with args `device`, `host`, `disk` per sample of
///   `tiers`, sorted by time;
/// - a counter `live bytes` computed from the tape alone, with two stacked args:
///   `made_in_step` (bytes of tensors produced by the step's ops, added at the producing op's
///   start, less those dropped) and `from_before_step` (bytes of the tensors from before the
///   step that the ops read, counted from time 0, less those dropped). A drop with
///   `after_ops = k` is subtracted at the end of op `k - 1` (at time 0 when `k` is 0). Tensors
///   the step never touched are not on the tape and not counted.
///
/// `displayTimeUnit` is `ns` so the viewer shows nanosecond precision.
pub fn to_perfetto(tape: &StepTape, tiers: &[TierSample]) -> String {
    let mut events: Vec<Value> = Vec::with_capacity(tape.ops.len() + tiers.len() + 8);

    events.push(json!({
        "name": "process_name", "ph": "M", "pid": PID, "tid": 0,
        "args": { "name": format!("burn-spill step {}", tape.step) },
    }));
    let mut threads: Vec<u64> = tape.ops.iter().map(|op| op.thread).collect();
    threads.sort_unstable();
    threads.dedup();
    for &thread in &threads {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": PID, "tid": thread,
            "args": { "name": format!("thread {thread}") },
        }));
    }

    let mut order: Vec<usize> = (0..tape.ops.len()).collect();
    order.sort_by_key(|&i| {
        let op = &tape.ops[i];
        (op.start_ns, Reverse(op.duration_ns), i)
    });
    for i in order {
        let op = &tape.ops[i];
        events.push(json!({
            "name": op.name, "cat": "op", "ph": "X", "pid": PID, "tid": op.thread,
            "ts": us(op.start_ns), "dur": us(op.duration_ns),
            "args": { "index": i, "inputs": op.inputs, "outputs": op.outputs },
        }));
    }

    let mut samples: Vec<&TierSample> = tiers.iter().collect();
    samples.sort_by_key(|s| s.t_ns);
    for s in samples {
        events.push(json!({
            "name": "resident bytes", "ph": "C", "pid": PID, "ts": us(s.t_ns),
            "args": { "device": s.device, "host": s.host, "disk": s.disk },
        }));
    }

    for (t_ns, made, before) in live_bytes(tape) {
        events.push(json!({
            "name": "live bytes", "ph": "C", "pid": PID, "ts": us(t_ns),
            "args": { "made_in_step": made, "from_before_step": before },
        }));
    }

    json!({ "traceEvents": events, "displayTimeUnit": "ns" }).to_string()
}

/// The "live bytes" counter: `(t_ns, made_in_step, from_before_step)` at each distinct time
/// the value changes, in time order, starting at 0.
///
/// Signed sums, clamped at zero on output, so that a malformed tape (a tensor dropped twice
/// is only subtracted once, but a drop of a tensor never produced is ignored) cannot wrap.
fn live_bytes(tape: &StepTape) -> Vec<(u64, u64, u64)> {
    // (time, made_in_step delta, from_before_step delta)
    let mut deltas: Vec<(u64, i128, i128)> = Vec::new();
    let n_ops = tape.ops.len();
    let mut baseline: i128 = 0;
    let mut by_id: HashMap<TensorId, &TensorRecord> = HashMap::new();
    for t in &tape.tensors {
        by_id.insert(t.id, t);
        match t.producer.filter(|p| (p.op as usize) < n_ops) {
            Some(p) => deltas.push((tape.ops[p.op as usize].start_ns, t.bytes as i128, 0)),
            None => baseline += t.bytes as i128,
        }
    }
    deltas.push((0, 0, baseline));
    let mut dropped: HashSet<TensorId> = HashSet::new();
    for d in &tape.drops {
        let Some(t) = by_id.get(&d.id) else { continue };
        if !dropped.insert(d.id) {
            continue;
        }
        // `after_ops` past the last op (a malformed tape) means the end of the last op.
        let t_ns = match (d.after_ops as usize).min(n_ops) {
            0 => 0,
            k => {
                let op = &tape.ops[k - 1];
                op.start_ns.saturating_add(op.duration_ns)
            }
        };
        let made = t.producer.is_some_and(|p| (p.op as usize) < n_ops);
        let bytes = t.bytes as i128;
        if made {
            deltas.push((t_ns, -bytes, 0));
        } else {
            deltas.push((t_ns, 0, -bytes));
        }
    }
    // Stable, so that at equal times additions listed first (production) precede drops; the
    // merge below makes the order within one timestamp invisible anyway.
    deltas.sort_by_key(|d| d.0);

    let mut points: Vec<(u64, u64, u64)> = Vec::new();
    let (mut made, mut before) = (0i128, 0i128);
    for (t_ns, dm, db) in deltas {
        made += dm;
        before += db;
        let point = (t_ns, made.max(0) as u64, before.max(0) as u64);
        match points.last_mut() {
            Some(last) if last.0 == t_ns => *last = point,
            _ => points.push(point),
        }
    }
    points
}

// ---------------------------------------------------------------------------------------------
// Files

/// Writes `contents` to `path`, replacing it whole: the text goes to a temporary file in the
/// same directory, which is then renamed over `path`, so a reader (or a crash mid-write) never
/// sees half a tape.
///
/// # Errors
/// [`SpillError::Export`] naming `path` when the directory does not exist, is not writable, or
/// `path` names a directory.
pub fn write_file(path: &Path, contents: &str) -> Result<(), SpillError> {
    let export_error = |source| SpillError::Export {
        path: path.to_path_buf(),
        source,
    };
    // `Path::parent` is `Some("")` for a bare file name: the current directory.
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".burn-spill-export-")
        .tempfile_in(dir)
        .map_err(export_error)?;
    tmp.write_all(contents.as_bytes()).map_err(export_error)?;
    // Exports are rare and small next to a step; syncing makes the rename's promise hold
    // across a power loss too.
    tmp.as_file().sync_all().map_err(export_error)?;
    // On failure the temporary file is removed when the returned error's handle drops.
    tmp.persist(path).map_err(|e| export_error(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::model::{DropRecord, OpRecord, Producer};

    fn tensor(
        id: TensorId,
        shape: &[usize],
        role: TensorRole,
        producer: Option<(u32, u8)>,
    ) -> TensorRecord {
        TensorRecord {
            id,
            bytes: shape.iter().product::<usize>() as u64 * 4,
            dtype: "F32".to_string(),
            shape: shape.to_vec(),
            role,
            producer: producer.map(|(op, output)| Producer { op, output }),
        }
    }

    fn op(
        name: &str,
        inputs: &[TensorId],
        outputs: &[TensorId],
        start_ns: u64,
        duration_ns: u64,
        thread: u64,
    ) -> OpRecord {
        OpRecord {
            name: name.to_string(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            start_ns,
            duration_ns,
            thread,
        }
    }

    /// A tiny training step: y = x @ w; loss = sum(y); backward (ones, grad of w); w update.
    /// Ops 0-1 forward, 2-4 backward. One op name carries a quote and a backslash.
    fn sample_tape() -> StepTape {
        StepTape {
            version: TAPE_SCHEMA_VERSION,
            step: 7,
            marked: true,
            ops: vec![
                op("float_matmul", &[1, 2], &[3], 0, 1_500, 1),
                op("float_sum", &[3], &[4], 2_000, 500, 1),
                op("float_ones", &[], &[5], 3_000, 250, 2),
                op("weird \"op\" \\ name", &[1, 5], &[6], 3_500, 2_000, 2),
                op("float_sub", &[2, 6], &[7], 6_000, 1_000, 1),
            ],
            tensors: vec![
                tensor(1, &[2, 3], TensorRole::Other, None),
                tensor(2, &[3, 4], TensorRole::Parameter, None),
                tensor(3, &[2, 4], TensorRole::Other, Some((0, 0))),
                tensor(4, &[1], TensorRole::Other, Some((1, 0))),
                tensor(5, &[2, 4], TensorRole::Other, Some((2, 0))),
                tensor(6, &[3, 4], TensorRole::Other, Some((3, 0))),
                tensor(7, &[3, 4], TensorRole::Other, Some((4, 0))),
            ],
            drops: vec![
                DropRecord {
                    id: 3,
                    after_ops: 2,
                },
                DropRecord {
                    id: 5,
                    after_ops: 4,
                },
                DropRecord {
                    id: 2,
                    after_ops: 5,
                },
            ],
            duration_ns: 7_500,
            tiers: Vec::new(),
        }
    }

    #[test]
    fn json_round_trips_exactly() {
        let tape = sample_tape();
        let json = to_json(&tape);
        assert_eq!(from_json(&json).unwrap(), tape);
        let empty = StepTape {
            version: TAPE_SCHEMA_VERSION,
            ..Default::default()
        };
        assert_eq!(from_json(&to_json(&empty)).unwrap(), empty);
    }

    #[test]
    fn json_of_another_version_is_rejected_with_both_versions() {
        let mut tape = sample_tape();
        tape.version = TAPE_SCHEMA_VERSION + 1;
        let err = from_json(&to_json(&tape)).unwrap_err();
        assert!(
            matches!(err, SpillError::TapeVersion { found, expected }
                if found == TAPE_SCHEMA_VERSION + 1 && expected == TAPE_SCHEMA_VERSION),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&(TAPE_SCHEMA_VERSION + 1).to_string()),
            "{msg}"
        );
        // A newer schema may change any other field: the version is still what is reported.
        let err = from_json(r#"{"version": 99, "ops": "changed"}"#).unwrap_err();
        assert!(
            matches!(err, SpillError::TapeVersion { found: 99, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn malformed_json_is_a_tape_json_error() {
        for bad in [
            "",
            "not json",
            "{}",
            r#"{"version": 1}"#,
            r#"{"version": "1"}"#,
        ] {
            let err = from_json(bad).unwrap_err();
            assert!(
                matches!(err, SpillError::TapeJson { .. }),
                "{bad:?}: {err:?}"
            );
        }
    }

    /// Checks the JSON against the structure `docs/tape-schema.md` documents: every required
    /// key, with its JSON type. If this fails after a model change, update the doc and bump
    /// `TAPE_SCHEMA_VERSION`.
    #[test]
    fn json_has_the_documented_structure() {
        let v: Value = serde_json::from_str(&to_json(&sample_tape())).unwrap();
        let obj = v.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "drops",
                "duration_ns",
                "marked",
                "ops",
                "step",
                "tensors",
                "tiers",
                "version"
            ]
        );
        assert!(v["version"].is_u64());
        assert_eq!(v["version"], TAPE_SCHEMA_VERSION);
        assert!(v["step"].is_u64());
        assert!(v["marked"].is_boolean());
        assert!(v["duration_ns"].is_u64());

        let ops = v["ops"].as_array().unwrap();
        assert_eq!(ops.len(), 5);
        for op in ops {
            assert_eq!(op.as_object().unwrap().len(), 6, "{op}");
            assert!(op["name"].is_string());
            for key in ["inputs", "outputs"] {
                assert!(
                    op[key].as_array().unwrap().iter().all(Value::is_u64),
                    "{op}"
                );
            }
            for key in ["start_ns", "duration_ns", "thread"] {
                assert!(op[key].is_u64(), "{key} in {op}");
            }
        }

        let tensors = v["tensors"].as_array().unwrap();
        for t in tensors {
            assert_eq!(t.as_object().unwrap().len(), 6, "{t}");
            assert!(t["id"].is_u64() && t["bytes"].is_u64() && t["dtype"].is_string());
            assert!(t["shape"].as_array().unwrap().iter().all(Value::is_u64));
            assert!(
                matches!(t["role"].as_str(), Some("parameter" | "other")),
                "{t}"
            );
            let p = &t["producer"];
            assert!(
                p.is_null() || (p["op"].is_u64() && p["output"].is_u64()),
                "{t}"
            );
            // The documented invariant: a producer names an op that lists the tensor as that
            // output.
            if !p.is_null() {
                let producer = &ops[p["op"].as_u64().unwrap() as usize];
                assert_eq!(
                    producer["outputs"][p["output"].as_u64().unwrap() as usize],
                    t["id"]
                );
            }
        }
        assert_eq!(tensors[1]["role"], "parameter");
        assert!(tensors[0]["producer"].is_null());

        for d in v["drops"].as_array().unwrap() {
            assert_eq!(d.as_object().unwrap().len(), 2, "{d}");
            assert!(d["id"].is_u64());
            assert!(d["after_ops"].as_u64().unwrap() <= ops.len() as u64);
        }
    }

    /// The example in the schema doc is a valid tape, so the doc cannot drift from the code.
    #[test]
    fn the_documented_example_reads_back() {
        let doc = include_str!("../../docs/tape-schema.md");
        let start = doc.find("```json\n").expect("the doc has a JSON example") + 8;
        let len = doc[start..].find("```").unwrap();
        let tape = from_json(&doc[start..start + len]).unwrap();
        assert_eq!(tape.ops.len(), 2);
        assert_eq!(
            tape.tensors[2].producer,
            Some(Producer { op: 0, output: 0 })
        );
        assert_eq!(tape.tensors[1].role, TensorRole::Parameter);
        assert_eq!(
            tape.drops,
            vec![DropRecord {
                id: 3,
                after_ops: 2
            }]
        );
        assert_eq!(from_json(&to_json(&tape)).unwrap(), tape);
    }

    #[test]
    fn dot_has_ops_sources_colours_bold_critical_path_and_escapes() {
        let dot = to_dot(&sample_tape(), Some(2), &[0, 1]);
        assert!(dot.starts_with("digraph step_7 {") && dot.trim_end().ends_with('}'));
        for i in 0..5 {
            assert!(
                dot.contains(&format!("  op{i} [label=\"#{i} ")),
                "op{i} missing:\n{dot}"
            );
        }
        assert!(dot.contains("#0 float_matmul\\n1.5 µs"), "{dot}");
        // Forward and backward fill colours.
        let line = |prefix: &str| {
            dot.lines()
                .find(|l| l.trim_start().starts_with(prefix))
                .unwrap_or_else(|| panic!("no line {prefix}:\n{dot}"))
                .to_string()
        };
        assert!(line("op1 [").contains(FORWARD_COLOR));
        assert!(line("op2 [").contains(BACKWARD_COLOR));
        // Critical nodes and the edge between them are bold; others are not.
        assert!(line("op0 [").contains("bold") && line("op1 [").contains("bold"));
        assert!(!line("op2 [").contains("bold"));
        let critical = line("op0 -> op1 ");
        assert!(critical.contains("style=bold"), "{critical}");
        assert!(critical.contains("[2, 4] F32\\n32 B"), "{critical}");
        assert!(!line("op2 -> op3 ").contains("bold"));
        // Tensors from before the step: a box for the parameter, an ellipse otherwise.
        assert!(line("t2 [").contains("shape=box") && line("t2 [").contains("param 2"));
        assert!(line("t1 [").contains("shape=ellipse"));
        assert!(dot.contains("  t1 -> op0;") && dot.contains("  t1 -> op3;"));
        assert!(dot.contains("  t2 -> op4;"));
        assert_eq!(dot.matches("  t1 [").count(), 1, "a source is drawn once");
        // The quote and backslash in the name are escaped, so the label stays one string.
        assert!(dot.contains(r#"#3 weird \"op\" \\ name"#), "{dot}");
        assert_eq!(
            line("op3 [").matches('"').count() - line("op3 [").matches("\\\"").count(),
            4
        );
    }

    #[test]
    fn dot_without_backward_start_uses_one_colour_and_survives_bad_indices() {
        let mut tape = sample_tape();
        tape.tensors[2].producer = Some(Producer { op: 99, output: 0 });
        let dot = to_dot(&tape, None, &[3, 99]);
        assert!(!dot.contains(BACKWARD_COLOR));
        assert!(dot.contains("op3 [") && !dot.contains("op99"));
        // The tensor with a dangling producer is drawn as a source instead.
        assert!(dot.contains("  t3 -> op1;"), "{dot}");
    }

    #[test]
    fn dot_escape_handles_newlines_quotes_and_backslashes() {
        assert_eq!(dot_escape("a\"b\\c\nd\re"), "a\\\"b\\\\c\\nde");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    fn events(trace: &str) -> Vec<Value> {
        let v: Value = serde_json::from_str(trace).expect("the trace is JSON");
        assert_eq!(v["displayTimeUnit"], "ns");
        v["traceEvents"].as_array().unwrap().clone()
    }

    #[test]
    fn perfetto_has_ops_counters_and_metadata() {
        let tape = sample_tape();
        let tiers = [
            TierSample {
                t_ns: 4_000,
                device: 10,
                host: 20,
                disk: 30,
            },
            TierSample {
                t_ns: 0,
                device: 100,
                host: 0,
                disk: 0,
            },
        ];
        let evs = events(&to_perfetto(&tape, &tiers));
        let of = |ph: &str| evs.iter().filter(|e| e["ph"] == ph).collect::<Vec<_>>();

        let xs = of("X");
        assert_eq!(xs.len(), tape.ops.len());
        for (i, op) in tape.ops.iter().enumerate() {
            let x = xs.iter().find(|x| x["args"]["index"] == i).unwrap();
            assert_eq!(x["name"], op.name.as_str());
            assert_eq!(x["pid"], 1);
            assert_eq!(x["tid"], op.thread);
            assert_eq!(x["dur"].as_f64().unwrap(), op.duration_ns as f64 / 1000.0);
            assert_eq!(x["ts"].as_f64().unwrap(), op.start_ns as f64 / 1000.0);
            assert_eq!(x["args"]["inputs"], json!(op.inputs));
            assert_eq!(x["args"]["outputs"], json!(op.outputs));
        }
        let ts: Vec<f64> = xs.iter().map(|x| x["ts"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");

        let resident: Vec<_> = of("C")
            .into_iter()
            .filter(|c| c["name"] == "resident bytes")
            .collect();
        assert_eq!(resident.len(), 2);
        assert_eq!(resident[0]["ts"].as_f64().unwrap(), 0.0, "sorted by time");
        assert_eq!(
            resident[1]["args"],
            json!({"device": 10, "host": 20, "disk": 30})
        );

        let live: Vec<_> = of("C")
            .into_iter()
            .filter(|c| c["name"] == "live bytes")
            .collect();
        assert!(!live.is_empty());
        let lts: Vec<f64> = live.iter().map(|c| c["ts"].as_f64().unwrap()).collect();
        assert!(lts.windows(2).all(|w| w[0] < w[1]), "{lts:?}");

        let ms = of("M");
        assert!(
            ms.iter()
                .any(|m| m["name"] == "process_name" && m["args"]["name"] == "burn-spill step 7")
        );
        for thread in [1, 2] {
            assert!(
                ms.iter()
                    .any(|m| m["name"] == "thread_name" && m["tid"] == thread)
            );
        }
    }

    #[test]
    fn live_bytes_follow_production_and_drops() {
        // Bytes: t1 24, t2 48 (before the step); t3 32 @0, t4 4 @2000, t5 32 @3000,
        // t6 48 @3500, t7 48 @6000. Drops: t3 after op 1 ends (2500), t5 after op 3 ends
        // (5500), t2 after op 4 ends (7000).
        let points = live_bytes(&sample_tape());
        assert_eq!(
            points,
            vec![
                (0, 32, 72),
                (2_000, 36, 72),
                (2_500, 4, 72),
                (3_000, 36, 72),
                (3_500, 84, 72),
                (5_500, 52, 72),
                (6_000, 100, 72),
                (7_000, 100, 24),
            ]
        );
        // A drop before any op, a duplicate drop and a drop of an unknown tensor.
        let mut tape = sample_tape();
        tape.drops = vec![
            DropRecord {
                id: 1,
                after_ops: 0,
            },
            DropRecord {
                id: 1,
                after_ops: 3,
            },
            DropRecord {
                id: 42,
                after_ops: 1,
            },
        ];
        let points = live_bytes(&tape);
        assert_eq!(points[0], (0, 32, 48));
        assert!(points.iter().all(|p| p.2 == 48));
        // An empty tape has one zero point.
        assert_eq!(live_bytes(&StepTape::default()), vec![(0, 0, 0)]);
    }

    #[test]
    fn write_file_replaces_the_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("step.json");
        write_file(&path, "first").unwrap();
        write_file(&path, "second").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left behind");
    }

    #[test]
    fn write_file_to_an_unwritable_path_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("regular");
        std::fs::write(&file, "x").unwrap();
        // Root can write anywhere the permissions say, but not under a regular file.
        for path in [
            file.join("step.json"),
            dir.path().join("missing/step.json"),
            dir.path().to_path_buf(),
        ] {
            let err = write_file(&path, "{}").unwrap_err();
            assert!(
                matches!(&err, SpillError::Export { path: p, .. } if *p == path),
                "{err:?}"
            );
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left behind"
        );
    }
}

/// The formats a step's tape can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TapeFormat {
    /// The versioned JSON of [`StepTape`] (`docs/tape-schema.md`).
    Json,
    /// Graphviz DOT: forward and backward coloured apart, the critical path bold.
    Dot,
    /// Chrome/Perfetto trace JSON: ops on a timeline, resident bytes per tier as counters.
    Perfetto,
}

/// Renders `tape` in `format`. The DOT needs the step's analysis (backward start, critical
/// path), which is computed here.
pub fn render(tape: &StepTape, format: TapeFormat) -> String {
    match format {
        TapeFormat::Json => to_json(tape),
        TapeFormat::Dot => {
            let analysis = super::analysis::StepAnalysis::new(tape);
            to_dot(tape, analysis.backward_start, &analysis.critical_path.ops)
        }
        TapeFormat::Perfetto => to_perfetto(tape, &tape.tiers),
    }
}
