"""The binding's side of three library calls: ``Optimizer.rebind_params``
(new storage, bit-identical run, bad arguments change nothing),
``StepInfo.grads_replicated`` with ``DoubleReductionWarning``, and
``load_state_dict(blob, reset_rank_local=...)`` (another rank's rank-local
state: Mismatch, or reset and reported). The multi-rank parts run
mpi_rank_local.py under ``mpirun -np 2``."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_runner
from dsopt_testing import build_feature

SCRIPT = Path(__file__).with_name("mpi_rank_local.py")
CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "threads": 1}


def arrays(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(300).astype(np.float32), rng.standard_normal(17).astype(np.float16),
            dsopt.bf16((rng.integers(0x3C00, 0x3F80, 9)).astype(np.uint16))]


def bits(a):
    return (a.array if isinstance(a, dsopt.bf16) else a).tobytes()


def copy(a):
    return dsopt.bf16(a.array.copy()) if isinstance(a, dsopt.bf16) else a.copy()


def test_rebind_params_continues_bit_identically():
    still, moved = arrays(1), arrays(1)
    grads = [np.random.default_rng(k).standard_normal(a.size if not isinstance(a, dsopt.bf16) else a.array.size)
             .astype(np.float32) for k, a in enumerate(arrays(1))]
    with dsopt.Optimizer(CONFIG, still) as a, dsopt.Optimizer(CONFIG, moved) as b:
        for k in range(6):
            if k in (0, 2, 4):
                old = moved
                moved = [copy(x) for x in moved]
                b.rebind_params(moved)
                assert all(x is y for x, y in zip(b.params, moved))
            a.step(grads)
            b.step(grads)
            assert [bits(x) for x in still] == [bits(x) for x in moved], f"step {k + 1}"
        frozen = [bits(x) for x in old]
        a.step(grads)
        b.step(grads)
        assert [bits(x) for x in old] == frozen, "the old arrays were updated after the rebind"
        assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize("change,pattern", [
    (lambda ps: ps[:2], "num_params"),
    (lambda ps: [ps[0][:299].copy(), ps[1], ps[2]], "numel"),
    (lambda ps: [ps[0], ps[1].astype(np.float32), ps[2]], "float16"),
])
def test_rebind_params_rejects_other_shapes_and_changes_nothing(change, pattern):
    params = arrays(2)
    with dsopt.Optimizer(CONFIG, params) as opt:
        other = [copy(x) for x in params]
        with pytest.raises(dsopt.InvalidArgument, match=pattern):
            opt.rebind_params(change(other))
        assert all(x is y for x, y in zip(opt.params, params))
        before = [bits(x) for x in other]
        opt.step([np.ones(300, np.float32), np.ones(17, np.float32), np.ones(9, np.float32)])
        assert [bits(x) for x in other] == before and bits(params[0]) != bits(other[0])


def test_rebind_params_refused_while_gradients_are_handed_over():
    params = arrays(3)
    with dsopt.Optimizer(CONFIG, params) as opt:
        opt.grad_ready(0, np.ones(300, np.float32))
        with pytest.raises(dsopt.InvalidArgument, match="handed over"):
            opt.rebind_params([copy(x) for x in params])
        opt.step()


def test_one_rank_never_reports_replicated_gradients(recwarn):
    with dsopt.Optimizer(CONFIG, arrays(4)) as opt:
        infos = [opt.step([np.ones(300, np.float32), np.ones(17, np.float32), np.ones(9, np.float32)])
                 for _ in range(4)]
    assert not any(i.grads_replicated for i in infos)
    assert not [w for w in recwarn if issubclass(w.category, dsopt.DoubleReductionWarning)]
    assert issubclass(dsopt.DoubleReductionWarning, UserWarning)


def test_load_state_dict_reports_no_reset_at_one_rank():
    with dsopt.Optimizer(CONFIG, arrays(5)) as opt:
        blob = opt.state_dict()
        assert opt.load_state_dict(blob) is False
        assert opt.load_state_dict(blob, reset_rank_local=True) is False


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    pytest.importorskip("mpi4py", reason="the worker exchanges blobs through mpi4py")
    return mpi_runner.mpirun(SCRIPT, 2, tmp_path_factory.mktemp("rank_local"), ["rank_local", "replicated"])


def test_another_ranks_rank_local_state_is_refused_or_reset(two_ranks):
    """Mismatch naming the saving rank and the Python flag, nothing changed;
    with reset_rank_local=True: True, the errors zero, the run goes on; own
    blob: False, errors restored; AdamW's replicated blob: loads anywhere."""
    for r in (0, 1):
        assert (two_ranks / f"rank{r}.txt").read_text().splitlines()[1] == "rank_local OK ok"


def test_replicated_gradients_are_reported_and_warned_once(two_ranks):
    """Equal gradients on both ranks: grads_replicated on steps 1-3, one
    DoubleReductionWarning naming the DDP comm hook; different: neither."""
    for r in (0, 1):
        assert (two_ranks / f"rank{r}.txt").read_text().splitlines()[2] == "replicated OK ok"
