//! Parameter and gradient buffers: borrowed slices described as `dsopt_tensor`.
//!
//! Rust has no stable 16-bit float type, so fp16 and bf16 data are `u16`
//! slices of raw bits, tagged with their [`DType`] by the constructor.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;

use dsopt_sys as sys;

/// Element type of a parameter or gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// IEEE half precision, as raw `u16` bits.
    F16,
    /// bfloat16, as raw `u16` bits.
    BF16,
}

impl DType {
    fn code(self) -> i32 {
        (match self {
            DType::F32 => sys::DSOPT_FLOAT32,
            DType::F16 => sys::DSOPT_FLOAT16,
            DType::BF16 => sys::DSOPT_BFLOAT16,
        }) as i32
    }
}

/// A parameter buffer, mutably borrowed for `'a` and updated in place by the
/// optimizer it is given to. Host memory unless made with
/// [`from_raw_parts`](Self::from_raw_parts).
#[derive(Debug)]
pub struct ParamSlice<'a> {
    data: NonNull<c_void>,
    numel: usize,
    dtype: DType,
    group: i32,
    host: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

// Safety: a ParamSlice is an exclusive borrow like `&'a mut [T]` (which is
// Send and Sync); device memory made with from_raw_parts carries the same
// promise from its unsafe constructor.
unsafe impl Send for ParamSlice<'_> {}
// Safety: through `&ParamSlice` the data is only read (as_f32 / as_bits).
unsafe impl Sync for ParamSlice<'_> {}

impl<'a> ParamSlice<'a> {
    fn host<T>(data: &'a mut [T], dtype: DType) -> Self {
        ParamSlice {
            numel: data.len(),
            data: NonNull::from(data).cast(),
            dtype,
            group: 0,
            host: true,
            _borrow: PhantomData,
        }
    }

    pub fn f32(data: &'a mut [f32]) -> Self {
        Self::host(data, DType::F32)
    }

    /// fp16 parameters as raw bits.
    pub fn f16_bits(data: &'a mut [u16]) -> Self {
        Self::host(data, DType::F16)
    }

    /// bf16 parameters as raw bits.
    pub fn bf16_bits(data: &'a mut [u16]) -> Self {
        Self::host(data, DType::BF16)
    }

    /// A buffer dsopt cannot check from Rust, typically CUDA device memory
    /// for an optimizer configured with `"device": "cuda"`.
    ///
    /// # Safety
    /// `data` must point to `numel` elements of `dtype` on the optimizer's
    /// device, valid for reads and writes and used by nothing else for `'a`.
    pub unsafe fn from_raw_parts(data: NonNull<c_void>, numel: usize, dtype: DType) -> Self {
        ParamSlice {
            data,
            numel,
            dtype,
            group: 0,
            host: false,
            _borrow: PhantomData,
        }
    }

    /// Puts the parameter in group `group` (an index into the config's
    /// `"param_groups"`).
    pub fn in_group(mut self, group: i32) -> Self {
        self.group = group;
        self
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn group(&self) -> i32 {
        self.group
    }

    pub fn len(&self) -> usize {
        self.numel
    }

    pub fn is_empty(&self) -> bool {
        self.numel == 0
    }

    /// The values of an fp32 host parameter.
    pub fn as_f32(&self) -> Option<&[f32]> {
        (self.host && self.dtype == DType::F32).then(|| {
            // Safety: the pointer and length come from a `&'a mut [f32]` that
            // this value borrows exclusively; `&self` allows only reads.
            unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<f32>(), self.numel) }
        })
    }

    /// The raw bits of an fp16 or bf16 host parameter.
    pub fn as_bits(&self) -> Option<&[u16]> {
        (self.host && self.dtype != DType::F32).then(|| {
            // Safety: as in as_f32, from a `&'a mut [u16]`.
            unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u16>(), self.numel) }
        })
    }

    pub(crate) fn to_c(&self) -> sys::dsopt_tensor {
        tensor(self.data.as_ptr(), self.numel, self.dtype, self.group)
    }
}

impl<'a> From<&'a mut [f32]> for ParamSlice<'a> {
    fn from(data: &'a mut [f32]) -> Self {
        ParamSlice::f32(data)
    }
}

/// A gradient buffer, read only during [`Optimizer::step`](crate::Optimizer::step),
/// or [`GradSlice::absent`].
#[derive(Debug, Clone, Copy)]
pub struct GradSlice<'g> {
    data: Option<NonNull<c_void>>,
    numel: usize,
    dtype: DType,
    _borrow: PhantomData<&'g [u8]>,
}

impl<'g> GradSlice<'g> {
    fn host<T>(data: &'g [T], dtype: DType) -> Self {
        GradSlice {
            numel: data.len(),
            data: Some(NonNull::from(data).cast()),
            dtype,
            _borrow: PhantomData,
        }
    }

    pub fn f32(data: &'g [f32]) -> Self {
        Self::host(data, DType::F32)
    }

    /// No gradient for this parameter in this step on this rank (a frozen
    /// parameter, an unused branch): `dsopt_step`'s NULL data. Ranks that
    /// have none contribute zeros; Adam/AdamW leave a parameter that no
    /// rank has a gradient for untouched (values, moments and its step
    /// count); the 1-bit optimizers step it with a zero gradient.
    pub fn absent() -> Self {
        GradSlice {
            data: None,
            numel: 0,
            dtype: DType::F32,
            _borrow: PhantomData,
        }
    }

    /// fp16 gradients as raw bits.
    pub fn f16_bits(data: &'g [u16]) -> Self {
        Self::host(data, DType::F16)
    }

    /// bf16 gradients as raw bits.
    pub fn bf16_bits(data: &'g [u16]) -> Self {
        Self::host(data, DType::BF16)
    }

    /// A gradient on the optimizer's device (CUDA memory, say).
    ///
    /// # Safety
    /// `data` must point to `numel` elements of `dtype` on the optimizer's
    /// device, valid for reads and not written during `'g`.
    pub unsafe fn from_raw_parts(data: NonNull<c_void>, numel: usize, dtype: DType) -> Self {
        GradSlice {
            data: Some(data),
            numel,
            dtype,
            _borrow: PhantomData,
        }
    }

    pub(crate) fn to_c(self) -> sys::dsopt_tensor {
        let data = self.data.map_or(std::ptr::null_mut(), NonNull::as_ptr);
        tensor(data, self.numel, self.dtype, 0)
    }
}

impl<'g> From<&'g [f32]> for GradSlice<'g> {
    fn from(data: &'g [f32]) -> Self {
        GradSlice::f32(data)
    }
}

fn tensor(data: *mut c_void, numel: usize, dtype: DType, group: i32) -> sys::dsopt_tensor {
    // A slice never holds more than isize::MAX bytes, so numel fits i64.
    sys::dsopt_tensor {
        data,
        numel: numel as i64,
        dtype: dtype.code(),
        group,
    }
}
