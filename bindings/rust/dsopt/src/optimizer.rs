//! `Optimizer`: one dsopt optimizer handle over borrowed parameter buffers.

use std::ffi::{CStr, CString};
use std::mem;
use std::ptr::{self, NonNull};

use dsopt_sys as sys;

use crate::comm::Communicator;
use crate::error::{check, Error, ErrorKind, Result};
use crate::step_info::StepInfo;
use crate::tensor::{GradSlice, ParamSlice};

/// What [`Optimizer::memory_usage`] reports: bytes dsopt holds for one
/// optimizer on this rank, in host and in device (CUDA) memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemoryUsage {
    /// Bytes in host memory.
    pub host: u64,
    /// Bytes in device memory (0 for a CPU optimizer).
    pub device: u64,
}

/// A dsopt optimizer (`dsopt_optimizer`). It borrows its parameter buffers
/// and its communicator for `'a` and updates the parameters in place; read
/// them between steps through [`params`](Self::params).
///
/// Creating, stepping, loading state and dropping are collective: every rank
/// of the communicator does them in the same order.
///
/// `Send` but not `Sync`: it may move to another thread, but one handle is
/// never used by two threads at once.
#[derive(Debug)]
pub struct Optimizer<'a> {
    raw: NonNull<sys::dsopt_optimizer>,
    params: Vec<ParamSlice<'a>>,
    comm: &'a mut Communicator,
}

// Safety: a dsopt_optimizer has no thread affinity (the error text is read on
// the thread that made the call); the parameters and the communicator are
// borrowed exclusively, so nothing else touches them from another thread.
// `NonNull` keeps it !Sync.
unsafe impl Send for Optimizer<'_> {}

impl<'a> Optimizer<'a> {
    /// Creates an optimizer from a JSON config (the DeepSpeed schema where it
    /// overlaps, see docs/reference/config.md) over `params`, averaging gradients
    /// over `comm`. Collective.
    ///
    /// ```no_run
    /// # fn main() -> dsopt::Result<()> {
    /// let mut w = vec![0.0f32; 16];
    /// let mut comm = dsopt::Communicator::local()?;
    /// let config = r#"{"optimizer": {"type": "Adam", "params": {"lr": 0.01}}}"#;
    /// let mut opt = dsopt::Optimizer::new(config, [dsopt::ParamSlice::f32(&mut w)], &mut comm)?;
    /// let info = opt.step(&[dsopt::GradSlice::f32(&[1.0; 16])])?;
    /// assert_eq!(info.step, 1);
    /// # Ok(()) }
    /// ```
    pub fn new(
        config: &str,
        params: impl IntoIterator<Item = ParamSlice<'a>>,
        comm: &'a mut Communicator,
    ) -> Result<Self> {
        let config =
            CString::new(config).map_err(|_| Error::invalid("config contains a NUL byte"))?;
        let params: Vec<ParamSlice<'a>> = params.into_iter().collect();
        let tensors: Vec<sys::dsopt_tensor> = params.iter().map(ParamSlice::to_c).collect();
        let mut out = ptr::null_mut();
        // Safety: `config` is NUL-terminated; `tensors` describes valid buffers
        // that stay exclusively borrowed for 'a, like the communicator, and
        // the optimizer (destroyed in Drop) cannot outlive 'a.
        check(unsafe {
            sys::dsopt_create(
                &mut out,
                config.as_ptr(),
                comm.as_ptr(),
                tensors.as_ptr(),
                tensors.len() as i64,
            )
        })?;
        let raw =
            NonNull::new(out).ok_or_else(|| Error::invalid("dsopt returned a NULL optimizer"))?;
        Ok(Optimizer { raw, params, comm })
    }

