//! Custom communicators: the caller's own collectives (a thread pool, an MPI
//! or NCCL binding of its own, a custom runtime) behind dsopt's table of
//! callbacks (`dsopt_comm_ops`, `dsopt_comm_create_custom`).
//!
//! The caller implements [`Collectives`];
//! [`Communicator::custom`](crate::Communicator::custom) boxes it and hands dsopt `extern "C"`
//! trampolines that turn the raw buffers into the typed slices of
//! [`Buffer`] and [`BufferMut`], an `Err` into a failure code whose text
//! dsopt reports, and a panic into such a failure too (nothing unwinds into
//! C). Dropping the communicator drops the implementation.

use std::ffi::c_void;
use std::mem;

use dsopt_sys as sys;

mod buffers;
mod trampolines;

pub use buffers::{Buffer, BufferMut};
pub(crate) use trampolines::{free_user, into_user, ops};

/// What a collective fails with: any error. A `String` or a `&str` converts
/// with `.into()`, other errors with `?`. dsopt fails the call that was
/// running with [`ErrorKind::Comm`](crate::ErrorKind::Comm) and this
/// error's text (with its sources, `: `-separated) as the message.
pub type CollectiveError = Box<dyn std::error::Error + Send + Sync>;

/// `Ok(())`, or the [`CollectiveError`] a collective failed with.
pub type CollectiveResult = std::result::Result<(), CollectiveError>;

/// Element type of a collective's buffers (`DSOPT_COMM_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElemType {
    F32,
    F64,
    I32,
    I64,
    U8,
}

impl ElemType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::F64 | ElemType::I64 => 8,
            ElemType::U8 => 1,
        }
    }

    /// Alignment of an element in memory.
    fn align(self) -> usize {
        match self {
            ElemType::F32 => mem::align_of::<f32>(),
            ElemType::F64 => mem::align_of::<f64>(),
            ElemType::I32 => mem::align_of::<i32>(),
            ElemType::I64 => mem::align_of::<i64>(),
            ElemType::U8 => 1,
        }
    }

    fn from_code(code: i32) -> Result<ElemType, CollectiveError> {
        Ok(match code as u32 {
            sys::DSOPT_COMM_FLOAT32 => ElemType::F32,
            sys::DSOPT_COMM_FLOAT64 => ElemType::F64,
            sys::DSOPT_COMM_INT32 => ElemType::I32,
            sys::DSOPT_COMM_INT64 => ElemType::I64,
            sys::DSOPT_COMM_UINT8 => ElemType::U8,
            _ => return Err(format!("dsopt passed an unknown element type (code {code})").into()),
        })
    }
}

/// The reduction of an allreduce or reduce-scatter (`DSOPT_COMM_SUM`,
/// `DSOPT_COMM_MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    Sum,
    Max,
}

impl ReduceOp {
    fn from_code(code: i32) -> Result<ReduceOp, CollectiveError> {
        Ok(match code as u32 {
            sys::DSOPT_COMM_SUM => ReduceOp::Sum,
            sys::DSOPT_COMM_MAX => ReduceOp::Max,
            _ => return Err(format!("dsopt passed an unknown reduction (code {code})").into()),
        })
    }
}

/// What a [`DeviceCall`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Collective {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    AllToAll,
}

/// A collective on CUDA device memory, for an optimizer configured with
/// `"device": "cuda"` ([`Collectives::device_collective`]).
///
/// The pointers are device pointers that Rust cannot check; using them
/// (through a CUDA or NCCL binding) is `unsafe` on the implementer's side.
/// dsopt has queued the work that fills `send` on `stream`, and queues the
/// work that reads `recv` on `stream` once the callback returns: finish the
/// collective before returning, or order it on `stream`, and keep no
/// reference to either buffer afterwards.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DeviceCall {
    pub collective: Collective,
    /// This rank's input: `count` elements for an allreduce or an
    /// allgather, `size * count` for a reduce-scatter or an all-to-all. An
    /// allreduce may be in place (`send == recv`).
    pub send: *const c_void,
    /// The output: `count` elements for an allreduce or a reduce-scatter,
    /// `size * count` for an allgather or an all-to-all.
    pub recv: *mut c_void,
    /// Elements per rank (> 0).
    pub count: usize,
    pub elem: ElemType,
    /// The stream given to
    /// [`Communicator::custom_on_stream`](crate::Communicator::custom_on_stream)
    /// (null: the legacy default stream).
    pub stream: *mut sys::CUstream_st,
}

