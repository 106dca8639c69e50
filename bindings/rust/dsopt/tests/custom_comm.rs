//! Custom communicators (`Communicator::custom`): an in-process world of
//! P ranks over threads, each rank's collectives a `Collectives`
//! implementation that exchanges bytes through shared slots.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use dsopt::{
    Buffer, BufferMut, CollectiveResult, Collectives, Communicator, ErrorKind, GradSlice,
    Optimizer, ParamSlice, ReduceOp, StepInfo, PHASE_COMPRESSED, PHASE_FULL,
};

// ---- an in-process world over threads -------------------------------------------

/// The state the ranks of one world share: one slot per rank for the
/// collective in progress, a reusable barrier, and the first failure.
struct World {
    size: usize,
    timeout: Duration,
    round: Mutex<Round>,
    turn: Condvar,
}

struct Round {
    slots: Vec<Vec<u8>>,
    arrived: usize,
    generation: u64,
    failed: Option<String>,
}

impl World {
    fn new(size: usize, timeout: Duration) -> Arc<World> {
        Arc::new(World {
            size,
            timeout,
            round: Mutex::new(Round {
                slots: vec![Vec::new(); size],
                arrived: 0,
                generation: 0,
                failed: None,
            }),
            turn: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        self.round
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks the world failed: every rank's collective, waiting or to come,
    /// returns an error with `text`.
    fn fail(&self, text: String) {
        let mut round = self.lock();
        round.failed.get_or_insert(text);
        self.turn.notify_all();
    }

    /// Waits for every rank; fails when a rank failed or after the timeout
    /// (which fails the world for the others too).
    fn barrier<'w>(
        &'w self,
        mut round: MutexGuard<'w, Round>,
        rank: usize,
    ) -> Result<MutexGuard<'w, Round>, String> {
        let generation = round.generation;
        round.arrived += 1;
        if round.arrived == self.size {
            round.arrived = 0;
            round.generation += 1;
            self.turn.notify_all();
            return Ok(round);
        }
        let deadline = Instant::now() + self.timeout;
        while round.generation == generation {
            if let Some(text) = &round.failed {
                return Err(format!("rank {rank}: another rank failed: {text}"));
            }
            let now = Instant::now();
            if now >= deadline {
                let text = format!("rank {rank} timed out after {:?}", self.timeout);
                round.failed.get_or_insert(text.clone());
                self.turn.notify_all();
                return Err(text);
            }
            round = self
                .turn
                .wait_timeout(round, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        Ok(round)
    }

    /// Every rank's `bytes`, in rank order.
    fn exchange(&self, rank: usize, bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let mut round = self.lock();
        if let Some(text) = &round.failed {
            return Err(format!("rank {rank}: another rank failed: {text}"));
        }
        round.slots[rank] = bytes.to_vec();
        let round = self.barrier(round, rank)?;
        let all = round.slots.clone();
        // Nobody writes the next collective's slot before all have read.
        drop(self.barrier(round, rank)?);
        Ok(all)
    }
}

/// What the test makes a rank's next collective do.
#[derive(Default)]
struct Faults {
    fail_next: AtomicBool,
    panic_next: AtomicBool,
}

/// One rank's collectives over a `World`.
struct ThreadComm {
    world: Arc<World>,
    rank: usize,
    faults: Arc<Faults>,
    calls: Arc<AtomicUsize>,
    concurrent: bool,
}

/// Fails the world if the collective it guards unwinds (a panic), so that
/// the other ranks fail at once instead of waiting for the timeout.
struct FailOnPanic<'w>(&'w World, usize);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.fail(format!("rank {} panicked", self.1));
        }
    }
}

impl ThreadComm {
    /// Every rank's send bytes, after the injected faults.
    fn exchange(&self, send: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let _guard = FailOnPanic(&self.world, self.rank);
        if self.faults.panic_next.swap(false, Ordering::Relaxed) {
            panic!("injected panic on rank {}", self.rank);
        }
        if self.faults.fail_next.swap(false, Ordering::Relaxed) {
            let text = format!("injected failure on rank {}", self.rank);
            self.world.fail(text.clone());
            return Err(text);
        }
        self.world.exchange(self.rank, send)
    }
}

impl Collectives for ThreadComm {
    fn rank(&self) -> i32 {
        self.rank as i32
    }

    fn size(&self) -> i32 {
        self.world.size as i32
    }

