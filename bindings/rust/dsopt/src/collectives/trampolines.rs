use std::any::Any;
use std::ffi::{c_void, CString};
use std::mem;
use std::os::raw::{c_char, c_int};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;

use dsopt_sys as sys;

use super::{
    Buffer, BufferMut, Collective, CollectiveError, CollectiveResult, Collectives, DeviceCall,
    ElemType, ReduceOp,
};

/// What dsopt's `user` pointer points to: the implementation and the text of
/// its last failure, which `error_message` serves.
struct Custom<C> {
    collectives: C,
    size: usize,
    stream: *mut sys::CUstream_st,
    message: CString,
}

/// The callback table for `C`, with `user` to be a `Box<Custom<C>>` made by
/// [`into_user`].
pub(crate) fn ops<C: Collectives>(
    rank: i32,
    size: i32,
    concurrent: bool,
    stream: *mut sys::CUstream_st,
) -> sys::dsopt_comm_ops {
    sys::dsopt_comm_ops {
        struct_size: mem::size_of::<sys::dsopt_comm_ops>() as u32,
        flags: if concurrent {
            sys::DSOPT_COMM_CONCURRENT
        } else {
            0
        },
        rank,
        size,
        stream,
        // `_`: the count parameter's type, `size_t` as this bindgen maps it
        // (usize or c_ulong).
        allreduce: Some(allreduce::<C, _>),
        reduce_scatter: Some(reduce_scatter::<C, _>),
        allgather: Some(allgather::<C, _>),
        alltoall: Some(alltoall::<C, _>),
        error_message: Some(error_message::<C>),
        release: Some(release::<C>),
    }
}

/// Boxes `collectives` as the `user` of [`ops`]; released by its `release`
/// callback, or by [`free_user`] when the communicator is not created.
pub(crate) fn into_user<C: Collectives>(
    collectives: C,
    size: i32,
    stream: *mut sys::CUstream_st,
) -> *mut c_void {
    let custom = Custom {
        collectives,
        size: usize::try_from(size).unwrap_or(0),
        stream,
        message: CString::default(),
    };
    Box::into_raw(Box::new(custom)).cast()
}

/// Frees a `user` from [`into_user`] that dsopt did not take.
///
/// # Safety
/// `user` came from `into_user::<C>` and is freed once.
pub(crate) unsafe fn free_user<C: Collectives>(user: *mut c_void) {
    // Safety: the caller's promise.
    drop_quietly(unsafe { Box::from_raw(user.cast::<Custom<C>>()) });
}

/// Drops `value`, swallowing a panic of its destructor (it must not unwind
/// into C).
fn drop_quietly<T>(value: T) {
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(move || drop(value))) {
        drop_payload(payload);
    }
}

fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        mem::forget(again);
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

/// The error's text and its sources', `: `-separated.
fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What every call of one communicator shares.
#[derive(Clone, Copy)]
struct Shape {
    size: usize,
    stream: *mut sys::CUstream_st,
}

/// Failure codes the trampolines return (any non-zero value fails).
const FAILED: c_int = 1;
const PANICKED: c_int = 2;

impl<C: Collectives> Custom<C> {
    /// Runs one collective: 0, or a failure code with its text kept in
    /// `message`. Never unwinds.
    fn run(&mut self, call: impl FnOnce(&mut C, Shape) -> CollectiveResult) -> c_int {
        let shape = Shape {
            size: self.size,
            stream: self.stream,
        };
        let collectives = &mut self.collectives;
        let outcome = panic::catch_unwind(AssertUnwindSafe(move || {
            call(collectives, shape).map_err(|error| error_text(&*error))
        }));
        let (code, text) = match outcome {
            Ok(Ok(())) => return 0,
            Ok(Err(text)) => (FAILED, text),
            Err(payload) => {
                let text = format!("a collective panicked: {}", panic_text(&*payload));
                drop_payload(payload);
                (PANICKED, text)
            }
        };
        let text = if text.is_empty() {
            "a collective failed (no message)".to_owned()
        } else {
            text
        };
        self.message = CString::new(text.replace('\0', "\\0")).unwrap_or_default();
        code
    }
}

/// The `size_t` count as bindgen maps it (`usize`, or `c_ulong` before
/// bindgen 0.61).
trait Count: Copy {
    fn to_usize(self) -> Option<usize>;
}

impl Count for usize {
    fn to_usize(self) -> Option<usize> {
        Some(self)
    }
}

