//! The safe binding's rules, one test each (local communicator).

use dsopt::{Communicator, ErrorKind, GradSlice, MemoryUsage, Optimizer, ParamSlice};

const ADAM: &str = r#"{"optimizer": {"type": "Adam", "params": {"lr": 0.01}}}"#;

fn grads(step: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + step * 3) % 11) as f32 * 0.1 - 0.5)
        .collect()
}

/// Runs `steps` steps from `start` on `params`, optionally loading `blob`
/// first, and returns the state afterwards.
fn run(
    config: &str,
    params: &mut [f32],
    blob: Option<&[u8]>,
    start: usize,
    steps: usize,
) -> Vec<u8> {
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(config, [ParamSlice::f32(params)], &mut comm).unwrap();
    if let Some(blob) = blob {
        opt.state_load(blob).unwrap();
    }
    let n = opt.params()[0].len();
    for s in start..start + steps {
        opt.step(&[GradSlice::f32(&grads(s, n))]).unwrap();
    }
    opt.state_save().unwrap()
}

#[test]
fn first_adam_step_moves_each_parameter_by_lr_against_its_gradient() {
    let mut w = vec![1.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let info = opt
        .step(&[GradSlice::f32(&[2.0, -3.0, 0.5, -0.25])])
        .unwrap();
    assert_eq!(info.step, 1);
    assert!(!info.skipped && !info.compressed);
    assert_eq!(info.loss_scale, 1.0);
    let w_now = opt.params()[0].as_f32().unwrap().to_vec();
    drop(opt);
    for (now, expected) in w_now.iter().zip([0.99, 1.01, 0.99, 1.01]) {
        assert!((now - expected).abs() < 1e-6, "{now} vs {expected}");
    }
    assert_eq!(w, w_now, "the caller's buffer is the one updated");
}

#[test]
fn unknown_config_key_is_invalid_argument_naming_the_key() {
    let mut w = vec![0.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let config = r#"{"optimizer": {"type": "Adam", "params": {"lrr": 0.01}}}"#;
    let err = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(err.code(), dsopt::sys::DSOPT_EINVAL);
    assert!(err.message().contains("lrr"), "{err}");
    assert!(err.to_string().contains(err.status_text()));
}

#[test]
fn wrong_number_of_gradients_fails_and_changes_nothing() {
    let mut w = vec![1.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let g = [1.0f32; 4];
    let err = opt
        .step(&[GradSlice::f32(&g), GradSlice::f32(&g)])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(opt.params()[0].as_f32().unwrap(), &[1.0; 4]);
}

#[test]
fn save_and_load_resume_bit_identically() {
    let mut straight = vec![0.5f32; 37];
    run(ADAM, &mut straight, None, 0, 8);

    let mut resumed = vec![0.5f32; 37];
    let blob = run(ADAM, &mut resumed, None, 0, 5);
    run(ADAM, &mut resumed, Some(&blob), 5, 3);
    assert_eq!(straight, resumed);
}

#[test]
fn corrupt_state_blob_is_rejected() {
    let mut w = vec![0.5f32; 8];
    let mut blob = run(ADAM, &mut w, None, 0, 2);
    let last = blob.len() - 1;
    blob[last] ^= 0x5a;
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let err = opt.state_load(&blob).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CorruptState, "{err}");
}

#[test]
fn gradient_clipping_is_settable_between_steps() {
    let mut p = vec![1.0f32; 8];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut p)], &mut comm).unwrap();
    assert_eq!(opt.gradient_clipping().unwrap(), 0.0);
    opt.set_gradient_clipping(0.25).unwrap();
    assert_eq!(opt.gradient_clipping().unwrap(), 0.25);
    assert_eq!(opt.set_gradient_clipping(-1.0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(opt.gradient_clipping().unwrap(), 0.25);
}

#[test]
fn threads_follow_the_config_or_the_budget() {
    let mut p = vec![1.0f32; 8];
    let mut comm = Communicator::local().unwrap();
    let config = r#"{"optimizer": {"type": "AdamW"}, "threads": 3}"#;
    let opt = Optimizer::new(config, [ParamSlice::f32(&mut p)], &mut comm).unwrap();
    assert_eq!(opt.threads().unwrap(), 3);
    drop(opt);
    let opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut p)], &mut comm).unwrap();
    assert!(opt.threads().unwrap() >= 1);
}

