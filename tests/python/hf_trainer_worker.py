"""One rank of test_hf_trainer.py: dsopt.hf.Trainer (transformers) on a
small classifier of scikit-learn's digits, started with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (gloo, CPU).

For each scenario of SCENARIOS (a dsopt optimizer, passed in or created by
the Trainer, and TrainingArguments) it trains STEPS steps saving a checkpoint
at step SAVE_AT, resumes a second Trainer (other initial weights) from that
checkpoint, and replays the batches the Trainer fed this rank through a
plain loop with the same dsopt optimizer alone (same initial weights). It
records the losses, the gradients in ``.grad`` before each step, dsopt's
step infos, the bytes the process wrote to its sockets during each step
(/proc/self/io's wchar), the logged grad_norm, the final parameters, the
DDP model's communication hooks and the warnings. ``torch`` trains with the
Trainer's default torch.optim optimizer under dsopt.hf.Trainer and under
transformers.Trainer. ``reshard`` (one rank) resumes the ZeRO-2 checkpoint
of a two-rank run.

    hf_trainer_worker.py OUT_DIR PHASE[,PHASE...] [ZERO2_CHECKPOINT]

writes OUT_DIR/PHASE-rankR.pt (torch.save of a dict) for each phase.
DSOPT_HF_DEVICE=cuda trains on the GPU (``use_cpu=False``, every rank on
the current GPU, gloo as the process group's backend)."""

import os
import sys
import warnings

import torch
import transformers
from transformers import TrainerCallback, TrainingArguments

import dsopt
import dsopt.hf
import dsopt.torch

STEPS = 6
SAVE_AT = 3
BATCH = 16
LR = 0.01
WEIGHT_DECAY = 0.01
CLIP = 0.3  # below the gradients' norms here: the clipping acts
SEED = 0
DEVICE = torch.device(os.environ.get("DSOPT_HF_DEVICE", "cpu"))


def digits():
    """scikit-learn's digits: (images scaled to [0, 1] as float32, labels)."""
    from sklearn.datasets import load_digits
    data = load_digits()
    return (torch.tensor(data.data / 16.0, dtype=torch.float32),
            torch.tensor(data.target, dtype=torch.long))


class Digits(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = digits()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class DigitsNet(torch.nn.Module):
    """A two-layer classifier returning its cross-entropy loss; every
    training forward is kept in ``seen`` as (inputs, labels, loss)."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.l1 = torch.nn.Linear(64, 32)
        self.l2 = torch.nn.Linear(32, 10)
        self.seen = []

    def forward(self, x, labels):
        logits = self.l2(torch.tanh(self.l1(x)))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        if self.training:
            self.seen.append((x.detach().clone(), labels.clone(), loss.detach().clone()))
        return {"loss": loss, "logits": logits}


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).cpu().clone() for t in tensors])


def flat_params(model):
    return flat(model.parameters())


def written_bytes():
    """Bytes this process handed to write-type system calls so far (its
    sockets' traffic, gloo's included)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def optimizer_state(opt, model):
    """Per parameter, dsopt's moments as flat tensors with the offset of
    this rank's part (the whole parameter, offset 0, without ZeRO)."""
    out = []
    for p in model.parameters():
        st = opt.state[p]
        out.append({"exp_avg": st["exp_avg"].reshape(-1).clone(),
                    "exp_avg_sq": st["exp_avg_sq"].reshape(-1).clone(),
                    "offset": int(st.get("offset", 0))})
    return out


class Recorder(TrainerCallback):
    """What happens around each optimizer step of the Trainer."""

    def __init__(self):
        self.grads, self.infos, self.wrote = [], [], []
        self.start_state = self.saved_state = None
        self._before = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        opt = dsopt.hf.dsopt_optimizer(optimizer)
        if opt is not None and opt._facts.type in ("Adam", "AdamW") and state.global_step > 0:
            self.start_state = optimizer_state(opt, model)

    def on_step_begin(self, args, state, control, **kwargs):
        self._before = written_bytes()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(flat(p.grad for p in model.parameters()))

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.wrote.append(written_bytes() - self._before)
        info = getattr(dsopt.hf.dsopt_optimizer(optimizer), "last_step_info", None)
        if info is not None:
            self.infos.append({"bytes_sent": info.bytes_sent, "grad_norm": info.grad_norm,
                               "compressed": bool(info.compressed)})

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        opt = dsopt.hf.dsopt_optimizer(optimizer)
        if state.global_step == SAVE_AT and opt is not None and opt._facts.type in ("Adam", "AdamW"):
            self.saved_state = optimizer_state(opt, model)


def training_args(out_dir, **overrides):
    settings = dict(output_dir=out_dir, per_device_train_batch_size=BATCH, max_steps=STEPS,
                    learning_rate=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=CLIP,
                    lr_scheduler_type="constant", logging_steps=1, save_strategy="steps",
                    save_steps=SAVE_AT, report_to=[], use_cpu=DEVICE.type == "cpu",
                    disable_tqdm=True, ddp_find_unused_parameters=False, seed=SEED,
                    log_level="error")
    if DEVICE.type != "cpu" and "WORLD_SIZE" in os.environ:
        # launched ranks share one GPU: gloo (NCCL needs a GPU per rank); in
        # the test process itself no backend is named, or accelerate takes
        # the run for a distributed one
        settings["ddp_backend"] = "gloo"
    settings.update(overrides)
    return TrainingArguments(**settings)


def grouped(model):
    """The Trainer's parameter groups: weights decay, biases do not."""
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if "bias" not in n], "weight_decay": WEIGHT_DECAY},
            {"params": [p for n, p in named if "bias" in n], "weight_decay": 0.0}]


