//! What one step did: a leaf module, shared by the optimizer and its errors.

use dsopt_sys as sys;

/// What one step did (`dsopt_step_info`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInfo {
    /// The step was skipped (a non-finite gradient on some rank).
    pub skipped: bool,
    /// The step used 1-bit compressed communication.
    pub compressed: bool,
    /// Updates applied so far, this one included.
    pub step: i64,
    /// Loss scale for the next backward pass (1.0 without loss scaling).
    pub loss_scale: f64,
    /// Global gradient norm before clipping, with clipping or
    /// `"report_grad_norm"` (else `None`).
    pub grad_norm: Option<f64>,
    /// Bytes this rank sent through the communicator during the step.
    pub bytes_sent: u64,
    /// Steps skipped in a row, this one included; 0 when this step applied.
    pub consecutive_skips: i64,
    /// What the step did: one of the `PHASE_*` constants (`DSOPT_PHASE_*`).
    pub phase: i32,
    /// Every rank's local gradients were bit-identical (and not all zero):
    /// something else had averaged them already and dsopt averaged them
    /// again. Checked while the run has applied fewer than 3 steps; false on
    /// later steps and at one rank.
    pub grads_replicated: bool,
    /// The global gradient norm has stayed far above its own recent history
    /// while every value is finite: true on every step of such an episode,
    /// the same on every rank (docs/reference/c-api.md "Divergence that stays finite"; the
    /// config key `"divergence_check"`).
    pub diverging: bool,
    /// The part of `bytes_sent` sent to ranks of other nodes (the config's
    /// `"topology"`; docs/reference/c-api.md "Step info").
    pub bytes_inter_node: u64,
}

/// [`StepInfo::phase`]: the step was skipped, nothing applied.
pub const PHASE_SKIPPED: i32 = sys::DSOPT_PHASE_SKIPPED as i32;
/// Full-precision averaged gradients (Adam, 1-bit Adam's warmup, 0/1 Adam's variance steps).
pub const PHASE_FULL: i32 = sys::DSOPT_PHASE_FULL as i32;
/// 1-bit compressed communication (1-bit Adam's compression stage, 0/1 Adam's 1-bit steps).
pub const PHASE_COMPRESSED: i32 = sys::DSOPT_PHASE_COMPRESSED as i32;
/// 0/1 Adam local step: no communication of gradients or momenta.
pub const PHASE_LOCAL: i32 = sys::DSOPT_PHASE_LOCAL as i32;
/// 0/1 Adam local step followed by the 1-bit sync of the accumulator.
pub const PHASE_SYNC: i32 = sys::DSOPT_PHASE_SYNC as i32;

impl StepInfo {
    pub(crate) fn from_c(info: &sys::dsopt_step_info) -> StepInfo {
        StepInfo {
            skipped: info.skipped != 0,
            compressed: info.compressed != 0,
            step: info.step,
            loss_scale: info.loss_scale,
            grad_norm: (info.grad_norm >= 0.0).then_some(info.grad_norm),
            bytes_sent: info.bytes_sent,
            consecutive_skips: info.consecutive_skips,
            phase: info.phase,
            grads_replicated: info.grads_replicated != 0,
            diverging: info.diverging != 0,
            bytes_inter_node: info.bytes_inter_node,
        }
    }
}