#[test]
fn set_lr_applies_to_every_group() {
    let (mut a, mut b) = (vec![0.0f32; 4], vec![0.0f32; 4]);
    let config = r#"{"optimizer": {"type": "AdamW"}, "param_groups": [{"lr": 0.1}, {"lr": 0.2}]}"#;
    let mut comm = Communicator::local().unwrap();
    let params = [ParamSlice::f32(&mut a), ParamSlice::f32(&mut b).in_group(1)];
    let mut opt = Optimizer::new(config, params, &mut comm).unwrap();
    assert_eq!(opt.num_groups().unwrap(), 2);
    assert_eq!(opt.lr(1).unwrap(), 0.2);
    opt.set_lr(0.05).unwrap();
    assert_eq!((opt.lr(0).unwrap(), opt.lr(1).unwrap()), (0.05, 0.05));
    opt.set_group_lr(1, 0.3).unwrap();
    assert_eq!(opt.lr(1).unwrap(), 0.3);
    assert_eq!(
        opt.set_lr(-1.0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn half_precision_parameters_take_raw_bits() {
    let mut bits = vec![0x3c00u16; 4]; // fp16 1.0
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f16_bits(&mut bits)], &mut comm).unwrap();
    opt.step(&[GradSlice::f32(&[1.0; 4])]).unwrap();
    let now = opt.params()[0].as_bits().unwrap();
    assert!(
        now.iter().all(|&b| b < 0x3c00),
        "fp16 values below 1.0: {now:x?}"
    );
    assert!(opt.params()[0].as_f32().is_none());
}

#[test]
fn optimizer_moves_to_another_thread() {
    let mut w = vec![1.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let info = std::thread::scope(|s| {
        s.spawn(move || opt.step(&[GradSlice::f32(&[1.0; 4])]))
            .join()
    })
    .unwrap()
    .unwrap();
    assert_eq!(info.step, 1);
    assert!(w.iter().all(|&x| x < 1.0));
}

#[test]
fn library_version_matches_the_header() {
    let (major, minor, patch) = dsopt::version();
    assert_eq!(
        (major, minor, patch),
        (
            dsopt::sys::DSOPT_VERSION_MAJOR,
            dsopt::sys::DSOPT_VERSION_MINOR,
            dsopt::sys::DSOPT_VERSION_PATCH
        )
    );
    assert!(dsopt::build_info().contains("simd="));
}

#[test]
fn onebit_adam_compresses_from_freeze_step() {
    let config =
        r#"{"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}}}"#;
    let mut w = vec![0.5f32; 64];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let compressed: Vec<bool> = (0..5)
        .map(|s| {
            opt.step(&[GradSlice::f32(&grads(s, 64))])
                .unwrap()
                .compressed
        })
        .collect();
    assert_eq!(compressed, [false, false, true, true, true]);
    let blob = opt.state_save().unwrap();
    opt.state_load(&blob).unwrap();
}

#[test]
fn zero_one_adam_reports_the_phase_of_every_step() {
    let config = r#"{"optimizer": {"type": "ZeroOneAdam", "params": {"lr": 0.01,
        "var_freeze_step": 3, "var_update_scaler": 1, "local_step_scaler": 1,
        "local_step_clipper": 4}}}"#;
    let mut w = vec![0.5f32; 64];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let phases: Vec<i32> = (0..7)
        .map(|s| opt.step(&[GradSlice::f32(&grads(s, 64))]).unwrap().phase)
        .collect();
    use dsopt::{PHASE_COMPRESSED as C, PHASE_FULL as F, PHASE_LOCAL as L, PHASE_SYNC as S};
    assert_eq!(phases, [F, C, F, S, S, L, S]);
    let blob = opt.state_save().unwrap();
    opt.state_load(&blob).unwrap();
}

#[test]
fn a_gradient_norm_far_above_its_history_is_reported_as_diverging() {
    // 40 steps at the usual scale, then 1000x: the third step above reports,
    // and the report lasts while the norm stays there.
    let mut w = vec![0.5f32; 64];
    let mut comm = Communicator::local().unwrap();
    let config = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.0}}}"#;
    let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let diverging: Vec<bool> = (0..50)
        .map(|s| {
            let scale = if s >= 40 { 1000.0 } else { 1.0 };
            let g: Vec<f32> = grads(s, 64).iter().map(|x| x * scale).collect();
            opt.step(&[GradSlice::f32(&g)]).unwrap().diverging
        })
        .collect();
    assert!(diverging[..42].iter().all(|d| !d), "{diverging:?}");
    assert!(diverging[42..].iter().all(|d| *d), "{diverging:?}");
}