/// The collectives dsopt needs, implemented by the caller; turned into a
/// communicator by [`Communicator::custom`](crate::Communicator::custom).
///
/// Each collective is called on every rank, in the same order, with the same
/// element type, length and reduction, one at a time. `count` below is the
/// elements per rank (> 0); `size` is [`size`](Self::size). Return `Err`
/// (any error, or a text with `.into()`) for a failure: the dsopt call that
/// was running fails on this rank with
/// [`ErrorKind::Comm`](crate::ErrorKind::Comm) and this error's text, and
/// dsopt calls the communicator no more. A collective must return an error
/// rather than wait forever for a rank that failed (a timeout, say): that is
/// what lets every rank fail instead of hanging. A panic is caught and fails
/// the call likewise.
///
/// Host buffers are valid only during the call: the collective must have
/// finished when it returns. On host memory dsopt computes every
/// floating-point sum over ranks itself, in a fixed order, from
/// [`alltoall`](Self::alltoall) and [`allgather`](Self::allgather), so
/// [`allreduce`](Self::allreduce) and
/// [`reduce_scatter`](Self::reduce_scatter) see only integer sums and maxima
/// and results do not depend on the implementation.
///
/// dsopt calls the host collectives for optimizers on the CPU and
/// [`device_collective`](Self::device_collective) for `"device": "cuda"`.
///
/// `Send`: dropping the communicator drops the implementation on the
/// dropping thread, and a [`concurrent`](Self::concurrent) implementation is
/// called from a thread dsopt starts.
pub trait Collectives: Send {
    /// This process's rank, `0 <= rank < size`. Read once, at creation.
    fn rank(&self) -> i32;

    /// Number of ranks, `>= 1`. Read once, at creation.
    fn size(&self) -> i32;

    /// `data[i] = op` over ranks of `data[i]`, in place (`count` elements).
    fn allreduce(&mut self, data: BufferMut<'_>, op: ReduceOp) -> CollectiveResult;

    /// `send` holds `size * count` elements; this rank receives in `recv`
    /// (`count` elements) the `op` over ranks of its block of `send`
    /// (elements `rank * count..(rank + 1) * count`).
    fn reduce_scatter(
        &mut self,
        send: Buffer<'_>,
        recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> CollectiveResult;

    /// `recv` (`size * count` elements) receives rank `r`'s `send` (`count`
    /// elements) as block `r`.
    fn allgather(&mut self, send: Buffer<'_>, recv: BufferMut<'_>) -> CollectiveResult;

    /// `send` and `recv` hold `size * count` elements: block `j` of `send`
    /// goes to rank `j`, block `i` of `recv` comes from rank `i`.
    fn alltoall(&mut self, send: Buffer<'_>, recv: BufferMut<'_>) -> CollectiveResult;

    /// A collective on device memory (an optimizer with `"device": "cuda"`);
    /// see [`DeviceCall`]. The default fails: host collectives only.
    fn device_collective(&mut self, call: DeviceCall) -> CollectiveResult {
        Err(format!(
            "this custom communicator has host collectives only ({:?} on device memory)",
            call.collective
        )
        .into())
    }

    /// Whether dsopt may call the collectives from a thread it starts while
    /// the caller's threads use dsopt and the runtime behind the collectives
    /// (`DSOPT_COMM_CONCURRENT`; lets
    /// [`grad_ready`](crate::Optimizer::grad_ready) overlap reductions with
    /// backward). Calls stay one at a time either way. Read once, at
    /// creation; default `false`.
    fn concurrent(&self) -> bool {
        false
    }
}
