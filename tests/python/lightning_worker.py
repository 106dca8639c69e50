"""The ranks of test_lightning_strategy.py: a small classifier on
scikit-learn's digits (128 samples) trained by ``lightning.Trainer(strategy=
dsopt.lightning.DsoptStrategy())`` on the CPU (gloo) and, for reference,
by the same dsopt.torch optimizer alone (a plain loop: the same initial
parameters, the same samples per rank and step from the shuffling
DistributedSampler Lightning puts in, the same LR schedule).
Each rank writes what it saw to ``OUT_DIR/<launch>-rank<r>.json``.

    python lightning_worker.py launcher OUT_DIR
        Lightning's own launcher (``devices=2``: this process is rank 0 and
        runs the script again for rank 1). For AdamW, AdamW with ZeRO-2 and
        1-bit Adam (compressed from step 3): 3 epochs of 4 steps with a
        checkpoint after every epoch ("full"), the run resumed from the
        first epoch's checkpoint ("resumed"), and dsopt alone ("alone").
        Then rank 0 alone, at world size 1: the ZeRO-2 run resumed from the
        2-rank checkpoint ("zero2_at_1"), and AdamW full / resumed / alone.
    python lightning_worker.py environment OUT_DIR
        One process per rank, started by the caller with torchrun's
        variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
        GROUP_RANK, MASTER_ADDR, MASTER_PORT): gradient accumulation
        against dsopt alone, and the settings DsoptStrategy refuses.
    python lightning_worker.py device OUT_DIR
        Two processes sharing one device, each a node of one (torchrun's
        variables with LOCAL_RANK 0 and GROUP_RANK its rank; ``devices=1,
        num_nodes=2``, gloo): the model on DSOPT_LIGHTNING_DEVICE (cuda:
        the GPU; cpu by default), AdamW, ZeRO-2 and 1-bit Adam full /
        resumed / alone as with the launcher.

Lightning's models start from a different initialisation on every rank
(DsoptStrategy broadcasts rank 0's); dsopt alone starts from rank 0's."""

import json
import os
import sys
import warnings

import torch

import dsopt
import dsopt.torch
import lightning
from dsopt.lightning import DsoptStrategy
from conftest import free_port
from torch_comm_worker import digits

SAMPLES = 128
BATCH = 16  # per rank at 2 ranks; 32 at 1 rank (the same samples per step)
EPOCH_STEPS = SAMPLES // (2 * BATCH)
EPOCHS = 3
INIT_SEED = 100  # + the rank, in Lightning's models

OPTIMIZERS = {
    "adamw": lambda p, **kw: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01, **kw),
    "adamw_zero2": lambda p, **kw: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01,
                                                     zero_stage=2, **kw),
    "onebit_adam": lambda p, **kw: dsopt.torch.OneBitAdam(p, lr=3e-3, freeze_step=3, **kw),
    "lamb_zero2": lambda p, **kw: dsopt.torch.Lamb(p, lr=1e-2, weight_decay=0.01, zero_stage=2, **kw),
    "compressed_zero2": lambda p, **kw: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01, zero_optimization={
        "stage": 2, "compression": {"gradients": "int4", "parameters": "int8"}}, **kw),
    "torch_adamw": lambda p, **kw: torch.optim.AdamW(p, lr=3e-3, **kw),
}


def make_optimizer(name, params, **kwargs):
    """(optimizer, StepLR stepped after every optimizer step)."""
    opt = OPTIMIZERS[name](params, **kwargs)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)


def make_net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))