    fn allreduce(&mut self, mut data: BufferMut<'_>, op: ReduceOp) -> CollectiveResult {
        let all = self.exchange(data.as_bytes())?;
        data.as_bytes_mut().copy_from_slice(&all[0]);
        for bytes in &all[1..] {
            data.reduce_bytes(bytes, op)?;
        }
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        send: Buffer<'_>,
        mut recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> CollectiveResult {
        let block = recv.as_bytes().len();
        let mine = self.rank * block..(self.rank + 1) * block;
        let all = self.exchange(send.as_bytes())?;
        recv.as_bytes_mut().copy_from_slice(&all[0][mine.clone()]);
        for bytes in &all[1..] {
            recv.reduce_bytes(&bytes[mine.clone()], op)?;
        }
        Ok(())
    }

    fn allgather(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
        let all = self.exchange(send.as_bytes())?;
        for (block, bytes) in recv
            .as_bytes_mut()
            .chunks_mut(send.as_bytes().len())
            .zip(&all)
        {
            block.copy_from_slice(bytes);
        }
        Ok(())
    }

    fn alltoall(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
        let block = send.as_bytes().len() / self.world.size;
        let mine = self.rank * block..(self.rank + 1) * block;
        let all = self.exchange(send.as_bytes())?;
        for (block, bytes) in recv.as_bytes_mut().chunks_mut(block).zip(&all) {
            block.copy_from_slice(&bytes[mine.clone()]);
        }
        Ok(())
    }

    fn concurrent(&self) -> bool {
        self.concurrent
    }
}

// ---- runs -------------------------------------------------------------------------

const ADAMW: &str =
    r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}}"#;
const ADAMW_ZERO2: &str = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 256}}"#;
const ONEBIT: &str =
    r#"{"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}}}"#;

/// Parameter lengths: one uneven, so that shards and blocks do not divide.
const LENS: [usize; 2] = [1000, 37];
const STEPS: usize = 8;

/// Rank `rank`'s gradient of parameter `param` at `step`: multiples of 1/8
/// in [-1, 1], so that sums over up to 4 ranks, and their mean, are exact.
fn grad(rank: usize, param: usize, step: usize) -> Vec<f32> {
    (0..LENS[param])
        .map(|i| ((i * 7 + step * 3 + rank * 5 + param * 11) % 17) as f32 / 8.0 - 1.0)
        .collect()
}

fn initial(param: usize) -> Vec<f32> {
    (0..LENS[param])
        .map(|i| (i % 13) as f32 * 0.05 - 0.3)
        .collect()
}

/// What one rank ended with: its parameters and every step's info, or the
/// error of the step that failed.
struct RankRun {
    params: Vec<Vec<f32>>,
    infos: Vec<StepInfo>,
    error: Option<dsopt::Error>,
}

