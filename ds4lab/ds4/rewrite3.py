"""Stage 3 in ds4 itself: what :func:`ds4lab.ds4.rewrite.rewrite_source` adds to stage 0 with ``stage="3"`` (a build of
its own). Each kernel argument that changes between tokens (:data:`MOVED`) gets an argument slot: the kernel takes a
trailing slot pointer and reads the argument from it when it is not NULL. Every launch, cuBLAS call, mmq entry, memset,
copy and event of the token is deferred during a dry pass of ds4's host token code: recorded with its evaluated
arguments, hashed into the token's signature, and run only if no graph of that signature exists. ``docs/ds4.md``,
"Stage 3"."""

from __future__ import annotations

import re
from pathlib import Path

#: Kernel → the argument indices (0-based, as ``cudaFuncGetParamInfo`` numbers them) that change between tokens:
#: every (kernel, argument) of the stage-3u runs' ``capture-args.csv`` (``docs/measurements/h200-2026-12-04-ds4``:
#: ``ladder/``, ``ladder-1k/``, ``trace-3u-16k/``).
MOVED = {
    "attention_decode_score_split_finalize_kernel": (8, 9),
    "attention_decode_score_split_scores_tile512_kernel": (9, 10),
    "attention_indexed_mixed_kernel": (7, 10, 11),
    "compressor_store_kernel": (9,),
    "compressor_update_pool_kernel": (0,),
    "dsv4_qkv_rms_norm_rows_kv_rope_kernel": (12,),
    "embed_token_hc_kernel": (0, 2),
    "fp8_kv_quantize_kernel": (0,),
    "fp8_kv_quantize_store_rows_kernel": (1,),
    "hc_split_weighted_sum_norm_fused_kernel": (4,),
    "hc_weighted_sum_kernel": (1,),
    "head_rms_norm_rope_tail_kernel": (5,),
    "indexer_hadamard_fp4_kernel": (0,),
    "indexer_topk_8192_cub_kernel": (2,),
    "indexer_topk_pow2_kernel": (2,),
    "matmul_q8_0_hc_expand_preq_warp8_kernel": (0, 7),
    "rms_norm_plain_batch8_kernel": (1,),
    "rms_norm_weight_kernel": (0, 1),
    "rope_tail_kernel": (0, 5),
    "router_select_warp_topk_kernel": (7,),
}
#: Calls deferred in the dry pass besides the cuBLAS compute calls and the mmq entry points (the stage-0 names:
#: ``ds4lab_memset`` is ds4's synchronous ``cudaMemset`` as stage 0 routes it).
DEFERRED = ("cudaMemsetAsync", "cudaMemcpyAsync", "cudaMemcpyPeerAsync", "cudaEventRecord", "cudaStreamWaitEvent",
            "cudaMemset")
#: cuBLAS calls whose ``alpha`` and ``beta`` are pointers (host memory in ds4's default pointer mode: the record keeps
#: their values): name → (alpha index, beta index, compute-type index or -1 for float).
CUBLAS_SCALARS = {
    "cublasSgemm": (6, 11, -1),
    "cublasSgemmStridedBatched": (6, 13, -1),
    "cublasGemmEx": (6, 13, 17),
    "cublasGemmStridedBatchedEx": (6, 15, 21),
}
#: The name of the slot parameter and the prefix of a moved argument's renamed parameter.
SLOT, ARG = "ds4lab_slot", "ds4lab_arg_"
DRY_HEADER = Path(__file__).with_name("csrc") / "ds4lab_dry.h"
PROLOGUE3 = (Path(__file__).with_name("csrc") / "ds4lab_stage3.inc").read_text().replace(
    "@DRY_H@", DRY_HEADER.read_text())


def mask(kernel: str) -> int:
    """Bit i set for each moved argument i of ``kernel`` (0 when it has none)."""
    return sum(1 << i for i in MOVED.get(kernel, ()))


