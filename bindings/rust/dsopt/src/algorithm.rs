//! What an algorithm is, as the library's registry describes it
//! (`dsopt_algorithm_names`, `dsopt_algorithm_describe`): the one source a
//! program builds its behaviour from instead of lists of names.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::ptr;

use dsopt_sys as sys;

use crate::error::{check, Error, Result};

/// The values a hyperparameter takes (`DSOPT_HYPER_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HyperRange {
    /// In [0, 1), and below 1 in fp32.
    Beta,
    /// Finite and >= 0.
    NonNegative,
    /// 0 or 1; `true` or `false` in a config.
    Flag,
}

/// One group hyperparameter of an algorithm.
#[derive(Clone, Debug, PartialEq)]
pub struct Hyperparameter {
    /// The name [`crate::Optimizer::group_param`] takes ("beta1").
    pub name: String,
    /// Its config key ("betas"; a key of several hyperparameters is a list
    /// of their values, in order).
    pub key: String,
    /// Its default in `optimizer.params` (a flag: 0 or 1).
    pub default: f64,
    pub range: HyperRange,
}

/// An algorithm as the registry describes it ([`describe`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Algorithm {
    /// Its canonical "optimizer.type".
    pub type_name: String,
    /// Other accepted spellings (any case, as the type).
    pub aliases: Vec<String>,
    /// Its fp32 moments' state view names ([`crate::Optimizer::state_view`]), in order.
    pub moment_names: Vec<String>,
    /// Its group hyperparameters, lr first.
    pub hyperparameters: Vec<Hyperparameter>,
    /// `optimizer.params` keys beyond the hyperparameters.
    pub keys: Vec<String>,
    /// `param_groups[i]` keys beyond the hyperparameters.
    pub group_keys: Vec<String>,
    /// `DSOPT_ALGORITHM_*` bits (see the methods).
    pub flags: u32,
}

impl Algorithm {
    /// fp32 moments per element of its state (m: 1; m and v: 2).
    pub fn moments(&self) -> usize {
        self.moment_names.len()
    }

    /// Parameters count their own steps ([`crate::Optimizer::param_step`]);
    /// each parameter's state stands alone, so an optimizer rebuilt with
    /// more parameters can take it over.
    pub fn param_steps(&self) -> bool {
        self.flags & sys::DSOPT_ALGORITHM_PARAM_STEPS != 0
    }

    /// Runs under ZeRO stage 1/2, compressed ZeRO included.
    pub fn zero(&self) -> bool {
        self.flags & sys::DSOPT_ALGORITHM_ZERO != 0
    }

    /// Its ZeRO shard can live in host memory ("offload_optimizer").
    pub fn offload(&self) -> bool {
        self.flags & sys::DSOPT_ALGORITHM_OFFLOAD != 0
    }

    /// 1-bit compressed communication after a warmup (error feedback,
    /// stages, momentum masks).
    pub fn compressed(&self) -> bool {
        self.flags & sys::DSOPT_ALGORITHM_COMPRESSED != 0
    }
}

/// The words of a static, NUL-terminated, space-separated list.
///
/// Safety: `list` is NULL or a valid NUL-terminated string.
unsafe fn words(list: *const c_char) -> Vec<String> {
    if list.is_null() {
        return Vec::new();
    }
    // Safety: the caller's promise.
    let text = unsafe { CStr::from_ptr(list) }.to_string_lossy();
    text.split_whitespace().map(str::to_owned).collect()
}

/// The types of the algorithms the loaded library has, in the registry's
/// order (`dsopt_algorithm_names`).
pub fn algorithm_names() -> Result<Vec<String>> {
    let mut names: *const c_char = ptr::null();
    // Safety: `names` is a valid out pointer.
    check(unsafe { sys::dsopt_algorithm_names(&mut names) })?;
    // Safety: on success it is a static NUL-terminated string.
    Ok(unsafe { words(names) })
}

fn range(code: i32) -> HyperRange {
    match code as u32 {
        sys::DSOPT_HYPER_BETA => HyperRange::Beta,
        sys::DSOPT_HYPER_FLAG => HyperRange::Flag,
        _ => HyperRange::NonNegative,
    }
}

/// What the algorithm `optimizer_type` (a config's "optimizer.type", any
/// case or alias) is (`dsopt_algorithm_describe`). An unknown type is
/// [`crate::ErrorKind::InvalidArgument`].
pub fn describe(optimizer_type: &str) -> Result<Algorithm> {
    let ty = CString::new(optimizer_type).map_err(|_| Error::invalid("type contains a NUL byte"))?;
    // Safety: an all-zero dsopt_algorithm_info is valid (integers and NULL pointers).
    let mut info: sys::dsopt_algorithm_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<sys::dsopt_algorithm_info>() as u32;
    // Safety: `ty` is NUL-terminated; `info` is a valid out struct of struct_size bytes.
    check(unsafe { sys::dsopt_algorithm_describe(ty.as_ptr(), &mut info) })?;
    // Safety: on success every string is static and NUL-terminated, and the
    // two arrays hold num_hyper elements.
    unsafe {
        let names = words(info.hyper_names);
        let keys = words(info.hyper_keys);
        let count = usize::try_from(info.num_hyper).unwrap_or(0);
        let defaults = std::slice::from_raw_parts(info.hyper_defaults, count);
        let ranges = std::slice::from_raw_parts(info.hyper_ranges, count);
        let hyperparameters = (0..count)
            .map(|i| Hyperparameter {
                name: names.get(i).cloned().unwrap_or_default(),
                key: keys.get(i).cloned().unwrap_or_default(),
                default: defaults[i],
                range: range(ranges[i]),
            })
            .collect();
        Ok(Algorithm {
            type_name: CStr::from_ptr(info.type_).to_string_lossy().into_owned(),
            aliases: words(info.aliases),
            moment_names: words(info.moment_names),
            hyperparameters,
            keys: words(info.keys),
            group_keys: words(info.group_keys),
            flags: info.flags,
        })
    }
}
