//! This crate's own tests and examples find libdsopt at run time through an
//! rpath to the directory dsopt-sys linked it from.
fn main() {
    if let Ok(dir) = std::env::var("DEP_DSOPT_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