def kernel_edits(src: str, code: str, site, edits: list, edit_cls, split_args, match_paren) -> None:
    """Give every definition and declaration of each kernel of :data:`MOVED` its slot: the trailing parameter
    ``const unsigned char *ds4lab_slot``, each moved parameter renamed ``ds4lab_arg_<name>`` and, at the top of the body,
    ``<its type> <name> = ds4lab_slot_take(ds4lab_slot, &o, ds4lab_arg_<name>)``. A kernel not found, or a parameter
    the rewrite cannot split into type and name, is a site ``not routed``. ``src``, ``code``: the text and its blanked
    copy; ``site``, ``edits``, ``edit_cls``, ``split_args``, ``match_paren``: the rewrite's own
    (:mod:`ds4lab.ds4.rewrite`)."""
    for name, moved in MOVED.items():
        found = False
        for m in re.finditer(r"__global__[^;{()]*?\b" + name + r"\s*\(", code):
            close = match_paren(code, m.end() - 1)
            after = code[close + 1:close + 200].lstrip() if close > 0 else ""
            if close < 0 or not (after.startswith("{") or after.startswith(";")):
                continue
            found = True
            _one_kernel(src, code, m, close, after.startswith("{"), name, moved, site, edits, edit_cls, split_args)
        if not found:
            site(0, "slot-kernel", "", "not routed", f"__global__ {name}(...) not found: its arguments stay by value")
        _graph_nodes(src, code, name, site, edits, edit_cls)


def _graph_nodes(src, code, name, site, edits, edit_cls) -> None:
    """ds4's own graph nodes of a kernel with a slot (``P.func = (void *)kernel; P.kernelParams = A;`` with ``void
    *A[] = {...}``): ``&ds4lab_no_slot`` (a NULL slot) appended to ``A``, so the node passes every parameter. A node
    whose argument array is not found is a site ``not routed``."""
    for m in re.finditer(r"\b(\w+)\s*\.\s*func\s*=\s*\(\s*void\s*\*\s*\)\s*" + name + r"\b", code):
        params = m.group(1)
        kp = list(re.finditer(r"\b" + params + r"\s*\.\s*kernelParams\s*=\s*(\w+)\s*;", code))
        arr = re.search(r"\bvoid\s*\*\s*" + kp[0].group(1) + r"\s*\[\s*\]\s*=\s*\{([^{}]*)\}", code) \
            if len(kp) == 1 else None
        if not arr:
            site(m.start(), "graph-node", "", "not routed", f"{name} is a node of ds4's own graph ({params}) whose "
                 "argument array was not found: the node would miss its slot parameter")
            continue
        body = src[arr.start(1):arr.end(1)].rstrip()
        at = arr.start(1) + len(body)
        edits.append(edit_cls(at, at, ", (void *)&ds4lab_no_slot"))
        site(m.start(), "graph-node", "", "slots (NULL)", "", f"{name}: {kp[0].group(1)}[] given a NULL slot")


def _one_kernel(src, code, m, close, is_def, name, moved, site, edits, edit_cls, split_args) -> bool:
    base = m.end()
    spans = split_args(code[base:close])
    params = [src[base + a:base + b] for a, b in spans]
    if max(moved) >= len(params):
        site(m.start(), "slot-kernel", "", "not routed", f"{name} has {len(params)} parameters, argument "
             f"{max(moved)} is moved")
        return False
    decls = []
    for i in moved:
        pm = re.fullmatch(r"(\s*)(.*?[\s*&])([A-Za-z_]\w*)(\s*)", params[i], re.S)
        if not pm or "[" in params[i] or "(" in params[i]:
            site(m.start(), "slot-kernel", "", "not routed", f"{name} parameter {i} ({params[i].strip()!r}): "
                 "cannot tell its type from its name")
            return False
        decls.append((i, pm.group(2).strip(), pm.group(3)))
    for i, _, pname in decls:
        a, b = spans[i]
        at = base + a + params[i].rfind(pname)
        edits.append(edit_cls(at, at + len(pname), ARG + pname))
    edits.append(edit_cls(close, close, f", const unsigned char *{SLOT}"))
    if is_def:
        brace = code.index("{", close)
        body = " unsigned ds4lab_so = 0;" + "".join(_take(ty, pname) for _, ty, pname in decls)
        edits.append(edit_cls(brace + 1, brace + 1, body))
    site(m.start(), "slot-kernel", "", "slots" if is_def else "slots (declaration)",
         "", f"{name}: " + ", ".join(f"#{i} {p}" for i, _, p in decls))
    return True


