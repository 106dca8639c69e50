use std::ffi::c_void;
use std::mem;
use std::ops::Range;
use std::slice;

use super::trampolines::check_raw;
use super::{CollectiveError, CollectiveResult, ElemType, ReduceOp};

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
    pub(super) unsafe fn from_raw(
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
    pub(super) unsafe fn from_raw(
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
