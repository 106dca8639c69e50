//! Data-parallel training over threads with a custom communicator: P
//! threads are the P ranks of one world, each holding 1/P of a linear
//! regression data set, and their collectives are this file's
//! `ThreadComm`, an implementation of `dsopt::Collectives` over shared
//! memory. dsopt averages the ranks' gradients through it, so every rank
//! steps with the gradient of the whole data set and all end with the same
//! parameters. AdamW first, then 1-bit Adam (warmup, then compressed
//! momentum).
//!
//! Prints the loss falling; exits non-zero unless each run ends below 5% of
//! its initial loss with the same parameters, bit for bit, on every rank.
//!
//!     cargo run --offline --release --bin threads [-- --ranks P --steps N]

use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use dsopt::{
    Buffer, BufferMut, CollectiveResult, Collectives, Communicator, GradSlice, Optimizer,
    ParamSlice, ReduceOp,
};

// ---- the communicator -------------------------------------------------------------

/// What the ranks of one world share: a slot per rank for the collective in
/// progress, a barrier, and the first failure (so that no rank waits for
/// one that is gone: dsopt needs collectives that fail rather than hang).
struct World {
    size: usize,
    state: Mutex<Round>,
    turn: Condvar,
}

struct Round {
    slots: Vec<Vec<u8>>,
    arrived: usize,
    generation: u64,
    failed: Option<String>,
}

const TIMEOUT: Duration = Duration::from_secs(30);

impl World {
    fn new(size: usize) -> Arc<World> {
        Arc::new(World {
            size,
            state: Mutex::new(Round {
                slots: vec![Vec::new(); size],
                arrived: 0,
                generation: 0,
                failed: None,
            }),
            turn: Condvar::new(),
        })
    }

    /// Waits for every rank, failing (and failing the world) after TIMEOUT.
    fn barrier<'w>(
        &'w self,
        mut round: MutexGuard<'w, Round>,
    ) -> Result<MutexGuard<'w, Round>, String> {
        let generation = round.generation;
        round.arrived += 1;
        if round.arrived == self.size {
            round.arrived = 0;
            round.generation += 1;
            self.turn.notify_all();
            return Ok(round);
        }
        let deadline = Instant::now() + TIMEOUT;
        while round.generation == generation {
            if let Some(text) = &round.failed {
                return Err(format!("another rank failed: {text}"));
            }
            let now = Instant::now();
            if now >= deadline {
                round.failed = Some("a rank timed out".into());
                self.turn.notify_all();
                return Err(format!("timed out after {TIMEOUT:?}"));
            }
            round = self.turn.wait_timeout(round, deadline - now).unwrap().0;
        }
        Ok(round)
    }

    /// Every rank's `bytes`, in rank order.
    fn exchange(&self, rank: usize, bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let mut round = self.state.lock().map_err(|_| "a rank panicked")?;
        round.slots[rank] = bytes.to_vec();
        let round = self.barrier(round)?;
        let all = round.slots.clone();
        drop(self.barrier(round)?); // nobody refills a slot before all have read
        Ok(all)
    }
}

/// One rank's collectives.
struct ThreadComm {
    world: Arc<World>,
    rank: usize,
}

impl Collectives for ThreadComm {
    fn rank(&self) -> i32 {
        self.rank as i32
    }

    fn size(&self) -> i32 {
        self.world.size as i32
    }

    fn allreduce(&mut self, mut data: BufferMut<'_>, op: ReduceOp) -> CollectiveResult {
        let all = self.world.exchange(self.rank, data.as_bytes())?;
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
        let n = recv.as_bytes().len();
        let mine = self.rank * n..(self.rank + 1) * n;
        let all = self.world.exchange(self.rank, send.as_bytes())?;
        recv.as_bytes_mut().copy_from_slice(&all[0][mine.clone()]);
        for bytes in &all[1..] {
            recv.reduce_bytes(&bytes[mine.clone()], op)?;
        }
        Ok(())
    }

    fn allgather(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
        let all = self.world.exchange(self.rank, send.as_bytes())?;
        recv.as_bytes_mut().copy_from_slice(&all.concat());
        Ok(())
    }

    fn alltoall(&mut self, send: Buffer<'_>, mut recv: BufferMut<'_>) -> CollectiveResult {
        let n = send.as_bytes().len() / self.world.size;
        let mine = self.rank * n..(self.rank + 1) * n;
        let all = self.world.exchange(self.rank, send.as_bytes())?;
        for (block, bytes) in recv.as_bytes_mut().chunks_mut(n).zip(&all) {
            block.copy_from_slice(&bytes[mine.clone()]);
        }
        Ok(())
    }
}

// ---- the model --------------------------------------------------------------------

const FEATURES: usize = 16;
const SAMPLES: usize = 2048;

/// y = X w* + 0.5 from a fixed linear congruential sequence; rank r holds
/// rows r, r + P, r + 2P, ...
struct Shard {
    x: Vec<f32>,
    y: Vec<f32>,
}

