"""dsopt.torch on CUDA parameters in one process (cuda_lockstep.py): every
configuration steps bit for bit as on the CPU with the same gradients (fp32
and bf16 parameters), resumes bit for bit from a state dict, shows its
state as live views on the device, follows a model moved from the CPU to
the GPU, hands gradients over during backward from torch's side streams,
trains under torch.compile with bf16 autocast, and refuses bad input on
the GPU path with a clear error that changes nothing.

Skips without a GPU (`make test-gpu` runs it on one; DSOPT_TEST_DEVICE=cpu
dry-runs it on the CPU)."""

import io

import pytest

torch = pytest.importorskip("torch")

import cuda_lockstep as ls  # noqa: E402

if ls.missing():
    if ls.REQUIRED:
        pytest.fail(ls.missing(), pytrace=False)
    pytest.skip(ls.missing(), allow_module_level=True)

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

DEVICE = ls.DEVICE
NAMES = list(ls.CONFIGS)


@pytest.mark.parametrize("dtype", list(ls.DTYPES), ids=list(ls.DTYPES))
@pytest.mark.parametrize("name", NAMES)
def test_every_config_steps_on_the_gpu_as_on_the_cpu(name, dtype):
    run = ls.run_lockstep(name, DEVICE, ls.DTYPES[dtype])
    assert run["mismatch"] is None, run["mismatch"]
    if name.startswith(("OneBit", "ZeroOne")):
        assert any(run["compressed"]), f"{name} never reached its compressed stage"


def _state_bytes(opt):
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("name", NAMES)
def test_resume_from_a_state_dict_is_bit_identical_on_the_gpu(name):
    """6 steps, a checkpoint through torch.save, 6 more; a new model and
    optimizer loaded from the checkpoint and given the same 6 gradients
    end bit-identical."""
    run = ls.Lockstep(name, DEVICE)
    data = list(ls.batches(steps=12))
    try:
        for x, y in data[:6]:
            run.step(x, y)
        model_state = {k: v.clone() for k, v in run.dut.state_dict().items()}
        blob = _state_bytes(run.dut_opt)
        for x, y in data[6:]:
            run.step(x, y)
        model = ls.make_model(device=DEVICE)
        model.load_state_dict(model_state)
        opt = dsopt.torch.Optimizer(model.parameters(), ls.config(name, DEVICE, torch.float32))
        opt.load_state_dict(torch.load(io.BytesIO(blob), map_location=DEVICE))
        for grads in run.grads[6:]:
            opt.zero_grad()
            for p, g in zip(model.parameters(), grads):
                p.grad = g.to(DEVICE, copy=True)
            opt.step()
        difference = ls.first_difference(list(run.dut.parameters()), list(model.parameters()))
        assert difference is None, f"{name}: the resumed run differs at {difference}"
        assert opt.last_step_info.step == run.dut_opt.last_step_info.step
        opt.close()
    finally:
        run.close()


@pytest.mark.parametrize("name", ["AdamW", "Lamb", "OneBitAdam", "AdamW_zero2"])
def test_state_views_live_on_the_gpu(name):
    """opt.state[p] of the GPU optimizer holds the CPU optimizer's values,
    on the parameters' device; the same write to both is used by both
    next steps."""
    run = ls.Lockstep(name, DEVICE)
    data = list(ls.batches(steps=4))
    try:
        for x, y in data[:3]:
            run.step(x, y)
        for p, q in zip(run.cpu.parameters(), run.dut.parameters()):
            a, b = run.cpu_opt.state[p], run.dut_opt.state[q]
            assert set(a) == set(b), name
            for key in ("exp_avg", "exp_avg_sq"):
                assert b[key].device == q.device, f"{name} {key} is on {b[key].device}"
                assert torch.equal(ls.bits(a[key]), ls.bits(b[key])), f"{name} {key}"
                a[key].mul_(0.5)
                b[key].mul_(0.5)
        run.step(*data[3])
        assert run.difference() is None, f"{name}: after writing the state views"
    finally:
        run.close()


@pytest.mark.parametrize("name", ["AdamW", "AdamW_zero2", "OneBitAdam"])
def test_a_model_moved_to_the_gpu_continues_bit_for_bit(name):
    """5 steps on the CPU, then model.to(device): the optimizer follows and
    the run continues as the one that stayed on the CPU."""
    moved, stayed = ls.make_model(), ls.make_model()
    config = ls.config(name, "cpu", torch.float32)
    opt_moved = dsopt.torch.Optimizer(moved.parameters(), config)
    opt_stayed = dsopt.torch.Optimizer(stayed.parameters(), config)
    try:
        for step, (x, y) in enumerate(ls.batches(steps=10)):
            if step == 5:
                moved.to(DEVICE)
            for opt, model in ((opt_stayed, stayed), (opt_moved, moved)):
                opt.zero_grad()
            ls.loss_of(stayed, x, y).backward()
            for p, q in zip(stayed.parameters(), moved.parameters()):
                q.grad = p.grad.to(q.device, copy=True)
            opt_stayed.step()
            opt_moved.step()
            difference = ls.first_difference(list(stayed.parameters()), list(moved.parameters()))
            assert difference is None, f"{name} step {step + 1}: {difference}"
        assert all(p.device == DEVICE for p in moved.parameters())
        assert opt_moved.state[next(moved.parameters())]["exp_avg"].device == DEVICE
    finally:
        opt_moved.close()
        opt_stayed.close()