    /// One optimizer step with this rank's local gradients: one per
    /// parameter, in order, same lengths (dtypes may differ). Collective.
    ///
    /// A step with Inf/NaN gradients on some rank is skipped on every rank
    /// (`skipped`, `consecutive_skips`). When the run stops progressing
    /// (`"max_consecutive_skips"` skips in a row, default 50; or an fp16
    /// overflow at `min_loss_scale`; `"max_consecutive_skips": 0` turns both
    /// checks off) the skipped step returns
    /// [`ErrorKind::NonFinite`] with its `StepInfo` in
    /// [`Error::step_info`]; the next step may continue.
    pub fn step(&mut self, grads: &[GradSlice<'_>]) -> Result<StepInfo> {
        let tensors: Vec<sys::dsopt_tensor> = grads.iter().map(|g| g.to_c()).collect();
        // Safety: `tensors` points to valid gradient buffers (borrowed from
        // `grads` for the whole call) that are only read during the call.
        unsafe { self.step_raw(tensors.as_ptr(), tensors.len() as i64) }
    }

    /// Points the optimizer at new buffers for its parameters
    /// (`dsopt_rebind_params`): every parameter again, in order, with the
    /// length, dtype and group it was created with. Nothing else changes:
    /// the next step updates the new buffers (fp32 masters of 16-bit
    /// parameters stay dsopt's), so a run whose values were copied into them
    /// continues bit-identically. Returns the previous slices, which dsopt
    /// no longer touches. Not collective.
    ///
    /// Errors ([`ErrorKind::InvalidArgument`], nothing changes and the new
    /// slices are dropped): another count, length, dtype or group, or
    /// gradients being handed over.
    pub fn rebind_params(
        &mut self,
        params: impl IntoIterator<Item = ParamSlice<'a>>,
    ) -> Result<Vec<ParamSlice<'a>>> {
        let params: Vec<ParamSlice<'a>> = params.into_iter().collect();
        let tensors: Vec<sys::dsopt_tensor> = params.iter().map(ParamSlice::to_c).collect();
        // Safety: the handle is live; `tensors` describes valid buffers that
        // stay exclusively borrowed for 'a, as the ones given at creation.
        check(unsafe {
            sys::dsopt_rebind_params(self.raw.as_ptr(), tensors.as_ptr(), tensors.len() as i64)
        })?;
        Ok(mem::replace(&mut self.params, params))
    }

    /// Hands over parameter `index`'s local gradient of one micro-batch
    /// (`dsopt_grad_ready`), typically while backward is still producing
    /// the others, so that its reduction overlaps the rest of backward;
    /// [`complete_step`](Self::complete_step) then completes the step.
    /// Not collective (`complete_step` is).
    ///
    /// `grad` has the parameter's length (any dtype) and is read completely
    /// before the call returns: the buffer may be reused at once. Any order,
    /// which may differ between ranks. With `"gradient_accumulation_steps"`
    /// = G each parameter is handed over G times per step, once per
    /// micro-batch, and the step uses the mean of the G gradients; a
    /// parameter not handed over in a micro-batch contributes zeros.
    ///
    /// Errors ([`ErrorKind::InvalidArgument`], nothing changes): an index
    /// out of range, a length or dtype that does not fit, or a parameter
    /// already handed over G times in this step.
    ///
    /// ```no_run
    /// # fn main() -> dsopt::Result<()> {
    /// # let (mut w, mut b) = (vec![0.0f32; 8], vec![0.0f32; 1]);
    /// # let mut comm = dsopt::Communicator::local()?;
    /// # let config = r#"{"optimizer": {"type": "AdamW"}}"#;
    /// let mut opt = dsopt::Optimizer::new(config,
    ///     [dsopt::ParamSlice::f32(&mut w), dsopt::ParamSlice::f32(&mut b)], &mut comm)?;
    /// // Backward produces the last parameter's gradient first.
    /// opt.grad_ready(1, dsopt::GradSlice::f32(&[0.1]))?;
    /// opt.grad_ready(0, dsopt::GradSlice::f32(&[0.5; 8]))?;
    /// let info = opt.complete_step()?;
    /// # Ok(()) }
    /// ```
    pub fn grad_ready(&mut self, index: usize, grad: GradSlice<'_>) -> Result<()> {
        let index =
            i64::try_from(index).map_err(|_| Error::invalid("parameter index out of range"))?;
        let tensor = grad.to_c();
        // Safety: the handle is live; `tensor` describes a buffer that is
        // borrowed for the call and only read (completely) during it.
        check(unsafe { sys::dsopt_grad_ready(self.raw.as_ptr(), index, &tensor) })
    }

