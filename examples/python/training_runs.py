"""Training the models of small_models.py with a dsopt optimizer: one
training loop for the demo, the convergence tests and the freeze_step table,
and the machinery to run a list of runs on one process or on several MPI
ranks: ``run_under_mpirun`` launches a worker script whose main calls
``mpi_worker_main``; every rank trains each ``RunSpec`` in turn and writes its
results to ``rank<r>.json``.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from small_models import MLP, CharModel, ConvNet, load_digits_split, load_text_split

# name -> (model factory, data loader): what a RunSpec names.
MODELS = {"digits": (MLP, load_digits_split), "chars": (CharModel, load_text_split),
          "digits_cnn": (ConvNet, load_digits_split)}


@dataclass
class RunResult:
    train_loss: float            # on the whole training set, after the last step
    test_accuracy: float
    skipped: int                 # steps skipped for non-finite gradients
    error: str = ""              # the dsopt error that ended the run early, if any
    error_step: int = 0          # the step (counted from 1) that raised it
    bytes_sent: int = 0          # this rank's bytes through the communicator
    bytes_inter_node: int = 0    # the part of them sent to ranks of other nodes
    memory_bytes: int = 0        # what dsopt holds for the optimizer on this rank (host + device)
    losses: list = field(default_factory=list)  # this rank's batch loss per step
    diverging: list = field(default_factory=list)  # StepInfo.diverging per step (0/1)
    grad_norms: list = field(default_factory=list)  # StepInfo.grad_norm per step (-1: not reported; NaN: skipped)
    phases: list = field(default_factory=list)  # StepInfo.phase per step
    # SHA-256 of this rank's parameters (their bytes) after the last step
    # that left every rank with the same ones: every step but 0/1 Adam's
    # local ones, which each rank takes with its own gradient
    params_digest: str = ""


def train(model, data, config, comm, rank, world, steps=300, batch=64, seed=0, on_step=None, evaluate=True):
    """Trains `model` on `data` with a dsopt optimizer built from `config`
    (a dict) over `comm`. Every rank calls it with the same arguments. A
    dsopt.NonFiniteError (the run stopped progressing) ends the run early
    and is reported in the result; other errors propagate. evaluate=False
    leaves train_loss NaN and test_accuracy 0 (every rank ends with the same
    parameters, so one rank evaluating is enough)."""
    import dsopt

    params = model.init_params(seed)
    local = batch // world
    # With gradient accumulation the local batch is split into G equal
    # micro-batches whose gradients are handed over one by one, last tensor
    # first as backward produces them; the step uses their mean, which is
    # the gradient of the whole local batch.
    micro = int(config.get("gradient_accumulation_steps", 1))
    draw = np.random.RandomState(seed + 1000)
    result = RunResult(float("nan"), 0.0, 0)
    # The parameters after the last step that was not local (0/1 Adam), kept
    # while local steps follow it.
    synced, previous_local = None, False
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for step in range(steps):
            if not previous_local:
                synced = [p.copy() for p in params]
            idx = draw.choice(len(data.y_train), batch, replace=False)[rank * local:(rank + 1) * local]
            try:
                if micro > 1:
                    losses = []
                    for part in np.array_split(idx, micro):
                        part_loss, grads = model.loss_and_grads(params, data.x_train[part], data.y_train[part])
                        losses.append(part_loss)
                        for i in reversed(range(len(grads))):
                            opt.grad_ready(i, grads[i].ravel())
                    loss = float(np.mean(losses))
                    info = opt.step()
                else:
                    loss, grads = model.loss_and_grads(params, data.x_train[idx], data.y_train[idx])
                    info = opt.step([g.ravel() for g in grads])
            except dsopt.NonFiniteError as e:
                result.error, result.error_step = str(e), step + 1
                result.skipped += 1
                if e.info is not None:  # the failing step was skipped, but it communicated
                    result.bytes_sent += int(e.info.bytes_sent)
                break
            result.skipped += int(info.skipped)
            result.bytes_sent += int(info.bytes_sent)
            result.bytes_inter_node += int(info.bytes_inter_node)
            result.losses.append(loss)
            result.diverging.append(int(info.diverging))
            result.grad_norms.append(float("nan") if info.skipped else float(info.grad_norm))
            result.phases.append(int(info.phase))
            previous_local = info.phase == dsopt.PHASE_LOCAL
            if on_step is not None:
                on_step(step, loss, info)
        result.memory_bytes = sum(opt.memory_usage().values())
    result.params_digest = params_digest(synced if previous_local else params)
    if evaluate:
        result.train_loss, _ = model.evaluate(params, data.x_train, data.y_train)
        _, result.test_accuracy = model.evaluate(params, data.x_test, data.y_test)
    return result


def params_digest(params):
    """SHA-256 (hex) of the arrays' bytes in order: equal on two ranks iff
    their parameters are the same bits."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(np.ascontiguousarray(p).tobytes())
    return digest.hexdigest()


