//! Safe Rust binding of dsopt: data-parallel optimizers (Adam, AdamW,
//! 1-bit Adam) behind a C ABI.
//!
//! ```no_run
//! use dsopt::{Communicator, GradSlice, Optimizer, ParamSlice};
//! # fn main() -> dsopt::Result<()> {
//! let (mut w, mut b) = (vec![0.0f32; 8], vec![0.0f32; 1]);
//! let mut comm = Communicator::local()?;
//! let config = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}"#;
//! let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w), ParamSlice::f32(&mut b)], &mut comm)?;
//! let (gw, gb) = (vec![0.5f32; 8], vec![0.1f32; 1]);
//! let info = opt.step(&[GradSlice::f32(&gw), GradSlice::f32(&gb)])?;
//! let blob = opt.state_save()?;
//! opt.state_load(&blob)?;
//! println!("step {} w[0] = {}", info.step, opt.params()[0].as_f32().unwrap()[0]);
//! # Ok(()) }
//! ```
//!
//! Every failing call returns [`Error`], with the status code and the
//! library's detail message. The raw C API is re-exported as [`sys`].
//!
//! # ZeRO
//!
//! With `"zero_optimization": {"stage": 1}` or `2` in the config, Adam and
//! AdamW shard their state over the ranks: each rank's
//! [`state_save`](Optimizer::state_save) holds its own shard.
//! [`load_state_shards`](Optimizer::load_state_shards), given the blobs of
//! every rank of a saved run in rank order, continues it at any world size
//! and stage; [`memory_usage`](Optimizer::memory_usage) reports the bytes
//! dsopt holds on this rank.
//!
//! # Custom communicators
//!
//! Besides [`Communicator::local`] and the MPI and NCCL wrappers, any
//! runtime with an allreduce, a reduce-scatter, an allgather and an
//! all-to-all can carry an optimizer: implement [`Collectives`] over
//! typed host slices ([`Buffer`], [`BufferMut`]; [`ElemType`],
//! [`ReduceOp`]) and pass it to [`Communicator::custom`]. A collective
//! returns `Err` (or panics) to fail the dsopt call that was running with
//! [`ErrorKind::Comm`] and the error's text, and must return (with a
//! timeout, say) rather than wait forever for a rank that failed. Device
//! memory, for `"device": "cuda"`, arrives as raw pointers in
//! [`Collectives::device_collective`] ([`DeviceCall`]).
//!
//! # Ownership
//!
//! An optimizer borrows its parameter buffers and its communicator mutably
//! for as long as it lives (the C library writes into the buffers during
//! every step), so they cannot be touched meanwhile except through the
//! optimizer:
//!
//! ```compile_fail
//! # use dsopt::{Communicator, Optimizer, ParamSlice};
//! let mut w = vec![0.0f32; 4];
//! let mut comm = Communicator::local().unwrap();
//! let opt = Optimizer::new("{}", [ParamSlice::f32(&mut w)], &mut comm).unwrap();
//! w[0] = 1.0; // error: `w` is borrowed by the optimizer
//! drop(opt);
//! ```
//!
//! An optimizer may move to another thread (`Send`) but not be shared
//! between threads (not `Sync`):
//!
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<dsopt::Optimizer<'static>>();
//! ```

mod algorithm;
mod codec;
mod collectives;
mod comm;
mod error;
mod optimizer;
mod step_info;
mod tensor;

pub use algorithm::{algorithm_names, describe, Algorithm, HyperRange, Hyperparameter};
pub use codec::Codec;
pub use collectives::{
    Buffer, BufferMut, Collective, CollectiveError, CollectiveResult, Collectives, DeviceCall,
    ElemType, ReduceOp,
};
pub use comm::Communicator;
pub use dsopt_sys as sys;
pub use error::{Error, ErrorKind, Result};
pub use optimizer::{canonical_config, group_param_names, MemoryUsage, Optimizer, StateView, StateViewMut};
pub use step_info::{StepInfo, PHASE_COMPRESSED, PHASE_FULL, PHASE_LOCAL, PHASE_SKIPPED, PHASE_SYNC};
pub use tensor::{DType, GradSlice, ParamSlice};

/// Version of the loaded library as (major, minor, patch).
pub fn version() -> (u32, u32, u32) {
    // Safety: no arguments, no preconditions.
    let n = unsafe { sys::dsopt_version_number() } as u32;
    (n / 10000, n / 100 % 100, n % 100)
}

/// What the loaded library was built with, as `key=value` pairs.
pub fn build_info() -> &'static str {
    // Safety: dsopt_build_info returns a static, NUL-terminated string.
    let info = unsafe { std::ffi::CStr::from_ptr(sys::dsopt_build_info()) };
    info.to_str().unwrap_or("")
}
