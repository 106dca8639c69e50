"""Training runs of the GPT of gpt.py with the dsopt.torch optimizers, on
one process or on the ranks of ``mpirun`` (mpi4py's COMM_WORLD).

A ``TransformerRun`` names a model size and corpus, an optimizer class of
dsopt.torch and how it departs from the user settings below. Every rank of
a run builds the same initial model from the seed and takes its share of
the same global batch (gpt.train_batch), so every optimizer sees the same
batches. User settings, as a user would write them:

* lr 1e-3 for the Adam family, 1e-2 for 1-bit LAMB; weight_decay 0.01;
  everything else at the optimizers' defaults;
* ``freeze_step`` (1-bit Adam, 1-bit LAMB) and ``var_freeze_step`` (0/1
  Adam) at 15% of the run;
* the learning rate warms up linearly over the first 10% of the steps, then
  follows a cosine down to 10% of its peak, through
  ``torch.optim.lr_scheduler.LambdaLR``;
* one torch thread and one dsopt thread per rank.

Results (``TransformerResult``, one per rank): rank 0's validation loss
every ``eval_every`` steps, each rank's final validation loss of its own
parameters (0/1 Adam's ranks differ between syncs), the skipped steps, the
dsopt.NonFiniteError that ended a run early, and dsopt's StepInfo of every
step (``info``: one list per field).

Run as a script, this file is the worker of run_under_mpirun:
``transformer_runs.py SPECS OUT_DIR``.
"""
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import gpt
import training_runs

LEARNING_RATES = {"AdamW": 1e-3, "OneBitAdam": 1e-3, "ZeroOneAdam": 1e-3, "OneBitLamb": 1e-2}
WEIGHT_DECAY = 0.01
FREEZE_FRACTION = 0.15
# A clipping threshold no gradient norm reaches: dsopt then computes
# StepInfo.grad_norm, and scales the gradients by exactly 1.
REPORT_GRAD_NORM = 1e30


@dataclass
class TransformerRun:
    name: str                  # unique among the runs of one launch
    optimizer: str             # a key of LEARNING_RATES: a class of dsopt.torch
    size: str = "tiny"         # a key of gpt.CONFIGS
    corpus: str = "licenses"   # a key of gpt.CORPUS_FILES
    steps: int = 300
    batch: int = 16            # sequences per global batch, split evenly over the ranks
    seed: int = 0              # initial weights and batches
    eval_every: int = 25       # rank 0's validation loss every this many steps
    options: dict = field(default_factory=dict)  # keyword arguments over the user settings
    report_grad_norm: bool = False  # StepInfo.grad_norm on every step
    tensor_groups: bool = False     # one parameter group per tensor (else one group)
    hook: dict = field(default_factory=dict)  # settings of the worker's before_step hook, if it has one


@dataclass
class TransformerResult:
    validation: list = field(default_factory=list)  # [step, loss] pairs (rank 0), step 0 first
    final_validation: float = float("nan")          # this rank's parameters after the run
    skipped: int = 0
    error: str = ""             # the dsopt.NonFiniteError that ended the run early
    error_step: int = 0         # the step (counted from 1) that raised it
    losses: list = field(default_factory=list)  # this rank's batch loss per step
    lr: list = field(default_factory=list)      # the learning rate of each step
    info: dict = field(default_factory=dict)    # StepInfo field -> its value at each step
    seconds: float = 0.0        # wall time of the training loop


def optimizer_kwargs(run):
    """The keyword arguments of the run's dsopt.torch class: the user
    settings, then run.options over them."""
    kwargs = {"lr": LEARNING_RATES[run.optimizer], "weight_decay": WEIGHT_DECAY, "threads": 1}
    freeze = max(1, int(FREEZE_FRACTION * run.steps))
    if run.optimizer in ("OneBitAdam", "OneBitLamb"):
        kwargs["freeze_step"] = freeze
    elif run.optimizer == "ZeroOneAdam":
        kwargs["var_freeze_step"] = freeze
    if run.report_grad_norm:
        kwargs["gradient_clipping"] = REPORT_GRAD_NORM
    kwargs.update(run.options)
    return kwargs


