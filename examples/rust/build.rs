//! The binary finds libdsopt at run time through an rpath to the directory
//! dsopt-sys linked it from (no LD_LIBRARY_PATH needed).
fn main() {
    if let Ok(dir) = std::env::var("DEP_DSOPT_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
}