# How each scenario's Trainer gets its optimizer, and the same optimizer
# made for the plain loop: "created" by the Trainer from
# optimizer_cls_and_kwargs (clipping from max_grad_norm), or "passed" in
# optimizers=(opt, None); then the scenario's TrainingArguments.
SCENARIOS = {
    "adamw": ("created", dsopt.torch.AdamW, {"lr": LR}, {}),
    "zero2": ("passed", dsopt.torch.AdamW,
              {"lr": LR, "weight_decay": WEIGHT_DECAY, "zero_stage": 2, "gradient_clipping": CLIP},
              {}),
    "onebit": ("created", dsopt.torch.OneBitAdam, {"lr": LR, "freeze_step": 2}, {}),
    "accumulate": ("created", dsopt.torch.AdamW, {"lr": LR}, {"gradient_accumulation_steps": 2}),
    "lamb_zero2": ("created", dsopt.torch.Lamb, {"lr": LR, "weight_decay": WEIGHT_DECAY, "zero_stage": 2},
                   {}),
    "compressed_zero2": ("created", dsopt.torch.AdamW,
                         {"lr": LR, "weight_decay": WEIGHT_DECAY, "zero_optimization": {
                             "stage": 2, "compression": {"gradients": "int4", "parameters": "int8"}}},
                         {}),
}


def trainer_for(name, model, args, recorder):
    how, cls, kwargs, _ = SCENARIOS[name]
    if how == "created":
        chosen = {"optimizer_cls_and_kwargs": (cls, dict(kwargs))}
    else:
        chosen = {"optimizers": (cls(model.parameters(), **kwargs), None)}
    return dsopt.hf.Trainer(model=model, args=args, train_dataset=Digits(), callbacks=[recorder],
                            **chosen)


def reference_optimizer(name, model):
    how, cls, kwargs, _ = SCENARIOS[name]
    if how == "created":
        return cls(grouped(model), **dict(kwargs, gradient_clipping=CLIP))
    return cls(model.parameters(), **kwargs)


def ddp_hooks(trainer):
    """The communication hooks of the Trainer's DDP model (None: no DDP)."""
    ddp = trainer.model_wrapped
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        return None
    return {"hooks": [f"{h.__module__}.{h.__qualname__}" for h, _ in ddp._comm_hooks],
            "logged": ddp._get_ddp_logging_data().get("comm_hook")}


def replay(opt, model, batches, accumulate=1):
    """dsopt alone: the plain loop over ``batches``, ``accumulate``
    micro-batches per step (each loss divided by their number)."""
    grads, infos, wrote = [], [], []
    for start in range(0, len(batches), accumulate):
        before = written_bytes()
        opt.zero_grad(set_to_none=True)
        for x, y in batches[start:start + accumulate]:
            (model(x, y)["loss"] / accumulate).backward()
        grads.append(flat(p.grad for p in model.parameters()))
        opt.step()
        wrote.append(written_bytes() - before)
        info = opt.last_step_info
        infos.append({"bytes_sent": info.bytes_sent, "grad_norm": info.grad_norm,
                      "compressed": bool(info.compressed)})
    return {"losses": [loss for _, _, loss in model.seen], "grads": grads, "infos": infos,
            "wrote": wrote, "params": flat_params(model)}


