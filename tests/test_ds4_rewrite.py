"""ds4lab's stage 0 in ds4 itself (``ds4lab.ds4.rewrite``), without a GPU: on the shared ds4 source
every kernel launch site of ``ds4_cuda.cu`` is found and routed through the accessor with the stream
it used before as the accessor's argument (so an unset accessor changes nothing), every call a
capture cannot hold is bracketed by the split hooks, every cuBLAS compute call's handle is routed,
the token's three hooks are in place; and a site the rewrite cannot route is reported by file and
line, left as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ds4lab.ds4 import rewrite as RW
from ds4lab.ds4.source import locate, materialize

SHARED_TARBALL = Path(__file__).resolve().parents[1].parent / "shared" / "ds4" / "ds4-b0309611.tar.gz"
needs_source = pytest.mark.skipif(not SHARED_TARBALL.exists(), reason="the shared ds4 archive is not beside the checkout")


@pytest.fixture(scope="module")
def ds4_checkout(tmp_path_factory):
    return materialize(locate(SHARED_TARBALL), tmp_path_factory.mktemp("ds4") / "src")


def _launch_configs(text: str) -> list[tuple[int, list[str]]]:
    """(line, items) of every launch configuration in ``text``, found independently of the rewrite's
    own launch finder (same lexer: comments and strings are not code)."""
    code = RW.blank(text)
    out = []
    for m in re.finditer("<<<", code):
        end = code.find(">>>", m.end())
        items = [text[m.end() + a:m.end() + b].strip() for a, b in RW.split_args(code[m.end():end])]
        out.append((text.count("\n", 0, m.start()) + 1, items))
    return out


@needs_source
def test_every_launch_site_of_ds4_cuda_is_routed_with_its_own_stream(ds4_checkout):
    original = (ds4_checkout / RW.TARGET).read_text()
    rw = RW.rewrite_checkout(ds4_checkout, write=False)
    assert rw.unrouted == []
    before, after = _launch_configs(original), _launch_configs(rw.text)
    assert len(before) == len(after) == 351
    assert rw.launches() == {RW.LEGACY: 207, RW.DECODE: 129, RW.NAMED: 15}
    shift = RW.PROLOGUE.count("\n") + 2  # the prologue and its version line
    for (ln0, a), (ln1, b) in zip(before, after):
        assert ln1 == ln0 + shift  # ds4's lines keep their numbers, after the prologue
        assert len(b) == 4 and b[:min(len(a), 3)] == a[:min(len(a), 3)]  # grid, block, shared memory kept
        stream = a[3] if len(a) == 4 else "(cudaStream_t)0"  # a launch with no stream runs on the legacy stream
        assert b[3] == f"ds4lab_current_stream({stream})", (ln0, a, b)
        if len(a) == 2:
            assert b[2] == "0"  # no dynamic shared memory, as before
    kinds = {s.line: s.stream for s in rw.sites if s.kind == "launch"}
    assert kinds[before[0][0]] in (RW.LEGACY, RW.DECODE) and all(k for k in kinds.values())


@needs_source
def test_every_call_a_capture_cannot_hold_is_bracketed_and_cublas_is_routed(ds4_checkout):
    rw = RW.rewrite_checkout(ds4_checkout, write=False)
    code = RW.blank(rw.text)
    body = code[rw.text.index("end of ds4lab's stage 0 prologue"):]  # ds4's code, not the accessor's own
    for name in RW.SPLITS:
        for m in re.finditer(r"(?<![\w])" + name + r"\s*\(", body):
            ok, _ = RW._is_call(body, m.start())
            if ok:
                assert body[:m.start()].rstrip().endswith("ds4lab_split_end("), (name, body[m.start() - 80:m.end() + 40])
    splits = [s for s in rw.sites if "split" in s.action]
    assert {s.kind for s in splits} >= {"cudaDeviceSynchronize", "cudaMemcpy", "cudaMalloc", "cudaFree"}
    # each bracket names ds4's own line of the call
    for s in splits:
        assert f'ds4lab_split_begin("{s.kind}", {s.line})' in rw.text, s
    cublas = [s for s in rw.sites if s.kind == "cublas"]
    assert len(cublas) == 15 and all(s.action == "routed" for s in cublas)
    for m in re.finditer(r"\b(cublas(?:GemmEx|Sgemm|GemmStridedBatchedEx|SgemmStridedBatched))\s*\(", body):
        assert body[m.end():].lstrip().startswith("ds4lab_cublas("), body[m.start():m.end() + 60]
    # the synchronous memsets become asynchronous on the override only while it is set
    assert sum(s.kind == "cudaMemset" and s.action == "async-when-set" for s in rw.sites) == 3
    assert not re.search(r"(?<![\w])cudaMemset\s*\(", body)


@needs_source
def test_the_token_is_bracketed_and_the_decode_stream_routed(ds4_checkout):
    rw = RW.rewrite_checkout(ds4_checkout, write=False)
    code = RW.blank(rw.text)
    for name, stmt in RW.HOOKS.items():
        assert re.search(r"\b" + name + r"\s*\(\s*void\s*\)\s*\{\s*" + re.escape(stmt), rw.text), name
    assert re.search(r"cuda_decode_stream\(void\)\s*\{\s*return\s+ds4lab_current_stream\(g_decode_graph_capturing",
                     rw.text)
    # the mmq entry that the decode token calls with cuda_decode_stream() gets the accessor too
    assert "ds4lab_current_stream(cuda_decode_stream()));" in rw.text.replace("\n", "")
    assert {s.kind for s in rw.sites if s.action == "hook"} == {"hook"}
    assert code.count("ds4lab_token_begin();") == 1  # in ds4's begin_commands (the prologue only defines it)


@needs_source
def test_the_inventory_lists_the_other_files_launches_as_not_rewritten(ds4_checkout):
    other = RW.other_launch_sites(ds4_checkout)
    assert other and all(s.file.startswith("cuda/") and s.action == "not routed" and s.why for s in other)
    assert all(s.line > 0 for s in other)


def test_a_site_the_rewrite_cannot_route_is_named_by_line_and_left_as_it_was():
    src = """#include <cuda_runtime.h>
