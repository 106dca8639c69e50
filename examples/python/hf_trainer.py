"""Hugging Face Trainer with a dsopt optimizer: dsopt.hf.Trainer.

A tiny GPT-2 (built from a config, no download) learns the GPL-3 text that
Debian ships (/usr/share/common-licenses/GPL-3), one byte per token. The
Trainer creates the dsopt optimizer from ``optimizer_cls_and_kwargs``;
``max_grad_norm`` becomes dsopt's clipping, DDP's allreduce is replaced by
``dsopt.torch.ddp_comm_hook`` (dsopt's reduction is the only one), and the
checkpoints hold every rank's optimizer state.

    torchrun --nproc-per-node 2 examples/python/hf_trainer.py
    torchrun --nproc-per-node 2 examples/python/hf_trainer.py --optimizer onebit
    python3 examples/python/hf_trainer.py                # one process

Run it again with the same --output-dir and a larger --steps and it resumes
from the last checkpoint, at this or another number of processes (ZeRO's
shards reshard; 1-bit Adam restarts its error feedback at another). The
backend is gloo on the CPU (``use_cpu``) unless --cuda is given (NCCL, one
GPU per process). Rank 0 prints the loss, dsopt's grad_norm and dsopt's
bytes per step.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bindings" / "python"))
import dsopt.hf  # noqa: E402
import dsopt.torch  # noqa: E402

TEXT = "/usr/share/common-licenses/GPL-3"
OPTIMIZERS = {
    "adamw": (dsopt.torch.AdamW, {}),
    "zero2": (dsopt.torch.AdamW, {"zero_stage": 2}),
    "onebit": (dsopt.torch.OneBitAdam, {"freeze_step": 30}),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw",
                        help="dsopt AdamW, AdamW with ZeRO-2, or 1-bit Adam (compressed from "
                             "step 30)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--output-dir", default="hf_trainer_output")
    parser.add_argument("--cuda", action="store_true", help="one GPU per process (NCCL)")
    return parser.parse_args(argv)


class ByteBlocks(torch.utils.data.Dataset):
    """A text file's bytes as blocks of ``length`` tokens (vocabulary 256)."""

    def __init__(self, path, length=64):
        data = torch.tensor(list(Path(path).read_bytes()), dtype=torch.long)
        self.blocks = data[:len(data) // length * length].view(-1, length)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class DsoptBytes(TrainerCallback):
    """Prints, with each log, what dsopt sent from rank 0 in the last step."""

    def on_log(self, args, state, control, logs=None, optimizer=None, **kwargs):
        info = getattr(dsopt.hf.dsopt_optimizer(optimizer), "last_step_info", None)
        if info is not None and "loss" in logs and state.is_world_process_zero:
            print(f"step {state.global_step}: dsopt sent {info.bytes_sent} bytes "
                  f"({'1-bit compressed' if info.compressed else 'fp32'})", flush=True)


def main(argv=None):
    options = parse_args(argv)
    args = TrainingArguments(
        output_dir=options.output_dir, max_steps=options.steps, per_device_train_batch_size=8,
        learning_rate=5e-3, weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="cosine",
        warmup_steps=5, logging_steps=20, save_steps=50, report_to=[], disable_tqdm=True,
        use_cpu=not options.cuda, ddp_find_unused_parameters=False, seed=0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    cls, kwargs = OPTIMIZERS[options.optimizer]
    kwargs = dict(kwargs, lr=args.learning_rate)  # optimizer_cls_and_kwargs takes no lr from args
    trainer = dsopt.hf.Trainer(model=model, args=args, train_dataset=ByteBlocks(TEXT),
                               optimizer_cls_and_kwargs=(cls, kwargs), callbacks=[DsoptBytes()])
    last = get_last_checkpoint(options.output_dir) if os.path.isdir(options.output_dir) else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
