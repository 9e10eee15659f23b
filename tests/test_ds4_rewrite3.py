"""ds4lab's stage 3 in ds4 itself (``ds4lab.ds4.rewrite3``), without a GPU: on the shared ds4 source every launch
site becomes a deferred launch and every memset, copy, event, cuBLAS compute call and mmq entry a deferred call; each
kernel whose arguments change between tokens (the stage-3u record's ``capture-args.csv``) gets its slot; stage 0's
text is unchanged and the stage-3 text differs from it only at those sites and in its prologue; a site it cannot
convert is reported by line. With nvcc on the machine, a small source rewritten the same way is compiled and its dry
pass run on the host (no GPU: nothing is launched in a dry pass)."""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from ds4lab.ds4 import rewrite as RW
from ds4lab.ds4 import rewrite3 as R3
from ds4lab.ds4.source import locate, materialize

ROOT = Path(__file__).resolve().parents[1]
SHARED_TARBALL = ROOT.parent / "shared" / "ds4" / "ds4-b0309611.tar.gz"
needs_source = pytest.mark.skipif(not SHARED_TARBALL.exists(), reason="the shared ds4 archive is not beside the checkout")
RECORD = ROOT / "docs" / "measurements" / "h200-2026-12-04-ds4"
#: SHA-256 of stage 0's ds4_cuda.cu from the shared source, as the H200 record built and measured it.
STAGE0_SHA256 = "d67759a2afdfe47b6ef02d12c204072252e70945b5a12aada56327983ae0e611"


@pytest.fixture(scope="module")
def ds4_checkout(tmp_path_factory):
    return materialize(locate(SHARED_TARBALL), tmp_path_factory.mktemp("ds4") / "src")


@pytest.fixture(scope="module")
def both(ds4_checkout):
    return RW.rewrite_checkout(ds4_checkout, write=False), RW.rewrite_checkout(ds4_checkout, write=False, stage="3")


def test_moved_covers_every_changing_argument_of_the_record():
    seen = set()
    for folder in ("ladder", "ladder-1k", "trace-3u-16k"):
        for r in pd.read_csv(RECORD / folder / "capture-args.csv").itertuples():
            mangled = r.kernel[2:]
            digits = len(mangled) - len(mangled.lstrip("0123456789"))
            seen.add((mangled[digits:digits + int(mangled[:digits])], int(r.param)))
    assert seen == {(k, p) for k, ps in R3.MOVED.items() for p in ps}
    assert R3.mask("rope_tail_kernel") == 0b100001 and R3.mask("not_a_kernel") == 0


@needs_source
def test_stage0_text_is_the_one_the_record_measured(both):
    rw0, _ = both
    assert hashlib.sha256(rw0.text.encode()).hexdigest() == STAGE0_SHA256
    with pytest.raises(ValueError, match="rewrite stage '2'"):
        RW.rewrite_source("", stage="2")


@needs_source
def test_every_launch_and_call_of_the_token_is_deferred_and_every_moved_kernel_has_its_slot(both):
    _, rw3 = both
    assert rw3.unrouted == []
    launches = [s for s in rw3.sites if s.kind == "launch"]
    assert len(launches) == 351 and all(s.action.startswith("routed+deferred") for s in launches)
    slotted = [s for s in launches if s.action.endswith("+slots")]
    assert len(slotted) == 30
    kernels = [s for s in rw3.sites if s.kind == "slot-kernel"]
    assert sorted(s.text.split(":")[0] for s in kernels) == sorted(R3.MOVED)
    assert all(s.action == "slots" for s in kernels)
    assert sum(1 for s in rw3.sites if s.kind == "cublas" and "deferred" in s.action) == 15
    assert sum(1 for s in rw3.sites if s.kind == "mmq-entry" and "deferred" in s.action) == 14
    assert rw3.text.count("ds4lab_launch<") - R3.PROLOGUE3.count("ds4lab_launch<") == 351
    # the moved parameters, and only they, read from the slot
    assert "uint32_t ds4lab_arg_pos0," in rw3.text and "uint32_t pos0 = ds4lab_slot_take(" in rw3.text
    # a struct by value (the raw KV store's row table, 1.8 KB): read in place, through a reference to the slot
    assert "const cuda_attention_decode_row_table &rows = ds4lab_slot_ref(ds4lab_slot" in rw3.text
    assert rw3.text.count("const unsigned char *ds4lab_slot)") == len(R3.MOVED)
    # ds4's own graph nodes of two of those kernels (its score-split graph) pass a NULL slot
    nodes = sorted(s.text for s in rw3.sites if s.kind == "graph-node")
    assert nodes == ["attention_decode_score_split_finalize_kernel: final_args[] given a NULL slot",
                     "rope_tail_kernel: rope_args[] given a NULL slot"]


@needs_source
def test_stage3_text_differs_from_stage0_only_at_its_sites_and_prologue(both):
    rw0, rw3 = both
    a, b = rw0.text.splitlines(), rw3.text.splitlines()
    start = b.index("/* ---- ds4lab: stage 3 (added by ds4lab's rewrite at build time; not part of ds4) ----")
    end = b.index("/* ---- end of ds4lab's stage 3 prologue ---- */")
    b = b[:start - 1] + b[end + 1:]  # the prologue's own lines (and the blank line before it) out
    marks = ("ds4lab_launch<", "ds4lab_defer<", "ds4lab_arg_", "ds4lab_slot", "ds4lab_no_slot")
    hunks = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    for op, i1, i2, j1, j2 in hunks:
        # a site's text, or the last line of a site of several lines (its closing parenthesis)
        assert op == "replace" and any(m in "\n".join(b[max(0, j1 - 40):j2]) for m in marks), (a[i1:i2], b[j1:j2])
    converted = [s for s in rw3.sites if "deferred" in s.action or s.kind in ("slot-kernel", "graph-node")]
    moved = sum(len(p) for p in R3.MOVED.values())
    assert len(hunks) <= len(converted) + moved  # a site, a renamed parameter or a kernel's slot: nothing else


