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

use std::any::Any;
use std::ffi::{c_void, CString};
use std::mem;
use std::ops::Range;
use std::os::raw::{c_char, c_int};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::slice;

use dsopt_sys as sys;

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

/// A collective's input in host memory, typed by its [`ElemType`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Buffer<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
}

/// A collective's output in host memory (or, for an allreduce, its input
/// and output), typed by its [`ElemType`].
#[derive(Debug)]
#[non_exhaustive]
pub enum BufferMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
    U8(&'a mut [u8]),
}

/// Applies `$body` to the slice inside any variant of `$buf`.
macro_rules! each {
    ($buf:expr, $enum:ident, $s:ident => $body:expr) => {
        match $buf {
            $enum::F32($s) => $body,
            $enum::F64($s) => $body,
            $enum::I32($s) => $body,
            $enum::I64($s) => $body,
            $enum::U8($s) => $body,
        }
    };
}

/// The bytes of a slice of plain numbers.
fn bytes_of<T: Copy>(s: &[T]) -> &[u8] {
    // Safety: only used with f32, f64, i32, i64 and u8, which have no
    // padding; the result covers exactly the slice's memory and borrows it.
    unsafe { slice::from_raw_parts(s.as_ptr().cast::<u8>(), mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of plain numbers.
fn bytes_of_mut<T: Copy>(s: &mut [T]) -> &mut [u8] {
    // Safety: as in bytes_of; and every bit pattern is a valid f32, f64,
    // i32, i64 or u8, so any bytes written through the result are values.
    unsafe { slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), mem::size_of_val(s)) }
}

impl<'a> Buffer<'a> {
    pub fn elem(&self) -> ElemType {
        match self {
            Buffer::F32(_) => ElemType::F32,
            Buffer::F64(_) => ElemType::F64,
            Buffer::I32(_) => ElemType::I32,
            Buffer::I64(_) => ElemType::I64,
            Buffer::U8(_) => ElemType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each!(self, Buffer, s => s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements' bytes, in native byte order: what to send over a byte
    /// transport.
    pub fn as_bytes(&self) -> &'a [u8] {
        each!(*self, Buffer, s => bytes_of(s))
    }

    /// Elements `range` (a rank's block: `r * count..(r + 1) * count`).
    /// Panics when the range is out of bounds, as slicing does.
    pub fn slice(&self, range: Range<usize>) -> Buffer<'a> {
        match *self {
            Buffer::F32(s) => Buffer::F32(&s[range]),
            Buffer::F64(s) => Buffer::F64(&s[range]),
            Buffer::I32(s) => Buffer::I32(&s[range]),
            Buffer::I64(s) => Buffer::I64(&s[range]),
            Buffer::U8(s) => Buffer::U8(&s[range]),
        }
    }

    /// A view of `count` elements of `elem` at `data`.
    ///
    /// # Safety
    /// `data` must be readable for `count` elements and not written for `'a`.
    unsafe fn from_raw(
        data: *const c_void,
        count: usize,
        elem: ElemType,
    ) -> Result<Buffer<'a>, CollectiveError> {
        check_raw(data, count, elem)?;
        // Safety: check_raw verified null, size and alignment; validity for
        // 'a is the caller's promise.
        Ok(unsafe {
            match elem {
                ElemType::F32 => Buffer::F32(slice::from_raw_parts(data.cast(), count)),
                ElemType::F64 => Buffer::F64(slice::from_raw_parts(data.cast(), count)),
                ElemType::I32 => Buffer::I32(slice::from_raw_parts(data.cast(), count)),
                ElemType::I64 => Buffer::I64(slice::from_raw_parts(data.cast(), count)),
                ElemType::U8 => Buffer::U8(slice::from_raw_parts(data.cast(), count)),
            }
        })
    }
}

impl<'a> BufferMut<'a> {
    pub fn elem(&self) -> ElemType {
        self.as_buffer().elem()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each!(self, BufferMut, s => s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current contents, read-only.
    pub fn as_buffer(&self) -> Buffer<'_> {
        match self {
            BufferMut::F32(s) => Buffer::F32(s),
            BufferMut::F64(s) => Buffer::F64(s),
            BufferMut::I32(s) => Buffer::I32(s),
            BufferMut::I64(s) => Buffer::I64(s),
            BufferMut::U8(s) => Buffer::U8(s),
        }
    }

    /// The elements' bytes, in native byte order.
    pub fn as_bytes(&self) -> &[u8] {
        self.as_buffer().as_bytes()
    }

    /// The elements' bytes, writable (any bytes are valid values of every
    /// element type): where to receive from a byte transport.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        each!(self, BufferMut, s => bytes_of_mut(s))
    }

    /// Elements `range`, writable. Panics when the range is out of bounds.
    pub fn slice_mut(&mut self, range: Range<usize>) -> BufferMut<'_> {
        match self {
            BufferMut::F32(s) => BufferMut::F32(&mut s[range]),
            BufferMut::F64(s) => BufferMut::F64(&mut s[range]),
            BufferMut::I32(s) => BufferMut::I32(&mut s[range]),
            BufferMut::I64(s) => BufferMut::I64(&mut s[range]),
            BufferMut::U8(s) => BufferMut::U8(&mut s[range]),
        }
    }

    /// Copies `other` (same type and length) in.
    pub fn copy_from(&mut self, other: Buffer<'_>) -> CollectiveResult {
        check_same(self, &other)?;
        self.as_bytes_mut().copy_from_slice(other.as_bytes());
        Ok(())
    }

    /// `self[i] = op(self[i], other[i])` for every element; `other` has the
    /// same type and length. Integer sums wrap; the maximum of floats is NaN
    /// when either value is.
    pub fn reduce(&mut self, other: Buffer<'_>, op: ReduceOp) -> CollectiveResult {
        check_same(self, &other)?;
        match (self, other) {
            (BufferMut::F32(a), Buffer::F32(b)) => combine(a, b.iter().copied(), op),
            (BufferMut::F64(a), Buffer::F64(b)) => combine(a, b.iter().copied(), op),
            (BufferMut::I32(a), Buffer::I32(b)) => combine(a, b.iter().copied(), op),
            (BufferMut::I64(a), Buffer::I64(b)) => combine(a, b.iter().copied(), op),
            (BufferMut::U8(a), Buffer::U8(b)) => combine(a, b.iter().copied(), op),
            _ => unreachable!("check_same compared the types"),
        }
        Ok(())
    }

    /// [`reduce`](Self::reduce) with `other` given as bytes in native byte
    /// order, as a byte transport delivers them (any alignment): as many
    /// bytes as `self` holds.
    pub fn reduce_bytes(&mut self, other: &[u8], op: ReduceOp) -> CollectiveResult {
        if other.len() != self.as_bytes().len() {
            return Err(format!(
                "{} bytes to reduce into {} x {:?}",
                other.len(),
                self.len(),
                self.elem()
            )
            .into());
        }
        each!(self, BufferMut, a => combine(a, decode(other), op));
        Ok(())
    }

    /// A writable view of `count` elements of `elem` at `data`.
    ///
    /// # Safety
    /// `data` must be valid for reads and writes of `count` elements and
    /// used by nothing else for `'a`.
    unsafe fn from_raw(
        data: *mut c_void,
        count: usize,
        elem: ElemType,
    ) -> Result<BufferMut<'a>, CollectiveError> {
        check_raw(data, count, elem)?;
        // Safety: check_raw verified null, size and alignment; validity and
        // exclusivity for 'a are the caller's promise.
        Ok(unsafe {
            match elem {
                ElemType::F32 => BufferMut::F32(slice::from_raw_parts_mut(data.cast(), count)),
                ElemType::F64 => BufferMut::F64(slice::from_raw_parts_mut(data.cast(), count)),
                ElemType::I32 => BufferMut::I32(slice::from_raw_parts_mut(data.cast(), count)),
                ElemType::I64 => BufferMut::I64(slice::from_raw_parts_mut(data.cast(), count)),
                ElemType::U8 => BufferMut::U8(slice::from_raw_parts_mut(data.cast(), count)),
            }
        })
    }
}