def train(run, comm=None, rank=0, world=1, before_step=None):
    """Trains the run's GPT on this rank (comm: an mpi4py communicator, or
    None for one process) and returns this rank's TransformerResult.
    before_step(step, model, opt), if given, is called after backward and
    the learning-rate schedule, before each optimizer step (it may change
    the groups' settings for that step: LambdaLR sets lr again next step)."""
    import torch

    import dsopt
    import dsopt.torch

    torch.set_num_threads(1)
    config = gpt.CONFIGS[run.size]
    corpus = gpt.load_corpus(run.corpus)
    model = gpt.build_model(config, run.seed)
    optimizer_class = getattr(dsopt.torch, run.optimizer)
    params = [{"params": [p]} for p in model.parameters()] if run.tensor_groups else model.parameters()
    opt = optimizer_class(params, comm=comm, **optimizer_kwargs(run))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, gpt.warmup_cosine(run.steps))
    if run.batch % world:
        raise ValueError(f"batch {run.batch} does not split over {world} ranks")
    local = run.batch // world
    result = TransformerResult(info={f.name: [] for f in fields(dsopt.StepInfo)})

    def evaluate(step):
        if rank == 0:
            result.validation.append([step, gpt.validation_loss(model, corpus, config.context)])

    evaluate(0)
    start = time.perf_counter()
    for step in range(run.steps):
        x, y = gpt.train_batch(corpus, step, run.batch, config.context, run.seed)
        opt.zero_grad(set_to_none=True)
        loss = model.loss(x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local])
        loss.backward()
        if before_step is not None:
            before_step(step, model, opt)
        result.lr.append(opt.param_groups[0]["lr"])
        try:
            opt.step()
        except dsopt.NonFiniteError as e:
            result.error, result.error_step = str(e), step + 1
        info = opt.last_step_info
        if info is not None:
            for name, values in result.info.items():
                values.append(getattr(info, name))
            result.skipped += int(info.skipped)
        result.losses.append(float(loss.detach()))
        if result.error:
            break
        schedule.step()
        if (step + 1) % run.eval_every == 0 or step + 1 == run.steps:
            evaluate(step + 1)
    result.seconds = time.perf_counter() - start
    result.final_validation = gpt.validation_loss(model, corpus, config.context)
    opt.close()
    return result


def run_local(runs):
    """{name: TransformerResult} of every run on one process."""
    return {run.name: train(run) for run in runs}


def mpi_worker_main(specs_path, out_dir, make_hook=None):
    """The body of the worker under mpirun: trains every TransformerRun of
    the JSON file in turn on COMM_WORLD; rank r rewrites rank<r>.json in
    out_dir after every run. make_hook(run, comm), if given, returns the
    run's before_step hook (or None)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    save = training_runs.result_writer(out_dir, world.Get_rank())
    for spec in json.loads(Path(specs_path).read_text()):
        run = TransformerRun(**spec)
        hook = make_hook(run, world) if make_hook is not None else None
        save(run.name, train(run, world, world.Get_rank(), world.Get_size(), before_step=hook))


def run_under_mpirun(runs, world, timeout=600, worker_args=None):
    """{name: [TransformerResult of each rank]} of the runs on `world`
    ranks (one mpirun of ``python3 *worker_args SPECS OUT_DIR``, by default
    this file); raises training_runs.MpirunFailed with the runs that
    finished when some did not."""
    return training_runs.run_under_mpirun(worker_args or [Path(__file__).resolve()], runs, world,
                                          timeout=timeout, result_type=TransformerResult)


def save_results(results, path):
    """Writes {name: [TransformerResult of each rank]} as JSON."""
    Path(path).write_text(json.dumps({name: [asdict(r) for r in rs] for name, rs in results.items()}))


def load_results(path):
    return {name: [TransformerResult(**r) for r in rs] for name, rs in json.loads(Path(path).read_text()).items()}


if __name__ == "__main__":
    mpi_worker_main(*sys.argv[1:])