impl Shard {
    fn new(rank: usize, ranks: usize) -> Shard {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let w_true: Vec<f32> = (0..FEATURES).map(|_| next()).collect();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for i in 0..SAMPLES {
            let row: Vec<f32> = (0..FEATURES).map(|_| next()).collect();
            if i % ranks == rank {
                y.push(row.iter().zip(&w_true).map(|(a, b)| a * b).sum::<f32>() + 0.5);
                x.extend(row);
            }
        }
        Shard { x, y }
    }

    /// Mean squared error / 2 over this shard, and its gradients.
    fn loss_and_grads(&self, w: &[f32], b: f32, gw: &mut [f32], gb: &mut f32) -> f64 {
        gw.fill(0.0);
        *gb = 0.0;
        let mut loss = 0.0f64;
        for (row, &y) in self.x.chunks_exact(FEATURES).zip(&self.y) {
            let r = row.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() + b - y;
            loss += 0.5 * f64::from(r * r);
            gw.iter_mut().zip(row).for_each(|(g, &xi)| *g += r * xi);
            *gb += r;
        }
        let n = self.y.len() as f32;
        gw.iter_mut().for_each(|g| *g /= n);
        *gb /= n;
        loss / self.y.len() as f64
    }
}

/// What one rank ends with: first and last local loss, its parameters.
type RankResult = Result<(f64, f64, Vec<f32>), dsopt::Error>;

/// One rank: its own communicator and optimizer, trained on its shard.
fn rank_main(comm: ThreadComm, ranks: usize, config: &str, steps: usize) -> RankResult {
    let rank = comm.rank;
    let shard = Shard::new(rank, ranks);
    let mut comm = Communicator::custom(comm)?;
    let (mut w, mut b) = (vec![0.0f32; FEATURES], [0.0f32]);
    let (mut gw, mut gb) = (vec![0.0f32; FEATURES], [0.0f32]);
    let mut opt = Optimizer::new(
        config,
        [ParamSlice::f32(&mut w), ParamSlice::f32(&mut b)],
        &mut comm,
    )?;
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    for step in 0..steps {
        let loss = {
            let params = opt.params();
            let (w, b) = (params[0].as_f32().unwrap(), params[1].as_f32().unwrap()[0]);
            shard.loss_and_grads(w, b, &mut gw, &mut gb[0])
        };
        let info = opt.step(&[GradSlice::f32(&gw), GradSlice::f32(&gb)])?;
        if step == 0 {
            first = loss;
        }
        last = loss;
        if rank == 0 && (step % (steps / 5).max(1) == 0 || step + 1 == steps) {
            println!(
                "step {:4}  rank 0 loss {:10.6}  compressed {}  bytes sent {}",
                info.step, loss, info.compressed as u8, info.bytes_sent
            );
        }
    }
    drop(opt);
    w.push(b[0]);
    Ok((first, last, w))
}

fn arg(name: &str, default: usize) -> usize {
    match std::env::args().skip_while(|a| a != name).nth(1) {
        Some(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("{name} takes a number")),
        None => default,
    }
}

fn main() -> ExitCode {
    let (ranks, steps) = (arg("--ranks", 4), arg("--steps", 300));
    let runs = [
        (
            "AdamW".to_string(),
            r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.0}}}"#
                .to_string(),
        ),
        (
            "1-bit Adam".to_string(),
            format!(
                r#"{{"optimizer": {{"type": "OneBitAdam", "params": {{"lr": 0.05, "freeze_step": {}}}}}}}"#,
                steps / 5
            ),
        ),
    ];
    let mut ok = true;
    for (name, config) in &runs {
        println!("== {name} on {ranks} threads: {config}");
        let world = World::new(ranks);
        let results: Vec<RankResult> = thread::scope(|scope| {
            let handles: Vec<_> = (0..ranks)
                .map(|rank| {
                    let comm = ThreadComm {
                        world: world.clone(),
                        rank,
                    };
                    scope.spawn(move || rank_main(comm, ranks, config, steps))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank panicked"))
                .collect()
        });
        let mut params = Vec::new();
        for (rank, result) in results.into_iter().enumerate() {
            match result {
                Ok((first, last, p)) => {
                    let passed = last < 0.05 * first;
                    println!(
                        "rank {rank}: loss {first:.6} -> {last:.6} ({})",
                        if passed { "ok" } else { "FAILED" }
                    );
                    ok &= passed;
                    params.push(p);
                }
                Err(err) => {
                    eprintln!("rank {rank}: {err}");
                    ok = false;
                }
            }
        }
        let same = params.windows(2).all(|p| {
            p[0].iter()
                .map(|x| x.to_bits())
                .eq(p[1].iter().map(|x| x.to_bits()))
        });
        println!("parameters identical on every rank: {same}\n");
        ok &= same;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
