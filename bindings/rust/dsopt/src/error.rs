//! `dsopt::Error`: a failed call's status code and the library's detail text.

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_int;

use dsopt_sys as sys;

use crate::step_info::StepInfo;

/// What kind of failure a status code is (`DSOPT_E*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `DSOPT_EINVAL`: bad argument or bad config.
    InvalidArgument,
    /// `DSOPT_EUNSUPPORTED`: not built in, or an unsupported combination.
    Unsupported,
    /// `DSOPT_ENOMEM`: host or device allocation failed.
    OutOfMemory,
    /// `DSOPT_EBUFS`: the caller's buffer is too small.
    BufferTooSmall,
    /// `DSOPT_ECORRUPT`: state blob truncated, wrong magic or bad checksum.
    CorruptState,
    /// `DSOPT_EMISMATCH`: blob of another algorithm or shape, or ranks disagree.
    Mismatch,
    /// `DSOPT_ECOMM`: MPI or NCCL failure.
    Comm,
    /// `DSOPT_ECUDA`: CUDA runtime failure.
    Cuda,
    /// `DSOPT_EINTERNAL`, or a code this binding does not know.
    Internal,
    /// `DSOPT_ENONFINITE`: training is not progressing (`max_consecutive_skips`
    /// steps in a row skipped for Inf/NaN gradients, or an fp16 overflow at
    /// `min_loss_scale`). The step was skipped like any other and the next one
    /// may continue; [`Error::step_info`] says what it did.
    NonFinite,
}

impl ErrorKind {
    fn from_code(code: c_int) -> ErrorKind {
        match code {
            sys::DSOPT_EINVAL => ErrorKind::InvalidArgument,
            sys::DSOPT_EUNSUPPORTED => ErrorKind::Unsupported,
            sys::DSOPT_ENOMEM => ErrorKind::OutOfMemory,
            sys::DSOPT_EBUFS => ErrorKind::BufferTooSmall,
            sys::DSOPT_ECORRUPT => ErrorKind::CorruptState,
            sys::DSOPT_EMISMATCH => ErrorKind::Mismatch,
            sys::DSOPT_ECOMM => ErrorKind::Comm,
            sys::DSOPT_ECUDA => ErrorKind::Cuda,
            sys::DSOPT_ENONFINITE => ErrorKind::NonFinite,
            _ => ErrorKind::Internal,
        }
    }
}

/// A dsopt call failed: its status code and the detail message that
/// `dsopt_last_error` gave right after it, on the same thread, plus the
/// step's [`StepInfo`] for [`ErrorKind::NonFinite`].
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    code: c_int,
    message: String,
    step_info: Option<StepInfo>,
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The C status code (negative).
    pub fn code(&self) -> i32 {
        self.code
    }

    pub fn kind(&self) -> ErrorKind {
        ErrorKind::from_code(self.code)
    }

    /// The library's detail message (may be empty).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The fixed text of the status code (`dsopt_status_string`).
    pub fn status_text(&self) -> &'static str {
        status_text(self.code)
    }

    /// What the failing step did, when the library reported it with the
    /// error: `Some` for [`ErrorKind::NonFinite`] from
    /// [`Optimizer::step`](crate::Optimizer::step) (a skipped step), else `None`.
    pub fn step_info(&self) -> Option<&StepInfo> {
        self.step_info.as_ref()
    }

    pub(crate) fn with_step_info(self, step_info: StepInfo) -> Error {
        Error {
            step_info: Some(step_info),
            ..self
        }
    }

    /// An argument the binding rejects before calling the library.
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error {
            code: sys::DSOPT_EINVAL,
            message: message.into(),
            step_info: None,
        }
    }

    /// Something the binding cannot do (the library could).
    pub(crate) fn unsupported(message: impl Into<String>) -> Error {
        Error {
            code: sys::DSOPT_EUNSUPPORTED,
            message: message.into(),
            step_info: None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{} ({})", self.status_text(), self.code)
        } else {
            write!(
                f,
                "{} ({}): {}",
                self.status_text(),
                self.code,
                self.message
            )
        }
    }
}

impl std::error::Error for Error {}

pub(crate) fn status_text(code: c_int) -> &'static str {
    // Safety: dsopt_status_string returns a static, NUL-terminated string for
    // any code, never NULL.
    let text = unsafe { CStr::from_ptr(sys::dsopt_status_string(code)) };
    text.to_str().unwrap_or("unknown status")
}

/// `Ok(())` for `DSOPT_OK`; otherwise the error with this thread's detail
/// message. Call it right after the call that returned `rc`.
pub(crate) fn check(rc: c_int) -> Result<()> {
    if rc == sys::DSOPT_OK {
        return Ok(());
    }
    // Safety: dsopt_last_error never returns NULL; the text is valid until the
    // next dsopt call on this thread, and it is copied before that.
    let detail = unsafe { CStr::from_ptr(sys::dsopt_last_error()) };
    Err(Error {
        code: rc,
        message: detail.to_string_lossy().into_owned(),
        step_info: None,
    })
}