# ---- configurations ------------------------------------------------------------------


def onebit_config(freeze_step, lr=1e-3, weight_decay=0.01, **params):
    """1-bit Adam; freeze_step beyond the run gives its uncompressed rule
    (Adam without bias correction). `params`: further optimizer params,
    e.g. stabilize=False."""
    return {"optimizer": {"type": "OneBitAdam",
                          "params": dict(lr=lr, weight_decay=weight_decay, freeze_step=freeze_step, **params)},
            "threads": 1}  # ranks share the cores


def lamb_config(freeze_step, lr=1e-2, weight_decay=0.01, **params):
    """1-bit LAMB; freeze_step beyond the run gives its uncompressed rule
    (LAMB without bias correction, trust ratio clamped to [min_coeff,
    max_coeff])."""
    return {"optimizer": {"type": "OneBitLamb",
                          "params": dict(lr=lr, weight_decay=weight_decay, freeze_step=freeze_step, **params)},
            "threads": 1}


def zoadam_config(var_freeze_step, lr=1e-3, weight_decay=0.01, var_update_scaler=16, local_step_scaler=10,
                  local_step_clipper=16, **params):
    """0/1 Adam: variance updates at growing intervals until var_freeze_step,
    then local steps with syncs every 1, 2, 4, ... local_step_clipper steps
    (local_step_scaler steps at each interval). `params`: further optimizer
    params, e.g. stabilize=False."""
    return {"optimizer": {"type": "ZeroOneAdam",
                          "params": dict(lr=lr, weight_decay=weight_decay, var_freeze_step=var_freeze_step,
                                         var_update_scaler=var_update_scaler, local_step_scaler=local_step_scaler,
                                         local_step_clipper=local_step_clipper, **params)},
            "threads": 1}


def plain_lamb_config(lr=1e-2, weight_decay=0.01, zero_stage=0, **params):
    """LAMB (no compression; bias-corrected unless bias_correction=False),
    its state sharded by ZeRO stage 1/2 when zero_stage > 0 (buckets of 4,096
    elements, smaller than the models' largest tensors)."""
    config = {"optimizer": {"type": "Lamb", "params": dict(lr=lr, weight_decay=weight_decay, **params)},
              "threads": 1}
    if zero_stage:
        config["zero_optimization"] = {"stage": zero_stage, "reduce_bucket_size": 4096,
                                       "allgather_bucket_size": 4096}
    return config