@pytest.mark.parametrize("name", ["AdamW", "OneBitAdam", "AdamW_zero2", "AdamW_zero2_int4_int8"])
def test_overlap_hands_gpu_gradients_over_from_side_streams(name):
    """overlap=True: backward runs on a side stream and hands each GPU
    gradient over from its hook; the steps equal the CPU's. The loss
    sum(p * g) makes backward produce exactly the CPU's gradients g."""
    run = ls.Lockstep(name, DEVICE, overlap=True)
    side = torch.cuda.Stream(DEVICE) if DEVICE.type == "cuda" else None
    try:
        for step, (x, y) in enumerate(ls.batches(steps=ls.STEPS), 1):
            grads, _ = run.gradients(x, y)
            run.dut_opt.zero_grad()
            if side is not None:
                side.wait_stream(torch.cuda.current_stream(DEVICE))
            with torch.cuda.stream(side) if side is not None else _nothing():
                exact = sum((q * g.to(DEVICE)).sum() for q, g in zip(run.dut.parameters(), grads))
                exact.backward()
            if side is not None:
                torch.cuda.current_stream(DEVICE).wait_stream(side)
            for p, g in zip(run.cpu.parameters(), grads):
                p.grad = g
            run.cpu_opt.step()
            run.dut_opt.step()
            difference = run.difference()
            assert difference is None, f"{name} overlap step {step}: {difference}"
    finally:
        run.close()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_compiled_model_with_bf16_autocast_trains_on_the_gpu():
    if not hasattr(torch, "compile"):
        pytest.skip(f"torch.compile needs torch >= 2.0 (this is {torch.__version__})")
    model = ls.make_model(device=DEVICE)
    compiled = torch.compile(model)
    opt = dsopt.torch.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    losses = []
    try:
        for x, y in ls.batches(steps=60, batch=64):
            x, y = x.to(DEVICE), y.to(DEVICE)
            opt.zero_grad()
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        assert opt.last_step_info.step == 60
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert sum(losses[-10:]) < 0.5 * sum(losses[:10]), losses
    finally:
        opt.close()


# ---- bad input on the GPU path -------------------------------------------------------------


def test_a_gradient_on_another_device_is_refused_and_changes_nothing():
    if DEVICE.type != "cuda":
        pytest.skip("needs CUDA memory")
    params = [torch.randn(100), torch.randn(10)]
    before = [p.clone() for p in params]
    opt = dsopt.Optimizer({"optimizer": {"type": "AdamW"}}, params)
    with pytest.raises(dsopt.InvalidArgument, match="grads\\[1\\].data is memory of CUDA device"):
        opt.step([torch.randn(100), torch.randn(10, device=DEVICE)])
    assert all(torch.equal(a, b) for a, b in zip(params, before))
    info = opt.step([torch.randn(100), torch.randn(10)])
    assert info.step == 1
    opt.close()
    gpu = [p.to(DEVICE) for p in before]
    opt = dsopt.Optimizer({"optimizer": {"type": "AdamW"}, "device": "cuda"}, gpu)
    with pytest.raises(dsopt.InvalidArgument, match="grads\\[0\\].data is host memory"):
        opt.step([torch.randn(100), torch.randn(10, device=DEVICE)])
    assert opt.step([torch.randn(100, device=DEVICE), torch.randn(10, device=DEVICE)]).step == 1
    opt.close()


def test_config_without_device_runs_on_the_parameters_device():
    """dsopt.torch.Optimizer(params, config) without "device" runs where
    the parameters are, as the classes do; "device": "cpu" with CUDA
    parameters is refused."""
    model = ls.make_model(device=DEVICE)
    opt = dsopt.torch.Optimizer(model.parameters(), {"optimizer": {"type": "AdamW"}})
    assert opt.dsopt.config["device"] == DEVICE.type
    model(torch.randn(4, 64, device=DEVICE)).sum().backward()
    assert opt.step() is None and opt.last_step_info.step == 1
    opt.close()
    if DEVICE.type == "cuda":
        with pytest.raises(dsopt.InvalidArgument, match="optimizer's device is cpu"):
            dsopt.torch.Optimizer(model.parameters(),
                                  {"optimizer": {"type": "AdamW"}, "device": "cpu"})


def test_parameters_on_two_gpus_are_refused():
    if DEVICE.type != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    model = ls.make_model(device=DEVICE)
    model[2].to(torch.device("cuda", 1 - DEVICE.index))
    with pytest.raises(ValueError, match="params\\[2\\].data is memory of CUDA device "
                                         f"{1 - DEVICE.index} but the optimizer's device is "
                                         f"cuda:{DEVICE.index}"):
        dsopt.torch.AdamW(model.parameters())
    params = [p.detach() for p in model.parameters()]
    with pytest.raises(dsopt.InvalidArgument, match="memory of CUDA device"):
        dsopt.Optimizer({"optimizer": {"type": "AdamW"}, "device": "cuda"}, params)


def test_torch_communicator_on_another_device_is_refused_before_anything_is_made():
    """A from_torch communicator made with another CUDA device current
    than the parameters' (here its device is set as if it had been)."""
    if DEVICE.type != "cuda":
        pytest.skip("needs CUDA memory")
    import torch.distributed as dist

    from conftest import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        comm = dsopt.Communicator.from_torch()
        comm.torch_collectives.device = torch.device("cuda", DEVICE.index + 1)
        model = ls.make_model(device=DEVICE)
        before = [p.clone() for p in model.parameters()]
        with pytest.raises(ValueError, match=f"works on cuda:{DEVICE.index + 1}.*parameters are "
                                             f"on cuda:{DEVICE.index}"):
            dsopt.torch.AdamW(model.parameters(), comm=comm)
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
        comm.close()
    finally:
        dist.destroy_process_group()
