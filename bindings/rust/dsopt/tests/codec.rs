//! dsopt::Codec: compressed ZeRO's codes (dsopt_codec) from Rust.

use dsopt::{Codec, ErrorKind};

#[test]
fn int8_levels_of_a_unit_scale_block() {
    let mut codec = Codec::with_threads("int8", 8, 1).unwrap();
    let x = [127.0f32, -63.5, 0.5, 1.5, 2.5, -3.0, 10.0, 0.0];
    let mut codes = vec![0u8; codec.encoded_size(8).unwrap()];
    assert_eq!(codes.len(), 12);
    assert_eq!(codec.encode(&x, 1, None, &mut codes).unwrap(), 12);
    assert_eq!(f32::from_le_bytes(codes[..4].try_into().unwrap()), 1.0);
    let levels: Vec<i8> = codes[4..].iter().map(|&b| b as i8).collect();
    assert_eq!(levels, [127, -64, 0, 2, 2, -3, 10, 0]);
    let mut out = [0f32; 8];
    codec.decode_sum(&codes, 1, &mut out).unwrap();
    assert_eq!(out, [127.0, -64.0, 0.0, 2.0, 2.0, -3.0, 10.0, 0.0]);
}

#[test]
fn the_residual_carries_what_was_lost() {
    let mut codec = Codec::new("int4", 16).unwrap();
    let n = 40;
    let g: Vec<f32> = (0..2 * n)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
        .collect();
    let mut residual = vec![0u8; 2 * codec.residual_size(n).unwrap()];
    let mut codes = vec![0u8; 2 * codec.encoded_size(n).unwrap()];
    codec
        .encode(&g, 2, Some(&mut residual), &mut codes)
        .unwrap();
    assert!(residual.iter().any(|&b| b != 0));
    // x' + e reproduces x up to the residual's own int8 step
    let (mut decoded, mut lost) = (vec![0f32; n], vec![0f32; n]);
    codec
        .decode_sum(&codes[..codes.len() / 2], 1, &mut decoded)
        .unwrap();
    let mut int8 = Codec::new("int8", 16).unwrap();
    int8.decode_sum(&residual[..residual.len() / 2], 1, &mut lost)
        .unwrap();
    for i in 0..n {
        assert!(
            (decoded[i] + lost[i] - g[i]).abs() <= 0.2 / 127.0 * 2.0,
            "element {i}"
        );
    }
}

#[test]
fn bad_arguments_are_errors_and_write_nothing() {
    let mut codec = Codec::new("sign", 8).unwrap();
    let x = [1.0f32; 16];
    let mut small = [0xA5u8; 9];
    let e = codec.encode(&x, 2, None, &mut small).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BufferTooSmall);
    assert!(small.iter().all(|&b| b == 0xA5));
    assert_eq!(
        codec
            .encode(&x, 3, None, &mut [0u8; 64])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        Codec::new("int2", 0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        Codec::new("int8", 12).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let bf16 = Codec::new("bf16", 0).unwrap();
    assert_eq!(
        bf16.residual_size(4).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}