/// What reduce needs of an element type.
trait Element: Copy + 'static {
    const SIZE: usize;
    fn from_bytes(bytes: &[u8]) -> Self;
    fn sum(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
}

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = mem::size_of::<$t>();
            fn from_bytes(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("one element's bytes"))
            }
            fn sum(self, other: Self) -> Self {
                self + other
            }
            /// NaN when either is NaN (f32::max would drop it).
            fn max(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    <$t>::NAN
                } else if other > self {
                    other
                } else {
                    self
                }
            }
        }
    )*};
}

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = mem::size_of::<$t>();
            fn from_bytes(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("one element's bytes"))
            }
            fn sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
        }
    )*};
}

float_element!(f32, f64);
int_element!(i32, i64, u8);

fn decode<T: Element>(bytes: &[u8]) -> impl Iterator<Item = T> + '_ {
    bytes.chunks_exact(T::SIZE).map(T::from_bytes)
}

fn combine<T: Element>(acc: &mut [T], other: impl Iterator<Item = T>, op: ReduceOp) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(other).for_each(|(a, b)| *a = a.sum(b)),
        ReduceOp::Max => acc.iter_mut().zip(other).for_each(|(a, b)| *a = a.max(b)),
    }
}

fn check_same(a: &BufferMut<'_>, b: &Buffer<'_>) -> CollectiveResult {
    if a.elem() != b.elem() || a.len() != b.len() {
        return Err(format!(
            "buffers differ: {} x {:?} and {} x {:?}",
            a.len(),
            a.elem(),
            b.len(),
            b.elem()
        )
        .into());
    }
    Ok(())
}

macro_rules! impl_from {
    ($($t:ty => $variant:ident),*) => {$(
        impl<'a> From<&'a [$t]> for Buffer<'a> {
            fn from(s: &'a [$t]) -> Self {
                Buffer::$variant(s)
            }
        }
        impl<'a> From<&'a mut [$t]> for BufferMut<'a> {
            fn from(s: &'a mut [$t]) -> Self {
                BufferMut::$variant(s)
            }
        }
    )*};
}
impl_from!(f32 => F32, f64 => F64, i32 => I32, i64 => I64, u8 => U8);

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
fn check_raw(data: *const c_void, count: usize, elem: ElemType) -> CollectiveResult {
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
