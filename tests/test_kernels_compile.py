"""Every ``kernels/*.cu`` compiles with NVRTC for sm_90 — no GPU needed, so this runs in CI — in both
build variants (``plain``, and ``pdl`` with the device-side half of programmatic dependent launch), and
the ``pdl`` build of every kernel the decode token launches waits before anything else.

Uses ``scripts/compile_kernels.py`` (see its docstring). Skipped, with the reason, where
``cuda.bindings.nvrtc`` (the ``nvrtc12`` or ``nvrtc13`` extra) is not importable or usable, or where no
``cuda_fp16.h`` is installed (``pip install nvidia-cuda-runtime-cu12``).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
SCRIPT = ROOT / "scripts" / "compile_kernels.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("compile_kernels", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ck = _load_script()


@pytest.fixture(scope="module")
def nvrtc():
    """``cuda.bindings.nvrtc``, or skip with the reason it is unusable."""
    try:
        return ck.load_nvrtc()
    except ck.NvrtcUnavailable as e:
        pytest.skip(f"NVRTC not available, kernels not compiled: {e}")


@pytest.fixture(scope="module")
def cuda_include(nvrtc):
    inc = ck.find_cuda_include_dir()
    if inc is None:
        pytest.skip("cuda_fp16.h not found (NVRTC 12 does not ship it): pip install nvidia-cuda-runtime-cu12")
    return inc


def test_kernel_files_present():
    files = ck.kernel_files(KERNELS)
    assert files, f"no .cu files in {KERNELS}"
    assert (KERNELS / "common.cuh").is_file()


@pytest.mark.parametrize("cu", ck.kernel_files(KERNELS), ids=lambda p: p.name)
def test_kernel_compiles_sm90(cu, nvrtc, cuda_include):
    r = ck.compile_kernel(cu, "sm_90", [KERNELS, cuda_include], nvrtc)
    assert r.ok, r.describe()
    assert r.cubin_size > 0
    assert r.kernels, f"no __global__ function found in {cu.name}"


def test_compiling_leaves_the_interpreters_single_bytes_intact(nvrtc, cuda_include):
    """An empty NVRTC log is one byte: written into ``b" " * 1`` (CPython's shared ``b" "``) it made every
    space read one byte at a time a NUL for the rest of the process."""
    import io

    r = ck.compile_kernel(ck.kernel_files(KERNELS)[0], "sm_90", [KERNELS, cuda_include], nvrtc)
    assert r.ok, r.describe()
    assert b" "[0] == 32 and io.BytesIO(b"a b").read(2)[1:] == b"\x20" and io.BytesIO(b" ").read(1)[0] == 32


def test_compile_all_reports_every_file(nvrtc, cuda_include):
    results = ck.compile_all(KERNELS, ["sm_90"], nvrtc=nvrtc)
    assert [r.path.name for r in results] == [p.name for p in ck.kernel_files(KERNELS)]
    assert all(r.arch == "sm_90" for r in results)
    bad = [r.describe() for r in results if not r.ok]
    assert not bad, "\n".join(bad)


BROKEN = """#include "common.cuh"
extern "C" __global__ void broken_kernel(float* x) {
    x[threadIdx.x] = warp_sum(1.0f)   // missing semicolon
}
"""


@pytest.fixture
def broken_dir(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir()
    shutil.copy(KERNELS / "common.cuh", d / "common.cuh")
    (d / "broken_syntax.cu").write_text(BROKEN)
    return d


def test_broken_kernel_is_reported(broken_dir, nvrtc, cuda_include):
    results = ck.compile_all(broken_dir, ["sm_90"], nvrtc=nvrtc)
    assert len(results) == 1
    r = results[0]
    assert not r.ok
    assert r.path.name == "broken_syntax.cu"
    assert r.kernels == ["broken_kernel"]
    assert "broken_syntax.cu" in r.log and "error" in r.log, r.log
    report = r.describe()
    assert report.startswith("FAIL") and "broken_syntax.cu" in report


def test_broken_kernel_fails_the_script(broken_dir, nvrtc, cuda_include, capsys):
    rc = ck.main(["--arch", "sm_80", "sm_90", "--kernels-dir", str(broken_dir)])
    out = capsys.readouterr()
    assert rc == 1
    fails = [ln for ln in out.out.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 4 and all("broken_syntax.cu" in ln for ln in fails), out.out  # 2 archs x 2 variants
    assert "error" in out.out and "broken_syntax.cu" in out.err


@pytest.mark.slow
def test_main_ok_on_real_kernels(nvrtc, cuda_include, capsys):
    rc = ck.main(["--arch", "sm_90", "--kernels-dir", str(KERNELS)])
    out = capsys.readouterr().out
    assert rc == 0, out
    n = len(ck.kernel_files(KERNELS))
    assert sum(ln.startswith("OK ") for ln in out.splitlines()) == n * len(ck.VARIANTS), out


def test_bad_arch_rejected():
    with pytest.raises(ValueError):
        ck.normalize_arch("ampere")
    assert ck.normalize_arch("90") == "sm_90"
    assert ck.main(["--arch", "ampere"]) == 2


def test_kernel_names_ignore_comments():
    src = '// __global__ void commented_out(int x)\nextern "C" __global__ void real_one(int* p) {}\n' \
          "/* __global__ void also_not(int) */\n__global__ void __launch_bounds__(256) bounded(float* y) {}\n"
    assert ck.kernel_names(src) == ["real_one", "bounded"]


def test_backend_finds_every_kernel_by_name():
    """The cupy backend's name scan (``extern "C" __global__ void NAME(``) sees the same kernels as
    NVRTC's compile check: an attribute between ``void`` and the name (``__launch_bounds__``)
    would make the backend register the attribute as a kernel name instead."""
    from ds4lab.backends.cupy_backend import kernel_sources

    found = kernel_sources()
    for f in sorted(KERNELS.glob("*.cu")):
        for name in ck.kernel_names(f.read_text()):
            assert found.get(name) == f.resolve(), (name, f.name)
    assert not any(n.startswith("__") for n in found)


def test_moe_ds4_kernels_compile_for_both_archs_and_cover_every_site(nvrtc, cuda_include):
    """``kernels/moe_ds4.cu`` (ds4's routed-MoE path; it includes ``ds4_formats.cuh``) compiles for
    sm_80 and sm_90 and defines every kernel ds4's launch sites can name, each format's included."""
    from ds4lab.token.config import EXPERT_FORMATS

    names = {"xq_quantize_q8k", "moe_midq_q8k", "moe_sum_slots", "init_superblocks"}
    for gu, dn, path in EXPERT_FORMATS.values():
        if path == "ds4":
            names |= {f"moe_gateup_mid_{gu}", f"moe_gateup_mid_tiled_{gu}", f"moe_down_sum_{dn}",
                      f"moe_down_tiled_{dn}"}
    for arch in ("sm_80", "sm_90"):
        r = ck.compile_kernel(KERNELS / "moe_ds4.cu", arch, [KERNELS, cuda_include], nvrtc)
        assert r.ok, r.describe()
        assert set(r.kernels) == names and not r.not_in_cubin, r.describe()


# ----------------------------------------------------------------------------- programmatic dependent launch
import re  # noqa: E402

#: PTX that touches memory, synchronizes, branches or returns: none may come before the wait.
_BEFORE_WAIT = re.compile(r"^\s*(?:@%\w+\s+)?(ld\.global|ld\.shared|st\.|atom\.|red\.|bar\.|barrier\.|bra|ret|call)\b")


def _entries(ptx: str) -> dict[str, list[str]]:
    """``{kernel: the lines of its PTX body}`` of every ``.entry`` in ``ptx``."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\(", ptx):
        start = ptx.index("{", ptx.index(")", m.end()))
        depth, i = 1, start + 1
        while depth:
            depth += (ptx[i] == "{") - (ptx[i] == "}")
            i += 1
        out[m.group(1)] = ptx[start + 1:i - 1].splitlines()
    return out


def test_device_half_is_the_first_statement_of_every_kernel_that_launches_in_a_token():
    """The source scan the backends refuse programmatic launches by: every kernel but the weight
    initializers, the timestamp kernels and the bench's empty and spinning kernels begins with
    DS4_PDL_ENTRY()."""
    from ds4lab.executor.kernel_pdl import device_half

    d = device_half(str(KERNELS))
    without = sorted(k for k, v in d.items() if not v)
    assert without == ["empty_kernel", "globaltimer_probe", "init_f32", "init_q4", "init_q8_0", "init_superblocks",
                       "spin_wait", "stamp_time"], without
    assert {"q8_matvec", "attention_decode", "attention_comp", "indexer_topk_merge", "cond_set_longctx",
            "moe_down_sum_q2_k", "tiny_add"} <= {k for k, v in d.items() if v}


@pytest.mark.parametrize("cu", [p for p in ck.kernel_files(KERNELS) if p.name not in ("init.cu", "timestamp.cu")],
                         ids=lambda p: p.name)
def test_pdl_build_waits_before_any_memory_access_branch_or_exit(cu, nvrtc, cuda_include):
    """In the ``pdl`` build for sm_90 the first instructions of every kernel with the device-side half
    are griddepcontrol.wait then griddepcontrol.launch_dependents, before any global or shared memory
    access, barrier, branch, call or return; the sm_80 build and the plain build have neither (the
    kernels every other stage runs are unchanged)."""
    from ds4lab.executor.kernel_pdl import device_half

    half = device_half(str(KERNELS))
    inc = [KERNELS, cuda_include]
    entries = _entries(ck.ptx_of(cu, "sm_90", inc, nvrtc, "pdl"))
    assert entries, cu.name
    for name, lines in entries.items():
        if not half.get(name):
            assert not any("griddepcontrol" in ln for ln in lines), name
            continue
        wait = next(i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln)
        trigger = next(i for i, ln in enumerate(lines) if "griddepcontrol.launch_dependents" in ln)
        early = [ln.strip() for ln in lines[:wait] if _BEFORE_WAIT.match(ln)]
        assert not early and wait < trigger, (name, early)
    for arch, variant in (("sm_80", "pdl"), ("sm_90", "plain")):
        assert "griddepcontrol" not in ck.ptx_of(cu, arch, inc, nvrtc, variant), (cu.name, arch, variant)


def test_condition_setters_call_the_device_runtime_for_both_archs(nvrtc, cuda_include):
    """``kernels/graph_cond.cu``: every setter calls cudaGraphSetConditional (a builtin the driver
    resolves when the module loads) on sm_80 and sm_90."""
    for arch in ("sm_80", "sm_90"):
        r = ck.compile_kernel(KERNELS / "graph_cond.cu", arch, [KERNELS, cuda_include], nvrtc)
        assert r.ok and set(r.kernels) == {"cond_set_from", "cond_count_down", "cond_set_longctx"}, r.describe()
        entries = _entries(ck.ptx_of(KERNELS / "graph_cond.cu", arch, [KERNELS, cuda_include], nvrtc))
        for name, lines in entries.items():
            assert any("cudaGraphSetConditional" in ln for ln in lines), (arch, name)


def test_unknown_variant_refused(nvrtc):
    with pytest.raises(ValueError, match="unknown variant"):
        ck.compile_all(KERNELS, ["sm_90"], nvrtc=nvrtc, variants=["fast"])
