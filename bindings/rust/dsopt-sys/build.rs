//! Finds libdsopt and links it; with the `bindgen` feature, also generates
//! the declarations from its header (the crate ships them pre-generated in
//! `src/bindings.rs`, which a test keeps equal to what bindgen makes of
//! `include/dsopt.h`).
//!
//! Where the library is looked for, first match wins:
//! 1. `DSOPT_LIB_DIR` (and `DSOPT_INCLUDE_DIR`, else `<lib dir>/../include`
//!    when it holds dsopt.h, else the repository's `include/`);
//! 2. pkg-config (`dsopt.pc`, from `cmake --install`);
//! 3. the in-tree build: `<repo>/build`, with `<repo>/include`;
//! 4. a build from the repository's sources with the `cmake` crate, into
//!    this crate's `OUT_DIR` (the library and its MPI plugin only; the
//!    environment's `DSOPT_WITH_CUDA`, `DSOPT_WITH_NCCL` and `DSOPT_WITH_MPI`,
//!    when set, are passed to CMake). `DSOPT_SYS_BUILD_FROM_SOURCE=1` goes
//!    straight there.
//!
//! Dependent build scripts get `DEP_DSOPT_LIB_DIR` and `DEP_DSOPT_INCLUDE`
//! (to set an rpath, say).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Location {
    lib_dir: PathBuf,
    include_dir: PathBuf,
    found_by: &'static str,
}

fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    // <repo>/bindings/rust/dsopt-sys
    manifest.join("../../..")
}

fn has_header(dir: &Path) -> bool {
    dir.join("dsopt.h").is_file()
}

fn from_env() -> Option<Location> {
    let lib_dir = PathBuf::from(env::var_os("DSOPT_LIB_DIR")?);
    let include_dir = match env::var_os("DSOPT_INCLUDE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None if has_header(&lib_dir.join("../include")) => lib_dir.join("../include"),
        None => repo_root().join("include"),
    };
    Some(Location {
        lib_dir,
        include_dir,
        found_by: "DSOPT_LIB_DIR",
    })
}

fn pkg_config_variable(name: &str) -> Option<PathBuf> {
    let out = Command::new(env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into()))
        .args(["--variable", name, "dsopt"])
        .output()
        .ok()?;
    let value = String::from_utf8(out.stdout).ok()?;
    let value = value.trim();
    (out.status.success() && !value.is_empty()).then(|| PathBuf::from(value))
}

fn from_pkg_config() -> Option<Location> {
    let lib_dir = pkg_config_variable("libdir")?;
    let include_dir = pkg_config_variable("includedir")?;
    Some(Location {
        lib_dir,
        include_dir,
        found_by: "pkg-config",
    })
}

fn from_tree() -> Option<Location> {
    let root = repo_root();
    let lib_dir = root.join("build");
    lib_dir.join("libdsopt.so").exists().then(|| Location {
        lib_dir,
        include_dir: root.join("include"),
        found_by: "the in-tree build",
    })
}

/// Builds the library from the repository's sources (when this crate sits
/// in the repository) with CMake, tests, examples and benchmarks off.
fn from_source() -> Option<Location> {
    let root = repo_root();
    if !root.join("CMakeLists.txt").is_file() {
        return None;
    }
    let mut config = cmake::Config::new(&root);
    config.profile("Release").build_target("all");
    for var in ["DSOPT_WITH_CUDA", "DSOPT_WITH_NCCL", "DSOPT_WITH_MPI"] {
        if let Ok(value) = env::var(var) {
            config.define(var, value);
        }
    }
    let prefix = config.build();
    let lib_dir = prefix.join("build");
    lib_dir.join("libdsopt.so").exists().then(|| Location {
        lib_dir,
        include_dir: root.join("include"),
        found_by: "a build from the repository's sources",
    })
}

fn main() {
    for var in [
        "DSOPT_LIB_DIR",
        "DSOPT_INCLUDE_DIR",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG",
        "DSOPT_SYS_BUILD_FROM_SOURCE",
        "DSOPT_WITH_CUDA",
        "DSOPT_WITH_NCCL",
        "DSOPT_WITH_MPI",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let forced = env::var("DSOPT_SYS_BUILD_FROM_SOURCE").map_or(false, |v| v == "1");
    let found = if forced {
        None
    } else {
        from_env().or_else(from_pkg_config).or_else(from_tree)
    };
    let loc = found.or_else(from_source).unwrap_or_else(|| {
        panic!(
            "dsopt-sys: libdsopt not found, and this crate is not inside the dsopt repository \
             to build it. Set DSOPT_LIB_DIR to the directory holding libdsopt.so, or install \
             dsopt so that `pkg-config dsopt` finds it"
        )
    });
    let lib_dir = loc
        .lib_dir
        .canonicalize()
        .unwrap_or_else(|_| loc.lib_dir.clone());
    let include_dir = loc
        .include_dir
        .canonicalize()
        .unwrap_or_else(|_| loc.include_dir.clone());
    let header = include_dir.join("dsopt.h");
    assert!(
        header.is_file(),
        "dsopt-sys: {} does not exist (libdsopt found through {} in {}; set DSOPT_INCLUDE_DIR)",
        header.display(),
        loc.found_by,
        lib_dir.display()
    );

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=dsopt");
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:include={}", include_dir.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!(
        "cargo:rerun-if-changed={}",
        lib_dir.join("libdsopt.so").display()
    );

    #[cfg(feature = "bindgen")]
    generate(&header, &include_dir);
}

/// `OUT_DIR/bindings.rs` from the header (the `bindgen` feature); the
/// pre-generated `src/bindings.rs` is this file, made by bindgen 0.60.
#[cfg(feature = "bindgen")]
fn generate(header: &Path, include_dir: &Path) {
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", include_dir.display()))
        .allowlist_function("dsopt_.*")
        .allowlist_type("dsopt_.*")
        .allowlist_var("DSOPT_.*")
        .generate()
        .expect("dsopt-sys: bindgen failed on dsopt.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    bindings
        .write_to_file(&out)
        .expect("dsopt-sys: cannot write bindings.rs");
}
