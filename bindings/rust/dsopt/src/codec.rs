//! `Codec`: compressed ZeRO's codes for collectives of the caller's own
//! (`dsopt_codec`, docs/reference/c-api.md "Codecs"), on host memory.

use std::ffi::CString;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use dsopt_sys as sys;

use crate::error::{check, Error, Result};

/// One codec: "int8", "int4", "sign" (an fp32 scale per block of elements,
/// with an error-feedback residual) or "bf16" (no blocks, no residual).
/// The bytes are the library's, bit for bit, whatever the thread count.
///
/// ```no_run
/// # fn main() -> dsopt::Result<()> {
/// let mut codec = dsopt::Codec::new("int4", 64)?;
/// let (n, ranks) = (1000, 4);
/// let grads = vec![0.5f32; ranks * n];
/// let mut residual = vec![0u8; ranks * codec.residual_size(n)?];
/// let mut codes = vec![0u8; ranks * codec.encoded_size(n)?];
/// codec.encode(&grads, ranks, Some(&mut residual), &mut codes)?;
/// // ... an all-to-all moves the codes ...
/// let mut shard = vec![0f32; n];
/// codec.decode_sum(&codes, ranks, &mut shard)?; // summed in rank order
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Codec {
    raw: NonNull<sys::dsopt_codec>,
}

// Safety: a dsopt_codec has no thread affinity; `&mut self` on every call
// that runs work keeps one thread at a time on it.
unsafe impl Send for Codec {}

impl Codec {
    /// A host codec `name` with `block` elements per scaled block (0: 64;
    /// "bf16" takes 0) on OpenMP's threads.
    pub fn new(name: &str, block: i64) -> Result<Self> {
        Self::with_threads(name, block, 0)
    }

    /// The same on `threads` CPU threads (0: OpenMP's count).
    pub fn with_threads(name: &str, block: i64, threads: i32) -> Result<Self> {
        let name =
            CString::new(name).map_err(|_| Error::invalid("codec name contains a NUL byte"))?;
        let options = sys::dsopt_codec_options {
            struct_size: std::mem::size_of::<sys::dsopt_codec_options>() as u32,
            device: sys::DSOPT_COMM_HOST as i32,
            block,
            threads,
            reserved: 0,
            stream: ptr::null_mut(),
        };
        let mut out = ptr::null_mut();
        // Safety: `out`, `name` and `options` are valid for the call.
        check(unsafe { sys::dsopt_codec_create(&mut out, name.as_ptr(), &options) })?;
        NonNull::new(out)
            .map(|raw| Codec { raw })
            .ok_or_else(|| Error::invalid("dsopt returned a NULL codec"))
    }

    fn size(
        &self,
        n: usize,
        call: unsafe extern "C" fn(*const sys::dsopt_codec, i64, *mut u64) -> i32,
    ) -> Result<usize> {
        let mut bytes = 0u64;
        // Safety: the handle is live; `bytes` is valid for the call.
        check(unsafe { call(self.raw.as_ptr(), n as i64, &mut bytes) })?;
        Ok(bytes as usize)
    }

    /// Bytes of the code of one run of `n` values.
    pub fn encoded_size(&self, n: usize) -> Result<usize> {
        self.size(n, sys::dsopt_codec_encoded_size)
    }

    /// Bytes of the error-feedback residual of one run of `n` values (all
    /// zero: the zero residual); `Unsupported` for "bf16".
    pub fn residual_size(&self, n: usize) -> Result<usize> {
        self.size(n, sys::dsopt_codec_residual_size)
    }

    /// Encodes `runs` runs of `values.len() / runs` values each into `dst`
    /// (run j's code at j encoded runs); with `residual` (`runs` residual
    /// runs), error feedback, the residual updated in place. Returns the
    /// bytes written.
    pub fn encode(
        &mut self,
        values: &[f32],
        runs: usize,
        residual: Option<&mut [u8]>,
        dst: &mut [u8],
    ) -> Result<usize> {
        let tensor = sys::dsopt_tensor {
            data: values.as_ptr() as *mut c_void,
            numel: values.len() as i64,
            dtype: sys::DSOPT_FLOAT32 as i32,
            group: 0,
        };
        let (e_ptr, e_len) = match residual {
            Some(e) => (e.as_mut_ptr() as *mut c_void, e.len() as u64),
            None => (ptr::null_mut(), 0),
        };
        // Safety: every pointer is valid for its length during the call
        // (the library reads values, reads and writes the residual, writes
        // dst, and keeps none of them).
        check(unsafe {
            sys::dsopt_codec_encode(
                self.raw.as_ptr(),
                &tensor,
                runs as i64,
                e_ptr,
                e_len,
                dst.as_mut_ptr() as *mut c_void,
                dst.len() as u64,
            )
        })?;
        Ok(runs * self.encoded_size(values.len() / runs.max(1))?)
    }

    /// `out[i]` = the sum over the `runs` codes of `out.len()` values each
    /// that `codes` holds, in run order, of their decoded element `i`.
    pub fn decode_sum(&mut self, codes: &[u8], runs: usize, out: &mut [f32]) -> Result<()> {
        let tensor = sys::dsopt_tensor {
            data: out.as_mut_ptr() as *mut c_void,
            numel: out.len() as i64,
            dtype: sys::DSOPT_FLOAT32 as i32,
            group: 0,
        };
        // Safety: codes and out are valid for their lengths during the call.
        check(unsafe {
            sys::dsopt_codec_decode_sum(
                self.raw.as_ptr(),
                codes.as_ptr() as *const c_void,
                codes.len() as u64,
                runs as i64,
                &tensor,
            )
        })
    }
}

impl Drop for Codec {
    fn drop(&mut self) {
        // Safety: the handle came from dsopt_codec_create and is freed once.
        unsafe { sys::dsopt_codec_destroy(self.raw.as_ptr()) }
    }
}