#[test]
fn momentum_masks_belong_to_one_bit_optimizers() {
    let mut w = vec![0.5f32; 8];
    let mut comm = Communicator::local().unwrap();
    let mut adam = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let mask = [1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
    assert_eq!(
        adam.set_momentum_mask(0, Some(&mask)).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    drop(adam);

    let config = r#"{"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}}}"#;
    let mut onebit = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    onebit.set_momentum_mask(0, Some(&mask)).unwrap();
    assert_eq!(
        onebit
            .set_momentum_mask(0, Some(&mask[..4]))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        onebit.set_momentum_mask(1, None).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    onebit.set_momentum_mask(0, None).unwrap();
}

#[test]
fn steps_skipped_max_consecutive_skips_times_in_a_row_are_a_non_finite_error() {
    let config =
        r#"{"optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "max_consecutive_skips": 2}"#;
    let mut w = vec![1.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let nan = [1.0, f32::NAN, 0.5, -0.5];

    let first = opt.step(&[GradSlice::f32(&nan)]).unwrap();
    assert!(first.skipped);
    assert_eq!((first.step, first.consecutive_skips), (0, 1));

    let err = opt.step(&[GradSlice::f32(&nan)]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NonFinite, "{err}");
    assert_eq!(err.code(), dsopt::sys::DSOPT_ENONFINITE);
    assert!(err.message().contains("max_consecutive_skips"), "{err}");
    let info = err
        .step_info()
        .expect("the skipped step's info comes with the error");
    assert!(info.skipped);
    assert_eq!((info.step, info.consecutive_skips), (0, 2));
    assert_eq!(opt.params()[0].as_f32().unwrap(), &[1.0; 4]);

    // The run may continue.
    let applied = opt.step(&[GradSlice::f32(&[1.0; 4])]).unwrap();
    assert!(!applied.skipped);
    assert_eq!((applied.step, applied.consecutive_skips), (1, 0));
}

#[test]
fn other_errors_carry_no_step_info() {
    let mut w = vec![1.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let err = opt.step(&[GradSlice::f32(&[1.0; 3])]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.step_info().is_none());
}

#[test]
fn parameters_sharing_storage_are_rejected_naming_both() {
    // Safe code cannot alias two parameters (each is a `&mut` borrow);
    // raw parts can, and the library refuses them.
    let mut w = vec![0.5f32; 16];
    let data = std::ptr::NonNull::new(w.as_mut_ptr().cast::<std::ffi::c_void>()).unwrap();
    let mut comm = Communicator::local().unwrap();
    // Safety: the buffer outlives the optimizer, which the failed call never creates.
    let params = unsafe {
        [
            ParamSlice::from_raw_parts(data, 16, dsopt::DType::F32),
            ParamSlice::from_raw_parts(data, 8, dsopt::DType::F32),
        ]
    };
    let err = Optimizer::new(ADAM, params, &mut comm).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("params[0] and params[1] share storage"), "{err}");
}

#[test]
fn onebit_adam_accepts_the_stabilize_keys() {
    for stabilize in ["true", "false"] {
        let config = format!(
            r#"{{"optimizer": {{"type": "OneBitAdam", "params": {{"lr": 0.01, "freeze_step": 2,
                "stabilize": {stabilize}, "stabilize_limit": 0.5}}}}}}"#
        );
        let mut w = vec![0.5f32; 64];
        let mut comm = Communicator::local().unwrap();
        let mut opt = Optimizer::new(&config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
        let last = (0..4)
            .map(|s| opt.step(&[GradSlice::f32(&grads(s, 64))]).unwrap())
            .last()
            .unwrap();
        assert!(last.compressed && last.step == 4);
    }
    let bad = r#"{"optimizer": {"type": "OneBitAdam", "params": {"stabilize_limit": 0}}}"#;
    let mut w = vec![0.5f32; 4];
    let mut comm = Communicator::local().unwrap();
    let err = Optimizer::new(bad, [ParamSlice::f32(&mut w)], &mut comm).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("stabilize_limit"), "{err}");
}

const ADAMW: &str =
    r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}}"#;
const ADAMW_ZERO2: &str = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 96, "allgather_bucket_size": 200}}"#;

