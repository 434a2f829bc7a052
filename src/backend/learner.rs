//! burn-train's `Learner`, with every training step marked for the tape.
//!
//! burn-train 0.21 runs its loop inside `SupervisedTraining::launch`, where a user cannot put
//! step markers, so without this the tape finds steps by period detection: a detected step may
//! start anywhere in the loop, and the last one never closes. [`SpillStrategy`] is burn-train's
//! single-device loop (the same calls in the same order, so a model trains exactly as under the
//! default strategy) with a marker around each step; [`WithSpillSteps::with_spill_steps`]
//! installs it in one line.

use std::marker::PhantomData;
use std::sync::Arc;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::GradientsAccumulator;
use burn::tensor::Device;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsTypes,
    SupervisedLearningStrategy, SupervisedTraining, SupervisedTrainingEventProcessor, TrainLoader,
    TrainingBackend, TrainingComponents, TrainingItem, TrainingModel, TrainingStrategy,
    ValidLoader,
};
use burn_backend::Backend;

use super::SpillBackend;

/// A backend whose training steps burn-spill can mark: [`SpillBackend`], and `Autodiff` over
/// one (with any checkpointing strategy).
pub trait SpillSteps: Backend {
    /// Begins a step (see [`SpillBackend::step_begin`]).
    fn spill_step_begin(device: &Self::Device);
    /// Ends the step (see [`SpillBackend::step_end`]).
    fn spill_step_end(device: &Self::Device);
    /// Stops recording until the next step begins: what runs between training steps (a
    /// validation epoch) is not a step of the training program.
    fn spill_pause_tape(device: &Self::Device);
}

impl<B: Backend> SpillSteps for SpillBackend<B> {
    fn spill_step_begin(device: &B::Device) {
        SpillBackend::<B>::step_begin(device)
    }

    fn spill_step_end(device: &B::Device) {
        SpillBackend::<B>::step_end(device)
    }

    fn spill_pause_tape(device: &B::Device) {
        SpillBackend::<B>::record_tape(device, false)
    }
}

impl<B: SpillSteps, C: CheckpointStrategy> SpillSteps for Autodiff<B, C> {
    fn spill_step_begin(device: &B::Device) {
        B::spill_step_begin(device)
    }

    fn spill_step_end(device: &B::Device) {
        B::spill_step_end(device)
    }

    fn spill_pause_tape(device: &B::Device) {
        B::spill_pause_tape(device)
    }
}

/// burn-train's single-device training loop with every step marked for burn-spill's tape.
///
/// A step is one optimizer step: one batch, or with `grads_accumulation(n)` the `n` batches
/// whose gradients one optimizer step applies, so that every step runs the same program. A
/// step begins before its first batch is loaded and ends after the optimizer step; the last
/// step of an epoch ends before validation, which is not recorded. Batches left over at the
/// end of an epoch with accumulation (fewer than `n`) form a last, shorter step, and, as under
/// burn-train's own loop, their gradients are not applied.
///
/// On a device that was never configured, nothing moves: the markers only shape the tape.
pub struct SpillStrategy<LC: LearningComponentsTypes> {
    _components: PhantomData<fn() -> LC>,
}

impl<LC: LearningComponentsTypes> SpillStrategy<LC> {
    /// The strategy, for `SupervisedTraining::with_training_strategy`
    /// (`TrainingStrategy::Custom`); [`WithSpillSteps::with_spill_steps`] does this in one call.
    pub fn new() -> Self {
        Self {
            _components: PhantomData,
        }
    }
}

impl<LC: LearningComponentsTypes> Default for SpillStrategy<LC> {
    fn default() -> Self {
        Self::new()
    }
}

/// Installs [`SpillStrategy`] on a `SupervisedTraining`:
///
/// ```
/// use burn::train::{LearningComponentsTypes, SupervisedTraining, TrainingBackend};
/// use burn_spill::{SpillSteps, WithSpillSteps};
///
/// // Where a training is set up: `SupervisedTraining::new(dir, train, valid)...`
/// fn set_up<LC>(training: SupervisedTraining<LC>) -> SupervisedTraining<LC>
/// where
///     LC: LearningComponentsTypes + 'static,
///     TrainingBackend<LC>: SpillSteps, // Autodiff<SpillBackend<B>>
/// {
///     training.num_epochs(10).with_spill_steps()
/// }
/// ```
pub trait WithSpillSteps {
    /// Trains with every step marked for burn-spill's tape.
    fn with_spill_steps(self) -> Self;
}

impl<LC> WithSpillSteps for SupervisedTraining<LC>
where
    LC: LearningComponentsTypes + 'static,
    TrainingBackend<LC>: SpillSteps,
{
    fn with_spill_steps(self) -> Self {
        self.with_training_strategy(TrainingStrategy::Custom(Arc::new(
            SpillStrategy::<LC>::new(),
        )))
    }
}