    /// Completes a step whose gradients were handed over with
    /// [`grad_ready`](Self::grad_ready) (`dsopt_step(opt, NULL, 0, info)`).
    /// Collective: every rank calls it, whatever it handed over. Reports and
    /// fails like [`step`](Self::step); a reduction's communication error
    /// surfaces here. Calling [`step`](Self::step) with gradients while
    /// some are handed over is [`ErrorKind::InvalidArgument`].
    pub fn complete_step(&mut self) -> Result<StepInfo> {
        // Safety: NULL with 0 gradients is the completion call.
        unsafe { self.step_raw(ptr::null(), 0) }
    }

    /// `dsopt_step` with `num` descriptors at `grads` (NULL and 0 to
    /// complete a handed-over step).
    ///
    /// # Safety
    /// `grads` is NULL with `num` 0, or points to `num` descriptors of valid
    /// gradient buffers, readable for the call.
    unsafe fn step_raw(&mut self, grads: *const sys::dsopt_tensor, num: i64) -> Result<StepInfo> {
        // Safety: an all-zero dsopt_step_info is a valid value (plain integers
        // and doubles); struct_size is set before the call.
        let mut info: sys::dsopt_step_info = unsafe { mem::zeroed() };
        info.struct_size = mem::size_of::<sys::dsopt_step_info>() as u32;
        // Safety: the handle is live; the caller vouches for `grads`.
        let rc = unsafe { sys::dsopt_step(self.raw.as_ptr(), grads, num, &mut info) };
        // `info` is written on DSOPT_OK and DSOPT_ENONFINITE.
        let step_info = StepInfo::from_c(&info);
        check(rc).map_err(|error| match error.kind() {
            ErrorKind::NonFinite => error.with_step_info(step_info),
            _ => error,
        })?;
        Ok(step_info)
    }

