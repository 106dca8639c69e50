//! `Communicator`: the world an optimizer averages gradients over.

use std::ptr::{self, NonNull};

use dsopt_sys as sys;

use crate::collectives::{self, Collectives};
use crate::error::{check, Error, Result};

/// A dsopt communicator (`dsopt_comm`). The MPI or NCCL communicator behind
/// it is borrowed, never freed; dropping this releases the wrapper only. A
/// [custom](Self::custom) communicator owns its [`Collectives`] and drops
/// them with itself.
///
/// An [`Optimizer`](crate::Optimizer) borrows its communicator mutably for
/// its whole life, so the borrow checker enforces the C rule that the
/// communicator outlives every optimizer created on it, and no two threads
/// run collectives on it at once.
///
/// `Send` but not `Sync`: collectives update the communicator's byte
/// counter without locking (and MPI forbids concurrent collectives on one
/// communicator), so it may move to another thread but not be shared.
#[derive(Debug)]
pub struct Communicator {
    raw: NonNull<sys::dsopt_comm>,
    // The node and rail communicators of `set_nodes`, dropped after `raw`.
    nodes: Option<Box<(Communicator, Communicator)>>,
}

// Safety: a dsopt_comm has no thread affinity; it is only ever used by one
// thread at a time (not Sync, and optimizers hold it through `&mut`). A
// custom communicator's collectives are `Send` (a trait bound), so they may
// be called and dropped on another thread.
unsafe impl Send for Communicator {}

