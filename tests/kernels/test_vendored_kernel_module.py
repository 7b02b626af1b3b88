"""The vendored kernel module (``kernels = true``): SGLang's signatures, our v1 bits.

Rendered as ``sync`` writes it, imported from a file (Triton reads a kernel's source), and run
under Triton's CPU interpreter (``TRITON_INTERPRET=1``, set before any kernel is defined, as in
``test_triton_kernels.py``); on a GPU it runs there. Every comparison is of bit patterns.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from contractgen.adapters.kernels.matmul import reference_matmul  # noqa: E402
from contractgen.adapters.kernels.triton import matmul as tmm  # noqa: E402
from contractgen.codegen.kernels_module import MODULE_NAME  # noqa: E402
from contractgen.codegen.paths import builtin_config  # noqa: E402
from contractgen.codegen.render import render_vendored  # noqa: E402
from contractgen.schema.loader import load_contracts  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
BF = torch.bfloat16


def _r(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(BF).to(DEV)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.int16)


def _rendered_module() -> bytes:
    config = dataclasses.replace(builtin_config(), kernels=frozenset({"sglang"}))
    contracts = load_contracts(config.contracts_dir, config.root)
    files = render_vendored(contracts, config, "sglang")
    return files[f"{config.package('sglang')}/{MODULE_NAME}"]


@pytest.fixture(scope="module")
def module_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vendored") / MODULE_NAME
    path.write_bytes(_rendered_module())
    return path


@pytest.fixture(scope="module")
def vk(module_file):
    spec = importlib.util.spec_from_file_location("vendored_tp_invariant_ops", module_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


# K = 128 * T; sglang_first_level runs = T / first_level_block(T): T = 1, 2, 3 -> 1 run,
# 4 and 6 -> 2, 8 and 12 -> 4, 16 -> 8. M = 1 (decode), odd M, and M past the per-run launch.
SHAPES = [
    (1, 128, 64),
    (1, 256, 96),
    (3, 384, 40),
    (1, 512, 64),
    (5, 768, 72),
    (7, 1024, 64),
    (1, 1536, 48),
    (3, 2048, 64),
    (33, 512, 80),  # the persistent launch (more than SMALL_ROWS rows)
    (17, 1024, 64),
]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul_tp_persistent_is_the_v1_reference_bitwise(vk, kp, m, k, n):
    x = _r(m, k, seed=m + k)
    w_NK = _r(n, k, seed=n, scale=k**-0.5)
    ref = reference_matmul(x, w_NK, kp)
    got = vk.matmul_tp_persistent(x, w_NK.t())  # callers pass weight.t()
    assert got.shape == (m, n) and got.dtype == BF
    assert torch.equal(_bits(got), _bits(ref))
    assert torch.equal(_bits(got), _bits(tmm.triton_matmul(x, w_NK, kp)))
    # B as a contiguous [K, N] tensor: the same bits
    assert torch.equal(_bits(vk.matmul_tp_persistent(x, w_NK.t().contiguous())), _bits(ref))


def test_runs_cover_one_two_four_eight(vk):
    assert [vk.k_runs(k)[1] for k in (128, 256, 384, 512, 768, 1024, 1536, 2048)] == [
        1, 1, 1, 2, 2, 4, 4, 8,
    ]  # fmt: skip


def test_matmul_tp_persistent_row_alone_equals_row_in_batch(vk):
    x = _r(9, 1024, seed=3)
    w = _r(64, 1024, seed=4, scale=1024**-0.5).t()
    batch = vk.matmul_tp_persistent(x, w)
    for i in (0, 4, 8):
        assert torch.equal(_bits(vk.matmul_tp_persistent(x[i : i + 1], w)[0]), _bits(batch[i]))


@pytest.mark.parametrize("bias_dtype", [BF, torch.float32])
def test_matmul_tp_persistent_bias_is_added_to_the_output(vk, kp, bias_dtype):
    x = _r(3, 512, seed=5)
    w_NK = _r(40, 512, seed=6, scale=512**-0.5)
    bias = _r(40, seed=7).to(bias_dtype)
    want = reference_matmul(x, w_NK, kp)
    want += bias  # what SGLang's ``C += bias`` does
    got = vk.matmul_tp_persistent(x, w_NK.t(), bias)
    assert got.dtype == BF
    assert torch.equal(_bits(got), _bits(want))
    got_kw = vk.matmul_tp_persistent(x, w_NK.t(), bias=bias)
    assert torch.equal(_bits(got_kw), _bits(want))


def test_matmul_tp_persistent_under_autograd_has_the_same_forward_bits(vk, kp):
    x = _r(3, 512, seed=8).requires_grad_(True)
    w_NK = _r(40, 512, seed=9, scale=512**-0.5).requires_grad_(True)
    bias = _r(40, seed=10).requires_grad_(True)
    y = vk.matmul_tp_persistent(x, w_NK.t(), bias)
    want = reference_matmul(x.detach(), w_NK.detach(), kp)
    want += bias.detach()
    assert torch.equal(_bits(y), _bits(want))
    y.float().sum().backward()
    assert x.grad is not None and w_NK.grad is not None and bias.grad is not None


def test_matmul_tp_persistent_refuses_what_it_does_not_compute(vk):
    x = _r(2, 256)
    with pytest.raises(TypeError, match="bfloat16"):
        vk.matmul_tp_persistent(x.float(), x.float().t())
    with pytest.raises(ValueError, match="expected A"):
        vk.matmul_tp_persistent(x, _r(128, 8))


def test_matmul_tp_persistent_of_no_rows_is_empty(vk):
    y = vk.matmul_tp_persistent(_r(0, 256), _r(256, 16))
    assert y.shape == (0, 16)


class _FakeGroup:
    """``dist`` as one rank of a group sees it: every rank's tensor, gathered in rank order."""

    def __init__(self, parts):
        self.parts = parts

    def get_world_size(self, group=None):
        return len(self.parts)

    def all_gather(self, out, t, group=None):
        for o, p in zip(out, self.parts, strict=True):
            o.copy_(p.contiguous().reshape(-1).view(torch.uint8))