def written_bytes():
    """Bytes this process handed to write-type system calls so far (its
    sockets' traffic, gloo's included)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


class Classifier(lightning.LightningModule):
    def __init__(self, name, seed, optimizer_kwargs=None):
        super().__init__()
        self.net = make_net(seed)
        self.name, self.optimizer_kwargs = name, optimizer_kwargs or {}
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        opt, sched = make_optimizer(self.name, self.parameters(), **self.optimizer_kwargs)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Recorder(lightning.Callback):
    """dsopt's bytes of every step, and what the process wrote during the
    training batches (forward, backward and the optimizer step)."""

    def __init__(self):
        self.sent, self.wrote, self._start = {}, 0, 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._start = written_bytes()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.wrote += written_bytes() - self._start
        info = trainer.optimizers[0].last_step_info
        if info is not None:
            self.sent[info.step] = info.bytes_sent


def loader(data, batch):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data), batch_size=batch)


def params_of(net):
    return [p.detach().cpu().flatten().tolist() for p in net.parameters()]


def warnings_of(caught):
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (RuntimeWarning, UserWarning))]


def lightning_fit(name, data, *, devices, batch, epochs, out_dir=None, ckpt_path=None,
                  accumulate=1, accelerator="cpu", backend=None, **trainer_kwargs):
    """One ``Trainer.fit``; a checkpoint after every epoch into ``out_dir``."""
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    model = Classifier(name, INIT_SEED + rank)
    recorder = Recorder()
    callbacks = [recorder]
    if out_dir is not None:
        callbacks.append(lightning.pytorch.callbacks.ModelCheckpoint(
            dirpath=out_dir, every_n_epochs=1, save_top_k=-1))
    trainer = lightning.Trainer(
        strategy=DsoptStrategy(process_group_backend=backend), accelerator=accelerator,
        devices=devices, max_epochs=epochs,
        accumulate_grad_batches=accumulate, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=out_dir is not None,
        callbacks=callbacks, default_root_dir=out_dir, **trainer_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, loader(data, batch), ckpt_path=ckpt_path)
    opt = trainer.optimizers[0]
    result = {"losses": model.losses, "params": params_of(model.net),
              "bytes_sent": [recorder.sent[s] for s in sorted(recorder.sent)],
              "wrote": recorder.wrote, "warnings": warnings_of(caught),
              "model": type(trainer.strategy.model).__name__,
              "world": trainer.world_size, "rank": trainer.global_rank}
    opt.close()
    return trainer, result


def rank_batches(data, *, rank, world, batch, epochs):
    """This rank's batches of every epoch as Lightning draws them for
    training: a DistributedSampler that shuffles (seed 0), set to each
    epoch."""
    dataset = torch.utils.data.TensorDataset(*data)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                  shuffle=True, seed=0)
    batches = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches += torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler)
    return batches


def dsopt_alone(name, data, *, rank, world, batch, epochs, accumulate=1, device="cpu",
                **optimizer_kwargs):
    """The same training with the dsopt.torch optimizer and no Lightning."""
    batches = [[t.to(device) for t in b]
               for b in rank_batches(data, rank=rank, world=world, batch=batch, epochs=epochs)]
    net = make_net(INIT_SEED).to(device)
    opt, sched = make_optimizer(name, net.parameters(), **optimizer_kwargs)
    losses, sent = [], []
    before = written_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(len(batches) // accumulate):
            opt.zero_grad()
            for x, y in batches[step * accumulate:(step + 1) * accumulate]:
                loss = torch.nn.functional.cross_entropy(net(x), y)
                (loss / accumulate).backward()
                losses.append(loss.item())
            opt.step()
            sched.step()
            sent.append(opt.last_step_info.bytes_sent)
    wrote = written_bytes() - before
    opt.close()
    return {"losses": losses, "params": params_of(net), "bytes_sent": sent, "wrote": wrote,
            "warnings": warnings_of(caught), "numel": sum(p.numel() for p in net.parameters())}


def checkpoint_rank_states(path):
    """The number of dsopt blobs in the checkpoint's optimizer state."""
    return len(torch.load(path, weights_only=False)["optimizer_states"][0]["dsopt_rank_states"])


def launcher_run(out_dir):
    data = tuple(t[:SAMPLES] for t in digits())
    results, first = {}, None
    for name in ("adamw", "adamw_zero2", "onebit_adam", "lamb_zero2", "compressed_zero2"):
        ckpt_dir = os.path.join(out_dir, name)
        trainer, full = lightning_fit(name, data, devices=2, batch=BATCH, epochs=EPOCHS,
                                      out_dir=ckpt_dir)
        first = first or trainer
        ckpt = os.path.join(ckpt_dir, f"epoch=0-step={EPOCH_STEPS}.ckpt")
        _, resumed = lightning_fit(name, data, devices=2, batch=BATCH, epochs=EPOCHS,
                                   ckpt_path=ckpt)
        rank, world = trainer.global_rank, trainer.world_size
        alone = dsopt_alone(name, data, rank=rank, world=world, batch=BATCH, epochs=EPOCHS)
        results[name] = {"full": full, "resumed": resumed, "alone": alone}
        if rank == 0:
            results[name]["checkpoint"] = checkpoint_rank_states(ckpt)
    rank = first.global_rank
    write(out_dir, "launcher", rank, results)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    if rank == 0:
        for proc in first.strategy.launcher.procs:  # rank 1
            proc.wait()
        write(out_dir, "one_rank", 0, one_rank_run(out_dir, data))