def run_trainer(name, out_dir, seed, resume=None):
    model = DigitsNet(seed)
    recorder = Recorder()
    trainer = trainer_for(name, model, training_args(out_dir, **SCENARIOS[name][3]), recorder)
    trainer.train(resume_from_checkpoint=resume)
    result = {"losses": [loss for _, _, loss in model.seen], "grads": recorder.grads,
              "infos": recorder.infos, "wrote": recorder.wrote, "params": flat_params(model),
              "logged_grad_norms": [e["grad_norm"] for e in trainer.state.log_history
                                    if "grad_norm" in e],
              "hooks": ddp_hooks(trainer),
              "comm_size": trainer.dsopt_optimizer.dsopt.communicator.size,
              "start_state": recorder.start_state, "saved_state": recorder.saved_state,
              "batches": [(x, y) for x, y, _ in model.seen]}
    trainer.dsopt_optimizer.close()  # collective: every rank, in the same order
    return result


def scenario(name, out_dir):
    """The uninterrupted run, its resumption from SAVE_AT and dsopt alone."""
    full = run_trainer(name, os.path.join(out_dir, name), SEED)
    checkpoint = os.path.join(out_dir, name, f"checkpoint-{SAVE_AT}")
    resumed = run_trainer(name, os.path.join(out_dir, name + "-resumed"), SEED + 1, checkpoint)
    model = DigitsNet(SEED).to(DEVICE)
    opt = reference_optimizer(name, model)
    alone = replay(opt, model, full["batches"],
                   SCENARIOS[name][3].get("gradient_accumulation_steps", 1))
    opt.close()
    return {"full": full, "resumed": resumed, "alone": alone}


def single_process_optimizer_error(out_dir):
    """The message of the Trainer given an optimizer on a communicator of
    its own (one process) while it runs several ("" when accepted)."""
    model = DigitsNet(SEED)
    opt = dsopt.torch.AdamW(model.parameters(), comm=dsopt.Communicator.local(),
                            gradient_clipping=CLIP)
    try:
        dsopt.hf.Trainer(model=model, args=training_args(out_dir), train_dataset=Digits(),
                         optimizers=(opt, None))
    except ValueError as error:
        return str(error)
    finally:
        opt.close()
    return ""


def torch_optim(out_dir):
    """The Trainer's default torch.optim optimizer under dsopt.hf.Trainer
    and transformers.Trainer."""
    result = {}
    for label, cls in (("dsopt_hf", dsopt.hf.Trainer), ("transformers", transformers.Trainer)):
        model = DigitsNet(SEED)
        trainer = cls(model=model, args=training_args(os.path.join(out_dir, label)),
                      train_dataset=Digits())
        trainer.train()
        result[label] = {"log": [{k: e[k] for k in ("loss", "grad_norm") if k in e}
                                 for e in trainer.state.log_history],
                         "losses": [loss for _, _, loss in model.seen],
                         "params": flat_params(model), "hooks": ddp_hooks(trainer),
                         "optimizer": type(dsopt.hf.dsopt_optimizer(trainer.optimizer)
                                           or trainer.optimizer.optimizer).__name__}
    return result


def reshard(out_dir, checkpoint):
    """Resumes ZeRO-2's checkpoint of another world size, and continues
    with dsopt alone from the same checkpoint (load_state_dict_shards of
    the ranks' blobs in optimizer.pt, weights from model.safetensors)."""
    resumed = run_trainer("zero2", os.path.join(out_dir, "zero2-resharded"), SEED + 1, checkpoint)
    from safetensors.torch import load_file
    model = DigitsNet(SEED + 2).to(DEVICE)
    model.load_state_dict(load_file(os.path.join(checkpoint, "model.safetensors")))
    opt = reference_optimizer("zero2", model)
    saved = torch.load(os.path.join(checkpoint, "optimizer.pt"), weights_only=True)
    base = {k: v for k, v in saved.items() if k not in ("dsopt_state", "dsopt_rank_states")}
    opt.load_state_dict_shards([dict(base, dsopt_state=blob)
                                for blob in saved["dsopt_rank_states"]])
    alone = replay(opt, model, resumed["batches"])
    opt.close()
    return {"resumed": resumed, "alone": alone, "saved_ranks": len(saved["dsopt_rank_states"])}


def main():
    out_dir, phases = sys.argv[1], sys.argv[2].split(",")
    rank = int(os.environ["RANK"])
    for phase in phases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if phase == "main":
                result = {name: scenario(name, out_dir) for name in SCENARIOS}
                result["single_process_optimizer_error"] = single_process_optimizer_error(
                    os.path.join(out_dir, "refused"))
            elif phase == "torch":
                result = torch_optim(out_dir)
            elif phase == "reshard":
                result = reshard(out_dir, sys.argv[3])
            else:
                raise ValueError(f"unknown phase {phase!r}")
        result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        result["world"] = int(os.environ["WORLD_SIZE"])
        torch.save(result, os.path.join(out_dir, f"{phase}-rank{rank}.pt"))
    # A gloo process group left to the interpreter's exit can end the process
    # in std::terminate ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