impl<LC> SupervisedLearningStrategy<LC> for SpillStrategy<LC>
where
    LC: LearningComponentsTypes,
    TrainingBackend<LC>: SpillSteps,
{
    fn fit(
        &self,
        components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        // burn-train's default strategy trains on the model's first device too.
        let device = learner.model().devices()[0].clone();
        let dataloader_train = dataloader_train.to_device(&device);
        let dataloader_valid = dataloader_valid.to_device(&device);
        learner.fork(&device);
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let mut early_stopping = components.early_stopping;
        let interrupter = &components.interrupter;
        let accumulation = components.grad_accumulation;

        for epoch in starting_epoch..=components.num_epochs {
            let progress = Progress {
                items_processed: epoch,
                items_total: components.num_epochs,
            };
            train_epoch::<LC>(
                &device,
                &mut learner,
                &dataloader_train,
                accumulation,
                &progress,
                &mut processor,
                interrupter,
            );
            if interrupter.should_stop() {
                let reason = interrupter.get_message();
                tracing::info!(
                    target: "burn_spill::train",
                    "training interrupted: {}",
                    reason.as_deref().unwrap_or("reason unknown")
                );
                break;
            }
            valid_epoch::<LC>(
                &learner,
                &dataloader_valid,
                &progress,
                &mut processor,
                interrupter,
            );
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
            if let Some(early_stopping) = &mut early_stopping
                && early_stopping.should_stop(epoch, &components.event_store)
            {
                break;
            }
        }
        (learner.model(), processor)
    }
}

/// One training epoch: burn-train's `SingleDeviceTrainEpoch::run`, marked.
fn train_epoch<LC>(
    device: &Device<TrainingBackend<LC>>,
    learner: &mut Learner<LC>,
    dataloader: &TrainLoader<LC>,
    accumulation: Option<usize>,
    epoch: &Progress,
    processor: &mut SupervisedTrainingEventProcessor<LC>,
    interrupter: &burn::train::Interrupter,
) where
    LC: LearningComponentsTypes,
    TrainingBackend<LC>: SpillSteps,
{
    let mut iterator = dataloader.iter();
    let mut iteration = 0;
    let mut accumulator = GradientsAccumulator::new();
    let mut accumulated = 0;
    let mut open = false;
    loop {
        if !open {
            TrainingBackend::<LC>::spill_step_begin(device);
            open = true;
        }
        // Loading the batch belongs to the step that trains on it.
        let Some(item) = iterator.next() else { break };
        iteration += 1;
        learner.lr_step();
        let progress = iterator.progress();
        let output = learner.train_step(item);
        match accumulation {
            Some(accumulation) => {
                accumulator.accumulate(&learner.model(), output.grads);
                accumulated += 1;
                if accumulation <= accumulated {
                    learner.optimizer_step(accumulator.grads());
                    accumulated = 0;
                }
            }
            None => learner.optimizer_step(output.grads),
        }
        let item = TrainingItem::new(
            output.item,
            progress,
            epoch.clone(),
            Some(iteration),
            Some(learner.lr_current()),
        );
        processor.process_train(LearnerEvent::ProcessedItem(item));
        if accumulated == 0 {
            TrainingBackend::<LC>::spill_step_end(device);
            open = false;
        }
        if interrupter.should_stop() {
            break;
        }
    }
    // A step opened for a batch that never came is empty and leaves no trace on the tape; one
    // cut short (by the interrupter, or leftover accumulated batches) ends here.
    if open {
        TrainingBackend::<LC>::spill_step_end(device);
    }
    TrainingBackend::<LC>::spill_pause_tape(device);
    processor.process_train(LearnerEvent::EndEpoch(epoch.items_processed));
}

/// One validation epoch: burn-train's `SingleDeviceValidEpoch::run`, outside any step.
fn valid_epoch<LC: LearningComponentsTypes>(
    learner: &Learner<LC>,
    dataloader: &ValidLoader<LC>,
    epoch: &Progress,
    processor: &mut SupervisedTrainingEventProcessor<LC>,
    interrupter: &burn::train::Interrupter,
) {
    let model = learner.model().valid();
    let mut iterator = dataloader.iter();
    let mut iteration = 0;
    while let Some(item) = iterator.next() {
        let progress = iterator.progress();
        iteration += 1;
        let item = TrainingItem::new(
            model.step(item),
            progress,
            epoch.clone(),
            Some(iteration),
            None,
        );
        processor.process_valid(LearnerEvent::ProcessedItem(item));
        if interrupter.should_stop() {
            break;
        }
    }
    processor.process_valid(LearnerEvent::EndEpoch(epoch.items_processed));
}
