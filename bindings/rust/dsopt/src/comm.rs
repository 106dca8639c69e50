//! `Communicator`: the world an optimizer averages gradients over.

use std::ptr::{self, NonNull};

use dsopt_sys as sys;

use crate::error::{check, Error, Result};

/// A dsopt communicator (`dsopt_comm`). The MPI or NCCL communicator behind
/// it is borrowed, never freed; dropping this releases the wrapper only.
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
}

// Safety: a dsopt_comm has no thread affinity; it is only ever used by one
// thread at a time (not Sync, and optimizers hold it through `&mut`).
unsafe impl Send for Communicator {}

impl Communicator {
    fn create(make: impl FnOnce(*mut *mut sys::dsopt_comm) -> i32) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(make(&mut out))?;
        NonNull::new(out)
            .map(|raw| Communicator { raw })
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

    /// The `dsopt_comm *` for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *mut sys::dsopt_comm {
        self.raw.as_ptr()
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Safety: `raw` came from a dsopt_comm_create_* call and is destroyed
        // once; no optimizer uses it any more (they borrow `self`).
        unsafe { sys::dsopt_comm_destroy(self.raw.as_ptr()) }
    }
}
