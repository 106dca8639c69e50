"""dsopt.torch.Optimizer(overlap=True) under ZeRO stage 1/2 with the
parameter allgather deferred behind the next forward pass: bit-identical
to overlap=False in one process and at 2 and 4 ranks under mpirun
(mpi_torch_prefetch.py), state_dict and evaluation between steps
included; a model registered in the reverse of its forward order has its
buckets gathered in forward order, with the same values; the forward
pre-hook goes with the optimizer.

Needs torch; `make test-torch` runs this file with a Python that has it."""

import gc
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt.torch  # noqa: E402
import mpi_runner  # noqa: E402
import mpi_torch_prefetch as pf  # noqa: E402


def test_one_process_bit_identical():
    assert pf.check_all() == 2 * len(pf.CONFIGS)


def test_overlap_turns_the_deferred_allgather_on_under_zero_only():
    model = pf.Net(torch.float32)
    opt = dsopt.torch.Optimizer(model.parameters(), pf.zero(2, bucket=None), overlap=True)
    zero = opt.dsopt.config["zero_optimization"]
    assert zero["deferred_allgather"] and zero["allgather_bucket_size"] == 1 << 22
    opt.close()
    opt = dsopt.torch.Optimizer(model.parameters(), pf.zero(2), overlap=False)
    assert not opt.dsopt.config["zero_optimization"]["deferred_allgather"]
    opt.close()
    # Every parameter codec too: the int8 codec's chunks are whole blocks, so
    # its values do not depend on the bucket size (test_compressed_zero.py).
    int8 = pf.zero(2, bucket=None, compression={"parameters": "int8"})
    sizes = []
    for overlap in (False, True):
        opt = dsopt.torch.Optimizer(model.parameters(), int8, overlap=overlap)
        sizes.append(opt.dsopt.config["zero_optimization"]["allgather_bucket_size"])
        opt.close()
    assert sizes == [500_000_000, 1 << 22]
    explicit = pf.zero(2, deferred_allgather=False)
    opt = dsopt.torch.Optimizer(model.parameters(), explicit, overlap=True)
    assert not opt.dsopt.config["zero_optimization"]["deferred_allgather"]
    assert opt._prefetch_handle is None
    opt.close()


def test_the_forward_hook_goes_with_the_optimizer():
    model = pf.Net(torch.float32)
    opt = dsopt.torch.Optimizer(model.parameters(), pf.zero(2), overlap=True)
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    assert len(hooks) >= 1
    opt.close()
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == len(hooks) - 1
    opt = dsopt.torch.Optimizer(model.parameters(), pf.zero(2), overlap=True)
    del opt
    gc.collect()
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == len(hooks) - 1


def needs_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_bit_identical_with_and_without_prefetch(tmp_path, ranks):
    needs_mpirun()
    mpi_runner.mpirun(Path(pf.__file__), ranks, tmp_path, ["prefetch"], timeout=600)


def test_one_process_forward_order():
    assert pf.check_forward_order() == 2 * len(pf.ORDER_CONFIGS)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_forward_order_first_and_bit_identical(tmp_path, ranks):
    needs_mpirun()
    mpi_runner.mpirun(Path(pf.__file__), ranks, tmp_path, ["order"], timeout=600)
