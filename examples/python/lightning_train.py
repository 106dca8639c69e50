"""Data-parallel training with PyTorch Lightning and dsopt.

A small MLP learns scikit-learn's digits with ``lightning.Trainer`` and
``dsopt.lightning.DsoptStrategy``: the model is not wrapped in
DistributedDataParallel; the dsopt.torch optimizer returned by
``configure_optimizers`` averages the gradients (1-bit compressed with
``--optimizer onebit``, reduce-scattered with ``--optimizer zero2``), and the
checkpoint Lightning writes after every epoch holds every rank's optimizer
state.

    python examples/python/lightning_train.py                  # 2 CPU processes
    python examples/python/lightning_train.py --optimizer onebit --devices 4
    python examples/python/lightning_train.py --epochs 3 && \
        python examples/python/lightning_train.py --epochs 5 --resume   # 3 epochs, then 2 more
    torchrun --nproc_per_node 2 examples/python/lightning_train.py

Run as a script, Lightning's launcher starts the other ``--devices - 1``
processes by running this script again; under ``torchrun`` the processes
are torchrun's (``--devices`` defaults to its LOCAL_WORLD_SIZE). With CUDA,
each process uses one GPU (``cuda:LOCAL_RANK``, NCCL); else the CPU (gloo).
Rank 0 prints the validation accuracy after every epoch.
"""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bindings" / "python"))
import lightning  # noqa: E402

import dsopt.torch  # noqa: E402
from dsopt.lightning import DsoptStrategy  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", choices=["adamw", "onebit", "zero2"], default="adamw")
    parser.add_argument("--devices", type=int,
                        default=int(os.environ.get("LOCAL_WORLD_SIZE", "2")))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--out", default="lightning_out", help="checkpoint folder")
    parser.add_argument("--resume", action="store_true",
                        help="continue from --out's last.ckpt up to --epochs")
    return parser.parse_args()


def digits():
    """(train, validation) TensorDatasets: scikit-learn's digits, pixels in
    [0, 1], a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(x))
    train, val = order[:cut], order[cut:]
    return (torch.utils.data.TensorDataset(x[train], y[train]),
            torch.utils.data.TensorDataset(x[val], y[val]))


class DigitsClassifier(lightning.LightningModule):
    def __init__(self, optimizer):
        super().__init__()
        self.optimizer_name = optimizer
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                       torch.nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self.net(x).argmax(dim=1) == y).float().mean()
        self.log("val_accuracy", accuracy, sync_dist=True)  # averaged over the ranks

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            accuracy = self.trainer.callback_metrics["val_accuracy"]
            print(f"epoch {self.current_epoch}: validation accuracy {accuracy:.3f}", flush=True)

    def configure_optimizers(self):
        # Runs once torch.distributed's default process group exists: the
        # optimizer averages the gradients over it.
        if self.optimizer_name == "onebit":
            opt = dsopt.torch.OneBitAdam(self.parameters(), lr=1e-2, freeze_step=50,
                                         gradient_clipping=1.0)
        else:
            opt = dsopt.torch.AdamW(self.parameters(), lr=1e-2, weight_decay=0.01,
                                    gradient_clipping=1.0,
                                    zero_stage=2 if self.optimizer_name == "zero2" else 0)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=50)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    args = parse_args()
    train, val = digits()
    train_loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=256)
    model = DigitsClassifier(args.optimizer)
    trainer = lightning.Trainer(
        strategy=DsoptStrategy(), accelerator="auto", devices=args.devices,
        max_epochs=args.epochs, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=args.out,
        callbacks=[lightning.pytorch.callbacks.ModelCheckpoint(dirpath=args.out, save_last=True)])
    resume = os.path.join(args.out, "last.ckpt") if args.resume else None
    trainer.fit(model, train_loader, val_loader, ckpt_path=resume)
    if trainer.is_global_zero:
        info = trainer.optimizers[0].last_step_info
        print(f"{trainer.world_size} processes, dsopt step {info.step}: {info.bytes_sent} bytes "
              f"sent by rank 0 in the last step; checkpoints in {args.out}/")


if __name__ == "__main__":
    main()