/// Like `run`, with two parameters (one split across buckets) and the
/// state loaded through `load_state_shards`.
fn run_sharded(
    config: &str,
    params: (&mut [f32], &mut [f32]),
    blobs: Option<&[Vec<u8>]>,
    start: usize,
    steps: usize,
) -> Vec<u8> {
    let mut comm = Communicator::local().unwrap();
    let (a, b) = params;
    let mut opt =
        Optimizer::new(config, [ParamSlice::f32(a), ParamSlice::f32(b)], &mut comm).unwrap();
    if let Some(blobs) = blobs {
        opt.load_state_shards(blobs).unwrap();
    }
    let (na, nb) = (opt.params()[0].len(), opt.params()[1].len());
    for s in start..start + steps {
        let (ga, gb) = (grads(s, na), grads(s + 1, nb));
        opt.step(&[GradSlice::f32(&ga), GradSlice::f32(&gb)])
            .unwrap();
    }
    opt.state_save().unwrap()
}

#[test]
fn zero_stage_2_on_one_rank_steps_like_stage_0() {
    let (mut a0, mut b0) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let (mut a2, mut b2) = (a0.clone(), b0.clone());
    run_sharded(ADAMW, (&mut a0, &mut b0), None, 0, 6);
    run_sharded(ADAMW_ZERO2, (&mut a2, &mut b2), None, 0, 6);
    assert_eq!((a0, b0), (a2, b2));
}

#[test]
fn zero_stage_2_resumes_bit_identically_from_its_single_shard() {
    let (mut a, mut b) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    run_sharded(ADAMW_ZERO2, (&mut a, &mut b), None, 0, 7);

    let (mut ra, mut rb) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let blob = run_sharded(ADAMW_ZERO2, (&mut ra, &mut rb), None, 0, 4);
    run_sharded(ADAMW_ZERO2, (&mut ra, &mut rb), Some(&[blob]), 4, 3);
    assert_eq!((a, b), (ra, rb));
}

#[test]
fn load_state_shards_reshards_a_stage_0_blob_into_stage_2() {
    let (mut a, mut b) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    run_sharded(ADAMW, (&mut a, &mut b), None, 0, 7);

    let (mut ra, mut rb) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let blob = run_sharded(ADAMW, (&mut ra, &mut rb), None, 0, 4);
    run_sharded(ADAMW_ZERO2, (&mut ra, &mut rb), Some(&[blob]), 4, 3);
    assert_eq!((a, b), (ra, rb));
}

#[test]
fn load_state_shards_takes_borrowed_slices_and_rejects_bad_sets() {
    let (mut a, mut b) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let blob = run_sharded(ADAMW_ZERO2, (&mut a, &mut b), None, 0, 2);
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(
        ADAMW_ZERO2,
        [ParamSlice::f32(&mut a), ParamSlice::f32(&mut b)],
        &mut comm,
    )
    .unwrap();
    opt.load_state_shards(&[blob.as_slice()]).unwrap();

    let none: &[&[u8]] = &[];
    let err = opt.load_state_shards(none).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("at least one blob"), "{err}");

    let mut damaged = blob.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x5a;
    let err = opt.load_state_shards(&[damaged]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CorruptState, "{err}");

    // A one-rank run wrote one blob: the same blob twice is not its set.
    let err = opt.load_state_shards(&[&blob[..], &blob[..]]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Mismatch, "{err}");

    let mut w = vec![0.5f32; 8];
    let onebit = run(
        r#"{"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}}}"#,
        &mut w,
        None,
        0,
        1,
    );
    let err = opt.load_state_shards(&[onebit]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Mismatch, "{err}");

    // Nothing changed: the optimizer still loads and steps.
    opt.load_state_shards(&[blob]).unwrap();
    let (ga, gb) = (grads(2, 301), grads(3, 37));
    assert_eq!(
        opt.step(&[GradSlice::f32(&ga), GradSlice::f32(&gb)])
            .unwrap()
            .step,
        3
    );
}

#[test]
fn memory_usage_reports_the_state_dsopt_holds() {
    let mut w = vec![0.5f32; 1000];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAMW_ZERO2, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    let before = opt.memory_usage().unwrap();
    opt.step(&[GradSlice::f32(&grads(0, 1000))]).unwrap();
    let usage = opt.memory_usage().unwrap();
    // At least the two fp32 moments of every element on one rank.
    assert!(
        usage.host >= 8 * 1000,
        "{usage:?} (before the step: {before:?})"
    );
    assert_eq!(usage.device, 0, "a CPU optimizer holds no device memory");
    // Of which the state: the two fp32 moments of the 1000 elements (fp32
    // parameters are their own masters).
    let state = opt.state_memory_usage().unwrap();
    assert_eq!(state, MemoryUsage { host: 8 * 1000, device: 0 });
}

