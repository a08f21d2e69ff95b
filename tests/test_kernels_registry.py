import sys

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels import peers, registry
from ditprof.kernels.reference import attention_reference

CONTRACT_NAMES = {"sdpa", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "fa4", "sage",
                  "fp8-emulated", "fp8"}
CUDA_ONLY = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "fa4", "sage", "fp8")


@pytest.fixture
def scratch_backend():
    """Register a throwaway backend and remove it afterwards."""
    names = []

    def make(name, **kwargs):
        names.append(name)
        return registry.register(name, **kwargs)

    yield make
    for name in names:
        registry._BACKENDS.pop(name, None)


def test_all_contract_backends_are_registered():
    assert CONTRACT_NAMES <= set(registry.names())


def test_unknown_backend_names_it_and_lists_the_others():
    with pytest.raises(DitprofError) as err:
        registry.get("flash9000")
    msg = str(err.value)
    assert "'flash9000'" in msg and "\n" not in msg
    assert "sdpa" in msg and "fp8-emulated" in msg
    if not torch.cuda.is_available():
        assert "fp8 (needs a CUDA device" in msg  # unavailable ones come with the reason


def test_availability_on_cpu():
    for name in ("sdpa", "sdpa-math", "fp8-emulated"):
        assert registry.available(name, "cpu") == (True, "")
    for name in CUDA_ONLY:
        ok, reason = registry.available(name, "cpu")
        assert not ok and reason == "needs a CUDA device (got cpu)"


def test_require_raises_one_line_with_the_reason():
    with pytest.raises(DitprofError, match=r"^attention backend 'fp8' is not available on cpu: needs a CUDA"):
        registry.require("fp8", "cpu")
    assert registry.require("sdpa", "cpu").name == "sdpa"


def test_missing_optional_packages_are_named(monkeypatch):
    monkeypatch.setattr(peers, "_cuda_reason", lambda device: "")  # pretend we are on a GPU
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # make sure it is absent, installed or not
    monkeypatch.setitem(sys.modules, "sageattention", None)
    ok, reason = registry.available("fa4", "cuda")
    assert not ok and reason.startswith("flash_attn.cute not importable:") and "flash_attn" in reason
    ok, reason = registry.available("sage", "cuda")
    assert not ok and reason.startswith("sageattention not importable:")


@pytest.mark.parametrize("capability, expected", [((8, 0), "got sm_80"), ((10, 0), "got sm_100"),
                                                  ((12, 0), ""), ((8, 9), "")])
def test_fp8_availability_by_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(peers, "_cuda_reason", lambda device: "")
    monkeypatch.setattr(peers, "_capability", lambda device: capability)
    monkeypatch.setattr(peers, "_import_reason", lambda module: "")
    ok, reason = registry.available("fp8", "cuda")
    assert ok == (expected == "") and expected in reason


def test_fp8_backend_imports_the_kernel_only_when_called():
    """The fp8 backend is the custom op: looking it up, and running it off CUDA (the emulation), import no CuTe
    DSL; the kernel module loads at the first CUDA call only."""
    import subprocess
    from pathlib import Path

    code = ("import sys, torch\nfrom ditprof.kernels import registry\nb = registry.get('fp8')\n"
            "q = torch.randn(1, 8, 2, 64).bfloat16()\no = b(q, q, q, scale=0.125)\n"
            "from ditprof.kernels.fp8_emulation import fp8_attention_emulated\n"
            "print(torch.equal(o, fp8_attention_emulated(q, q, q, scale=0.125)), 'cutlass' in sys.modules, "
            "'ditprof.kernels.interface' in sys.modules)\n")
    root = str(Path(__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["True", "False", "False"]


def test_register_decorator_and_failing_probe(scratch_backend):
    @scratch_backend("test-double", description="doubles q", available=lambda device: 1 / 0)
    def double(q, k, v, *, scale=None):
        return q * 2

    backend = registry.get("test-double")
    assert backend.description == "doubles q"
    assert torch.equal(backend(torch.ones(1), None, None), torch.full((1,), 2.0))
    ok, reason = registry.available("test-double", "cpu")
    assert not ok and reason.startswith("availability check failed: ZeroDivisionError")


@pytest.mark.parametrize("name", ["sdpa", "sdpa-math"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_backends_follow_the_contract(name, dtype):
    torch.manual_seed(0)
    q = torch.randn(2, 33, 3, 64, dtype=dtype)  # (B, Sq, H, D), Sq != Sk
    k = torch.randn(2, 20, 3, 64, dtype=dtype)
    v = torch.randn(2, 20, 3, 64, dtype=dtype)
    out = registry.get(name)(q, k, v, scale=0.2)
    ref = attention_reference(q, k, v, scale=0.2)
    assert out.shape == q.shape and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (out.double() - ref).abs().max().item() < tol