    /// Sets the learning rate of every parameter group.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        // Safety: the handle is live.
        check(unsafe { sys::dsopt_set_lr(self.raw.as_ptr(), lr) })
    }

    /// Sets `"gradient_clipping"` (the global gradient norm's limit; 0.0:
    /// off) from the next step on; the same value on every rank.
    pub fn set_gradient_clipping(&mut self, max_norm: f64) -> Result<()> {
        // Safety: the handle is live.
        check(unsafe { sys::dsopt_set_gradient_clipping(self.raw.as_ptr(), max_norm) })
    }

    /// The CPU threads of this optimizer's host work: `"threads"`, or by
    /// default this rank's share of its cores (`dsopt_get_threads`).
    pub fn threads(&self) -> Result<i32> {
        let mut threads = 0;
        // Safety: the handle is live; `threads` is a valid out pointer.
        check(unsafe { sys::dsopt_get_threads(self.raw.as_ptr(), &mut threads) })?;
        Ok(threads)
    }

    /// The current `"gradient_clipping"` (0.0: off).
    pub fn gradient_clipping(&self) -> Result<f64> {
        let mut max_norm = 0.0;
        // Safety: the handle is live; `max_norm` is a valid out pointer.
        check(unsafe { sys::dsopt_get_gradient_clipping(self.raw.as_ptr(), &mut max_norm) })?;
        Ok(max_norm)
    }

    /// Sets the learning rate of one parameter group.
    pub fn set_group_lr(&mut self, group: i32, lr: f64) -> Result<()> {
        // Safety: the handle is live.
        check(unsafe { sys::dsopt_set_group_lr(self.raw.as_ptr(), group, lr) })
    }

    /// Learning rate of one parameter group.
    pub fn lr(&self, group: i32) -> Result<f64> {
        let mut lr = 0.0;
        // Safety: the handle is live; `lr` is a valid out pointer.
        check(unsafe { sys::dsopt_get_lr(self.raw.as_ptr(), group, &mut lr) })?;
        Ok(lr)
    }

    /// A hyperparameter of one group by name: the algorithm's
    /// ([`group_param_names`]), e.g. "lr", "beta1",
    /// "beta2", "eps" or "weight_decay" for Adam (`dsopt_get_group_param`).
    pub fn group_param(&self, group: i32, name: &str) -> Result<f64> {
        let name = CString::new(name).map_err(|_| Error::invalid("name contains a NUL byte"))?;
        let mut value = 0.0;
        // Safety: the handle is live; `name` is NUL-terminated; `value` is a valid out pointer.
        check(unsafe {
            sys::dsopt_get_group_param(self.raw.as_ptr(), group, name.as_ptr(), &mut value)
        })?;
        Ok(value)
    }

    /// Sets a hyperparameter of one group from the next step on (for
    /// schedules that cycle momentum or decay; `dsopt_set_group_param`).
    /// Not collective; set the same value on every rank.
    pub fn set_group_param(&mut self, group: i32, name: &str, value: f64) -> Result<()> {
        let name = CString::new(name).map_err(|_| Error::invalid("name contains a NUL byte"))?;
        // Safety: the handle is live; `name` is NUL-terminated.
        check(unsafe { sys::dsopt_set_group_param(self.raw.as_ptr(), group, name.as_ptr(), value) })
    }

    /// Updates applied to parameter `index` (torch.optim's `state["step"]`;
    /// steps in which no rank had its gradient do not count for Adam/AdamW).
    pub fn param_step(&self, index: usize) -> Result<i64> {
        let index = param_index(index)?;
        let mut step = 0;
        // Safety: the handle is live; `step` is a valid out pointer.
        check(unsafe { sys::dsopt_get_param_step(self.raw.as_ptr(), index, &mut step) })?;
        Ok(step)
    }

    /// Sets parameter `index`'s step count (Adam/AdamW; the 1-bit
    /// optimizers return [`ErrorKind::Unsupported`]).
    pub fn set_param_step(&mut self, index: usize, step: i64) -> Result<()> {
        let index = param_index(index)?;
        // Safety: the handle is live.
        check(unsafe { sys::dsopt_set_param_step(self.raw.as_ptr(), index, step) })
    }

    /// The buckets of ZeRO's parameter allgather (`dsopt_gather_num_buckets`;
    /// 0 where parameters are never gathered: stage 0, one rank).
    pub fn gather_buckets(&self) -> Result<i64> {
        let mut count = 0;
        // Safety: the handle is live; `count` is a valid out pointer.
        check(unsafe { sys::dsopt_gather_num_buckets(self.raw.as_ptr(), &mut count) })?;
        Ok(count)
    }

    /// The bucket after whose arrival parameter `index` is whole
    /// (`dsopt_gather_bucket_of`); -1 when it is never gathered.
    pub fn gather_bucket_of(&self, index: usize) -> Result<i64> {
        let index = param_index(index)?;
        let mut bucket = 0;
        // Safety: the handle is live; `bucket` is a valid out pointer.
        check(unsafe { sys::dsopt_gather_bucket_of(self.raw.as_ptr(), index, &mut bucket) })?;
        Ok(bucket)
    }

    /// Collective (`dsopt_gather_order`): the order in which the caller
    /// needs the parameters (the model's forward order), every parameter
    /// index once; empty: the default, parameter order. From the next step
    /// on the deferred allgather posts its buckets in the order these
    /// parameters first need them, and `gather_bucket_of` and
    /// `wait_gather_bucket` number buckets by that position; values and
    /// state are the same whatever the order. Every rank passes the same
    /// order: [`ErrorKind::InvalidArgument`] on a rank whose order is not
    /// a permutation, [`ErrorKind::Mismatch`] on the others and on every
    /// rank when the orders differ; nothing changes then.
    pub fn set_gather_order(&mut self, order: &[usize]) -> Result<()> {
        // An index past i64 is not a parameter: dsopt rejects it on every rank.
        let order: Vec<i64> = order.iter().map(|&i| i64::try_from(i).unwrap_or(-1)).collect();
        let ptr = if order.is_empty() { std::ptr::null() } else { order.as_ptr() };
        // Safety: the handle is live; `ptr` points at `order.len()` values or is null with 0.
        check(unsafe { sys::dsopt_gather_order(self.raw.as_ptr(), ptr, order.len() as i64) })
    }

    /// Buckets of the last step's deferred allgather not arrived yet
    /// (`dsopt_gather_pending`; does not wait).
    pub fn gathers_pending(&mut self) -> Result<i64> {
        let mut pending = 0;
        // Safety: the handle is live; `pending` is a valid out pointer.
        check(unsafe { sys::dsopt_gather_pending(self.raw.as_ptr(), &mut pending) })?;
        Ok(pending)
    }

    /// Waits until parameter `index` is whole after a step with
    /// `"deferred_allgather"` (`dsopt_gather_wait`); `None`: every
    /// parameter. Every other call waits for all buckets by itself.
    pub fn wait_gather(&mut self, index: Option<usize>) -> Result<()> {
        let index = match index {
            Some(i) => param_index(i)?,
            None => -1,
        };
        // Safety: the handle is live.
        check(unsafe { sys::dsopt_gather_wait(self.raw.as_ptr(), index) })
    }

    /// Waits until buckets 0 ..= `bucket` have arrived
    /// (`dsopt_gather_wait_bucket`); `None`: every bucket.
    pub fn wait_gather_bucket(&mut self, bucket: Option<i64>) -> Result<()> {
        // Safety: the handle is live.
        check(unsafe { sys::dsopt_gather_wait_bucket(self.raw.as_ptr(), bucket.unwrap_or(-1)) })
    }

    /// The names [`state_view`](Self::state_view) accepts ("exp_avg",
    /// "exp_avg_sq", ...).
    pub fn state_names(&self) -> Result<Vec<String>> {
        let mut names: *const std::os::raw::c_char = ptr::null();
        // Safety: the handle is live; `names` is a valid out pointer.
        check(unsafe { sys::dsopt_state_names(self.raw.as_ptr(), &mut names) })?;
        // Safety: on success `names` is a NUL-terminated string that lives
        // as long as the optimizer; it is copied at once.
        let text = unsafe { CStr::from_ptr(names) }.to_string_lossy();
        Ok(text.split_whitespace().map(str::to_owned).collect())
    }

    /// Parameter `index`'s state tensor `name` in dsopt's own memory, read
    /// only (host optimizers; see [`state_view_mut`](Self::state_view_mut)).
    /// Under ZeRO stage 1/2 it is this rank's part of the parameter,
    /// starting at element [`StateView::offset`].
    pub fn state_view(&self, index: usize, name: &str) -> Result<StateView<'_>> {
        let (data, len, offset, param_numel) = self.raw_state_view(index, name)?;
        let values: &[f32] = if len == 0 {
            &[]
        } else {
            // Safety: dsopt owns `len` fp32 host values at `data` until
            // dsopt_destroy; it writes them only in calls that take `&mut
            // self`, which this shared borrow excludes.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        Ok(StateView { values, offset, param_numel })
    }

    /// The same, writable: the next step uses what is written (as if it had
    /// been loaded from a blob). Keep replicated state the same on every rank.
    pub fn state_view_mut(&mut self, index: usize, name: &str) -> Result<StateViewMut<'_>> {
        let (data, len, offset, param_numel) = self.raw_state_view(index, name)?;
        let values: &mut [f32] = if len == 0 {
            &mut []
        } else {
            // Safety: as in state_view; the exclusive borrow of the optimizer
            // keeps dsopt from touching the values while the slice lives.
            unsafe { std::slice::from_raw_parts_mut(data, len) }
        };
        Ok(StateViewMut { values, offset, param_numel })
    }

    fn raw_state_view(&self, index: usize, name: &str) -> Result<(*mut f32, usize, usize, usize)> {
        let index = param_index(index)?;
        let name = CString::new(name).map_err(|_| Error::invalid("name contains a NUL byte"))?;
        // Safety: an all-zero dsopt_state_view is a valid value; struct_size is set below.
        let mut view: sys::dsopt_state_view = unsafe { mem::zeroed() };
        view.struct_size = mem::size_of::<sys::dsopt_state_view>() as u32;
        // Safety: the handle is live; `name` is NUL-terminated; `view` is a valid out pointer.
        check(unsafe {
            sys::dsopt_get_state_view(self.raw.as_ptr(), index, name.as_ptr(), &mut view)
        })?;
        if view.device != sys::DSOPT_COMM_HOST as i32 {
            return Err(Error::unsupported(
                "the state is in device memory: read it through the C API's dsopt_state_view",
            ));
        }
        Ok((
            view.tensor.data.cast::<f32>(),
            view.tensor.numel as usize,
            view.offset as usize,
            view.param_numel as usize,
        ))
    }

    /// Number of parameter groups.
    pub fn num_groups(&self) -> Result<i32> {
        let mut count = 0;
        // Safety: the handle is live; `count` is a valid out pointer.
        check(unsafe { sys::dsopt_num_groups(self.raw.as_ptr(), &mut count) })?;
        Ok(count)
    }

    /// Scale to multiply the next loss by (1.0 without loss scaling).
    pub fn loss_scale(&self) -> Result<f64> {
        let mut scale = 0.0;
        // Safety: the handle is live; `scale` is a valid out pointer.
        check(unsafe { sys::dsopt_get_loss_scale(self.raw.as_ptr(), &mut scale) })?;
        Ok(scale)
    }

    /// Sets (or with `None` clears) the momentum mask of parameter `index`
    /// for 1-bit optimizers: fp32 host values, one per element of the
    /// parameter; dsopt keeps a copy.
    pub fn set_momentum_mask(&mut self, index: usize, mask: Option<&[f32]>) -> Result<()> {
        let tensor = mask.map(|m| GradSlice::f32(m).to_c());
        let mask_ptr = tensor
            .as_ref()
            .map_or(ptr::null(), |t| t as *const sys::dsopt_tensor);
        let index =
            i64::try_from(index).map_err(|_| Error::invalid("parameter index out of range"))?;
        // Safety: the handle is live; `mask_ptr` is null or describes a host
        // buffer that is only read (and copied) during the call.
        check(unsafe { sys::dsopt_set_momentum_mask(self.raw.as_ptr(), index, mask_ptr) })
    }

    /// The canonical configuration as JSON text (`dsopt_get_config`): every
    /// key with its effective value, defaults filled in, aliases resolved,
    /// the group hyperparameters and gradient clipping as they are now. An
    /// optimizer created from it has the same config.
    pub fn config(&self) -> Result<String> {
        let raw = self.raw.as_ptr();
        // Safety: the handle is live; `read_text` passes a buffer of
        // `capacity` writable bytes (or NULL with 0) and a valid out pointer.
        read_text(|dst, capacity, size| unsafe { sys::dsopt_get_config(raw, dst, capacity, size) })
    }

    /// This rank's whole optimizer state as one checksummed blob.
    pub fn state_save(&self) -> Result<Vec<u8>> {
        let mut size = 0u64;
        // Safety: the handle is live; `size` is a valid out pointer.
        check(unsafe { sys::dsopt_state_size(self.raw.as_ptr(), &mut size) })?;
        let capacity = usize::try_from(size).map_err(|_| Error::invalid("state blob too large"))?;
        let mut blob = vec![0u8; capacity];
        let mut written = 0u64;
        // Safety: `blob` holds `size` writable bytes; `written` is a valid out
        // pointer.
        check(unsafe {
            sys::dsopt_state_save(
                self.raw.as_ptr(),
                blob.as_mut_ptr().cast(),
                size,
                &mut written,
            )
        })?;
        blob.truncate(written as usize);
        Ok(blob)
    }

    /// Restores a blob from [`state_save`](Self::state_save) into an optimizer
    /// made with the same config and parameter shapes. The blob is validated
    /// completely before anything changes. Collective.
    ///
    /// A blob another rank of this world size saved is
    /// [`ErrorKind::Mismatch`] (on every rank, nothing changed) when it holds
    /// state that belongs to that rank (1-bit compression errors, 0/1 Adam's
    /// accumulator, a ZeRO shard); the message says what to load instead.
    pub fn state_load(&mut self, blob: &[u8]) -> Result<()> {
        // Safety: the handle is live; `blob` is readable for its length.
        check(unsafe {
            sys::dsopt_state_load(self.raw.as_ptr(), blob.as_ptr().cast(), blob.len() as u64)
        })
    }

    /// [`state_load`](Self::state_load), and with `reset_rank_local` the
    /// 1-bit optimizers load another rank's blob too: its replicated state,
    /// with the rank-local state reset on every rank as a load at another
    /// world size does (`dsopt_state_load_ex` with
    /// `DSOPT_LOAD_RESET_RANK_LOCAL`; a ZeRO shard is still refused).
    /// Returns whether rank-local state was reset (the same on every rank):
    /// also where the 1-bit compression errors belong to another world size
    /// or topology (flat or node-aware), which reset.
    /// Collective.
    pub fn state_load_ex(&mut self, blob: &[u8], reset_rank_local: bool) -> Result<bool> {
        let flags = if reset_rank_local {
            sys::DSOPT_LOAD_RESET_RANK_LOCAL
        } else {
            0
        };
        let mut reset = 0i32;
        // Safety: the handle is live; `blob` is readable for its length;
        // `reset` is a valid out pointer.
        check(unsafe {
            sys::dsopt_state_load_ex(
                self.raw.as_ptr(),
                blob.as_ptr().cast(),
                blob.len() as u64,
                flags,
                &mut reset,
            )
        })?;
        Ok(reset != 0)
    }

    /// Restores the state of a run saved at any world size from the blobs
    /// all of its ranks wrote with [`state_save`](Self::state_save):
    /// `blobs[i]` is old rank `i`'s blob, and every rank of this optimizer
    /// passes all of them, in the same order (`dsopt_state_load_shards`).
    /// Collective.
    ///
    /// Adam and AdamW at any ZeRO stage reshard: the old run's ZeRO shards
    /// (or its replicated stage-0 state) are cut into this rank's shard, so
    /// a run saved on 2 ranks continues on 4, or a stage-0 run continues at
    /// stage 2, as an uninterrupted run at the new size would. The other
    /// optimizers have replicated state and load as
    /// [`state_load`](Self::state_load) would. A single blob (the blob of a
    /// one-rank run, or one replica of replicated state) is a complete set.
    ///
    /// Every blob is validated before anything changes. Errors:
    /// [`ErrorKind::InvalidArgument`] for an empty `blobs` (checked here,
    /// before the library is called), [`ErrorKind::CorruptState`] for a
    /// truncated or damaged blob, [`ErrorKind::Mismatch`] for another
    /// algorithm or shapes, or a missing, duplicated or misordered blob, or
    /// blobs of different runs or steps.
    ///
    /// ```no_run
    /// # fn main() -> dsopt::Result<()> {
    /// # let mut w = vec![0.0f32; 16];
    /// # let mut comm = dsopt::Communicator::local()?;
    /// # let config = r#"{"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}"#;
    /// # let mut opt = dsopt::Optimizer::new(config, [dsopt::ParamSlice::f32(&mut w)], &mut comm)?;
    /// // One blob per rank of the old run, read back from a checkpoint.
    /// let old_blobs: Vec<Vec<u8>> = vec![opt.state_save()?];
    /// opt.load_state_shards(&old_blobs)?;
    /// # Ok(()) }
    /// ```
    pub fn load_state_shards<B: AsRef<[u8]>>(&mut self, blobs: &[B]) -> Result<()> {
        if blobs.is_empty() {
            return Err(Error::invalid(
                "load_state_shards needs at least one blob (one per rank of the saved run)",
            ));
        }
        let pointers: Vec<*const std::ffi::c_void> =
            blobs.iter().map(|b| b.as_ref().as_ptr().cast()).collect();
        let sizes: Vec<u64> = blobs.iter().map(|b| b.as_ref().len() as u64).collect();
        // Safety: the handle is live; `pointers[i]` is readable for
        // `sizes[i]` bytes (borrowed from `blobs` for the whole call) and
        // both arrays hold `blobs.len()` entries.
        check(unsafe {
            sys::dsopt_state_load_shards(
                self.raw.as_ptr(),
                pointers.as_ptr(),
                sizes.as_ptr(),
                pointers.len() as i64,
            )
        })
    }

    /// Bytes of the buffers dsopt holds for this optimizer on this rank
    /// (`dsopt_memory_usage`): state (moments, fp32 masters, ZeRO shards),
    /// gradient and communication buffers, in host and in device memory.
    /// The caller's parameters and gradients are not counted. Not
    /// collective.
    pub fn memory_usage(&self) -> Result<MemoryUsage> {
        let (mut host, mut device) = (0u64, 0u64);
        // Safety: the handle is live; both are valid out pointers.
        check(unsafe { sys::dsopt_memory_usage(self.raw.as_ptr(), &mut host, &mut device) })?;
        Ok(MemoryUsage { host, device })
    }

    /// The part of [`memory_usage`](Self::memory_usage) that is state the
    /// blob saves (moments, fp32 masters, compression errors;
    /// `dsopt_state_memory_usage`); the rest are gradient, scratch and
    /// communication buffers. Not collective.
    pub fn state_memory_usage(&self) -> Result<MemoryUsage> {
        let (mut host, mut device) = (0u64, 0u64);
        // Safety: the handle is live; both are valid out pointers.
        check(unsafe { sys::dsopt_state_memory_usage(self.raw.as_ptr(), &mut host, &mut device) })?;
        Ok(MemoryUsage { host, device })
    }

    /// The parameters (those of the last [`rebind_params`](Self::rebind_params)),
    /// as updated by the steps so far. Waits for a deferred parameter
    /// allgather first (a failure of it marks the optimizer failed: the
    /// next call returns it).
    pub fn params(&self) -> &[ParamSlice<'a>] {
        // Safety: the handle is live; no other call on it runs meanwhile
        // (the optimizer is not Sync).
        unsafe { sys::dsopt_gather_wait(self.raw.as_ptr(), -1) };
        &self.params
    }

    pub fn communicator(&self) -> &Communicator {
        self.comm
    }

    /// The `dsopt_optimizer *` for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *mut sys::dsopt_optimizer {
        self.raw.as_ptr()
    }
}