// ---- gradients handed over one parameter at a time (grad_ready) -------------------

const ADAMW_ZERO2_SMALL: &str = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 64, "allgather_bucket_size": 48}}"#;
const ADAMW_ACCUMULATE2: &str = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 64, "allgather_bucket_size": 48},
    "gradient_accumulation_steps": 2}"#;

/// `steps` steps over two parameters (301 and 37 elements), gradients from
/// `grads`; `hand_over` hands them over in reverse order through one
/// scratch buffer, then completes the step, instead of `step`.
fn run_handed_over(config: &str, hand_over: bool, steps: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(
        config,
        [ParamSlice::f32(&mut a), ParamSlice::f32(&mut b)],
        &mut comm,
    )
    .unwrap();
    let mut scratch = vec![f32::NAN; 301];
    for s in 0..steps {
        let (ga, gb) = (grads(s, 301), grads(s + 1, 37));
        let info = if hand_over {
            scratch[..37].copy_from_slice(&gb);
            opt.grad_ready(1, GradSlice::f32(&scratch[..37])).unwrap();
            scratch.copy_from_slice(&ga); // dsopt has read the previous gradient
            opt.grad_ready(0, GradSlice::f32(&scratch)).unwrap();
            scratch.fill(f32::NAN);
            opt.complete_step().unwrap()
        } else {
            opt.step(&[GradSlice::f32(&ga), GradSlice::f32(&gb)])
                .unwrap()
        };
        assert_eq!((info.step, info.skipped), (s as i64 + 1, false));
    }
    drop(opt);
    (a, b)
}

#[test]
fn handed_over_gradients_step_bit_identically_to_step() {
    for config in [ADAMW, ADAMW_ZERO2_SMALL] {
        let want = run_handed_over(config, false, 5);
        assert_eq!(run_handed_over(config, true, 5), want, "{config}");
    }
}

#[test]
fn accumulated_micro_batches_step_with_their_mean() {
    // Two micro-batches per step, handed over as they come; the reference
    // steps with their mean (exact: a sum of two fp32 values halved).
    let (mut a, mut b) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let (mut ra, mut rb) = (a.clone(), b.clone());
    let mut comm = Communicator::local().unwrap();
    let mut ref_comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(
        ADAMW_ACCUMULATE2,
        [ParamSlice::f32(&mut a), ParamSlice::f32(&mut b)],
        &mut comm,
    )
    .unwrap();
    let mut reference = Optimizer::new(
        ADAMW_ZERO2_SMALL,
        [ParamSlice::f32(&mut ra), ParamSlice::f32(&mut rb)],
        &mut ref_comm,
    )
    .unwrap();
    for s in 0..4 {
        let micro = [
            (grads(2 * s, 301), grads(2 * s + 5, 37)),
            (grads(2 * s + 1, 301), grads(2 * s + 6, 37)),
        ];
        for (ga, gb) in &micro {
            opt.grad_ready(1, GradSlice::f32(gb)).unwrap();
            opt.grad_ready(0, GradSlice::f32(ga)).unwrap();
        }
        let mean = |x: &[f32], y: &[f32]| -> Vec<f32> {
            x.iter().zip(y).map(|(p, q)| (p + q) * 0.5).collect()
        };
        let ma = mean(&micro[0].0, &micro[1].0);
        let mb = mean(&micro[0].1, &micro[1].1);
        let info = opt.complete_step().unwrap();
        let want = reference
            .step(&[GradSlice::f32(&ma), GradSlice::f32(&mb)])
            .unwrap();
        assert_eq!((info.step, info.skipped), (want.step, want.skipped));
        assert_eq!(opt.params()[0].as_f32(), reference.params()[0].as_f32());
        assert_eq!(opt.params()[1].as_f32(), reference.params()[1].as_f32());
    }
}