def adamw_config(lr=1e-3, weight_decay=0.01):
    return {"optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay}}, "threads": 1}


# ---- several runs, one or several ranks ------------------------------------------------


@dataclass
class RunSpec:
    name: str        # unique among the runs of one launch
    model: str       # a key of MODELS
    config: dict
    steps: int = 300
    batch: int = 64  # global
    seed: int = 0


def run_specs(specs, comm, rank, world, on_result=None):
    """Trains every RunSpec in turn on `comm`; returns {name: RunResult}
    (loss and accuracy from rank 0 only). `on_result(name, result)` is
    called after each run."""
    loaded = {}
    results = {}
    for spec in specs:
        make_model, load_data = MODELS[spec.model]
        if spec.model not in loaded:
            loaded[spec.model] = load_data()
        results[spec.name] = train(make_model(), loaded[spec.model], spec.config, comm, rank, world,
                                   steps=spec.steps, batch=spec.batch, seed=spec.seed, evaluate=rank == 0)
        if on_result is not None:
            on_result(spec.name, results[spec.name])
    return results


def run_local(specs):
    """run_specs on one rank, in this process."""
    import dsopt

    with dsopt.Communicator.local() as comm:
        return run_specs(specs, comm, 0, 1)


def mpi_worker_main(specs_path, out_dir):
    """The body of a worker script under mpirun: runs the RunSpecs of the
    JSON file on MPI_COMM_WORLD (mpi4py); rank r rewrites rank<r>.json in
    out_dir after every run, so a crash or hang leaves the finished ones."""
    from mpi4py import MPI

    import dsopt

    specs = [RunSpec(**s) for s in json.loads(Path(specs_path).read_text())]
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    with dsopt.Communicator.from_mpi4py(world) as comm:
        run_specs(specs, comm, rank, world.Get_size(), on_result=result_writer(out_dir, rank))


def result_writer(out_dir, rank):
    """save(name, result): adds a finished run's result (a dataclass) to
    rank<rank>.json in out_dir, rewritten whole after every run (what
    run_under_mpirun reads back)."""
    done = {}

    def save(name, result):
        done[name] = asdict(result)
        path = Path(out_dir) / f"rank{rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(done))
        path.with_suffix(".tmp").replace(path)
    return save


def mpi_available():
    """'' when mpirun and mpi4py are there, else what is missing."""
    if shutil.which("mpirun") is None:
        return "mpirun not found (apt-get install openmpi-bin)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py not importable (pip install mpi4py)"
    return ""


class MpirunFailed(RuntimeError):
    """mpirun timed out or some rank did not finish every run; `finished`:
    {name: [RunResult of each rank]} of the runs every rank finished."""

    def __init__(self, message, finished):
        super().__init__(message)
        self.finished = finished


def run_under_mpirun(worker_args, specs, world, timeout=120, result_type=RunResult):
    """Runs `specs` on `world` ranks: ``mpirun -np world python3
    *worker_args SPECS OUT_DIR``, the worker calling mpi_worker_main(SPECS,
    OUT_DIR). Returns {name: [RunResult of each rank]} (loss and accuracy
    in rank 0's); raises MpirunFailed (with mpirun's output) when it times
    out or some rank did not finish all. Other workers run other specs
    (dataclasses with a ``name``, written with asdict) and write their
    results with result_writer: `result_type` rebuilds them."""
    import dsopt

    if len({s.name for s in specs}) < len(specs):
        raise ValueError("RunSpec names must be unique")
    here = str(Path(__file__).resolve().parent)
    binding = str(Path(dsopt.__file__).resolve().parent.parent)
    path = [here, binding] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(path))
    with tempfile.TemporaryDirectory(prefix="dsopt_runs_") as tmp:
        specs_path = Path(tmp) / "specs.json"
        specs_path.write_text(json.dumps([asdict(s) for s in specs]))
        cmd = [shutil.which("mpirun"), "-np", str(world), "--oversubscribe", sys.executable,
               *map(str, worker_args), str(specs_path), tmp]
        # A session of its own, so that a timeout can end mpirun and its ranks together.
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output = proc.communicate(timeout=timeout)[0]
            output = f"exit {proc.returncode}\n{output}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            output = f"timed out after {timeout} s\n{proc.communicate()[0]}"
        per_rank = []
        for rank in range(world):
            path = Path(tmp) / f"rank{rank}.json"
            per_rank.append(json.loads(path.read_text()) if path.exists() else {})
    finished = {s.name: [result_type(**per_rank[r][s.name]) for r in range(world)]
                for s in specs if all(s.name in per_rank[r] for r in range(world))}
    if len(finished) < len(specs):
        unfinished = [s.name for s in specs if s.name not in finished]
        raise MpirunFailed(f"mpirun -np {world}: runs not finished on every rank: {unfinished}\n{output[-4000:]}",
                           finished)
    return finished