impl Communicator {
    fn create(make: impl FnOnce(*mut *mut sys::dsopt_comm) -> i32) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(make(&mut out))?;
        NonNull::new(out)
            .map(|raw| Communicator { raw, nodes: None })
            .ok_or_else(|| Error::invalid("dsopt returned a NULL communicator"))
    }

    /// A world of one rank: no communication.
    pub fn local() -> Result<Self> {
        // Safety: `out` points to a valid `*mut dsopt_comm` for the call.
        Self::create(|out| unsafe { sys::dsopt_comm_create_local(out) })
    }

    /// Wraps an MPI communicator given by its Fortran handle
    /// (`MPI_Comm_c2f(comm)` in C).
    ///
    /// # Safety
    /// MPI must stay initialised, and the MPI communicator valid, until this
    /// value is dropped. If the communicator is used from a thread other
    /// than the one that initialised MPI, MPI must have been initialised
    /// with a thread level that allows it.
    pub unsafe fn from_mpi_fortran_handle(handle: i64) -> Result<Self> {
        // Safety: `out` is valid for the call; the handle's lifetime is the
        // caller's promise above (dsopt validates the handle itself).
        Self::create(|out| unsafe { sys::dsopt_comm_create_mpi(out, handle) })
    }

    /// Wraps an NCCL communicator (`ncclComm_t`) and the CUDA stream dsopt's
    /// device work runs on (null: the legacy default stream).
    ///
    /// # Safety
    /// `comm` must be a valid `ncclComm_t` and `stream` null or a valid
    /// `cudaStream_t`, both until this value is dropped.
    pub unsafe fn from_nccl(
        comm: *mut sys::ncclComm,
        stream: *mut sys::CUstream_st,
    ) -> Result<Self> {
        // Safety: `out` is valid for the call; `comm` and `stream` are valid
        // by the caller's promise above.
        Self::create(|out| unsafe { sys::dsopt_comm_create_nccl(out, comm, stream) })
    }

    /// A communicator whose collectives are `collectives`, the caller's own
    /// (`dsopt_comm_create_custom`): an in-process world over threads, a
    /// runtime dsopt has no built-in support for. Rank, size and
    /// [`concurrent`](Collectives::concurrent) are read once, here. Not
    /// collective.
    ///
    /// dsopt calls the collectives through `extern "C"` trampolines: an
    /// `Err` or a panic fails the running dsopt call with
    /// [`ErrorKind::Comm`](crate::ErrorKind::Comm) and the error's text;
    /// dsopt then calls the communicator no more. Dropping the communicator
    /// drops `collectives`. A rank or size out of range is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// (and `collectives` is dropped).
    ///
    /// ```no_run
    /// use dsopt::{Buffer, BufferMut, CollectiveResult, Collectives, Communicator, ReduceOp};
    ///
    /// /// One rank alone: every collective is a copy.
    /// struct Alone;
    ///
    /// impl Collectives for Alone {
    ///     fn rank(&self) -> i32 { 0 }
    ///     fn size(&self) -> i32 { 1 }
    ///     fn allreduce(&mut self, _data: BufferMut<'_>, _op: ReduceOp) -> CollectiveResult {
    ///         Ok(())
    ///     }
    ///     fn reduce_scatter(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>, _op: ReduceOp)
    ///         -> CollectiveResult { recv.copy_from(send) }
    ///     fn allgather(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
    ///         recv.copy_from(send)
    ///     }
    ///     fn alltoall(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
    ///         recv.copy_from(send)
    ///     }
    /// }
    ///
    /// # fn main() -> dsopt::Result<()> {
    /// let comm = Communicator::custom(Alone)?;
    /// assert_eq!((comm.rank(), comm.size()), (0, 1));
    /// # Ok(()) }
    /// ```
    pub fn custom<C: Collectives + 'static>(collectives: C) -> Result<Self> {
        // Safety: a null stream is the legacy default stream, always valid
        // (and unused by optimizers on the CPU).
        unsafe { Self::custom_on_stream(collectives, ptr::null_mut()) }
    }

    /// [`custom`](Self::custom) for an optimizer with `"device": "cuda"`:
    /// dsopt runs its device work on `stream` (`ops.stream`; null: the
    /// legacy default stream), and passes it to
    /// [`device_collective`](Collectives::device_collective).
    ///
    /// # Safety
    /// `stream` must be null or a valid `cudaStream_t` until this value is
    /// dropped.
    pub unsafe fn custom_on_stream<C: Collectives + 'static>(
        collectives: C,
        stream: *mut sys::CUstream_st,
    ) -> Result<Self> {
        let (rank, size) = (collectives.rank(), collectives.size());
        let ops = collectives::ops::<C>(rank, size, collectives.concurrent(), stream);
        let user = collectives::into_user(collectives, size, stream);
        let mut out = ptr::null_mut();
        // Safety: `ops` is a complete table whose callbacks expect `user`, a
        // Box<Custom<C>> that dsopt borrows until dsopt_comm_destroy calls
        // `release` (from Drop); `stream` is valid by the caller's promise.
        let rc = unsafe { sys::dsopt_comm_create_custom(&mut out, &ops, user) };
        if rc != sys::DSOPT_OK {
            // Safety: dsopt did not take `user` (release is not called when
            // the creation fails); it is freed once, here.
            unsafe { collectives::free_user::<C>(user) };
            check(rc)?;
        }
        NonNull::new(out)
            .map(|raw| Communicator { raw, nodes: None })
            .ok_or_else(|| Error::invalid("dsopt returned a NULL communicator"))
    }

    /// This process's rank.
    pub fn rank(&self) -> i32 {
        // Safety: `raw` is a live communicator until drop.
        unsafe { sys::dsopt_comm_rank(self.raw.as_ptr()) }
    }

    /// Number of ranks.
    pub fn size(&self) -> i32 {
        // Safety: `raw` is a live communicator until drop.
        unsafe { sys::dsopt_comm_size(self.raw.as_ptr()) }
    }

    /// Gives dsopt the node and rail communicators of this one
    /// (`dsopt_comm_set_nodes`), which it keeps until it is dropped or
    /// [`clear_nodes`](Self::clear_nodes): `node` holds the ranks of this
    /// rank's node ranked by local index (R ranks), `rail` the ranks of its
    /// local index, one per node, ranked by node (N ranks), N * R this
    /// communicator's size. Optimizers created afterwards take their
    /// topology from them and, where the config's `"topology"`
    /// `"hierarchy"` makes them node-aware, run the 1-bit optimizers'
    /// compressed collectives on them (how custom communicators, which
    /// dsopt cannot split, run node-aware). The layout is checked when an
    /// optimizer is created (`DSOPT_EINVAL` on every rank).
    ///
    /// # Errors
    /// `DSOPT_EINVAL` when the sizes do not make this world; the
    /// communicators are dropped then.
    pub fn set_nodes(&mut self, node: Communicator, rail: Communicator) -> Result<()> {
        // Safety: all three are live; dsopt borrows node and rail, which
        // this value owns from now on and drops after its own handle.
        check(unsafe { sys::dsopt_comm_set_nodes(self.raw.as_ptr(), node.as_ptr(), rail.as_ptr()) })?;
        self.nodes = Some(Box::new((node, rail)));
        Ok(())
    }

    /// Forgets the node and rail communicators of
    /// [`set_nodes`](Self::set_nodes) and hands them back.
    pub fn clear_nodes(&mut self) -> Option<(Communicator, Communicator)> {
        // Safety: `raw` is live; NULL, NULL forgets them.
        let rc = unsafe { sys::dsopt_comm_set_nodes(self.raw.as_ptr(), ptr::null_mut(), ptr::null_mut()) };
        debug_assert_eq!(rc, sys::DSOPT_OK);
        self.nodes.take().map(|b| *b)
    }

    /// The `dsopt_comm *` for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *mut sys::dsopt_comm {
        self.raw.as_ptr()
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Safety: `raw` came from a dsopt_comm_create_* call and is destroyed
        // once; no optimizer uses it any more (they borrow `self`). A custom
        // communicator's `release` drops its collectives here.
        unsafe { sys::dsopt_comm_destroy(self.raw.as_ptr()) }
    }
}