#include <cublas_v2.h>
static inline cudaStream_t cuda_decode_stream(void) {
    return (cudaStream_t)0;
}
extern "C" int ds4_gpu_begin_commands(void) { return 1; }
extern "C" int ds4_gpu_end_commands(void) { return cudaDeviceSynchronize() == cudaSuccess; }
void f(float *p) {
    k1<<<grid>>>(p);                 /* one item: no block size, cannot tell the stream */
    k2<<<g, b, 0, s, extra>>>(p);    /* five items */
    k3<<<g, 256>>>(p);               // fine
    // k4<<<not, code>>>(p);  a comment is not a site
    const char *msg = "k5<<<in, a string>>>";
    cudaMemsetAsync(p, 0, 4, cudaMemcpyAsync(p, p, 4, cudaMemcpyDeviceToDevice));
}
"""
    rw = RW.rewrite_source(src, file="x.cu")
    bad = {(s.line, s.kind): s.why for s in rw.unrouted}
    assert (9, "launch") in bad and "1 items" in bad[(9, "launch")]
    assert (10, "launch") in bad and "5 items" in bad[(10, "launch")]
    assert (14, "overlap") in bad  # a call nested in another rewritten call: both left, both named
    assert any(s.kind == "hook" and "ds4_gpu_flush_commands" in s.why for s in rw.unrouted)
    text = rw.text
    assert "k1<<<grid>>>(p);" in text and "k2<<<g, b, 0, s, extra>>>(p);" in text
    assert "k3<<<g, 256, 0, ds4lab_current_stream((cudaStream_t)0)>>>(p);" in text
    assert "// k4<<<not, code>>>(p);" in text and '"k5<<<in, a string>>>"' in text
    assert "cudaMemsetAsync(p, 0, 4, cudaMemcpyAsync(p, p, 4, cudaMemcpyDeviceToDevice));" in text
    assert [s.line for s in rw.sites if s.kind == "launch" and s.action == "routed"] == [11]


def test_blank_keeps_offsets_and_hides_comments_and_strings():
    src = 'a = "x<<<y"; // c<<<d\n/* e<<<\n f */ g<<<h, i>>>(); c = \'<\';'
    b = RW.blank(src)
    assert len(b) == len(src) and b.count("\n") == src.count("\n")
    assert b.count("<<<") == 1 and b.index("<<<") == src.rindex("<<<")


def test_split_args_keeps_template_arguments_together():
    code = "grid, kTTThreads,\n tt_Budget<kTTStageRows, kTTG>::total,\n stream"
    items = [code[a:b].strip() for a, b in RW.split_args(code)]
    assert items == ["grid", "kTTThreads", "tt_Budget<kTTStageRows, kTTG>::total", "stream"]
    other = "f(a, b), c[1, 2], {d, e}"
    assert [other[a:b] for a, b in RW.split_args(other)] == ["f(a, b)", " c[1, 2]", " {d, e}"]
    assert len(RW.split_args("(n < 4 ? a : b), 256")) == 2


def test_mmq_entries_are_read_from_their_headers(tmp_path):
    (tmp_path / "cuda" / "mmq").mkdir(parents=True)
    (tmp_path / "cuda" / "mmq" / "ds4_mmq.h").write_text(
        "int ds4_mmq_a(const void *w, int n,\n    cudaStream_t  stream);\n"
        "int ds4_mmq_b(int n); /* no stream */\nvoid ds4_pool_set_stream(cudaStream_t stream);\n")
    assert RW.mmq_stream_entries(tmp_path) == {"ds4_mmq_a": 2, "ds4_pool_set_stream": 0}
    src = "#include <x.h>\nvoid f(void) { ds4_mmq_a(w, 4, 0); ds4_mmq_b(3); }\n"
    rw = RW.rewrite_source(src, mmq_entries=RW.mmq_stream_entries(tmp_path))
    assert "ds4_mmq_a(w, 4, ds4lab_current_stream(0));" in rw.text and "ds4_mmq_b(3);" in rw.text


def test_rewrite_checkout_refuses_a_folder_without_the_cuda_back_end(tmp_path):
    with pytest.raises(RW.RewriteError, match="ds4_cuda.cu"):
        RW.rewrite_checkout(tmp_path)