#: Parameter types read from a slot by value; any other (a struct passed by value: ds4's row table) is read through a
#: reference to the slot's copy, so the kernel loads only the fields it uses.
SCALARS = {"int", "unsigned", "unsigned int", "float", "double", "bool", "int32_t", "uint32_t", "int64_t", "uint64_t",
           "size_t", "uint16_t", "int16_t", "uint8_t", "int8_t", "long", "unsigned long", "long long",
           "unsigned long long", "uintptr_t"}


def _take(ty: str, pname: str) -> str:
    """The statement that declares moved parameter ``pname`` of type ``ty`` at the top of its kernel."""
    bare = " ".join(w for w in ty.replace("*", " * ").split() if w not in ("const", "volatile", "__restrict__"))
    if "*" in ty or bare in SCALARS:
        return f" {ty} {pname} = ds4lab_slot_take({SLOT}, &ds4lab_so, {ARG}{pname});"
    return f" const {bare} &{pname} = ds4lab_slot_ref({SLOT}, &ds4lab_so, {ARG}{pname});"


def kernel_expr_start(code: str, launch_at: int) -> int:
    """Offset where the kernel expression before the ``<<<`` at ``launch_at`` starts (an identifier, ``::``-qualified,
    with one template argument list ``name<...>``), or -1."""
    k = launch_at - 1
    while k >= 0 and code[k] in " \t\r\n":
        k -= 1
    if k >= 0 and code[k] == ">":
        depth = 0
        while k >= 0:
            depth += code[k] == ">"
            depth -= code[k] == "<"
            if depth == 0:
                break
            k -= 1
        k -= 1
        while k >= 0 and code[k] in " \t":
            k -= 1
    end = k
    while k >= 0 and (code[k].isalnum() or code[k] in "_:"):
        k -= 1
    return k + 1 if k < end and (code[k + 1].isalpha() or code[k + 1] == "_") else -1


def launch_text(kernel: str, config: list[str], args: list[str], line: int) -> str:
    """The stage-3 form of ``kernel<<<config>>>(args)``: ``ds4lab_launch<MASK>(line, kernel, grid, block, smem,
    stream, ds4lab_pack(kernel).pack(args[, slot]))``. ``config``: grid, block, shared memory, stream (the stream
    already routed)."""
    base = re.sub(r"\s+", "", kernel).split("<")[0].split("::")[-1]
    mk = mask(base)
    slot = ["(const unsigned char *)0"] if mk else []
    packed = ", ".join([a.strip() for a in args if a.strip()] + slot)
    return (f"ds4lab_launch<{mk}ULL>({line}, {kernel.strip()}, {config[0].strip()}, {config[1].strip()}, "
            f"{config[2].strip()}, {config[3].strip()}, ds4lab_pack({kernel.strip()}).pack({packed}))")


def defer_text(call: str, name: str, line: int) -> str:
    """``name(args)`` (its stage-0 text) as ``ds4lab_defer<alpha, beta, compute>(line, [](auto... a) { return
    name(a...); }, args)``."""
    open_at = call.index("(")
    args = call[open_at + 1:call.rstrip().rindex(")")]
    ia, ib, ic = CUBLAS_SCALARS.get(name, (-1, -1, -1))
    fn = call[:open_at].strip()
    return f"ds4lab_defer<{ia}, {ib}, {ic}>({line}, [](auto... a) {{ return {fn}(a...); }}, {args})"