SYNTHETIC = r"""
#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

__global__ static void rope_tail_kernel(float *x, uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t pos0,
                                        float f) {
    if (threadIdx.x < a) x[threadIdx.x] = (float)pos0 * f;
}
__global__ static void fill_kernel(float *x, uint32_t n) { if (threadIdx.x < n) x[threadIdx.x] = 0.0f; }

static float *const y = (float *)0x3000; /* a buffer every token uses */
static int token(float *x, uint32_t pos, uint32_t n, cudaStream_t s) {
    rope_tail_kernel<<<1, 32, 0, s>>>(x, n, 2, 3, 4, pos, 0.5f);
    fill_kernel<<<(n + 31) / 32, 32>>>(y, n);
    return cudaMemsetAsync(y, 0, n * sizeof(float), s) == cudaSuccess;
}
"""

HARNESS = r"""
/* No cuBLAS is linked: the accessor's setter (stage 0's prologue) is its only reference here. */
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { (void)h; (void)s; return CUBLAS_STATUS_SUCCESS; }
static ds4lab_dry_state pass(float *x, uint32_t pos, uint32_t n) {
    ds4lab_dry_begin(1);
    (void)token(x, pos, n, (cudaStream_t)0);
    ds4lab_dry_end();
    ds4lab_dry_state st;
    ds4lab_dry_get(&st);
    return st;
}
static unsigned char stage[4096];
int main(void) {
    if (ds4lab_dry_setup(stage, 0x7000000ULL, sizeof stage, 1 << 20) != 0) return 2;
    ds4lab_dry_state a = pass((float *)0x1000, 7, 5), b = pass((float *)0x2000, 8, 5), c = pass((float *)0x1000, 7, 6);
    unsigned o = 0;
    float *x = ds4lab_slot_take(stage, &o, (float *)0);
    uint32_t pos = ds4lab_slot_take(stage, &o, (uint32_t)0);
    printf("records %lld launches %lld moved %lld slot %llu..%llu\n", a.records, a.launches, a.moved,
           a.slot_begin, a.slot_end);
    printf("same_signature_moved_changed %d\n", a.signature == b.signature);
    printf("same_signature_unmoved_changed %d\n", a.signature == c.signature);
    printf("slot %p %u error '%s'\n", (void *)x, pos, c.error);
    return 0;
}
"""


def test_a_site_stage3_cannot_convert_is_reported_by_line():
    src = ("#include <x.h>\n__global__ void rope_tail_kernel(float *x, uint32_t a[4]) { }\n"
           "static void f(void) {\n  (k_table[i])<<<1, 2>>>(y);\n  cublasSgemv(h, 1, 2);\n}\n")
    rw = RW.rewrite_source(src, stage="3")
    why = {(s.line, s.kind): s.why for s in rw.unrouted}
    assert "cannot parse the kernel" in why[(4, "launch")]
    assert "cublasSgemv: where its alpha and beta are is not known" in why[(5, "cublas")]
    assert "not found" in why[(1, "slot-kernel")] and "(k_table[i])<<<1, 2>>>(y);" in rw.text
    src2 = "#include <x.h>\n__global__ void rope_tail_kernel(float *x, int, int, int, int, float (*p)[2]) { }\n"
    bad = [s for s in RW.rewrite_source(src2, stage="3").unrouted if s.kind == "slot-kernel" and s.line == 2]
    assert bad and "cannot tell its type from its name" in bad[0].why
    src3 = ("#include <x.h>\n__global__ void rope_tail_kernel(float *x, int a, int b, int c, int d, int pos0) { }\n"
            "void g(void **args) {\n  p.func = (void *)rope_tail_kernel;\n  p.kernelParams = args;\n}\n")
    node = [s for s in RW.rewrite_source(src3, stage="3").unrouted if s.kind == "graph-node"]
    assert node and node[0].line == 4 and "would miss its slot parameter" in node[0].why


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not on PATH")
def test_the_dry_pass_records_hashes_and_stages_without_a_gpu(tmp_path):
    rw = RW.rewrite_source(SYNTHETIC, stage="3")
    assert [s.action for s in rw.sites if s.kind == "launch"] == ["routed+deferred+slots", "routed+deferred"]
    (tmp_path / "t.cu").write_text(rw.text + HARNESS)
    from ds4lab.ds4.build import Toolchain

    cuda = Toolchain.find().cuda_home
    inc = [f"-I{d}" for d in os.environ.get("CPATH", "").split(":") if d]
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-o", str(tmp_path / "t"), str(tmp_path / "t.cu"), *inc,
           f"-L{cuda}/lib64"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and "cublas_v2.h" in out.stderr:
        pytest.skip("cuBLAS headers not found (set CPATH)")
    assert out.returncode == 0, out.stderr[-3000:]
    run = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = dict(ln.split(" ", 1) for ln in run.stdout.splitlines())
    assert lines["records"].startswith("3 launches 2 moved 1 slot 0..12")  # two launches, one memset; x (8 bytes), pos0 (4)
    assert lines["same_signature_moved_changed"] == "1"  # x and pos0 differ: read from the slot
    assert lines["same_signature_unmoved_changed"] == "0"  # n differs: another graph
    assert lines["slot"].startswith("0x1000 7 error ''")  # the first pass's slot, read as its kernel reads it
