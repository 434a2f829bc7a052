//! What one training run reports as it goes: when each step began, each step's loss, and a
//! progress bar (indicatif) showing the loss, the step time and the resident device bytes.
//!
//! The log is shared: a custom loop calls it directly, while under burn-train's `Learner` the
//! batcher (on the training thread) marks step starts and a metric (on the Learner's event
//! thread) records the losses. Hooks let the caller act at each step start (the spilled run
//! marks steps for the tape there) and read the resident bytes for the bar.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::report::bytes;

type Hook = Arc<dyn Fn() + Send + Sync>;
type Resident = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

#[derive(Default)]
struct State {
    starts: Vec<Instant>,
    end: Option<Instant>,
    losses: Vec<f32>,
    /// Device bytes read at the last step start, for the bar.
    resident: Option<u64>,
}

/// A cheap-to-clone handle on one run's log.
#[derive(Clone)]
pub struct StepLog {
    state: Arc<Mutex<State>>,
    bar: ProgressBar,
    on_step_begin: Hook,
    on_run_end: Hook,
    resident: Resident,
}

/// What a finished run logged.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RunLog {
    pub losses: Vec<f32>,
    /// Wall time of each step whose end was seen: from its start to the next step's start
    /// (and for the last step, to the end of the run when the loop reported it).
    #[serde(serialize_with = "serialize_millis")]
    pub step_times: Vec<Duration>,
}

impl RunLog {
    /// The median step time, robust to the slow first step (allocation, autotuning).
    pub fn median_step(&self) -> Option<Duration> {
        let mut times = self.step_times.clone();
        times.sort();
        // The lower median: with two steps it is the faster one, not the warm-up.
        times.get(times.len().saturating_sub(1) / 2).copied()
    }
}

fn serialize_millis<S: serde::Serializer>(times: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(times.iter().map(|t| t.as_secs_f64() * 1e3))
}

impl StepLog {
    /// A log with a progress bar of `steps` steps labelled `label`. The bar draws on stderr
    /// only when it is a terminal (indicatif hides it otherwise, as in tests and CI logs).
    pub fn new(label: &str, steps: usize) -> Self {
        let bar = ProgressBar::new(steps as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>8} [{bar:20}] {pos}/{len} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        Self {
            state: Arc::default(),
            bar,
            on_step_begin: Arc::new(|| {}),
            on_run_end: Arc::new(|| {}),
            resident: Arc::new(|| None),
        }
    }

    /// Runs `hook` on the training thread as each step begins.
    pub fn on_step_begin(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_step_begin = Arc::new(hook);
        self
    }

    /// Runs `hook` once after the last step, where the loop can tell (see [`end_run`]).
    ///
    /// [`end_run`]: Self::end_run
    pub fn on_run_end(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_run_end = Arc::new(hook);
        self
    }

    /// Where the bar reads the resident device bytes from.
    pub fn resident(mut self, read: impl Fn() -> Option<u64> + Send + Sync + 'static) -> Self {
        self.resident = Arc::new(read);
        self
    }

    /// A step starts now. Must be called on the thread that runs the step.
    pub fn begin_step(&self) {
        (self.on_step_begin)();
        // Reading the stats waits for burn-spill's transfer workers, so it is done only where
        // someone sees the bar, and once per step.
        let resident = if self.bar.is_hidden() {
            None
        } else {
            (self.resident)()
        };
        let now = Instant::now();
        let mut state = self.lock();
        state.resident = resident;
        if let Some(&previous) = state.starts.last() {
            self.bar.set_position(state.starts.len() as u64);
            self.refresh(&state, Some(now - previous));
        }
        state.starts.push(now);
    }

    /// The loss of the next step in order (steps finish in order on every path).
    pub fn record_loss(&self, loss: f32) {
        let mut state = self.lock();
        state.losses.push(loss);
        self.refresh(&state, None);
    }

    /// The last step ended now. A loop that cannot tell (the `Learner` runs validation and
    /// clean-up after its last step) skips this, and its last step is left out of the times.
    pub fn end_run(&self) {
        let now = Instant::now();
        self.lock().end = Some(now);
        (self.on_run_end)();
    }

    /// Clears the bar and returns what was logged.
    pub fn finish(&self) -> RunLog {
        self.bar.finish_and_clear();
        let state = self.lock();
        let mut times: Vec<Duration> = state.starts.windows(2).map(|w| w[1] - w[0]).collect();
        if let (Some(&last), Some(end)) = (state.starts.last(), state.end) {
            times.push(end - last);
        }
        RunLog {
            losses: state.losses.clone(),
            step_times: times,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refresh(&self, state: &State, step_time: Option<Duration>) {
        let mut parts = Vec::new();
        if let Some(loss) = state.losses.last() {
            parts.push(format!("loss {loss:.4}"));
        }
        let step_time = step_time.or_else(|| state.starts.windows(2).last().map(|w| w[1] - w[0]));
        if let Some(t) = step_time {
            parts.push(format!("{:.0} ms/step", t.as_secs_f64() * 1e3));
        }
        if let Some(device) = state.resident {
            parts.push(format!("device {}", bytes(device)));
        }
        self.bar.set_message(parts.join("  "));
    }
}
