//! The shipped `src/bindings.rs` is what bindgen makes of `include/dsopt.h`
//! now (run with `--features bindgen`; without it there is nothing to
//! compare with).
#[cfg(feature = "bindgen")]
#[test]
fn pregenerated_bindings_match_the_header() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let shipped = include_str!("../src/bindings.rs");
    assert!(
        generated == shipped,
        "src/bindings.rs differs from bindgen's output for include/dsopt.h: regenerate it with \
         `cargo build -p dsopt-sys --features bindgen` and copy OUT_DIR/bindings.rs over it"
    );
}