impl Count for u64 {
    fn to_usize(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}

impl Count for u32 {
    fn to_usize(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}

/// Where dsopt says a collective's buffers are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Location {
    Host,
    Device,
}

fn location(code: i32) -> Result<Location, CollectiveError> {
    match code as u32 {
        sys::DSOPT_COMM_HOST => Ok(Location::Host),
        sys::DSOPT_COMM_CUDA => Ok(Location::Device),
        _ => Err(format!("dsopt passed an unknown buffer location (code {code})").into()),
    }
}

fn elements(count: impl Count, blocks: usize) -> Result<usize, CollectiveError> {
    count
        .to_usize()
        .and_then(|n| n.checked_mul(blocks))
        .ok_or_else(|| "dsopt passed a count too large for this machine".into())
}

/// Checks what slice::from_raw_parts needs that can be checked: non-null,
/// aligned, at most isize::MAX bytes.
pub(super) fn check_raw(data: *const c_void, count: usize, elem: ElemType) -> CollectiveResult {
    if data.is_null() {
        return Err("dsopt passed a NULL buffer".into());
    }
    if (data as usize) & (elem.align() - 1) != 0 {
        return Err(format!("dsopt passed a buffer misaligned for {elem:?}").into());
    }
    match count.checked_mul(elem.size()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(()),
        _ => Err("dsopt passed a buffer too large for this machine".into()),
    }
}

/// Recovers the state behind dsopt's `user` pointer.
///
/// # Safety
/// `user` is the pointer given to dsopt_comm_create_custom with `ops::<C>`,
/// not yet released; dsopt makes one callback at a time per communicator, so
/// the reference is exclusive for the callback.
unsafe fn state<'u, C>(user: *mut c_void) -> &'u mut Custom<C> {
    // Safety: the caller's promise.
    unsafe { &mut *user.cast::<Custom<C>>() }
}

unsafe extern "C" fn allreduce<C: Collectives, N: Count>(
    send: *const c_void,
    recv: *mut c_void,
    count: N,
    elem: i32,
    op: i32,
    device: i32,
    user: *mut c_void,
) -> c_int {
    // Safety: dsopt calls back with the `user` it was given, one call at a
    // time, before release.
    let state = unsafe { state::<C>(user) };
    state.run(|collectives, shape| {
        let (elem, op) = (ElemType::from_code(elem)?, ReduceOp::from_code(op)?);
        let count = elements(count, 1)?;
        if location(device)? == Location::Device {
            return collectives.device_collective(DeviceCall {
                collective: Collective::AllReduce(op),
                send,
                recv,
                count,
                elem,
                stream: shape.stream,
            });
        }
        if !ptr::eq(send, recv) {
            check_raw(send, count, elem)?;
            check_raw(recv, count, elem)?;
            // Safety: dsopt's host buffers hold `count` elements each, valid
            // for the call, and never overlap unless equal (checked above).
            unsafe {
                ptr::copy_nonoverlapping(send.cast::<u8>(), recv.cast::<u8>(), count * elem.size())
            };
        }
        // Safety: `recv` holds `count` elements, readable and writable for
        // the call, and nothing else uses it meanwhile (send is only read and
        // is either recv itself or done with).
        let data = unsafe { BufferMut::from_raw(recv, count, elem)? };
        collectives.allreduce(data, op)
    })
}

unsafe extern "C" fn reduce_scatter<C: Collectives, N: Count>(
    send: *const c_void,
    recv: *mut c_void,
    count: N,
    elem: i32,
    op: i32,
    device: i32,
    user: *mut c_void,
) -> c_int {
    // Safety: as in allreduce.
    let state = unsafe { state::<C>(user) };
    state.run(|collectives, shape| {
        let (elem, op) = (ElemType::from_code(elem)?, ReduceOp::from_code(op)?);
        let count = elements(count, 1)?;
        if location(device)? == Location::Device {
            return collectives.device_collective(DeviceCall {
                collective: Collective::ReduceScatter(op),
                send,
                recv,
                count,
                elem,
                stream: shape.stream,
            });
        }
        // Safety: dsopt's host buffers, valid for the call and disjoint:
        // send holds size * count elements (only read), recv count.
        let (send, recv) = unsafe {
            (
                Buffer::from_raw(send, elements(count, shape.size)?, elem)?,
                BufferMut::from_raw(recv, count, elem)?,
            )
        };
        collectives.reduce_scatter(send, recv, op)
    })
}

unsafe extern "C" fn allgather<C: Collectives, N: Count>(
    send: *const c_void,
    recv: *mut c_void,
    count: N,
    elem: i32,
    device: i32,
    user: *mut c_void,
) -> c_int {
    // Safety: as in allreduce.
    let state = unsafe { state::<C>(user) };
    state.run(|collectives, shape| {
        let elem = ElemType::from_code(elem)?;
        let count = elements(count, 1)?;
        if location(device)? == Location::Device {
            return collectives.device_collective(DeviceCall {
                collective: Collective::AllGather,
                send,
                recv,
                count,
                elem,
                stream: shape.stream,
            });
        }
        // Safety: dsopt's host buffers, valid for the call and disjoint:
        // send holds count elements (only read), recv size * count.
        let (send, recv) = unsafe {
            (
                Buffer::from_raw(send, count, elem)?,
                BufferMut::from_raw(recv, elements(count, shape.size)?, elem)?,
            )
        };
        collectives.allgather(send, recv)
    })
}

unsafe extern "C" fn alltoall<C: Collectives, N: Count>(
    send: *const c_void,
    recv: *mut c_void,
    count: N,
    elem: i32,
    device: i32,
    user: *mut c_void,
) -> c_int {
    // Safety: as in allreduce.
    let state = unsafe { state::<C>(user) };
    state.run(|collectives, shape| {
        let elem = ElemType::from_code(elem)?;
        let count = elements(count, 1)?;
        if location(device)? == Location::Device {
            return collectives.device_collective(DeviceCall {
                collective: Collective::AllToAll,
                send,
                recv,
                count,
                elem,
                stream: shape.stream,
            });
        }
        let total = elements(count, shape.size)?;
        // Safety: dsopt's host buffers, valid for the call and disjoint,
        // size * count elements each; send is only read.
        let (send, recv) = unsafe {
            (
                Buffer::from_raw(send, total, elem)?,
                BufferMut::from_raw(recv, total, elem)?,
            )
        };
        collectives.alltoall(send, recv)
    })
}

unsafe extern "C" fn error_message<C: Collectives>(
    _code: c_int,
    user: *mut c_void,
) -> *const c_char {
    // Safety: as in allreduce. The text stays in `message` until the next
    // failing callback replaces it.
    let state = unsafe { state::<C>(user) };
    state.message.as_ptr()
}

unsafe extern "C" fn release<C: Collectives>(user: *mut c_void) {
    // Safety: dsopt_comm_destroy calls this once, after the last callback.
    unsafe { free_user::<C>(user) }
}
