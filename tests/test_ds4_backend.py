"""ds4 itself as a backend, without a GPU: locating a checkout, the build's command lines and its
cache (a small stand-in checkout built for real where a C compiler and nvcc are present), the
worker's loop on a stand-in engine, ds4's log lines and the tables read from the workers' files,
and ``ds4lab ds4`` refusing cleanly where no GPU is."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from unittest import mock

from ds4lab.ds4 import build as B
from ds4lab.ds4 import readout as R
from ds4lab.ds4 import worker as W
from ds4lab.ds4.configs import DEFAULT_CONFIGS, parse_configs
from ds4lab.ds4.measure import collect, worker_env
from ds4lab.ds4.source import REQUIRED, locate, materialize
from ds4lab.errors import BadInput

SHARED_TARBALL = Path(__file__).resolve().parents[1].parent / "shared" / "ds4" / "ds4-b0309611.tar.gz"


def _fake_checkout(root: Path, makefile: str | None = None) -> Path:
    """A folder shaped like a ds4 checkout: the four required files, a Makefile whose CORE_OBJS is one
    C object, and a ds4.h declaring the calls ds4lab's driver makes (with stand-in definitions in ds4.c)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "ds4.h").write_text(
        "#include <stddef.h>\n#include <stdint.h>\n#include <stdbool.h>\n"
        "typedef struct ds4_engine ds4_engine; typedef struct ds4_session ds4_session;\n"
        "typedef enum { DS4_BACKEND_METAL, DS4_BACKEND_CUDA, DS4_BACKEND_CPU } ds4_backend;\n"
        "typedef struct { int *v; int len; int cap; } ds4_tokens;\n"
        "typedef struct { const char *model_path; ds4_backend backend; int n_threads; int context_size;"
        " bool load_slice; uint32_t load_layer_start; uint32_t load_layer_end; bool load_output; }"
        " ds4_engine_options;\n"
        "int ds4_engine_open(ds4_engine **, const ds4_engine_options *); void ds4_engine_close(ds4_engine *);\n"
        "int ds4_session_create(ds4_session **, ds4_engine *, int); void ds4_session_free(ds4_session *);\n"
        "int ds4_engine_vocab_size(ds4_engine *); int ds4_engine_layer_count(ds4_engine *);\n"
        "int ds4_engine_routed_quant_bits(ds4_engine *); uint64_t ds4_engine_model_bytes(ds4_engine *);\n"
        "int ds4_session_pos(ds4_session *); int ds4_session_argmax(ds4_session *);\n"
        "void ds4_tokens_push(ds4_tokens *, int); void ds4_tokens_free(ds4_tokens *);\n"
        "int ds4_session_sync(ds4_session *, const ds4_tokens *, char *, size_t);\n"
        "int ds4_session_eval(ds4_session *, int, char *, size_t);\n"
        "int ds4_session_copy_logits(ds4_session *, float *, int);\n")
    (root / "ds4.c").write_text(
        '#include "ds4.h"\n#include <stdlib.h>\n'
        "int ds4_engine_open(ds4_engine **e, const ds4_engine_options *o) { (void)o; *e = 0; return 1; }\n"
        "void ds4_engine_close(ds4_engine *e) { (void)e; }\n"
        "int ds4_session_create(ds4_session **s, ds4_engine *e, int c) { (void)e; (void)c; *s = 0; return 1; }\n"
        "void ds4_session_free(ds4_session *s) { (void)s; }\n"
        "int ds4_engine_vocab_size(ds4_engine *e) { (void)e; return 0; }\n"
        "int ds4_engine_layer_count(ds4_engine *e) { (void)e; return 0; }\n"
        "int ds4_engine_routed_quant_bits(ds4_engine *e) { (void)e; return 0; }\n"
        "uint64_t ds4_engine_model_bytes(ds4_engine *e) { (void)e; return 0; }\n"
        "int ds4_session_pos(ds4_session *s) { (void)s; return 0; }\n"
        "int ds4_session_argmax(ds4_session *s) { (void)s; return 0; }\n"
        "void ds4_tokens_push(ds4_tokens *t, int x) { (void)t; (void)x; }\n"
        "void ds4_tokens_free(ds4_tokens *t) { (void)t; }\n"
        "int ds4_session_sync(ds4_session *s, const ds4_tokens *t, char *e, size_t n)"
        " { (void)s; (void)t; (void)e; (void)n; return 0; }\n"
        "int ds4_session_eval(ds4_session *s, int x, char *e, size_t n) { (void)s; (void)x; (void)e; (void)n; return 0; }\n"
        "int ds4_session_copy_logits(ds4_session *s, float *o, int c) { (void)s; (void)o; (void)c; return 0; }\n")
    (root / "ds4_cuda.cu").write_text("// stand-in\n")
    (root / "Makefile").write_text(makefile or (
        "CFLAGS ?= -O2\nCORE_OBJS = ds4.o\n"
        "ds4.o: ds4.c ds4.h\n\t$(CC) $(CFLAGS) -c -o $@ ds4.c\n"))
    return root


# -- the checkout ---------------------------------------------------------------------------------


def test_locate_folder_and_archive_agree_on_the_digest(tmp_path):
    src = _fake_checkout(tmp_path / "ds4-b0309611")
    folder = locate(src)
    assert folder.kind == "folder" and folder.commit == "b0309611"
    tgz = tmp_path / "ds4-b0309611.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        for f in sorted(src.iterdir()):
            tf.add(f, arcname=f"./{f.name}")
    arch = locate(tgz)
    assert arch.kind == "archive" and arch.commit == "b0309611"
    assert arch.digest == folder.digest
    # an edit changes the digest (the build cache is keyed by it)
    (src / "ds4.c").write_text((src / "ds4.c").read_text() + "// edited\n")
    assert locate(src).digest != folder.digest