impl Drop for Optimizer<'_> {
    fn drop(&mut self) {
        // Safety: `raw` came from dsopt_create and is destroyed once, before
        // the borrowed parameters and communicator are released.
        unsafe { sys::dsopt_destroy(self.raw.as_ptr()) }
    }
}

/// Part of one parameter's optimizer state, read in place
/// ([`Optimizer::state_view`]).
#[derive(Debug)]
pub struct StateView<'o> {
    /// fp32 values of elements `offset .. offset + values.len()`.
    pub values: &'o [f32],
    pub offset: usize,
    /// Elements of the whole parameter.
    pub param_numel: usize,
}

/// The same, writable ([`Optimizer::state_view_mut`]).
#[derive(Debug)]
pub struct StateViewMut<'o> {
    pub values: &'o mut [f32],
    pub offset: usize,
    pub param_numel: usize,
}

fn param_index(index: usize) -> Result<i64> {
    i64::try_from(index).map_err(|_| Error::invalid("parameter index out of range"))
}

/// The canonical form of a config (`dsopt_config_canonical`): what
/// [`Optimizer::config`] of an optimizer created from it returns.
pub fn canonical_config(config: &str) -> Result<String> {
    let config = CString::new(config).map_err(|_| Error::invalid("config contains a NUL byte"))?;
    // Safety: `config` is NUL-terminated; see `read_text` for the buffer.
    read_text(|dst, capacity, size| unsafe {
        sys::dsopt_config_canonical(config.as_ptr(), dst, capacity, size)
    })
}

