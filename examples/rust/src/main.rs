//! Linear regression on generated data, trained with dsopt from Rust: first
//! with Adam, then with AdamW under ZeRO stage 2 (sharded state; on one rank
//! it steps like stage 0), then with 1-bit Adam (a short warmup, then
//! compressed momentum), all on the local communicator. Each run reports the
//! memory dsopt holds and reloads its state blob with the resharding load.
//! Prints the loss falling and exits non-zero unless each run ends below 5%
//! of its initial loss.
//!
//!     cargo run --offline --release [-- --steps N]

use std::process::ExitCode;

use dsopt::{Communicator, GradSlice, Optimizer, ParamSlice};

const FEATURES: usize = 32;
const SAMPLES: usize = 1024;
const NOISE: f32 = 0.05;
const REQUIRED_LOSS_RATIO: f64 = 0.05;

/// xorshift64* with Box-Muller normals: a fixed data set without crates.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u1, u2) = (self.uniform().max(1e-300), self.uniform());
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

/// y = X w* + b* + noise, with features of different scales.
struct Data {
    x: Vec<f32>, // SAMPLES x FEATURES, row-major
    y: Vec<f32>,
}

impl Data {
    fn generate(seed: u64) -> Data {
        let mut rng = Rng(seed);
        let scale: Vec<f32> = (0..FEATURES).map(|j| 0.2 + 2.0 * (j % 5) as f32).collect();
        let w_true: Vec<f32> = (0..FEATURES).map(|_| rng.normal()).collect();
        let b_true = 0.7;
        let x: Vec<f32> = (0..SAMPLES * FEATURES)
            .map(|k| rng.normal() * scale[k % FEATURES])
            .collect();
        let y = (0..SAMPLES)
            .map(|i| {
                let row = &x[i * FEATURES..(i + 1) * FEATURES];
                dot(row, &w_true) + b_true + NOISE * rng.normal()
            })
            .collect();
        Data { x, y }
    }

    /// Mean squared error / 2 and its gradients with respect to w and b.
    fn loss_and_grads(&self, w: &[f32], b: f32, gw: &mut [f32], gb: &mut f32) -> f64 {
        gw.fill(0.0);
        *gb = 0.0;
        let mut loss = 0.0f64;
        for (row, &y) in self.x.chunks_exact(FEATURES).zip(&self.y) {
            let r = dot(row, w) + b - y;
            loss += 0.5 * f64::from(r * r);
            for (g, &xi) in gw.iter_mut().zip(row) {
                *g += r * xi;
            }
            *gb += r;
        }
        let n = SAMPLES as f32;
        gw.iter_mut().for_each(|g| *g /= n);
        *gb /= n;
        loss / SAMPLES as f64
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Trains w and b from zero with `config`; returns (first loss, last loss).
fn train(
    name: &str,
    config: &str,
    data: &Data,
    steps: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    println!("== {name}: {config}");
    let (mut w, mut b) = (vec![0.0f32; FEATURES], [0.0f32]);
    let (mut gw, mut gb) = (vec![0.0f32; FEATURES], [0.0f32]);
    let mut comm = Communicator::local()?;
    let mut opt = Optimizer::new(
        config,
        [ParamSlice::f32(&mut w), ParamSlice::f32(&mut b)],
        &mut comm,
    )?;
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    let print_every = (steps / 10).max(1);
    for step in 0..steps {
        let loss = {
            let params = opt.params();
            let (w, b) = (params[0].as_f32().unwrap(), params[1].as_f32().unwrap()[0]);
            data.loss_and_grads(w, b, &mut gw, &mut gb[0])
        };
        let info = opt.step(&[GradSlice::f32(&gw), GradSlice::f32(&gb)])?;
        if step == 0 {
            first = loss;
        }
        last = loss;
        if step % print_every == 0 || step + 1 == steps {
            println!(
                "step {:4}  loss {:10.6}  compressed {}  bytes sent {}",
                info.step, loss, info.compressed as u8, info.bytes_sent
            );
        }
    }
    let blob = opt.state_save()?;
    let usage = opt.memory_usage()?;
    println!(
        "state blob: {} bytes; dsopt holds {} host bytes, {} device bytes",
        blob.len(),
        usage.host,
        usage.device
    );
    // A one-rank run's single blob is a complete set for the resharding load
    // (a run saved on P ranks passes its P blobs, in rank order).
    opt.load_state_shards(&[&blob])?;
    if opt.state_save()? != blob {
        return Err("the state after load_state_shards differs from the saved one".into());
    }
    Ok((first, last))
}

fn main() -> ExitCode {
    let steps = match std::env::args().skip_while(|a| a != "--steps").nth(1) {
        Some(n) => n.parse().expect("--steps takes a number"),
        None => 300,
    };
    println!("dsopt {:?}: {}", dsopt::version(), dsopt::build_info());
    let data = Data::generate(0x5eed);
    let runs = [
        (
            "Adam",
            r#"{"optimizer": {"type": "Adam", "params": {"lr": 0.05}}}"#.to_string(),
        ),
        (
            "AdamW, ZeRO stage 2",
            r#"{"optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.0}},
                "zero_optimization": {"stage": 2, "reduce_bucket_size": 16}}"#
                .to_string(),
        ),
        (
            "1-bit Adam",
            format!(
                r#"{{"optimizer": {{"type": "OneBitAdam", "params": {{"lr": 0.05, "freeze_step": {}}}}}}}"#,
                steps / 5
            ),
        ),
    ];
    let mut ok = true;
    for (name, config) in &runs {
        match train(name, config, &data, steps) {
            Ok((first, last)) => {
                let passed = last < REQUIRED_LOSS_RATIO * first;
                println!(
                    "{name}: loss {first:.6} -> {last:.6} ({})\n",
                    if passed { "ok" } else { "FAILED" }
                );
                ok &= passed;
            }
            Err(err) => {
                eprintln!("{name}: {err}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