/// `steps` steps of `config` on `comm` with `grads(step)`; stops at the
/// first error. `before_step(step)` runs before each step (to inject a
/// fault).
fn train(
    comm: &mut Communicator,
    config: &str,
    steps: usize,
    grads: impl Fn(usize) -> Vec<Vec<f32>>,
    before_step: impl Fn(usize),
) -> RankRun {
    let mut params: Vec<Vec<f32>> = (0..LENS.len()).map(initial).collect();
    let mut infos = Vec::new();
    let mut error = None;
    {
        let slices = params.iter_mut().map(|p| ParamSlice::f32(p));
        let mut opt = Optimizer::new(config, slices, comm).expect("Optimizer::new");
        for step in 0..steps {
            before_step(step);
            let g = grads(step);
            let slices: Vec<GradSlice<'_>> = g.iter().map(|g| GradSlice::f32(g)).collect();
            match opt.step(&slices) {
                Ok(info) => infos.push(info),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
    }
    RankRun {
        params,
        infos,
        error,
    }
}

/// The world's parts for one rank.
struct RankSetup {
    comm: ThreadComm,
    faults: Arc<Faults>,
}

fn world(size: usize, timeout: Duration) -> Vec<RankSetup> {
    let world = World::new(size, timeout);
    (0..size)
        .map(|rank| {
            let faults = Arc::new(Faults::default());
            RankSetup {
                comm: ThreadComm {
                    world: world.clone(),
                    rank,
                    faults: faults.clone(),
                    calls: Arc::new(AtomicUsize::new(0)),
                    concurrent: false,
                },
                faults,
            }
        })
        .collect()
}

/// Runs `steps` steps of `config` on `size` ranks, one thread each; rank r
/// steps with `grads(r, step)`, and `before_step(r, faults, step)` runs
/// before each step.
fn run_threads(
    size: usize,
    timeout: Duration,
    config: &str,
    steps: usize,
    grads: impl Fn(usize, usize) -> Vec<Vec<f32>> + Sync,
    before_step: impl Fn(usize, &Faults, usize) + Sync,
) -> Vec<RankRun> {
    let (grads, before_step) = (&grads, &before_step);
    thread::scope(|scope| {
        let handles: Vec<_> = world(size, timeout)
            .into_iter()
            .map(|setup| {
                scope.spawn(move || {
                    let rank = setup.comm.rank;
                    let faults = setup.faults;
                    let mut comm = Communicator::custom(setup.comm).expect("Communicator::custom");
                    assert_eq!((comm.rank(), comm.size()), (rank as i32, size as i32));
                    train(
                        &mut comm,
                        config,
                        steps,
                        |step| grads(rank, step),
                        |step| before_step(rank, &faults, step),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn all_grads(rank: usize, step: usize) -> Vec<Vec<f32>> {
    (0..LENS.len()).map(|p| grad(rank, p, step)).collect()
}

/// The mean over `size` ranks of `all_grads` (exact: see `grad`).
fn mean_grads(size: usize, step: usize) -> Vec<Vec<f32>> {
    (0..LENS.len())
        .map(|p| {
            let mut sum = vec![0.0f32; LENS[p]];
            for r in 0..size {
                sum.iter_mut()
                    .zip(grad(r, p, step))
                    .for_each(|(s, g)| *s += g);
            }
            sum.iter().map(|s| s / size as f32).collect()
        })
        .collect()
}

fn local_run(config: &str, steps: usize, grads: impl Fn(usize) -> Vec<Vec<f32>>) -> RankRun {
    let mut comm = Communicator::local().unwrap();
    train(&mut comm, config, steps, grads, |_| {})
}

fn no_faults(_rank: usize, _faults: &Faults, _step: usize) {}

const TIMEOUT: Duration = Duration::from_secs(60);

/// Bit patterns, so that -0.0 != 0.0 and NaN == NaN in comparisons.
fn bits(params: &[Vec<f32>]) -> Vec<Vec<u32>> {
    params
        .iter()
        .map(|p| p.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn assert_ranks_agree(runs: &[RankRun], steps: usize) {
    for (rank, run) in runs.iter().enumerate() {
        assert!(run.error.is_none(), "rank {rank}: {:?}", run.error);
        assert_eq!(run.infos.len(), steps, "rank {rank}");
        assert_eq!(
            bits(&run.params),
            bits(&runs[0].params),
            "rank {rank} differs from rank 0"
        );
    }
}

// ---- tests ------------------------------------------------------------------------

#[test]
fn ranks_with_different_gradients_step_like_one_rank_with_their_mean() {
    for config in [ADAMW, ADAMW_ZERO2] {
        for size in [2, 4] {
            let runs = run_threads(size, TIMEOUT, config, STEPS, all_grads, no_faults);
            assert_ranks_agree(&runs, STEPS);
            let local = local_run(config, STEPS, |step| mean_grads(size, step));
            assert_eq!(
                bits(&runs[0].params),
                bits(&local.params),
                "{size} ranks, {config}"
            );
            assert!(runs[0].infos.iter().all(|i| i.phase == PHASE_FULL));
            assert!(runs[0].infos.iter().all(|i| i.bytes_sent > 0));
            assert_ne!(
                bits(&runs[0].params),
                bits(&(0..2).map(initial).collect::<Vec<_>>())
            );
        }
    }
}

#[test]
fn ranks_with_the_same_gradients_step_like_one_rank() {
    for size in [2, 4] {
        let same = |_rank, step| all_grads(0, step);
        let runs = run_threads(size, TIMEOUT, ADAMW, STEPS, same, no_faults);
        assert_ranks_agree(&runs, STEPS);
        let local = local_run(ADAMW, STEPS, |step| all_grads(0, step));
        assert_eq!(bits(&runs[0].params), bits(&local.params), "{size} ranks");
    }
}

#[test]
fn onebit_adam_runs_its_compressed_stage_over_threads() {
    for size in [2, 4] {
        let runs = run_threads(size, TIMEOUT, ONEBIT, STEPS, all_grads, no_faults);
        assert_ranks_agree(&runs, STEPS);
        let phases: Vec<i32> = runs[0].infos.iter().map(|i| i.phase).collect();
        let mut expected = vec![PHASE_FULL; 2];
        expected.resize(STEPS, PHASE_COMPRESSED);
        assert_eq!(phases, expected, "{size} ranks");
        assert!(runs[0].params.iter().flatten().all(|x| x.is_finite()));

        // The warmup is full-precision Adam: like one rank with the mean.
        // (The compressed stage has no such reference: each rank compresses
        // its own block of the momentum with its own scale.)
        let warmup = run_threads(size, TIMEOUT, ONEBIT, 2, all_grads, no_faults);
        assert_ranks_agree(&warmup, 2);
        let local = local_run(ONEBIT, 2, |step| mean_grads(size, step));
        assert_eq!(bits(&warmup[0].params), bits(&local.params), "{size} ranks");

        // Compressed steps send about 1 bit per element instead of 32.
        let full = runs[0].infos[0].bytes_sent;
        let compressed = runs[0].infos[STEPS - 1].bytes_sent;
        assert!(compressed * 8 < full, "{compressed} vs {full} bytes");
    }
}

#[test]
fn handed_over_gradients_step_like_one_rank_through_a_concurrent_communicator() {
    let config = r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 256}}"#;
    let size = 2;
    let runs: Vec<(Vec<Vec<f32>>, usize)> = thread::scope(|scope| {
        let handles: Vec<_> = world(size, TIMEOUT)
            .into_iter()
            .map(|mut setup| {
                setup.comm.concurrent = true;
                let (rank, calls) = (setup.comm.rank, setup.comm.calls.clone());
                scope.spawn(move || {
                    let mut comm = Communicator::custom(setup.comm).unwrap();
                    let mut params: Vec<Vec<f32>> = (0..LENS.len()).map(initial).collect();
                    {
                        let slices = params.iter_mut().map(|p| ParamSlice::f32(p));
                        let mut opt = Optimizer::new(config, slices, &mut comm).unwrap();
                        for step in 0..STEPS {
                            // Backward's order: the last parameter first.
                            for (i, g) in all_grads(rank, step).iter().enumerate().rev() {
                                opt.grad_ready(i, GradSlice::f32(g)).unwrap();
                            }
                            opt.complete_step().unwrap();
                        }
                    }
                    (params, calls.load(Ordering::Relaxed))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let local = local_run(ADAMW, STEPS, |step| mean_grads(size, step));
    for (rank, (params, calls)) in runs.iter().enumerate() {
        assert_eq!(bits(params), bits(&local.params), "rank {rank}");
        assert!(*calls > STEPS, "rank {rank}: {calls} collectives");
    }
}

/// Every rank's error of a run where `inject` makes rank 1's collective
/// misbehave at step 2.
fn failed_runs(size: usize, timeout: Duration, inject: fn(&Faults)) -> Vec<dsopt::Error> {
    let runs = run_threads(
        size,
        timeout,
        ADAMW,
        STEPS,
        all_grads,
        |rank, faults, step| {
            if rank == 1 && step == 2 {
                inject(faults)
            }
        },
    );
    runs.into_iter()
        .enumerate()
        .map(|(rank, run)| {
            assert_eq!(run.infos.len(), 2, "rank {rank} stepped until the failure");
            run.error
                .unwrap_or_else(|| panic!("rank {rank} did not fail"))
        })
        .collect()
}

#[test]
fn a_collective_error_fails_the_step_on_every_rank() {
    for size in [2, 4] {
        let started = Instant::now();
        let errors = failed_runs(size, TIMEOUT, |f| {
            f.fail_next.store(true, Ordering::Relaxed)
        });
        for (rank, err) in errors.iter().enumerate() {
            assert_eq!(err.kind(), ErrorKind::Comm, "rank {rank}: {err}");
            assert!(
                err.message().contains("injected failure on rank 1"),
                "rank {rank}: {err}"
            );
        }
        // The others learned of it from the shared flag, not the timeout.
        assert!(started.elapsed() < TIMEOUT / 2);
    }
}

#[test]
fn a_panicking_collective_fails_the_step_on_every_rank() {
    for size in [2, 4] {
        let errors = failed_runs(size, TIMEOUT, |f| {
            f.panic_next.store(true, Ordering::Relaxed)
        });
        for (rank, err) in errors.iter().enumerate() {
            assert_eq!(err.kind(), ErrorKind::Comm, "rank {rank}: {err}");
            let expected = if rank == 1 {
                "injected panic on rank 1"
            } else {
                "rank 1 panicked"
            };
            assert!(err.message().contains(expected), "rank {rank}: {err}");
        }
        assert!(errors[1].message().contains("panicked"), "{}", errors[1]);
    }
}

#[test]
fn a_rank_that_never_comes_fails_the_others_by_timeout() {
    // Rank 1 of 2 never creates its communicator: rank 0's creation times out.
    let mut setups = world(2, Duration::from_millis(300));
    drop(setups.pop());
    let setup = setups.pop().unwrap();
    let mut comm = Communicator::custom(setup.comm).unwrap();
    let mut w = vec![0.0f32; 8];
    let err = Optimizer::new(ADAMW, [ParamSlice::f32(&mut w)], &mut comm).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Comm, "{err}");
    assert!(err.message().contains("timed out"), "{err}");
}

/// Counts drops of the collectives it is part of.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// One rank alone, with a fixed rank and size to report.
struct Alone {
    rank: i32,
    size: i32,
    _dropped: Dropped,
}

impl Collectives for Alone {
    fn rank(&self) -> i32 {
        self.rank
    }
    fn size(&self) -> i32 {
        self.size
    }
    fn allreduce(&mut self, _data: BufferMut<'_>, _op: ReduceOp) -> CollectiveResult {
        Ok(())
    }
    fn reduce_scatter(
        &mut self,
        send: Buffer<'_>,
        mut recv: BufferMut<'_>,
        _op: ReduceOp,
    ) -> CollectiveResult {
        recv.copy_from(send)
    }
    fn allgather(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
        recv.copy_from(send)
    }
    fn alltoall(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
        recv.copy_from(send)
    }
}

#[test]
fn the_communicator_owns_its_collectives() {
    let drops = Arc::new(AtomicUsize::new(0));
    let alone = |rank, size| Alone {
        rank,
        size,
        _dropped: Dropped(drops.clone()),
    };

    let comm = Communicator::custom(alone(0, 1)).unwrap();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(comm);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "dropped with the communicator"
    );

    for (rank, size) in [(1, 1), (-1, 2), (0, 0)] {
        let err = Communicator::custom(alone(rank, size)).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidArgument,
            "rank {rank} size {size}"
        );
    }
    assert_eq!(
        drops.load(Ordering::SeqCst),
        4,
        "dropped when creation fails"
    );
}

#[test]
fn a_one_rank_custom_communicator_steps_like_the_local_one() {
    let custom = {
        let mut comm = Communicator::custom(Alone {
            rank: 0,
            size: 1,
            _dropped: Dropped(Arc::new(AtomicUsize::new(0))),
        })
        .unwrap();
        train(&mut comm, ADAMW, STEPS, |step| all_grads(0, step), |_| {})
    };
    let local = local_run(ADAMW, STEPS, |step| all_grads(0, step));
    assert!(custom.error.is_none(), "{:?}", custom.error);
    assert_eq!(bits(&custom.params), bits(&local.params));
}

#[test]
fn the_communicator_moves_to_another_thread() {
    let setups = world(1, TIMEOUT);
    let comm = Communicator::custom(setups.into_iter().next().unwrap().comm).unwrap();
    let size = thread::spawn(move || comm.size()).join().unwrap();
    assert_eq!(size, 1);
}

#[test]
fn buffers_reduce_typed_values_and_bytes() {
    let mut acc = [1.0f32, f32::NAN, -2.0, 3.0];
    let other = [2.0f32, 1.0, -1.0, f32::NAN];
    let mut buf = BufferMut::from(&mut acc[..]);
    buf.reduce(Buffer::from(&other[..]), ReduceOp::Max).unwrap();
    assert_eq!(acc[0], 2.0);
    assert!(acc[1].is_nan() && acc[3].is_nan(), "NaN wins a maximum");
    assert_eq!(acc[2], -1.0);

    let mut sum = [i64::MAX, 5];
    let bytes: Vec<u8> = [1i64, -7].iter().flat_map(|x| x.to_ne_bytes()).collect();
    // At an odd offset: bytes from a transport need no alignment.
    let unaligned = [&[0u8][..], &bytes].concat();
    let mut buf = BufferMut::from(&mut sum[..]);
    buf.reduce_bytes(&unaligned[1..], ReduceOp::Sum).unwrap();
    assert_eq!(sum, [i64::MIN, -2], "integer sums wrap");

    let mut short = [0i32; 2];
    let mut buf = BufferMut::from(&mut short[..]);
    assert!(buf
        .reduce(Buffer::from(&[1i32][..]), ReduceOp::Sum)
        .is_err());
    assert!(buf
        .reduce(Buffer::from(&[1.0f32, 2.0][..]), ReduceOp::Sum)
        .is_err());
    assert!(buf.reduce_bytes(&[0u8; 7], ReduceOp::Sum).is_err());
    assert_eq!(buf.slice_mut(1..2).len(), 1);
    assert_eq!(
        Buffer::from(&[1u8, 2, 3][..]).slice(1..3).as_bytes(),
        &[2, 3]
    );
}