def test_materialize_unpacks_an_archive_with_a_top_folder(tmp_path):
    src = _fake_checkout(tmp_path / "x")
    tgz = tmp_path / "release.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(src, arcname="ds4-main")
    s = locate(tgz)
    assert s.commit == ""  # neither the name nor a .git says which commit
    assert "no commit" in s.label
    dest = materialize(s, tmp_path / "copy")
    assert sorted(p.name for p in dest.iterdir()) == sorted(REQUIRED)


@pytest.mark.parametrize("missing", REQUIRED)
def test_locate_names_what_a_checkout_lacks(tmp_path, missing):
    src = _fake_checkout(tmp_path / "c")
    (src / missing).unlink()
    with pytest.raises(BadInput, match=missing.replace(".", r"\.")):
        locate(src)


def test_locate_refuses_missing_paths_and_other_files(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        locate(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BadInput, match="checkout folder or a .tar.gz"):
        locate(tmp_path / "notes.txt")
    bad = tmp_path / "broken.tar.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(BadInput, match="cannot read the archive"):
        locate(bad)


@pytest.mark.skipif(not SHARED_TARBALL.exists(), reason="the shared ds4 archive is not beside the checkout")
def test_the_shared_ds4_archive_is_a_checkout():
    s = locate(SHARED_TARBALL)
    assert s.commit == "b0309611" and len(s.digest) == 16


# -- the build ------------------------------------------------------------------------------------


def _toolchain():
    return B.Toolchain(nvcc="/usr/local/cuda/bin/nvcc", cc="cc", cuda_home="/usr/local/cuda")


def test_build_plan_restates_ds4s_flags_with_fpic_and_the_arch():
    plan = B.build_plan("sm_90", jobs=16, toolchain=_toolchain())
    v = plan.make_vars
    # ds4's Makefile appends these to CFLAGS; a CFLAGS given on make's command line drops the append
    for flag in ("-O3", "-ffast-math", "-march=native", "-std=c99", "-D_GNU_SOURCE", "-fno-finite-math-only", "-fPIC"):
        assert flag in v["CFLAGS"].split()
    for flag in ("-O3", "--use_fast_math", "-arch=sm_90", "-fPIC"):
        assert flag in v["NVCCFLAGS"].split()
    assert "-g" not in v["CFLAGS"].split() and "-lineinfo" not in v["NVCCFLAGS"].split()
    cmd = plan.make_command(Path("/s"), ["ds4.o"])
    assert cmd[:4] == ["make", "-C", "/s", "-j16"] and cmd[-1] == "ds4.o" and "CUDA_ARCH=sm_90" in cmd
    link = plan.link_command(Path("/s"), ["ds4.o", "cuda/mmq/x.o"], Path("/b/d.o"), Path("/b/lib.so"))
    assert link[1] == "-shared" and "/s/cuda/mmq/x.o" in link and "-lcublas" in link and "-lcudart" in link
    # another architecture, other flags: another cache folder
    assert B.build_plan("sm_80", toolchain=_toolchain()).flags_digest != plan.flags_digest


@pytest.mark.parametrize("arch", ["90", "sm90", "sm_9", "compute_90", "sm_90; rm -rf /"])
def test_build_plan_refuses_a_bad_arch(arch):
    with pytest.raises(BadInput, match="--arch"):
        B.build_plan(arch, toolchain=_toolchain())


def _can_build() -> bool:
    return bool(shutil.which("make") and shutil.which("cc") and Path("/usr/local/cuda/include/cuda_runtime.h").exists()
                and (Path("/usr/local/cuda/bin/nvcc").exists()))


@pytest.mark.skipif(not _can_build(), reason="needs make, cc and the CUDA toolkit's nvcc and headers")
def test_build_links_the_driver_with_the_checkouts_objects_and_caches_it(tmp_path):
    src = locate(_fake_checkout(tmp_path / "ds4-abc1234"))
    # a stand-in libcublas, so the link needs no cuBLAS on this machine
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "empty.c").write_text("int ds4lab_stub_symbol;\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(stub / "libcublas.so"), str(stub / "empty.c")], check=True)
    plan = B.build_plan("sm_90", jobs=2, toolchain=_toolchain(), extra_lib=(str(stub),))
    said = []
    b = B.build(src, plan, cache=tmp_path / "cache", say=said.append)
    assert b.library.is_file() and not b.cached
    assert b.info["objects"] == ["ds4.o"] and b.info["ds4_commit"] == "abc1234"
    nm = subprocess.run(["nm", "-D", str(b.library)], capture_output=True, text=True).stdout
    for sym in ("ds4lab_open", "ds4lab_eval", "ds4lab_eval_timed", "ds4lab_sync", "ds4_session_eval"):
        assert f" T {sym}" in nm
    assert not (tmp_path / "ds4-abc1234" / "ds4.o").exists()  # the user's checkout is never written to
    again = B.build(src, plan, cache=tmp_path / "cache", say=said.append)
    assert again.cached and again.library == b.library
    # a new driver: ds4's objects stand, the driver is compiled and linked again (no make)
    drv = tmp_path / "driver.c"
    drv.write_text(B.DRIVER_SOURCE.read_text() + "\nint ds4lab_new_driver_symbol(void) { return 7; }\n")
    (b.folder / "src" / "ds4.c").write_text("#error the objects must not be rebuilt\n")
    with mock.patch.object(B, "DRIVER_SOURCE", drv):
        relinked = B.build(src, plan, cache=tmp_path / "cache", say=said.append)
    assert relinked.cached and relinked.info["driver_digest"] != b.info["driver_digest"]
    assert [s["step"] for s in relinked.info["relinked"]] == ["compile ds4lab's driver", "link the library"]
    nm = subprocess.run(["nm", "-D", str(relinked.library)], capture_output=True, text=True).stdout
    assert " T ds4lab_new_driver_symbol" in nm and " T ds4_session_eval" in nm


@pytest.mark.skipif(not _can_build(), reason="needs make, cc and the CUDA toolkit's nvcc and headers")
def test_a_rewritten_build_sits_beside_the_shipped_one_and_names_what_it_could_not_route(tmp_path):
    """The rewrite runs on the build's copy (never the checkout), into a build of its own (its name and
    key differ), every site in rewrite-sites.csv; a checkout whose CUDA file lacks ds4's token calls
    gets them named as not routed, not a silent build."""
    import csv

    root = _fake_checkout(tmp_path / "ds4-abc1234")
    (root / "ds4_cuda.cu").write_text("#include <cuda_runtime.h>\n#include <cublas_v2.h>\n"
                                      "void f(float *p) { k<<<1, 32>>>(p); }\n")
    src = locate(root)
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "empty.c").write_text("int ds4lab_stub_symbol;\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(stub / "libcublas.so"), str(stub / "empty.c")], check=True)
    shipped = B.build_plan("sm_90", jobs=2, toolchain=_toolchain(), extra_lib=(str(stub),))
    plan = B.build_plan("sm_90", jobs=2, toolchain=_toolchain(), extra_lib=(str(stub),), rewrite=True)
    said = []
    b = B.build(src, plan, cache=tmp_path / "cache", say=said.append)
    plain = B.build(src, shipped, cache=tmp_path / "cache", say=said.append)
    assert plain.folder != b.folder and "-rw" not in plain.folder.name and plain.info["rewrite"] is None
    rw = b.info["rewrite"]
    assert f"-sm_90-rw{rw['rewritten_digest']}-" in b.folder.name  # keyed by the text it compiles
    with pytest.raises(B.BuildError, match="no cached build"):  # --no-build: another flag, nothing built
        B.build(src, B.build_plan("sm_90", jobs=2, toolchain=_toolchain(), extra_lib=(str(stub),), rewrite=True,
                                  host_march="x86-64-v3"), cache=tmp_path / "cache", cached_only=True)
    assert B.build(src, plan, cache=tmp_path / "cache", cached_only=True).cached
    assert rw["launch_sites"] == {"legacy": 1, "cuda_decode_stream()": 0, "named": 0}
    assert any("ds4_gpu_begin_commands" in u for u in rw["unrouted"]) and any("NOT routed" in s for s in said)
    rows = list(csv.DictReader(open(b.folder / "rewrite-sites.csv")))
    assert {r["action"] for r in rows} == {"routed", "not routed"} and all(r["line"] for r in rows)
    assert "ds4lab_current_stream" in (b.folder / "src" / "ds4_cuda.cu").read_text()
    assert (root / "ds4_cuda.cu").read_text().count("ds4lab") == 0  # the checkout is never written to


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_a_failed_build_keeps_the_compiler_output_aside(tmp_path):
    mk = "CORE_OBJS = ds4.o\nds4.o: ds4.c\n\t@echo 'ds4.c:1: error: planted failure'; exit 3\n"
    src = locate(_fake_checkout(tmp_path / "ds4-def5678", makefile=mk))
    plan = B.build_plan("sm_90", jobs=1, toolchain=_toolchain())
    with pytest.raises(B.BuildError, match="make CORE_OBJS") as e:
        B.build(src, plan, cache=tmp_path / "cache", say=lambda s: None)
    assert "planted failure" in str(e.value)
    aside = list((tmp_path / "cache" / "ds4").glob("*.failed-*"))
    assert len(aside) == 1 and "planted failure" in (aside[0] / "build.log").read_text()
    # nothing else is left but the builds' lock file
    assert not [p for p in (tmp_path / "cache" / "ds4").iterdir() if ".failed-" not in p.name
                and not (p.name.startswith(".") and p.name.endswith(".lock"))]


# -- configurations -------------------------------------------------------------------------------


def test_configs_parse_and_refuse_unknown_names():
    assert parse_configs("islands-on, islands-off,islands-on") == ("islands-on", "islands-off")
    with pytest.raises(BadInput, match="unknown islands-maybe"):
        parse_configs("islands-off,islands-maybe")
    with pytest.raises(BadInput, match="at least one"):
        parse_configs(" , ")
    assert set(DEFAULT_CONFIGS) <= {"islands-off", "islands-on", "moe-profile"}


def test_worker_env_drops_the_callers_ds4_switches():
    env = worker_env("islands-on", True, base={"PATH": "/bin", "DS4_CUDA_DECODE_GRAPHS": "0", "DS4_X": "1"})
    assert env["PATH"] == "/bin" and "DS4_X" not in env
    assert "DS4_CUDA_DECODE_GRAPHS" not in env  # islands on is ds4's default: the caller's "off" must not leak
    assert env["DS4_CUDA_COPY_MODEL"] == "1" and env["DS4_CUDA_DECODE_GRAPH_LOG"] == "1"
    off = worker_env("islands-off", False, base={})
    assert off["DS4_CUDA_DECODE_GRAPHS"] == "0" and "DS4_CUDA_COPY_MODEL" not in off


# -- the worker on a stand-in engine --------------------------------------------------------------


class _StandInEngine:
    """Positions advance as ds4's do; µs per token grows with the position so tables can be checked."""

    rewritten = 0

    def __init__(self, library, model, ctx_size, threads=0, resident=False):
        self.ctx_size, self.pos, self.calls, self.resident = ctx_size, 0, [], resident
        self.vocab_size, self.layer_count, self.routed_quant_bits, self.model_bytes = 1000, 43, 2, 123
        self.mode = 0

    def logits(self):
        """The same logits for the same position in every configuration (ds4 is deterministic)."""
        return np.random.default_rng(self.pos).standard_normal(self.vocab_size).astype(np.float32)

    def capture_mode(self, mode):
        self.mode = mode

    def capture_stats(self, diff=True):
        return {"segments": 1, "splits": 0, "instantiated": 0, "updated": 1, "update_refused": 0, "nodes": 1700,
                "kernel_nodes": 1700, "nodes_changed": 300, "kernels_shape": 0, "kernels_uncompared": 0,
                "diffed_segments": 1, "breaks": "", "replayed": 0, "records": 0, "moved": 0, "slot_bytes": 0}

    def capture_tally(self):
        return [{"kernel": "rope_kernel", "param": 3, "changes": 40}]

    def sync(self, tokens):
        assert len(tokens) >= self.pos
        self.pos = len(tokens)
        return 0.5

    def eval_timed(self, token):
        self.calls.append((self.pos, token))
        self.pos += 1
        return 1000.0 + self.pos, 900.0

    def eval(self, token):
        self.calls.append((self.pos, token))
        self.pos += 1

    def close(self):
        pass


def test_worker_times_each_context_on_one_prompt(tmp_path, monkeypatch):
    import ds4lab.ds4.engine as E

    made = []
    monkeypatch.setattr(E, "Ds4Engine", lambda *a, **k: made.append(_StandInEngine(*a, **k)) or made[-1])
    plan = {"library": "x", "model": "m", "config": "islands-on", "contexts": [64, 16], "warmup": 2, "tokens": 3,
            "trace_contexts": [], "trace_tokens": 0, "seed": 5, "out": str(tmp_path / "w")}
    assert W.run(plan) == 0
    t = pd.read_csv(tmp_path / "w" / "tokens.csv")
    assert list(t.context.unique()) == [16, 64]  # ascending, whatever order they were given in
    assert list(t[t.context == 16].pos) == [18, 19, 20]  # after 2 warm-up tokens
    assert list(t[t.context == 64].pos) == [66, 67, 68]
    prompt = W.prompt_tokens(64 + 5 + 1, 1000, 5)
    assert list(t.token) == [prompt[p] for p in t.pos]  # the decode tokens are the prompt's own
    eng = made[0]
    assert [c[1] for c in eng.calls] == [prompt[p] for p, _ in eng.calls]
    pf = pd.read_csv(tmp_path / "w" / "prefill.csv")
    assert list(pf.tokens) == [16, 64 - 21]
    info = json.loads((tmp_path / "w" / "worker.json").read_text())
    assert info["layer_count"] == 43 and info["ctx_size"] >= 64 + 5


class _StandInRecording:
    """``ds4lab.audit.arguments.recording`` without CUPTI: the worker's two trace passes run their tokens
    inside it, and it saves an empty file where the real one saves the recording."""

    def __init__(self, **kw):
        self.kw = kw

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def host_range(self, name):
        import contextlib

        return contextlib.nullcontext()

    def save(self, folder, note=""):
        path = Path(folder)
        path = path / "recording.csv.gz" if path.suffix != ".gz" else path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        return path


def test_one_traced_context_sizes_the_prompt_for_every_pass(tmp_path, monkeypatch):
    """A run of one context that is also traced (``ds4lab ds4 --contexts 1024``, the default trace
    context): the warm-up, the timed tokens and both trace passes (recording, then kernel arguments)
    each decode the prompt's next token, none past its end, within the session's context."""
    import ds4lab.audit.arguments as A
    import ds4lab.ds4.engine as E

    made = []
    monkeypatch.setattr(E, "Ds4Engine", lambda *a, **k: made.append(_StandInEngine(*a, **k)) or made[-1])
    monkeypatch.setattr(A, "recording", lambda **kw: _StandInRecording(**kw))
    plan = {"library": "x", "model": "m", "config": "islands-off", "contexts": [16], "warmup": 2, "tokens": 3,
            "trace_contexts": [16], "trace_tokens": 4, "seed": 7, "out": str(tmp_path / "w")}
    assert W.run(plan) == 0
    eng = made[0]
    n = W.tokens_per_context(2, 3, 4, traced=True)
    assert n == 2 + 3 + 2 * 4
    assert [p for p, _ in eng.calls] == list(range(16, 16 + n))  # every pass on the prompt's next tokens
    prompt = W.prompt_tokens(16 + n + 1, 1000, 7)
    assert [t for _, t in eng.calls] == [prompt[p] for p, _ in eng.calls]
    assert eng.ctx_size >= 16 + n
    info = json.loads((tmp_path / "w" / "worker.json").read_text())
    assert info["traces"]["16"]["why"] == "" and info["traces"]["16"]["arguments"]
    t = pd.read_csv(tmp_path / "w" / "tokens.csv")
    assert list(t.pos) == [18, 19, 20]


def test_one_context_is_a_valid_plan_and_close_contexts_count_both_trace_passes(tmp_path):
    from ds4lab.jobs.ds4 import Ds4JobConfig, check_config

    src = _fake_checkout(tmp_path / "ds4-abc1234")
    cfg = Ds4JobConfig(source=src, contexts=(1024,), trace_contexts=(1024,))
    check_config(cfg)
    assert cfg.contexts == (1024,)
    # 4 warm-up + 32 timed + 2 × 4 traced = 44 tokens after 1024: 1068 is too close, 1069 is not
    with pytest.raises(BadInput, match="2 × trace tokens"):
        check_config(Ds4JobConfig(source=src, contexts=(1024, 1068), trace_contexts=(1024,)))
    check_config(Ds4JobConfig(source=src, contexts=(1024, 1069), trace_contexts=(1024,)))


def test_prompt_tokens_are_reproducible_and_in_range():
    a, b = W.prompt_tokens(500, 129280, 1), W.prompt_tokens(500, 129280, 1)
    assert a == b and 0 <= min(a) and max(a) < 129280 and len(set(a)) > 400
    assert W.prompt_tokens(500, 129280, 2) != a


# -- ds4's log and the tables ---------------------------------------------------------------------

_LOG = """\
ds4: CUDA copying 81.02 GiB model to device memory
ds4: CUDA model copy complete in 41.250s
ds4: decode graph captured il=0 island=0 (total 1)
ds4: decode graph captured il=3 island=1 (total 2)
ds4: decode graph capture failed (il=4 island=1): operation would make the legacy stream depend on a capturing blocking stream
ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.010 sort=0.000 gateup=0.050 midq=0.008 down=0.030 sum=0.000 total=0.098 ms
"""


def test_read_log_finds_captures_failures_profile_lines_and_the_copy(tmp_path):
    p = tmp_path / "ds4-moe-profile.log"
    p.write_text(_LOG)
    lg = R.read_log(p)
    assert lg["captured"] == [(0, 0), (3, 1)]
    assert lg["failed"] == [{"layer": 4, "island": 1, "step": "capture failed",
                             "error": "operation would make the legacy stream depend on a capturing blocking stream"}]
    assert lg["model_copy_s"] == pytest.approx(41.25) and lg["profile_lines"] == 1 and not lg["disabled"]
    off = tmp_path / "off.log"
    off.write_text("ds4: DS4_CUDA_DECODE_GRAPHS=0 - decode graph capture disabled\n")
    t = R.island_table({"moe-profile": lg, "islands-off": R.read_log(off), "none": R.read_log(tmp_path / "absent")})
    row = t.set_index("config").loc["moe-profile"]
    assert (row.captured, row.captured_island0, row.captured_island1, row.failed_island1) == (2, 1, 1, 1)
    assert t.set_index("config").loc["islands-off"].islands_disabled
    assert lg["weights"] == "gpu-memory" and row.weights == "gpu-memory"


def test_read_log_counts_launches_that_failed_inside_a_lost_capture(tmp_path):
    """ds4 prints no capture-failed line when its MoE profile breaks island 1: only its launch checks."""
    p = tmp_path / "ds4-moe-profile.log"
    p.write_text("ds4: decode graph captured il=3 island=0 (total 4)\n"
                 + "ds4: CUDA routed_moe x quantize launch failed: operation failed due to a previous error "
                   "during capture\n" * 2
                 + "ds4: CUDA embed token launch failed: invalid device function\n")
    lg = R.read_log(p)
    assert [e["launch"] for e in lg["capture_launch_errors"]] == ["routed_moe x quantize"] * 2
    row = R.island_table({"moe-profile": lg}).iloc[0]
    assert row.launch_errors_in_capture == 2 and "previous error during capture" in row.launch_error_in_capture
    assert row.captured_island0 == 1 and row.failed == 0


def test_read_log_says_where_the_weights_are(tmp_path):
    """ds4's whole-model open registers the mapping (b0309611: weights read over PCIe); a copy that
    never says it completed is not taken for one."""
    cases = {"ds4: CUDA (no-copy) registered 80.76 GiB model mapping for multi-tier selective cache\n": "host-mapped",
             "ds4: CUDA copying 80.76 GiB model to device memory\n": "unknown",
             "ds4: CUDA copying 80.76 GiB model to device memory\nds4: CUDA model copy complete in 38.1s\n":
                 "gpu-memory",
             "ds4: memory: KV 0.41 GiB\n": "unknown"}
    for i, (text, where) in enumerate(cases.items()):
        p = tmp_path / f"{i}.log"
        p.write_text(text)
        assert R.read_log(p)["weights"] == where, text


def _tokens(seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for cfg, base in (("islands-off", 20000.0), ("islands-on", 19000.0), ("moe-profile", 19000.0)):
        for ctx in (1024, 4096):
            for i in range(24):
                rows.append({"config": cfg, "context": ctx, "index": i, "pos": ctx + 4 + i, "token": 1,
                             "gpu_us": base + ctx / 10 + rng.normal(0, 30), "host_us": base - 500})
    return pd.DataFrame(rows)


def test_paired_gain_measures_a_gain_and_calls_none_not_measurable():
    t = _tokens()
    g = R.paired_gain(t, "islands-off", "islands-on")
    assert list(g.context) == [1024, 4096] and (g.pairs == 24).all()
    assert ((g.gain_us > 900) & (g.gain_us < 1100)).all() and g.measurable.all()
    assert (g.gain_lo <= g.gain_us).all() and (g.gain_us <= g.gain_hi).all()
    same = R.paired_gain(t, "islands-on", "moe-profile")
    assert not same.measurable.any()  # same mean, noise only: the interval straddles zero
    with pytest.raises(KeyError):
        R.paired_gain(t, "islands-on", "moe-graph")


def test_summarize_tokens_gives_medians_and_spread():
    s = R.summarize_tokens(_tokens()).set_index(["config", "context"])
    r = s.loc[("islands-off", 1024)]
    assert r.tokens == 24 and abs(r.us_per_token - 20102.4) < 40 and 0 < r.iqr_us < 120 and r.host_us == 19500


def _recorded_frame():
    from ds4lab.trace.events import COLUMNS

    rows = []

    def row(**kw):
        base = {c: miss for c, (_, miss) in COLUMNS.items()}
        base.update(kw)
        rows.append(base)

    corr = 0
    for tok in range(2):
        t0 = 1_000_000 * (tok + 1)
        row(kind="nvtx", name="decode_step", domain="ds4lab", tid=7, start_ns=t0, end_ns=t0 + 500_000)
        for k in range(3):  # three eager launches of 4 µs host each, kernels of 10 µs
            corr += 1
            s = t0 + 1000 + k * 5000
            row(kind="api", name="cudaLaunchKernel_v7000", domain="runtime", tid=7, start_ns=s, end_ns=s + 4000,
                correlation=corr)
            row(kind="kernel", name=f"k{k}", start_ns=s + 50_000, end_ns=s + 60_000, correlation=corr, grid="1,1,1",
                block="32,1,1")
        corr += 1
        s = t0 + 20_000
        row(kind="api", name="cudaGraphLaunch_v10000", domain="runtime", tid=7, start_ns=s, end_ns=s + 2000,
            correlation=corr)
        for n in range(2):
            row(kind="kernel", name="island", start_ns=s + 100_000 + n * 10_000, end_ns=s + 105_000 + n * 10_000,
                correlation=corr, graph_id=9, graph_node_id=n, grid="2,1,1", block="64,1,1")
        row(kind="api", name="cudaDeviceSynchronize_v3020", domain="runtime", tid=7, start_ns=t0 + 30_000,
            end_ns=t0 + 400_000, correlation=corr + 1000)
    return pd.DataFrame(rows)


def test_trace_census_counts_launches_graph_kernels_and_the_host_span():
    tokens, kernels = R.trace_census(_recorded_frame())
    assert list(tokens.launch_calls) == [3, 3] and list(tokens.graph_launches) == [1, 1]
    assert list(tokens.kernels) == [5, 5] and list(tokens.kernels_in_graphs) == [2, 2]
    assert tokens.busy_us.tolist() == [40.0, 40.0]
    assert tokens.launch_call_us.tolist() == [4.0, 4.0]
    assert tokens.enqueue_us.tolist() == [22.0, 22.0]  # to the end of the last launch (the graph's), not the sync
    k = kernels.set_index("name")
    assert k.loc["island"].per_token == 2 and k.loc["island"].in_graph == 1.0 and k.loc["k0"].in_graph == 0.0
    with pytest.raises(ValueError, match="decode_step"):
        R.trace_census(_recorded_frame().query("kind != 'nvtx'"))


def test_collect_reads_the_workers_files_into_the_jobs_tables(tmp_path):
    t = _tokens()
    for cfg in ("islands-off", "islands-on"):
        w = tmp_path / f"worker-{cfg}"
        w.mkdir()
        t[t.config == cfg].to_csv(w / "tokens.csv", index=False)
        (tmp_path / f"ds4-{cfg}.log").write_text(_LOG if cfg == "islands-on" else "")
    out = collect(tmp_path, ["islands-off", "islands-on"])
    assert set(out) >= {"tokens", "summary", "gains", "islands"}
    assert (tmp_path / "gains.csv").exists() and (tmp_path / "summary.csv").exists()
    assert out["gains"].iloc[0].base == "islands-off" and out["islands"].captured.tolist() == [0, 2]


# -- the command without a GPU --------------------------------------------------------------------


def test_ds4_command_without_a_gpu_says_so_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ds4lab.cli import main

    src = _fake_checkout(tmp_path / "ds4-abc1234")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no nvidia-smi
    for arch in ([], ["--arch", "sm_90"]):  # naming the architecture does not skip the GPU check
        r = CliRunner().invoke(main, ["ds4", "--source", str(src), *arch, "--out", str(tmp_path / "out"),
                                      "--cache", str(tmp_path / "cache")])
        assert r.exit_code == 2, r.output
        assert "GPU" in r.output and len([ln for ln in r.output.strip().splitlines() if ln.strip()]) == 1
        assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("args, message", [
    (["--contexts", "4096,1024"], "ascending"),
    (["--contexts", "1024,1030"], "within warmup"),
    (["--trace-contexts", "2048"], "not among --contexts"),
    (["--configs", "islands-maybe"], "unknown islands-maybe"),
    (["--model", "missing.gguf"], "no such file"),
    (["--random-expert-layers", "43"], "layers 0..42"),
    (["--random-expert-layers", "x"], "--random-expert-layers"),
    (["--contexts", "1024,,4096"], "empty element"),
    (["--contexts", "abc"], "not an integer"),
    (["--contexts", "99999999999"], "past 262144"),
    (["--trace-contexts", "1024,"], "--trace-contexts"),
    (["--model", "README"], "not a GGUF file"),
])
def test_ds4_command_refuses_bad_options_before_any_work(tmp_path, args, message):
    from click.testing import CliRunner

    from ds4lab.cli import main

    src = _fake_checkout(tmp_path / "ds4-abc1234")
    (tmp_path / "README").write_text("not a model\n")
    args = [str(tmp_path / a) if a == "README" else a for a in args]
    r = CliRunner().invoke(main, ["ds4", "--source", str(src), *args, "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and message in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_ds4_command_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    (tmp_path / "src").mkdir()
    r = CliRunner().invoke(main, ["ds4", "--source", str(tmp_path / "src")])
    assert r.exit_code == 2 and "not a ds4 checkout" in r.output


def test_cpu_build_plan_uses_ds4s_cpu_objects_and_no_cuda():
    plan = B.build_plan(B.CPU, toolchain=_toolchain())
    assert plan.objects_var == "CPU_CORE_OBJS" and set(plan.make_vars) == {"CC", "CFLAGS"}
    assert "-DDS4LAB_CPU_ONLY" in plan.driver_command(Path("/s"), Path("/o"))
    link = plan.link_command(Path("/s"), ["ds4_cpu.o"], Path("/d.o"), Path("/l.so"))
    assert link[:2] == ["cc", "-shared"] and not any("cud" in a for a in link)


# -- ds4's own engine, on its CPU back end (opt-in: minutes) --------------------------------------

_CPU_RUN = os.environ.get("DS4LAB_DS4_CPU") == "1"


@pytest.mark.slow
@pytest.mark.skipif(not _CPU_RUN, reason="opt-in (DS4LAB_DS4_CPU=1): ds4's CPU back end takes 5-20 s per Flash "
                                         "token and writes a 2 GiB sparse model; about 4 minutes on 2 cores")
@pytest.mark.skipif(not SHARED_TARBALL.exists(), reason="the shared ds4 archive is not beside the checkout")
def test_the_driver_and_worker_run_ds4s_own_engine_on_the_synthetic_model(tmp_path):
    """ds4lab's driver (built with -DDS4LAB_CPU_ONLY) and worker, held to ds4 itself: ds4 opens the
    synthetic model, prefills, decodes, and extends its prefix (the second prefill evaluates only
    the tokens after the first context's decode tokens)."""
    from ds4lab.ds4.gguf_writer import write_synthetic_model

    bld = B.build(locate(SHARED_TARBALL), B.build_plan(B.CPU, jobs=2), cache=tmp_path / "cache", say=lambda s: None)
    model = write_synthetic_model(tmp_path / "flash.gguf", dense="holes")
    plan = {"library": str(bld.library), "model": str(model.path), "config": "cpu", "contexts": [4, 9],
            "warmup": 1, "tokens": 2, "trace_contexts": [], "trace_tokens": 0, "seed": 3, "threads": 2,
            "out": str(tmp_path / "w")}
    assert W.run(plan) == 0
    info = json.loads((tmp_path / "w" / "worker.json").read_text())
    assert (info["layer_count"], info["vocab_size"], info["routed_quant_bits"]) == (43, 129280, 2)
    t = pd.read_csv(tmp_path / "w" / "tokens.csv")
    assert list(t.pos) == [5, 6, 10, 11] and (t.host_us > 0).all()
    pf = pd.read_csv(tmp_path / "w" / "prefill.csv")
    assert list(pf.from_pos) == [0, 7] and list(pf.tokens) == [4, 2]
    # the layer-slice open the GPU runs ask for (every layer and the output head): the same tokens
    assert W.run({**plan, "resident": True, "out": str(tmp_path / "r")}) == 0
    r = pd.read_csv(tmp_path / "r" / "tokens.csv")
    assert list(r.pos) == list(t.pos) and list(r.token) == list(t.token)


def test_expert_data_check_compares_the_random_layers_with_the_holes():
    from ds4lab.trace.events import COLUMNS

    rows = []

    def row(**kw):
        base = {c: miss for c, (_, miss) in COLUMNS.items()}
        base.update(kw)
        rows.append(base)

    for tok in range(2):
        t0 = 10_000_000 * (tok + 1)
        row(kind="nvtx", name="decode_step", start_ns=t0, end_ns=t0 + 1_000_000, tid=1)
        for layer in range(43):
            s = t0 + 1000 + layer * 20_000
            us = 15 if layer == 21 else 10  # the random layer's expert kernel is slower
            row(kind="kernel", name="moe_gate_up", start_ns=s, end_ns=s + us * 1000)
            row(kind="kernel", name="rms_norm", start_ns=s + 16_000, end_ns=s + 17_000)
        row(kind="kernel", name="output_head", start_ns=t0 + 900_000, end_ns=t0 + 950_000)
    t = R.expert_data_check(pd.DataFrame(rows), (21,)).set_index("name")
    assert set(t.index) == {"moe_gate_up", "rms_norm"}  # once per layer; the head runs once a token
    assert t.loc["moe_gate_up"].ratio == pytest.approx(1.5) and t.loc["moe_gate_up"].tokens == 2
    assert t.loc["rms_norm"].ratio == pytest.approx(1.0)
    assert R.expert_data_check(pd.DataFrame(rows), ()).empty


def test_random_expert_blocks_keep_their_scales_small_and_finite():
    from ds4lab.ds4.gguf_model import EXPERT_BLOCKS, ds4_tensors
    from ds4lab.ds4.gguf_writer import tensor_bytes

    specs = [t for t in ds4_tensors("small", random_expert_layers=(1,)) if "exps" in t.name]
    assert {t.fill for t in specs if ".1." in t.name} == {"random"} and {t.fill for t in specs if ".0." in t.name} == {"hole"}
    for t in (s for s in specs if s.fill == "random"):
        data = np.frombuffer(b"".join(b for _, b in tensor_bytes(t, 0)), dtype=np.uint8)
        size, offs = EXPERT_BLOCKS[t.ggml_type]
        blocks = data.reshape(-1, size)
        for o in offs:
            d = blocks[:, o:o + 2].copy().view("<f2").ravel()
            assert np.all(d == np.float16(2.0 ** -10))
        assert len(np.unique(blocks[:, max(offs) + 2 if offs[0] == 0 else 0])) > 100  # the rest is random
    with pytest.raises(BadInput, match="random_expert_layers"):
        ds4_tensors("ds4-flash", random_expert_layers=(43,))


def test_audit_recordings_audits_each_recorded_configuration(tmp_path):
    from ds4lab.trace.events import EventTable
    from ds4lab.trace.sources.saved import write_table
    from ds4lab.jobs.ds4 import audit_recordings

    frame = _recorded_frame()
    frame["pid"] = 1
    frame.loc[frame.kind != "api", "device"] = 0
    frame.loc[frame.kind == "api", "device"] = 0
    frame.loc[frame.kind.isin(["kernel", "api"]), "stream"] = 7
    rec = tmp_path / "worker-islands-on" / "trace-1024"
    rec.mkdir(parents=True)
    write_table(EventTable(frame, source="recording.csv.gz", tool="cupti"), rec / "recording.csv.gz")
    done = audit_recordings(tmp_path, ["islands-on", "islands-off"], say=lambda s: None)
    assert list(done) == ["audit-islands-on-1024"]
    assert done["audit-islands-on-1024"] == "audited", done
    assert (tmp_path / "audit-islands-on-1024" / "audit.csv").is_file()


# -- ds4's capture ladder (the stages on ds4 rewritten by ds4lab), on stand-in engines ----------------


class _DriftingEngine(_StandInEngine):
    """A stage whose token from position ``drift_from`` on gives other logits (one bit of logit 7)."""

    drift_from = 10**9

    def logits(self):
        lg = super().logits()
        if self.pos - 1 >= self.drift_from:
            lg.view(np.uint32)[7] ^= 1
        return lg


def _run_stage(tmp_path, monkeypatch, config, engine=_StandInEngine, capture=0):
    import ds4lab.ds4.engine as E

    made = []
    monkeypatch.setattr(E, "Ds4Engine", lambda *a, **k: made.append(engine(*a, **k)) or made[-1])
    plan = {"library": "x", "model": "m", "config": config, "contexts": [16, 64], "warmup": 1, "tokens": 4,
            "trace_contexts": [], "trace_tokens": 0, "seed": 2, "capture": capture,
            "out": str(tmp_path / f"worker-{config}")}
    assert W.run(plan) == 0
    return made[0]


def test_stages_are_held_to_ds4_as_it_ships_bit_for_bit_and_laddered(tmp_path, monkeypatch):
    from ds4lab.ds4.measure import collect

    _run_stage(tmp_path, monkeypatch, "islands-off")
    _run_stage(tmp_path, monkeypatch, "stage-0")
    drifting = type("D", (_DriftingEngine,), {"drift_from": 66})
    eng = _run_stage(tmp_path, monkeypatch, "stage-3u", engine=drifting, capture=1)
    assert eng.mode == 1  # the worker set the driver's capture mode
    w = tmp_path / "worker-stage-3u"
    assert np.load(w / "logits-64.npy").shape == (4, 1000)
    cap = pd.read_csv(w / "capture.csv")
    assert list(cap.pos) == [17, 18, 19, 20, 65, 66, 67, 68] and (cap.nodes_changed == 300).all()
    assert pd.read_csv(w / "capture-args.csv").kernel.tolist() == ["rope_kernel"]
    tables = collect(tmp_path, ["islands-off", "stage-0", "stage-3u"])
    ex = tables["exact"]
    assert ex[ex.config == "stage-0"].identical.all() and len(ex[ex.config == "stage-0"]) == 8
    bad = ex[(ex.config == "stage-3u") & ~ex.identical]
    assert list(bad.pos) == [66, 67, 68] and (bad.first_diff == 7).all() and (bad.n_diff == 1).all()
    lad = tables["ladder"].set_index(["context", "stage"])
    assert list(tables["ladder"].stage.unique()) == ["shipped", "0", "3u"]
    assert lad.loc[(16, "3u"), "exact_tokens"] == 4 and lad.loc[(16, "3u"), "first_difference"] == ""
    assert lad.loc[(64, "3u"), "exact_tokens"] == 1 and lad.loc[(64, "3u"), "compared_tokens"] == 4
    assert lad.loc[(64, "3u"), "first_difference"].startswith("pos 66: logit 7")
    assert lad.loc[(16, "3u"), "node_updates_per_token"] == 300 and lad.loc[(16, "3u"), "graphs_per_token"] == 1
    assert lad.loc[(16, "shipped"), "first_difference"] == "reference"
    assert (tmp_path / "ladder.csv").exists() and (tmp_path / "exact.csv").exists()
    # the logits removed once compared: a later collect keeps the comparison it made
    for f in tmp_path.glob("worker-*/logits-*.npy"):
        f.unlink()
    again = collect(tmp_path, ["islands-off", "stage-0", "stage-3u"])
    assert len(again["exact"]) == len(ex) and again["ladder"].first_difference.tolist() == \
        tables["ladder"].first_difference.tolist()


def test_stages_option_runs_the_reference_first_and_refuses_stages_not_built(tmp_path):
    from ds4lab.ds4.configs import parse_stages
    from ds4lab.jobs.ds4 import Ds4JobConfig, check_config

    assert parse_stages("0,i,3u") == ("islands-off", "stage-0", "stage-i", "stage-3u")
    assert parse_stages("0,3") == ("islands-off", "stage-0", "stage-3")
    with pytest.raises(BadInput, match="3p: stage 3p sets programmatic dependent launch"):
        parse_stages("0,3p")
    with pytest.raises(BadInput, match="unknown 9"):
        parse_stages("0,9")
    for bad in ("3,3", "0,,i", "0,i,"):
        with pytest.raises(BadInput, match=rf"--stages '{bad}': an empty or repeated stage"):
            parse_stages(bad)
    src = _fake_checkout(tmp_path / "ds4-abc1234")
    with pytest.raises(BadInput, match="--stages '': name at least one"):
        check_config(Ds4JobConfig(source=src, stages=""))
    for bad, msg in ((dict(warmup=-1), "--warmup -1: must be at least 0"),
                     (dict(jobs=0), "--jobs 0: must be at least 1"),
                     (dict(trace_tokens=-2), "--trace-tokens -2: must be at least 0")):
        with pytest.raises(BadInput, match=msg):
            check_config(Ds4JobConfig(source=src, **bad))
    cfg = Ds4JobConfig(source=src, stages="3u,0")
    check_config(cfg)
    assert cfg.configs == ("islands-off", "stage-3u", "stage-0")
    cfg = Ds4JobConfig(source=src)
    check_config(cfg)
    assert cfg.configs == DEFAULT_CONFIGS
    with pytest.raises(BadInput, match="--host-march"):
        check_config(Ds4JobConfig(source=src, host_march="native -O0"))