#[test]
fn misused_grad_ready_is_invalid_argument_and_changes_nothing() {
    let (mut a, mut b) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(
        ADAMW_ACCUMULATE2,
        [ParamSlice::f32(&mut a), ParamSlice::f32(&mut b)],
        &mut comm,
    )
    .unwrap();
    let (ga, gb) = (grads(0, 301), grads(1, 37));
    let invalid = |r: dsopt::Result<()>, what: &str| {
        let err = r.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err}");
    };
    invalid(opt.grad_ready(2, GradSlice::f32(&gb)), "index out of range");
    invalid(
        opt.grad_ready(usize::MAX, GradSlice::f32(&gb)),
        "index beyond i64",
    );
    invalid(opt.grad_ready(0, GradSlice::f32(&gb)), "wrong length");
    opt.grad_ready(1, GradSlice::f32(&gb)).unwrap();
    let err = opt
        .step(&[GradSlice::f32(&ga), GradSlice::f32(&gb)])
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidArgument,
        "step while handed over: {err}"
    );
    opt.grad_ready(0, GradSlice::f32(&ga)).unwrap();
    opt.grad_ready(1, GradSlice::f32(&gb)).unwrap();
    opt.grad_ready(0, GradSlice::f32(&ga)).unwrap();
    invalid(
        opt.grad_ready(0, GradSlice::f32(&ga)),
        "a third hand-over (G = 2)",
    );
    assert_eq!(opt.complete_step().unwrap().step, 1);
    let after = opt.params()[0].as_f32().unwrap().to_vec();
    drop(opt);

    // The same step without the mistakes: the mean of two equal gradients.
    let (mut ra, mut rb) = (vec![0.5f32; 301], vec![-0.25f32; 37]);
    let mut comm = Communicator::local().unwrap();
    let mut reference = Optimizer::new(
        ADAMW_ZERO2_SMALL,
        [ParamSlice::f32(&mut ra), ParamSlice::f32(&mut rb)],
        &mut comm,
    )
    .unwrap();
    reference
        .step(&[GradSlice::f32(&ga), GradSlice::f32(&gb)])
        .unwrap();
    assert_eq!(reference.params()[0].as_f32().unwrap(), &after[..]);
}

#[test]
fn an_absent_gradient_leaves_adam_parameters_and_their_step_count_alone() {
    let (mut w, mut b) = (vec![0.5f32, -1.5, 2.0], vec![0.25f32; 2]);
    let mut comm = Communicator::local().unwrap();
    let config = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}}"#;
    let mut opt = Optimizer::new(
        config,
        [ParamSlice::f32(&mut w), ParamSlice::f32(&mut b)],
        &mut comm,
    )
    .unwrap();
    opt.step(&[GradSlice::f32(&[0.3, -0.2, 0.1]), GradSlice::f32(&[1.0, -1.0])])
        .unwrap();
    let frozen: Vec<f32> = opt.params()[1].as_f32().unwrap().to_vec();
    let m_before = opt.state_view(1, "exp_avg").unwrap().values.to_vec();
    for _ in 0..3 {
        opt.step(&[GradSlice::f32(&[0.3, -0.2, 0.1]), GradSlice::absent()])
            .unwrap();
    }
    assert_eq!(opt.params()[1].as_f32().unwrap(), &frozen[..]);
    assert_eq!(opt.state_view(1, "exp_avg").unwrap().values, &m_before[..]);
    assert_eq!(opt.param_step(0).unwrap(), 4);
    assert_eq!(opt.param_step(1).unwrap(), 1);
}

