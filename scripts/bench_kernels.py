#!/usr/bin/env python3
"""Variants of the token's heavy kernels, checked and timed on the GPU in one run (device only).

For each kernel of the ds4-flash token that ``kernels/`` tunes (the Q8_0 matvecs, the decode MoE
matvecs, attention, router top-k, the hyper-connection pre-mix), every compile-time variant
(``-DQ8_NR``, ``-DQ8_UNROLL``; ``-DMOE_GU_RPW`` / ``_UNROLL`` and ``-DMOE_DN_RPW`` / ``_UNROLL``;
``-DATTN_HPB``, ``-DATTN_NS``) and every launch geometry worth trying (threads per row group, x
staged in shared memory or not) is:

* checked: one launch against a float64 NumPy reference of a sample of its outputs, on fresh
  random weights and activations (relative L2 error, must be < 2e-5);
* timed as the replayed token runs it: a CUDA graph of ``L`` back-to-back launches, each on another
  copy of the weights (rotating through a pool several times the 50 MB L2), replayed ``R`` times
  between two events; µs per launch = replay time / L, median over replays.

With ``--baseline DIR`` (a ``kernels/`` folder of an older tree) its kernels are timed the same way
in the same run (``variant = baseline``). Writes ``kernels.csv`` (one row per kernel, shape,
variant, geometry: µs, GB/s, fraction of the copy bandwidth, error) to ``--out`` and prints the
best configuration per shape.

Usage: ``python3 scripts/bench_kernels.py --out DIR [--baseline DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RTOL = 2e-5
POOL_BYTES = 3 << 30  # weight pool the launches rotate through (60 x the L2)


def log(*a):
    print(*a, flush=True)


class Gpu:
    def __init__(self):
        import cupy

        self.cp = cupy
        self.st = cupy.cuda.Stream(non_blocking=True)
        self.e0, self.e1 = cupy.cuda.Event(), cupy.cuda.Event()
        rs = cupy.random.RandomState(7)
        self.pool = rs.randint(-127, 128, POOL_BYTES, dtype=np.int8)  # q8 and 4-bit bytes alike
        self.dpool = (rs.random_sample(160 << 20, dtype=np.float32) * 0.01 + 0.001).astype(np.float16)
        self.mods = {}
        self.copy_GBps = self.copy_bw()

    def copy_bw(self):
        cp = self.cp
        n = 1 << 30
        a = cp.empty(n, dtype=np.int8)
        b = cp.empty_like(a)
        with self.st:
            for _ in range(3):
                b[...] = a
        v = []
        for _ in range(10):
            self.e0.record(self.st)
            cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, n, cp.cuda.runtime.memcpyDeviceToDevice, self.st.ptr)
            self.e1.record(self.st)
            self.e1.synchronize()
            v.append(2 * n / (cp.cuda.get_elapsed_time(self.e0, self.e1) * 1e-3) / 1e9)
        return float(np.median(v))

    def module(self, kdir: Path, fname: str, defines=()):
        key = (str(kdir), fname, tuple(defines))
        if key not in self.mods:
            t0 = time.time()
            opts = ("-std=c++17", f"-I{kdir}") + tuple(f"-D{d}" for d in defines)
            m = self.cp.RawModule(code=(kdir / fname).read_text(), options=opts)
            m.compile()
            self.mods[key] = m
            log(f"  compiled {kdir.name}/{fname} {' '.join(defines)} in {time.time() - t0:.1f}s")
        return self.mods[key]

    def qslice(self, i, nbytes):
        """The i-th weight copy of nbytes in the pool (256-byte aligned)."""
        step = (nbytes + 255) // 256 * 256
        n = max(1, POOL_BYTES // step)
        off = (i % n) * step
        return self.pool[off: off + nbytes]

    def dslice(self, i, n):
        step = (n + 127) // 128 * 128
        k = max(1, self.dpool.size // step)
        off = (i % k) * step
        return self.dpool[off: off + n]

    def time_graph(self, launches, reps=12):
        """µs per launch of a captured graph of the launch callables, median of reps replays."""
        cp, st = self.cp, self.st
        with st:
            for f in launches[:2]:
                f()
        st.synchronize()
        st.begin_capture()
        try:
            with st:
                for f in launches:
                    f()
        finally:
            g = st.end_capture()
        g.launch(st)
        g.launch(st)
        st.synchronize()
        v = []
        for _ in range(reps):
            self.e0.record(st)
            g.launch(st)
            self.e1.record(st)
            self.e1.synchronize()
            v.append(cp.cuda.get_elapsed_time(self.e0, self.e1) * 1e3 / len(launches))
        return float(np.median(v)), float(np.percentile(v, 25)), float(np.percentile(v, 75))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def n_launches(nbytes):
    return int(max(4, min(48, (600 << 20) // max(nbytes, 1))))


def split_tprs(units, chunks):
    out = []
    for tpr in (32, 64, 128, 256):
        if tpr == 32 or tpr <= chunks:
            if -(-units // (256 // tpr)) >= 64 or tpr == 32:
                out.append(tpr)
    return out


# ----------------------------------------------------------------------------- Q8_0 matvecs
Q8_SHAPES = [  # name, kernel, rows (gate rows for swiglu), cols, rows_per_group, launches per token
    ("q_a", "q8_matvec", 1024, 4096, None, 43),
    ("kv", "q8_matvec", 512, 4096, None, 43),
    ("q_b", "q8_matvec", 32768, 1024, None, 43),
    ("o_a", "q8_matvec", 8192, 4096, 1024, 43),
    ("o_b_expand", "q8_matvec_expand", 4096, 8192, None, 43),
    ("sh_gateup_swiglu", "q8_matvec_swiglu", 2048, 4096, None, 43),
    ("sh_down_expand", "q8_matvec_expand", 4096, 2048, None, 43),
    ("vocab", "q8_matvec", 129280, 4096, None, 1),
]


def q8_rows(kernel, rows):
    return 2 * rows if kernel == "q8_matvec_swiglu" else rows


def q8_case(gpu, mod, name, kernel, rows, cols, rpg, nr, tpr, smx, baseline, rng):
    """(check error, µs per launch (median, p25, p75), bytes per launch) of one configuration."""
    cp = gpu.cp
    wrows = q8_rows(kernel, rows)
    nbytes_q, nb = wrows * cols, wrows * cols // 32
    groups_in = (wrows // rpg) if rpg else 1
    S = 4
    x = cp.asarray(rng.standard_normal(cols * groups_in).astype(np.float32))
    y = cp.full(wrows, np.nan, dtype=np.float32)
    h0 = rng.standard_normal((S, rows)).astype(np.float32)
    h = cp.asarray(h0)
    mix = cp.asarray(rng.standard_normal(2 * S).astype(np.float32))
    extra = cp.asarray(rng.standard_normal(rows).astype(np.float32))
    fn = mod.get_function(kernel)
    if baseline:
        units = (rows if kernel == "q8_matvec_swiglu" else wrows // 2)
        per = 256 // tpr
        grid, block, shared = (-(-units // per),), (tpr, per), 0
        tail = ()
    else:
        units = -(-rows // (nr // 2)) if kernel == "q8_matvec_swiglu" else -(-wrows // nr)
        per = 256 // tpr
        grid, block = (-(-units // per),), (tpr, per)
        if smx and rpg and rpg % (nr * per):
            return None
        shared = cols * 5 if smx else 0
        tail = (np.int32(1 if smx else 0),)

    def args(i):
        qs = gpu.qslice(i, nbytes_q)
        d = gpu.dslice(i, nb)
        if kernel == "q8_matvec":
            return (qs, d, x, y, np.int32(wrows), np.int32(cols), np.int32(rpg or wrows), np.int32(cols if rpg else 0)) + tail
        if kernel == "q8_matvec_swiglu":
            return (qs, d, x, y, np.int32(rows), np.int32(cols), np.float32(10.0)) + tail
        return (qs, d, x, h, mix, extra, np.int32(rows), np.int32(cols), np.int32(S)) + tail

    def launch(i):
        return lambda: fn(grid, block, args(i), shared_mem=shared)

    # check launch 0 on a sample of rows
    with gpu.st:
        if kernel == "q8_matvec_expand":
            h[...] = cp.asarray(h0)
        launch(0)()
    gpu.st.synchronize()
    sample = rng.choice(rows if kernel != "q8_matvec" else wrows, size=min(256, rows), replace=False)
    need = np.concatenate([sample, sample + rows]) if kernel == "q8_matvec_swiglu" else sample
    qs = {int(r): v for r, v in zip(need, cp.asnumpy(gpu.qslice(0, nbytes_q).reshape(wrows, cols)[cp.asarray(need)]))}
    dd = cp.asnumpy(gpu.dslice(0, nb).reshape(wrows, cols // 32)[cp.asarray(need)]).astype(np.float64)
    d = {int(r): v for r, v in zip(need, dd)}
    xh = cp.asnumpy(x).astype(np.float64)

    def ref_row(r):
        g = (r // rpg) if rpg else 0
        w = qs[int(r)].astype(np.float64) * np.repeat(d[int(r)], 32)
        return w @ xh[g * cols:(g + 1) * cols]

    if kernel == "q8_matvec":
        err = rel(cp.asnumpy(y)[sample], [ref_row(r) for r in sample])
    elif kernel == "q8_matvec_swiglu":
        gv = np.array([ref_row(r) for r in sample])
        uv = np.array([ref_row(r + rows) for r in sample])
        gcl = np.minimum(gv, 10.0)
        ucl = np.clip(uv, -10.0, 10.0)
        err = rel(cp.asnumpy(y)[sample], gcl / (1 + np.exp(-gcl)) * ucl)
    else:
        yv = np.array([ref_row(r) for r in sample]) + cp.asnumpy(extra)[sample]
        post = 2 / (1 + np.exp(-cp.asnumpy(mix)[S:].astype(np.float64)))
        got = cp.asnumpy(h)[:, sample] - h0[:, sample]
        err = rel(got, post[:, None] * yv[None, :])
    L = n_launches(nbytes_q)
    t = gpu.time_graph([launch(i) for i in range(L)])
    nbytes = nbytes_q + nb * 2 + 4 * (cols * groups_in + rows)
    return err, t, nbytes


def run_q8(gpu, kdir, base, rows_out, quick, rng):
    variants = [("4", "1"), ("2", "2")]
    if quick:
        variants = variants[:1]
    for nr, u in variants:
        try:
            mod = gpu.module(kdir, "dense.cu", (f"Q8_NR={nr}", f"Q8_UNROLL={u}"))
        except Exception as e:
            log(f"  FAIL compile dense.cu NR={nr} U={u}: {e}")
            continue
        for name, kernel, rows, cols, rpg, per_tok in Q8_SHAPES:
            units = -(-q8_rows(kernel, rows) // int(nr))
            for tpr in split_tprs(units, cols // 16):
                for smx in (1, 0):
                    try:
                        r = q8_case(gpu, mod, name, kernel, rows, cols, rpg, int(nr), tpr, smx, False, rng)
                    except Exception as e:
                        log(f"  FAIL {name} NR={nr} U={u} tpr={tpr} smx={smx}: {type(e).__name__}: {e}")
                        traceback.print_exc()
                        continue
                    if r is None:
                        continue
                    add(rows_out, gpu, name, kernel, f"NR{nr}_U{u}", f"tpr={tpr} smx={smx}", per_tok, *r)
    if base is not None:
        mod = gpu.module(base, "dense.cu")
        for name, kernel, rows, cols, rpg, per_tok in Q8_SHAPES:
            units = rows if kernel == "q8_matvec_swiglu" else rows // 2
            for tpr in split_tprs(units, cols // 16):
                try:
                    r = q8_case(gpu, mod, name, kernel, rows, cols, rpg, 2, tpr, 0, True, rng)
                except Exception as e:
                    log(f"  FAIL baseline {name} tpr={tpr}: {type(e).__name__}: {e}")
                    continue
                add(rows_out, gpu, name, kernel, "baseline", f"tpr={tpr}", per_tok, *r)


# ----------------------------------------------------------------------------- decode MoE
def moe_case(gpu, mod, stage, rpw, smx, baseline, rng):
    cp = gpu.cp
    E, F, k, n_exp = 4096, 2048, 6, 256
    if stage == "gateup":
        rows, cols = 2 * F, E
    else:
        rows, cols = E, F
    per_expert_q, per_expert_d = rows * cols // 2, rows * cols // 32
    L = n_launches(6 * (per_expert_q + per_expert_d * 2))
    ids_h = [rng.choice(n_exp, k, replace=False).astype(np.int32) for _ in range(L)]  # other experts every launch
    ids = [cp.asarray(v) for v in ids_h]
    xq_h = rng.integers(-127, 128, (k, cols)).astype(np.int8)
    xd_h = (rng.random((k, cols // 256)) * 0.02 + 0.001).astype(np.float32)
    xq, xd = cp.asarray(xq_h), cp.asarray(xd_h)
    out0 = cp.full((k, F if stage == "gateup" else E), np.nan, dtype=np.float32)
    out1 = cp.full((k, F), np.nan, dtype=np.float32)
    fn = mod.get_function(f"moe_{stage}_decode")
    bank_q = n_exp * per_expert_q
    bank_d = n_exp * per_expert_d
    if baseline:
        grid = ((F // 8) if stage == "gateup" else (E // 16), k)
        shared, tail = 0, ()
    else:
        grid = ((-(-F // (8 * rpw // 2))) if stage == "gateup" else -(-E // (8 * rpw)), k)
        shared = 3 * cols // 2 if smx else 0
        tail = (np.int32(smx), np.uint64(0), np.int32(0), np.int32(0))  # no profiling stamp
    q = gpu.qslice(0, bank_q)
    d = gpu.dslice(0, bank_d)
    assert q.size == bank_q and d.size == bank_d, "weight pool too small for one bank"

    def args(i):
        if stage == "gateup":
            return (q, d, xq, xd, ids[i], out0, out1, np.int32(k), np.int32(F), np.int32(E), np.int32(n_exp)) + tail
        return (q, d, xq, xd, ids[i], out0, np.int32(F), np.int32(E), np.int32(n_exp)) + tail

    def launch(i):
        return lambda: fn(grid, (256,), args(i), shared_mem=shared)

    with gpu.st:
        launch(0)()
    gpu.st.synchronize()
    errs = []
    for p in range(2):  # two pairs, 128 sampled rows each
        e = int(ids_h[0][p])
        xs = xq_h[0 if stage == "gateup" else p].astype(np.float64) * np.repeat(xd_h[0 if stage == "gateup" else p], 256)
        rs = rng.choice(rows, 128, replace=False)
        qe = cp.asnumpy(q[e * per_expert_q:(e + 1) * per_expert_q]).view(np.uint8).reshape(rows, cols // 32, 16)
        de = cp.asnumpy(d[e * per_expert_d:(e + 1) * per_expert_d]).astype(np.float64).reshape(rows, cols // 32)
        lo = (qe[rs] & 0x0F).astype(np.float64) - 8
        hi = (qe[rs] >> 4).astype(np.float64) - 8
        w = np.concatenate([lo, hi], axis=-1) * de[rs][:, :, None]
        ref = w.reshape(len(rs), cols) @ xs
        if stage == "gateup":
            g, u = cp.asnumpy(out0)[p], cp.asnumpy(out1)[p]
            got = np.where(rs < F, g[np.minimum(rs, F - 1)], u[np.maximum(rs - F, 0)])
        else:
            got = cp.asnumpy(out0)[p][rs]
        errs.append(rel(got, ref))
    tm = gpu.time_graph([launch(i) for i in range(L)])
    nbytes = k * (per_expert_q + per_expert_d * 2) + (cols + cols // 64) + k * rows * 4
    return max(errs), tm, nbytes


def run_moe(gpu, kdir, base, rows_out, quick, rng):
    variants = [("2", "2"), ("4", "1"), ("4", "2")]
    if quick:
        variants = variants[:2]
    for rpw, u in variants:
        try:
            mod = gpu.module(kdir, "moe.cu", (f"MOE_GU_RPW={rpw}", f"MOE_GU_UNROLL={u}", f"MOE_DN_RPW={rpw}",
                                              f"MOE_DN_UNROLL={u}"))
        except Exception as e:
            log(f"  FAIL compile moe.cu RPW={rpw} U={u}: {e}")
            continue
        for stage in ("gateup", "down"):
            for smx in (1, 0):
                try:
                    r = moe_case(gpu, mod, stage, int(rpw), smx, False, rng)
                except Exception as e:
                    log(f"  FAIL moe {stage} RPW={rpw} U={u} smx={smx}: {type(e).__name__}: {e}")
                    traceback.print_exc()
                    continue
                add(rows_out, gpu, stage, f"moe_{stage}_decode", f"RPW{rpw}_U{u}", f"smx={smx}", 43, *r)
    if base is not None:
        mod = gpu.module(base, "moe.cu")
        for stage in ("gateup", "down"):
            try:
                r = moe_case(gpu, mod, stage, 2, 0, True, rng)
                add(rows_out, gpu, stage, f"moe_{stage}_decode", "baseline", "", 43, *r)
            except Exception as e:
                log(f"  FAIL baseline moe {stage}: {type(e).__name__}: {e}")


# ----------------------------------------------------------------------------- small kernels
def run_small(gpu, kdir, base, rows_out, rng):
    """attention (ds4-flash: 64 heads x 512, window 128, full), router top-k, hc_premix: new and baseline."""
    cp = gpu.cp
    H, D, W = 64, 512, 128
    sets = 43
    qs = [cp.asarray(rng.standard_normal((H, D)).astype(np.float32)) for _ in range(sets)]
    cs = [cp.asarray(rng.standard_normal((W, D)).astype(np.float32)) for _ in range(sets)]
    os_ = [cp.full((H, D), np.nan, dtype=np.float32) for _ in range(sets)]
    pos = 5000
    scal = cp.asarray(np.array([pos, pos % W, W, 3], np.int32))
    part_o = cp.zeros(H * 64 * D, np.float32)  # the global combine's scratch (baseline, and before sm_90)
    part_ml = cp.zeros(H * 64 * 2, np.float32)
    counter = cp.zeros(64, np.int32)

    def att_ref(q, c):
        q, c = q.astype(np.float64), c.astype(np.float64)
        rows = [(pos - (W - 1 - j)) % W for j in range(W)]
        k = c[rows]
        s = q @ k.T / np.sqrt(D)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return (p / p.sum(axis=1, keepdims=True)) @ k

    from ds4lab.token import ops
    from ds4lab.token.config import get_preset

    cfg = get_preset("ds4-flash")
    att = [("new", kdir, 4, 8)] + [(f"HPB{h}_NS{n}", kdir, h, n) for h, n in ((2, 8), (8, 8), (4, 4), (8, 4))]
    att += [("baseline", base, 0, 0)] if base is not None else []
    for tag, kd, hpb, ns in att:
        try:
            if tag == "baseline":
                fn = gpu.module(kd, "attention.cu").get_function("attention_decode")

                def la(i, fn=fn):
                    return lambda: fn((H // 4, W // 16), (256,), (qs[i], cs[i], os_[i], np.int32(D), np.int32(W),
                                                                  np.int32(H), part_o, part_ml, counter, scal,
                                                                  np.int32(0), np.int32(0), np.int32(0), np.int32(0)))
            else:
                defs = () if tag == "new" else (f"ATTN_HPB={hpb}", f"ATTN_NS={ns}")
                fn = gpu.module(kd, "attention.cu", defs).get_function("attention_decode")
                was = ops.ATTN_HPB, ops.ATTN_NS
                ops.ATTN_HPB, ops.ATTN_NS = hpb, ns
                try:
                    grid, kc, shared = ops.attention_launch(cfg)
                finally:
                    ops.ATTN_HPB, ops.ATTN_NS = was

                def la(i, fn=fn, kc=kc, shared=shared, grid=grid):
                    return lambda: fn(grid, (256,), (qs[i], cs[i], os_[i], np.int32(D), np.int32(W), np.int32(H),
                                                     np.int32(kc), part_o, part_ml, counter, scal, np.int32(0),
                                                     np.int32(0), np.int32(0), np.int32(0)), shared_mem=shared)
            with gpu.st:
                la(0)()
                la(0)()
            gpu.st.synchronize()
            err = rel(cp.asnumpy(os_[0]), att_ref(cp.asnumpy(qs[0]), cp.asnumpy(cs[0])))
            tm = gpu.time_graph([la(i) for i in range(sets)])
            add(rows_out, gpu, "attention", "attention_decode", tag, "", 43, err, tm, 4 * D * (2 * H + W))
        except Exception as e:
            log(f"  FAIL attention {tag}: {type(e).__name__}: {e}")
            traceback.print_exc()
    # router top-k: 256 logits, k = 6
    N, k = 256, 6
    lgs = [cp.asarray(rng.standard_normal(N).astype(np.float32)) for _ in range(sets)]
    ids = cp.full(k, -1, np.int32)
    wts = cp.full(k, np.nan, np.float32)
    for tag, kd in (("new", kdir), ("baseline", base)):
        if kd is None:
            continue
        try:
            fn = gpu.module(kd, "router.cu").get_function("router_topk")
            block = (32,) if tag == "new" else (256,)

            def lt(i, fn=fn, block=block):
                return lambda: fn((1,), block, (lgs[i], ids, wts, np.int32(N), np.int32(k)))
            with gpu.st:
                lt(0)()
            gpu.st.synchronize()
            lg = cp.asnumpy(lgs[0]).astype(np.float64)
            order = np.argsort(-lg, kind="stable")[:k]
            s = 1 / (1 + np.exp(-lg[order]))
            ok = np.array_equal(cp.asnumpy(ids), order)
            err = rel(cp.asnumpy(wts), s / s.sum()) if ok else float("inf")
            tm = gpu.time_graph([lt(i) for i in range(sets)])
            add(rows_out, gpu, "router_topk", "router_topk", tag, "", 40, err, tm, 4 * (N + 2 * k))
        except Exception as e:
            log(f"  FAIL router_topk {tag}: {type(e).__name__}: {e}")
            traceback.print_exc()
    # hc_premix: S = 4 streams of 4096, 16 partials per logit
    S, E, ns = 4, 4096, 16
    hs = [cp.asarray(rng.standard_normal((S, E)).astype(np.float32)) for _ in range(sets)]
    parts = [cp.asarray(rng.standard_normal(2 * S * ns).astype(np.float32) * 0.1) for _ in range(sets)]
    wn = cp.asarray(rng.standard_normal(E).astype(np.float32))
    lgo = cp.zeros(2 * S, np.float32)
    xo = cp.full(E, np.nan, np.float32)
    for tag, kd in (("new", kdir), ("baseline", base)):
        if kd is None:
            continue
        try:
            fn = gpu.module(kd, "dense.cu").get_function("hc_premix")

            grid, block = (1,), (1024,)

            def lp(i, fn=fn, grid=grid, block=block):
                return lambda: fn(grid, block, (hs[i], parts[i], lgo, wn, xo, np.int32(S), np.int32(E), np.int32(ns),
                                                np.float32(1e-6)))
            with gpu.st:
                lp(0)()
            gpu.st.synchronize()
            lgr = cp.asnumpy(parts[0]).astype(np.float64).reshape(2 * S, ns).sum(axis=1)
            pre = np.exp(lgr[:S] - lgr[:S].max())
            pre /= pre.sum()
            v = (pre[:, None] * cp.asnumpy(hs[0]).astype(np.float64)).sum(axis=0)
            ref = v / np.sqrt((v * v).mean() + 1e-6) * cp.asnumpy(wn)
            err = rel(cp.asnumpy(xo), ref)
            tm = gpu.time_graph([lp(i) for i in range(sets)])
            add(rows_out, gpu, "hc_premix", "hc_premix", tag, "", 86, err, tm, 4 * (S * E + 2 * E))
        except Exception as e:
            log(f"  FAIL hc_premix {tag}: {type(e).__name__}: {e}")
            traceback.print_exc()


# ----------------------------------------------------------------------------- output
def add(rows_out, gpu, shape, kernel, variant, geometry, per_tok, err, tm, nbytes):
    us, p25, p75 = tm
    gbps = nbytes / (us * 1e-6) / 1e9
    row = {"shape": shape, "kernel": kernel, "variant": variant, "geometry": geometry, "per_token": per_tok,
           "us": round(us, 3), "us_p25": round(p25, 3), "us_p75": round(p75, 3), "bytes": nbytes,
           "GBps": round(gbps, 1), "copy_fraction": round(gbps / gpu.copy_GBps, 4), "rel_err": err,
           "ok": bool(err < RTOL)}
    rows_out.append(row)
    log(f"  {shape:18s} {variant:10s} {geometry:16s} {us:8.2f} µs  {row['copy_fraction']:5.0%}  err {err:.1e}"
        f"{'' if row['ok'] else '  WRONG'}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="q8,moe,small")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng()
    gpu = Gpu()
    log(f"copy bandwidth {gpu.copy_GBps:.0f} GB/s")
    rows = []
    t0 = time.time()
    only = set(a.only.split(","))
    if "small" in only:
        run_small(gpu, a.kernels, a.baseline, rows, rng)
    if "moe" in only:
        run_moe(gpu, a.kernels, a.baseline, rows, a.quick, rng)
    if "q8" in only:
        run_q8(gpu, a.kernels, a.baseline, rows, a.quick, rng)
    with open(a.out / "kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    log(f"\n{len(rows)} configurations in {time.time() - t0:.0f}s; copy {gpu.copy_GBps:.0f} GB/s")
    best = {}
    for r in rows:
        if r["ok"] and r["variant"] != "baseline":
            b = best.get(r["shape"])
            if b is None or r["us"] < b["us"]:
                best[r["shape"]] = r
    base = {}
    for r in rows:
        if r["variant"] == "baseline" and (r["shape"] not in base or r["us"] < base[r["shape"]]["us"]):
            base[r["shape"]] = r
    log(f"{'shape':18s} {'best variant':26s} {'µs':>8s} {'copy':>5s} {'baseline µs':>11s}")
    for s, r in best.items():
        b = base.get(s)
        log(f"{s:18s} {r['variant'] + ' ' + r['geometry']:26s} {r['us']:8.2f} {r['copy_fraction']:5.0%} "
            f"{b['us'] if b else float('nan'):11.2f}")
    bad = [r for r in rows if not r["ok"]]
    if bad:
        log(f"WRONG: {len(bad)} configurations failed their check: "
            + ", ".join(f"{r['shape']}/{r['variant']}/{r['geometry']}" for r in bad[:12]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