def test_tree_all_reduce_sum_is_the_fixed_pairwise_order(vk, monkeypatch):
    parts = [_r(5, 33, seed=20 + i) * (10.0**i) for i in range(4)]
    monkeypatch.setattr(vk, "dist", _FakeGroup(parts))
    got = vk.tree_all_reduce_sum(parts[1], device_group="tp")
    pairwise = (parts[0] + parts[1]) + (parts[2] + parts[3])
    assert torch.equal(_bits(got), _bits(pairwise))
    sequential = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    assert not torch.equal(_bits(sequential), _bits(pairwise))  # the order is visible here


def test_tree_all_reduce_sum_refuses_non_power_of_two(vk, monkeypatch):
    monkeypatch.setattr(vk, "dist", _FakeGroup([_r(2, 2)] * 3))
    with pytest.raises(ValueError, match="not a power of two"):
        vk.tree_all_reduce_sum(_r(2, 2))


def test_tree_all_reduce_sum_on_a_real_group_of_one(vk):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = _r(3, 7, seed=30).cpu()
        got = vk.tree_all_reduce_sum(x)
        assert torch.equal(_bits(got), _bits(x)) and got.data_ptr() != x.data_ptr()
    finally:
        dist.destroy_process_group()


BLOCKER = """
import importlib.abc, sys
class _NoContractgen(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "contractgen" or name.startswith("contractgen."):
            raise ImportError(f"{name}: contractgen is not installed here")
        return None
sys.meta_path.insert(0, _NoContractgen())
"""


def test_module_runs_with_torch_and_triton_only(module_file, kp, tmp_path):
    """A fresh interpreter where contractgen cannot be imported: the module imports, computes
    the v1 bits, and pulls in nothing of contractgen."""
    out = tmp_path / "y.pt"
    code = BLOCKER + textwrap.dedent(f"""
        import torch
        try:
            import contractgen
        except ImportError:
            pass
        else:
            raise SystemExit("contractgen is importable: the test proves nothing")
        sys.path.insert(0, {str(module_file.parent)!r})
        import tp_invariant_ops as m
        g = torch.Generator().manual_seed(0)
        x = torch.randn(3, 1024, generator=g).to(torch.bfloat16).to({DEV!r})
        w = (torch.randn(48, 1024, generator=g) / 32).to(torch.bfloat16).to({DEV!r})
        torch.save({{"x": x.cpu(), "w": w.cpu(), "y": m.matmul_tp_persistent(x, w.t()).cpu()}},
                   {str(out)!r})
        leaked = sorted(n for n in sys.modules if n.startswith("contractgen"))
        assert not leaked, leaked
    """)
    env = {**os.environ}
    if not CUDA:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    saved = torch.load(out)
    ref = reference_matmul(saved["x"].to(DEV), saved["w"].to(DEV), kp)
    assert torch.equal(_bits(saved["y"]), _bits(ref))


def test_module_is_cut_from_our_kernel_source(module_file):
    """Every definition the module shares with the kernel files (``triton/matmul.py`` and the
    modules it is split into) is that definition, unchanged (the module is extracted, never a
    second copy); what the module adds is only the public wrappers and their constants."""
    import ast

    def defs(path: Path) -> dict[str, str]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                out[node.name] = ast.dump(node)
        return out

    folder = Path(tmm.__file__).parent
    ours = {
        name: text
        for part in ("matmul", "matmul_tiles", "matmul_kernels", "matmul_shapes", "arith")
        for name, text in defs(folder / f"{part}.py").items()
    }
    vendored = defs(module_file)
    shared = set(ours) & set(vendored)
    assert {"_launch", "_run", "_push", "_round", "_mm_persistent", "_mm_runs"} <= shared
    assert all(ours[name] == vendored[name] for name in shared)
    added = set(vendored) - set(ours)
    assert added == {
        "first_level_block", "pairwise_sum", "stream_key", "k_runs", "_TPInvariantMatmul",
        "matmul_tp_persistent", "tree_all_reduce_sum",
    }  # fmt: skip