def one_rank_run(out_dir, data):
    """Rank 0 at world size 1 (its own new process group)."""
    os.environ.update(WORLD_SIZE="1", MASTER_PORT=str(free_port()))
    zero2 = os.path.join(out_dir, "adamw_zero2", f"epoch=0-step={EPOCH_STEPS}.ckpt")
    _, zero2_at_1 = lightning_fit("adamw_zero2", data, devices=1, batch=2 * BATCH,
                                  epochs=EPOCHS, ckpt_path=zero2)
    ckpt_dir = os.path.join(out_dir, "adamw_at_1")
    _, full = lightning_fit("adamw", data, devices=1, batch=2 * BATCH, epochs=EPOCHS,
                            out_dir=ckpt_dir)
    _, resumed = lightning_fit("adamw", data, devices=1, batch=2 * BATCH, epochs=EPOCHS,
                               ckpt_path=os.path.join(ckpt_dir, f"epoch=0-step={EPOCH_STEPS}.ckpt"))
    alone = dsopt_alone("adamw", data, rank=0, world=1, batch=2 * BATCH, epochs=EPOCHS)
    return {"zero2_at_1": zero2_at_1, "adamw": {"full": full, "resumed": resumed, "alone": alone}}


def refused(data, name, optimizer_kwargs=None, **trainer_kwargs):
    """The message of the exception ``Trainer.fit`` raises (None if none)."""
    rank = int(os.environ["LOCAL_RANK"])
    model = Classifier(name, INIT_SEED + rank, optimizer_kwargs)
    trainer = lightning.Trainer(
        strategy=DsoptStrategy(), accelerator="cpu", devices=2, max_steps=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        **trainer_kwargs)
    try:
        trainer.fit(model, loader(data, BATCH))
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    finally:
        for opt in trainer.optimizers:
            if isinstance(opt, dsopt.torch.Optimizer):
                opt.close()
    return None


def environment_run(out_dir):
    data = tuple(t[:SAMPLES] for t in digits())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _, accumulated = lightning_fit("adamw", data, devices=2, batch=BATCH // 2, epochs=1,
                                   accumulate=2)
    alone = dsopt_alone("adamw", data, rank=rank, world=world, batch=BATCH // 2, epochs=1,
                        accumulate=2)
    # gradient_clip_val is dsopt's clipping of the averaged gradients
    _, clipped = lightning_fit("adamw", data, devices=2, batch=BATCH, epochs=1,
                               gradient_clip_val=0.05)
    clipped_alone = dsopt_alone("adamw", data, rank=rank, world=world, batch=BATCH, epochs=1,
                                gradient_clipping=0.05)
    unclipped_alone = dsopt_alone("adamw", data, rank=rank, world=world, batch=BATCH, epochs=1)
    results = {"accumulated": {"lightning": accumulated, "alone": alone},
               "clipped": {"lightning": clipped, "alone": clipped_alone,
                           "unclipped": unclipped_alone}, "refused": {
        "torch_optimizer": refused(data, "torch_adamw"),
        "gradient_clip_mismatch": refused(data, "adamw", {"gradient_clipping": 0.25},
                                          gradient_clip_val=0.5),
        "gradient_clip_value": refused(data, "adamw", gradient_clip_val=0.5,
                                       gradient_clip_algorithm="value"),
        "local_comm": refused(data, "adamw", {"comm": dsopt.Communicator.local()}),
        # (Lightning's precision="16-mixed" on the CPU is bf16-mixed: the
        # plugin with its GradScaler, as on a GPU)
        "fp16_scaler": refused(data, "adamw", plugins=[
            lightning.pytorch.plugins.precision.MixedPrecision("16-mixed", "cpu")]),
        "overlap_accumulate": refused(data, "adamw", {"overlap": True}, accumulate_grad_batches=2),
    }}
    write(out_dir, "environment", rank, results)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def device_run(out_dir):
    data = tuple(t[:SAMPLES] for t in digits())
    device = os.environ.get("DSOPT_LIGHTNING_DEVICE", "cpu")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = {}
    for name in ("adamw", "adamw_zero2", "onebit_adam"):
        ckpt_dir = os.path.join(out_dir, name)
        fit = dict(devices=1, num_nodes=world, accelerator=device, backend="gloo", batch=BATCH,
                   epochs=EPOCHS)
        trainer, full = lightning_fit(name, data, out_dir=ckpt_dir, **fit)
        full["device"] = str(next(trainer.lightning_module.parameters()).device)
        ckpt = os.path.join(ckpt_dir, f"epoch=0-step={EPOCH_STEPS}.ckpt")
        torch.distributed.barrier()
        _, resumed = lightning_fit(name, data, ckpt_path=ckpt, **fit)
        alone = dsopt_alone(name, data, rank=rank, world=world, batch=BATCH, epochs=EPOCHS,
                            device=device)
        results[name] = {"full": full, "resumed": resumed, "alone": alone}
    write(out_dir, "device", rank, results)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def write(out_dir, launch, rank, results):
    with open(os.path.join(out_dir, f"{launch}-rank{rank}.json"), "w") as f:
        json.dump(results, f)


def main():
    torch.set_num_threads(1)
    launch, out_dir = sys.argv[1], sys.argv[2]
    {"launcher": launcher_run, "environment": environment_run, "device": device_run}[launch](
        out_dir)


if __name__ == "__main__":
    main()