/// The group hyperparameters of the algorithm `optimizer_type` (a config's
/// "optimizer.type", any case or alias), each with its config key, in
/// order: ("lr", "lr"), ("beta1", "betas"), ... (`dsopt_group_param_names`;
/// a key named more than once is a list of those values). The names are
/// those [`Optimizer::group_param`] accepts.
pub fn group_param_names(optimizer_type: &str) -> Result<Vec<(String, String)>> {
    let ty = CString::new(optimizer_type).map_err(|_| Error::invalid("type contains a NUL byte"))?;
    let mut names: *const std::os::raw::c_char = ptr::null();
    let mut keys: *const std::os::raw::c_char = ptr::null();
    // Safety: `ty` is NUL-terminated; both are valid out pointers.
    check(unsafe { sys::dsopt_group_param_names(ty.as_ptr(), &mut names, &mut keys) })?;
    // Safety: on success both are static NUL-terminated strings.
    let (names, keys) = unsafe { (CStr::from_ptr(names), CStr::from_ptr(keys)) };
    let (names, keys) = (names.to_string_lossy(), keys.to_string_lossy());
    Ok(names
        .split_whitespace()
        .zip(keys.split_whitespace())
        .map(|(n, k)| (n.to_owned(), k.to_owned()))
        .collect())
}

/// The text of a call with dsopt's string-buffer convention: asked for its
/// size (NULL, 0), then written into a buffer of that size.
fn read_text(mut fill: impl FnMut(*mut std::os::raw::c_char, u64, *mut u64) -> i32) -> Result<String> {
    let mut size = 0u64;
    check(fill(ptr::null_mut(), 0, &mut size))?;
    let mut buf = vec![0u8; size as usize];
    check(fill(buf.as_mut_ptr().cast(), size, &mut size))?;
    let text = CStr::from_bytes_until_nul(&buf).map_err(|_| Error::invalid("text without its NUL"))?;
    Ok(text.to_string_lossy().into_owned())
}