#[test]
fn group_params_state_views_and_param_steps_round_trip() {
    let mut w = vec![0.5f32, -1.5, 2.0, 4.0];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(ADAM, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    opt.set_group_param(0, "beta1", 0.8).unwrap();
    assert_eq!(opt.group_param(0, "beta1").unwrap(), 0.8);
    let err = opt.set_group_param(0, "beta1", 1.5).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(opt.group_param(0, "beta1").unwrap(), 0.8);
    assert_eq!(
        opt.group_param(0, "momentum").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    opt.step(&[GradSlice::f32(&[1.0, -2.0, 0.5, 0.25])]).unwrap();
    // m = (1 - beta1) g after one step
    let m = opt.state_view(0, "exp_avg").unwrap();
    assert_eq!(m.offset, 0);
    assert_eq!(m.param_numel, 4);
    let expected: Vec<f32> = [1.0f32, -2.0, 0.5, 0.25].iter().map(|g| (1.0f32 - 0.8) * g).collect();
    assert_eq!(m.values, &expected[..]);
    opt.state_view_mut(0, "exp_avg").unwrap().values[0] = 7.0;
    assert_eq!(opt.state_view(0, "exp_avg").unwrap().values[0], 7.0);
    assert!(opt.state_names().unwrap().contains(&"exp_avg_sq".to_string()));
    opt.set_param_step(0, 10).unwrap();
    assert_eq!(opt.param_step(0).unwrap(), 10);
    assert_eq!(opt.set_param_step(0, -1).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn group_param_names_are_the_algorithms() {
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter().map(|(n, k)| (n.to_string(), k.to_string())).collect()
    };
    let adam = pairs(&[("lr", "lr"), ("beta1", "betas"), ("beta2", "betas"), ("eps", "eps"),
                       ("weight_decay", "weight_decay")]);
    assert_eq!(dsopt::group_param_names("AdamW").unwrap(), adam);
    assert_eq!(dsopt::group_param_names("onebitadam").unwrap(), adam);
    assert_eq!(
        dsopt::group_param_names("Lion").unwrap(),
        pairs(&[("lr", "lr"), ("beta1", "betas"), ("beta2", "betas"), ("weight_decay", "weight_decay")])
    );
    assert_eq!(
        dsopt::group_param_names("NoSuchOptimizer").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let mut w = vec![0.5f32, -1.5];
    let mut comm = Communicator::local().unwrap();
    let mut lion = Optimizer::new(r#"{"optimizer": {"type": "Lion"}}"#, [ParamSlice::f32(&mut w)],
                                  &mut comm)
        .unwrap();
    assert_eq!(lion.set_group_param(0, "eps", 1e-6).unwrap_err().kind(), ErrorKind::InvalidArgument);
    lion.set_group_param(0, "beta2", 0.9).unwrap();
    assert_eq!(lion.group_param(0, "beta2").unwrap(), 0.9);
}

#[test]
fn rebind_params_moves_the_run_to_new_buffers_bit_identically() {
    let n = 29;
    let (mut still, mut first) = (vec![0.5f32; n], vec![0.5f32; n]);
    let (mut second, mut short) = (vec![0.0f32; n], vec![0.0f32; n - 1]);
    let mut comm_a = Communicator::local().unwrap();
    let mut comm_b = Communicator::local().unwrap();
    let mut a = Optimizer::new(ADAM, [ParamSlice::f32(&mut still)], &mut comm_a).unwrap();
    let mut b = Optimizer::new(ADAM, [ParamSlice::f32(&mut first)], &mut comm_b).unwrap();
    let step_both = |a: &mut Optimizer, b: &mut Optimizer, s: usize| {
        let g = grads(s, n);
        let (x, y) = (
            a.step(&[GradSlice::f32(&g)]).unwrap(),
            b.step(&[GradSlice::f32(&g)]).unwrap(),
        );
        assert!(
            !x.grads_replicated && !y.grads_replicated,
            "one rank reports nothing"
        );
    };
    for s in 0..3 {
        step_both(&mut a, &mut b, s);
    }
    second.copy_from_slice(b.params()[0].as_f32().unwrap());
    let old = b.rebind_params([ParamSlice::f32(&mut second)]).unwrap();
    let frozen = old[0].as_f32().unwrap().to_vec();
    for s in 3..6 {
        step_both(&mut a, &mut b, s);
    }
    assert_eq!(a.params()[0].as_f32(), b.params()[0].as_f32());
    assert_eq!(
        old[0].as_f32().unwrap(),
        &frozen[..],
        "the old buffer is left alone"
    );
    assert_eq!(a.state_save().unwrap(), b.state_save().unwrap());

    let err = b.rebind_params([ParamSlice::f32(&mut short)]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("numel"), "{err}");
    step_both(&mut a, &mut b, 6);
    assert_eq!(
        a.params()[0].as_f32(),
        b.params()[0].as_f32(),
        "still on the rebound buffer"
    );
}

#[test]
fn state_load_ex_reports_no_reset_at_one_rank() {
    let mut w = vec![0.25f32; 8];
    let mut comm = Communicator::local().unwrap();
    let config = r#"{"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}}}"#;
    let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    for s in 0..3 {
        opt.step(&[GradSlice::f32(&grads(s, 8))]).unwrap();
    }
    let blob = opt.state_save().unwrap();
    assert!(!opt.state_load_ex(&blob, true).unwrap());
    assert!(!opt.state_load_ex(&blob, false).unwrap());
    let err = opt
        .state_load_ex(&blob[..blob.len() - 1], true)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CorruptState);
}

#[test]
fn config_is_canonical_and_round_trips() {
    let canonical = dsopt::canonical_config(r#"{"optimizer": {"type": "adamw"}}"#).unwrap();
    assert!(canonical.contains(r#""type":"AdamW""#), "{canonical}");
    assert!(canonical.contains(r#""lr":0.001"#), "{canonical}");
    let mut w = vec![1.0f32; 4];
    let mut comm = Communicator::local().unwrap();
    let mut opt = Optimizer::new(&canonical, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    assert_eq!(opt.config().unwrap(), canonical);
    opt.set_lr(0.5).unwrap();
    assert!(opt.config().unwrap().contains(r#""lr":0.5"#));
    let err = dsopt::canonical_config(r#"{"optimizer": {"type": "Adagrad"}}"#).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn deferred_allgather_calls_answer_at_one_rank() {
    let mut w = vec![1.0f32; 8];
    let mut comm = Communicator::local().unwrap();
    let config = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 2, "deferred_allgather": true, "allgather_bucket_size": 4}}"#;
    let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
    assert_eq!(opt.gather_buckets().unwrap(), 0, "one rank gathers nothing");
    assert_eq!(opt.gather_bucket_of(0).unwrap(), -1);
    opt.step(&[GradSlice::f32(&grads(0, 8))]).unwrap();
    assert_eq!(opt.gathers_pending().unwrap(), 0);
    opt.wait_gather(Some(0)).unwrap();
    opt.wait_gather(None).unwrap();
    opt.wait_gather_bucket(None).unwrap();
    let err = opt.wait_gather(Some(1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(opt.params()[0].as_f32().unwrap().iter().any(|&x| x != 1.0), "the step updated");
}

#[test]
fn a_gather_order_is_checked_and_changes_no_value() {
    let config = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 2, "deferred_allgather": true}}"#;
    let (mut a, mut b) = (vec![1.0f32; 8], vec![1.0f32; 8]);
    let (mut x, mut y) = (vec![-0.5f32; 5], vec![-0.5f32; 5]);
    let mut comm = Communicator::local().unwrap();
    let mut ordered =
        Optimizer::new(config, [ParamSlice::f32(&mut a), ParamSlice::f32(&mut x)], &mut comm).unwrap();
    let mut comm2 = Communicator::local().unwrap();
    let mut plain =
        Optimizer::new(config, [ParamSlice::f32(&mut b), ParamSlice::f32(&mut y)], &mut comm2).unwrap();
    ordered.set_gather_order(&[1, 0]).unwrap();
    for bad in [&[0usize][..], &[0, 0], &[1, 2], &[0, 1, 2]] {
        let err = ordered.set_gather_order(bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
    assert_eq!(ordered.gather_bucket_of(1).unwrap(), -1, "one rank gathers nothing");
    for k in 0..3 {
        let (g0, g1) = (grads(k, 8), grads(k + 7, 5));
        let g = [GradSlice::f32(&g0), GradSlice::f32(&g1)];
        ordered.step(&g).unwrap();
        plain.step(&g).unwrap();
    }
    ordered.set_gather_order(&[]).unwrap();
    assert_eq!(ordered.params()[0].as_f32().unwrap(), plain.params()[0].as_f32().unwrap());
    assert_eq!(ordered.params()[1].as_f32().unwrap(), plain.params()[1].as_f32().unwrap());
    assert_eq!(ordered.state_save().unwrap(), plain.state_save().unwrap());
}

#[test]
fn node_and_rail_communicators_are_kept_and_handed_back() {
    let mut comm = Communicator::local().unwrap();
    comm.set_nodes(Communicator::local().unwrap(), Communicator::local().unwrap())
        .unwrap();
    {
        let mut w = vec![0.25f32; 8];
        let config = r#"{"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}},
                         "topology": {"hierarchy": "node_aware"}}"#;
        let mut opt = Optimizer::new(config, [ParamSlice::f32(&mut w)], &mut comm).unwrap();
        for s in 0..3 {
            opt.step(&[GradSlice::f32(&grads(s, 8))]).unwrap();
        }
    }
    let (node, rail) = comm.clear_nodes().expect("the communicators given");
    assert_eq!((node.size(), rail.size()), (1, 1));
    assert!(comm.clear_nodes().is_none());
}
