"""Stage 0 in ds4 itself: ds4lab's rewrite of a ds4 checkout's CUDA back end (the build's copy only). Every stream
site (:data:`ROUTED`) goes through ``ds4lab_current_stream(site)``; calls a capture cannot hold (:data:`SPLITS`) are
bracketed by split hooks; a site that cannot be routed is listed (:attr:`Rewrite.unrouted`). ``docs/ds4.md``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: The file the rewrite applies to, relative to the checkout.
TARGET = "ds4_cuda.cu"
#: Headers of the vendored mmq tier whose entry points take a stream (the decode token calls some:
#: ``ds4_mmq_q8_0_aligned_dense_vec`` with ``cuda_decode_stream()``).
MMQ_HEADERS = ("cuda/mmq/ds4_mmq.h", "cuda/mmq/ds4_repack.h")

#: CUDA runtime calls whose stream argument is routed: name → (index of the stream argument, number of
#: arguments when the stream is left out: the legacy stream by default).
ROUTED = {
    "cudaMemsetAsync": (3, 3),
    "cudaMemcpyAsync": (4, 4),
    "cudaMemcpyPeerAsync": (5, 5),
    "cudaEventRecord": (1, 1),
    "cudaStreamWaitEvent": (0, None),
    "cudaStreamIsCapturing": (0, None),
    "cudaStreamSynchronize": (0, None),
    "cudaGraphLaunch": (1, None),
}
#: Calls a capture cannot hold: the capturing driver splits the token around each.
SPLITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaEventElapsedTime",
          "cudaMemcpy", "cudaMemcpyPeer", "cudaMalloc", "cudaMallocHost", "cudaMallocManaged", "cudaFree",
          "cudaFreeHost", "cudaHostRegister", "cudaHostUnregister", "cudaMemGetInfo", "cudaMemPrefetchAsync",
          "cudaMemAdvise", "cudaGraphLaunch")
#: cuBLAS calls that do not run work on a stream (their handle is left alone).
CUBLAS_SETUP = ("cublasCreate", "cublasDestroy", "cublasSetStream", "cublasGetStream", "cublasSetMathMode",
                "cublasGetMathMode", "cublasSetWorkspace", "cublasGetStatusString", "cublasGetStatusName",
                "cublasGetVersion", "cublasSetPointerMode", "cublasGetPointerMode")
#: Functions of ds4's token that get a hook at the start of their body: name → the statement.
HOOKS = {
    "ds4_gpu_begin_commands": "ds4lab_token_begin();",
    "ds4_gpu_end_commands": "ds4lab_token_end();",
    "ds4_gpu_flush_commands": "if (ds4lab_token_active()) return 1;",
}
#: What ``stage`` the rewrite makes: ``"0"`` (the stream accessor and hooks) or ``"3"`` (stage 0, argument slots and
#: the dry pass: :mod:`ds4lab.ds4.rewrite3`).
STAGES = ("0", "3")
#: Site kinds by the stream a kernel launch used before.
LEGACY, DECODE, NAMED = "legacy", "cuda_decode_stream()", "named"

#: What the rewrite puts before ds4's first line of code (after its includes): the accessor, the
#: setter, the hooks. C++ (``ds4_cuda.cu`` is compiled by nvcc as C++).
PROLOGUE = r"""
/* ---- ds4lab: stage 0 (added by ds4lab's rewrite at build time; not part of ds4) ----
 * One thread-local stream accessor for every launch, cuBLAS call, memset and copy of the file: unset,
 * it returns the stream the site used before; set (ds4lab_capture_set_stream), the override.
 * Calls a capture cannot hold are bracketed by ds4lab_split_begin/ds4lab_split_end, and ds4's token
 * (begin/end/flush commands) calls ds4lab_token_*: hooks a capturing driver installs. */
@HOOKS_H@static thread_local cudaStream_t ds4lab_tl_stream = 0;
static thread_local int ds4lab_tl_set = 0;
static thread_local const ds4lab_capture_hooks *ds4lab_tl_hooks = NULL;
static thread_local cublasHandle_t ds4lab_tl_cublas[8];
static thread_local cudaStream_t ds4lab_tl_cublas_was[8];
static thread_local int ds4lab_tl_ncublas = 0;

static inline cudaStream_t ds4lab_current_stream(cudaStream_t site) {
    return ds4lab_tl_set ? ds4lab_tl_stream : site;
}
extern "C" int ds4lab_rewrite_version(void) { return DS4LAB_REWRITE_VERSION; }
/* on != 0: every site of this thread runs on s; on == 0: back to each site's own stream, and every
 * cuBLAS handle pointed at s is pointed back where it was. Returns 0, or the cuBLAS status. */
extern "C" int ds4lab_capture_set_stream(cudaStream_t s, int on) {
    int rc = 0;
    if (!on) {
        for (int i = 0; i < ds4lab_tl_ncublas; i++) {
            const cublasStatus_t st = cublasSetStream(ds4lab_tl_cublas[i], ds4lab_tl_cublas_was[i]);
            if (st != CUBLAS_STATUS_SUCCESS && rc == 0) rc = (int)st;
        }
        ds4lab_tl_ncublas = 0;
    }
    ds4lab_tl_stream = on ? s : (cudaStream_t)0;
    ds4lab_tl_set = on ? 1 : 0;
    return rc;
}
extern "C" void ds4lab_capture_set_hooks(const ds4lab_capture_hooks *hooks) { ds4lab_tl_hooks = hooks; }
static inline cublasHandle_t ds4lab_cublas(cublasHandle_t h) {
    if (!ds4lab_tl_set || !h) return h;
    int i = 0;
    while (i < ds4lab_tl_ncublas && ds4lab_tl_cublas[i] != h) i++;
    if (i == ds4lab_tl_ncublas && i < 8) {
        cudaStream_t was = 0;
        (void)cublasGetStream(h, &was);
        ds4lab_tl_cublas[i] = h;
        ds4lab_tl_cublas_was[i] = was;
        ds4lab_tl_ncublas++;
    }
    (void)cublasSetStream(h, ds4lab_tl_stream);
    return h;
}
static inline cudaError_t ds4lab_memset(void *p, int v, size_t n) {
    return ds4lab_tl_set ? cudaMemsetAsync(p, v, n, ds4lab_tl_stream) : cudaMemset(p, v, n);
}
static inline void ds4lab_split_begin(const char *call, int line) {
    if (ds4lab_tl_hooks && ds4lab_tl_hooks->split_begin) ds4lab_tl_hooks->split_begin(ds4lab_tl_hooks->ctx, call, line);
}
template <class T> static inline T ds4lab_split_end(T v) {
    if (ds4lab_tl_hooks && ds4lab_tl_hooks->split_end) ds4lab_tl_hooks->split_end(ds4lab_tl_hooks->ctx);
    return v;
}
static inline void ds4lab_token_begin(void) {
    if (ds4lab_tl_hooks && ds4lab_tl_hooks->token_begin) ds4lab_tl_hooks->token_begin(ds4lab_tl_hooks->ctx);
}
static inline void ds4lab_token_end(void) {
    if (ds4lab_tl_hooks && ds4lab_tl_hooks->token_end) ds4lab_tl_hooks->token_end(ds4lab_tl_hooks->ctx);
}
static inline int ds4lab_token_active(void) {
    return ds4lab_tl_hooks && ds4lab_tl_hooks->token_active ? ds4lab_tl_hooks->token_active(ds4lab_tl_hooks->ctx) : 0;
}
/* ---- end of ds4lab's stage 0 prologue ---- */
"""
#: The hooks' layout, shared with ds4lab's driver (``csrc/ds4lab_hooks.h``, which the driver includes): the
#: prologue carries the same text, so the two sides cannot disagree.
HOOKS_HEADER = Path(__file__).with_name("csrc") / "ds4lab_hooks.h"
PROLOGUE = PROLOGUE.replace("@HOOKS_H@", HOOKS_HEADER.read_text())
#: Bumped when the inserted code changes meaning (the driver reads it: ``ds4lab_rewrite_version``).
VERSION = 1


@dataclass(frozen=True)
class Site:
    """One place the rewrite looked at: ``file``, ``line`` (1-based, in ds4's file), ``kind`` (``launch``, ``cublas``,
    a CUDA call's name, ``mmq-entry``, ``hook``), ``stream`` (what it ran on before: :data:`LEGACY`, :data:`DECODE`,
    ``named: <expression>``, ``handle``, or ``""``), ``action`` (``routed``, ``routed+split``, ``split``,
    ``async-when-set``, ``hook``, ``not routed``), ``why`` (for a site not routed) and ``text`` (the site's first
    line, stripped)."""

    file: str
    line: int
    kind: str
    stream: str
    action: str
    why: str = ""
    text: str = ""


@dataclass
class Rewrite:
    """A rewritten file: its new text and every site, routed or not."""

    file: str
    text: str
    sites: list = field(default_factory=list)

    @property
    def unrouted(self) -> list:
        """The sites the rewrite could not route (file, line, why)."""
        return [s for s in self.sites if s.action == "not routed"]

    def counts(self) -> dict:
        """``{(kind, stream, action): n}`` over :attr:`sites`."""
        out: dict = {}
        for s in self.sites:
            key = (s.kind, s.stream, s.action)
            out[key] = out.get(key, 0) + 1
        return out

    def launches(self) -> dict:
        """Kernel launch sites by the stream they used before: ``{legacy, cuda_decode_stream(), named}``."""
        out = {LEGACY: 0, DECODE: 0, NAMED: 0}
        for s in self.sites:
            if s.kind == "launch":
                out[NAMED if s.stream.startswith(NAMED) else s.stream] += 1
        return out

    def rows(self) -> list[dict]:
        """The sites as dicts (the inventory's CSV rows)."""
        return [s.__dict__.copy() for s in self.sites]


class RewriteError(RuntimeError):
    """The checkout cannot be rewritten at all (the target file is missing); a single site that cannot be routed is not
    an error but a :class:`Site` with action ``not routed``."""


# -- the lexer ------------------------------------------------------------------------------------

def blank(src: str) -> str:
    """``src`` with comments and the insides of string and character literals replaced by spaces (newlines kept), so
    every offset is the same as in ``src`` and a search of it finds code only."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            _spaces(out, i, j)
            i = j
        elif c == "/" and i + 1 < n and src[i + 1] == "*":
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            _spaces(out, i, j)
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and src[i - 1].isalnum())):  # 1'000 is a digit separator
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            _spaces(out, i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _spaces(out: list, a: int, b: int) -> None:
    for k in range(a, b):
        if out[k] != "\n":
            out[k] = " "


def split_args(code: str) -> list[tuple[int, int]]:
    """Spans ``(start, end)`` of the top-level comma-separated items of ``code``; ``()[]{}`` nest, and ``<`` right
    after an identifier with no space after it opens a template argument list (``Budget<kA, kB>::total``)."""
    spans, depth, angle, start = [], 0, 0, 0
    for k, ch in enumerate(code):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "<" and k > 0 and (code[k - 1].isalnum() or code[k - 1] == "_") and k + 1 < len(code) \
                and code[k + 1] not in " <=":
            angle += 1
        elif ch == ">" and angle and (k + 1 >= len(code) or code[k + 1] != "="):
            angle -= 1
        elif ch == "," and depth == 0 and angle == 0:
            spans.append((start, k))
            start = k + 1
    spans.append((start, len(code)))
    return spans


def match_paren(code: str, open_at: int) -> int:
    """Offset of the ``)`` matching the ``(`` at ``open_at`` in blanked ``code``, or -1."""
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "(":
            depth += 1
        elif code[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return -1


# -- the rewrite ----------------------------------------------------------------------------------

@dataclass
class _Edit:
    start: int
    end: int
    text: str


def mmq_stream_entries(root: Path) -> dict:
    """``{name: index of its cudaStream_t parameter}`` of the functions the vendored mmq headers declare
    (:data:`MMQ_HEADERS`), read from the headers of the checkout at ``root``."""
    out = {}
    for rel in MMQ_HEADERS:
        p = Path(root) / rel
        if not p.is_file():
            continue
        code = blank(p.read_text(errors="replace"))
        for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", code):
            close = match_paren(code, m.end() - 1)
            if close < 0:
                continue
            params = [code[m.end() + a:m.end() + b].strip() for a, b in split_args(code[m.end():close])]
            idx = [i for i, prm in enumerate(params) if re.match(r"(const\s+)?cudaStream_t\b", prm)]
            after = code[close + 1:close + 40].lstrip()
            if idx and after.startswith(";"):  # a declaration whose parameter is a stream
                out[m.group(1)] = idx[0]
    return out


def rewrite_source(src: str, *, file: str = TARGET, mmq_entries: dict | None = None, stage: str = "0") -> Rewrite:
    """Rewrite the text ``src`` of ds4's ``ds4_cuda.cu`` (``file``: its name in the reports; ``mmq_entries``: the mmq
    entry points' stream parameter, :func:`mmq_stream_entries`; ``stage``: ``"0"``, or ``"3"`` for stage 0 with the
    argument slots and the dry pass of :mod:`ds4lab.ds4.rewrite3`). Returns the new text and every site; unroutable
    sites are in :attr:`Rewrite.unrouted` and left as they were. Raises ValueError: an unknown ``stage``."""
    if stage not in STAGES:
        raise ValueError(f"rewrite stage {stage!r}: choose from {', '.join(STAGES)}")
    code = blank(src)
    line_at = _line_index(src)
    lines = src.splitlines()
    sites: list[Site] = []
    edits: list[_Edit] = []

    def site(pos: int, kind: str, stream: str, action: str, why: str = "", text: str | None = None) -> None:
        ln = line_at(pos)
        sites.append(Site(file, ln, kind, stream, action, why,
                          text if text is not None else lines[ln - 1].strip()[:160] if lines else ""))

    _launches(src, code, site, edits, stage, line_at)
    _calls(src, code, site, edits, mmq_entries or {}, line_at, stage)
    _hooks(src, code, site, edits)
    if stage == "3":
        from . import rewrite3

        rewrite3.kernel_edits(src, code, site, edits, _Edit, split_args, match_paren)
    edits.sort(key=lambda e: e.start)
    kept: list[_Edit] = []
    for e in edits:  # an edit inside another would be lost by one of them: reported, both left as they were
        if kept and e.start < kept[-1].end:
            prev = kept.pop()
            for pos in (prev.start, e.start):
                site(pos, "overlap", "", "not routed", "nested in another rewritten call")
            continue
        kept.append(e)
    out = src
    for e in reversed(kept):
        out = out[:e.start] + e.text + out[e.end:]
    out = _insert_prologue(out, blank(out), site, stage)
    sites.sort(key=lambda s: (s.line, s.kind))
    return Rewrite(file, out, sites)


def _line_index(src: str):
    starts = [0] + [m.end() for m in re.finditer("\n", src)]

    import bisect

    def line_at(pos: int) -> int:
        return bisect.bisect_right(starts, pos)

    return line_at


def _launches(src: str, code: str, site, edits: list, stage: str = "0", line_at=None) -> None:
    for m in re.finditer(r"<<<", code):
        if stage == "3":
            _launch3(src, code, m, site, edits, line_at)
            continue
        start = m.end()
        end = code.find(">>>", start)
        if end < 0:
            site(m.start(), "launch", "", "not routed", "no >>> closes the launch configuration")
            continue
        spans = split_args(code[start:end])
        args = [src[start + a:start + b] for a, b in spans]
        if not 2 <= len(args) <= 4 or any(not a.strip() for a in args):
            site(m.start(), "launch", "", "not routed",
                 f"launch configuration of {len(args)} items: cannot tell its stream")
            continue
        if len(args) == 4:
            s = args[3].strip()
            kind = LEGACY if s in ("0", "NULL", "nullptr", "cudaStreamLegacy", "(cudaStream_t)0") else \
                DECODE if re.fullmatch(r"cuda_decode_stream\(\s*\)", s) else f"{NAMED}: {s}"
            a, b = spans[3]
            lead = len(args[3]) - len(args[3].lstrip())
            edits.append(_Edit(start + a + lead, start + b, f"ds4lab_current_stream({args[3].strip()})"))
            site(m.start(), "launch", kind, "routed")
        else:
            extra = ", 0" if len(args) == 2 else ""
            edits.append(_Edit(end, end, f"{extra}, ds4lab_current_stream((cudaStream_t)0)"))
            site(m.start(), "launch", LEGACY, "routed")


def _launch3(src: str, code: str, m, site, edits: list, line_at) -> None:
    """One launch site in stage 3: the whole ``kernel<<<...>>>(...)`` as ``ds4lab_launch`` (:mod:`.rewrite3`), its
    stream routed as in stage 0. A site whose kernel, configuration or arguments cannot be parsed is not routed."""
    from . import rewrite3

    start = m.end()
    end = code.find(">>>", start)
    k0 = rewrite3.kernel_expr_start(code, m.start())
    paren = end + 3 + (len(code[end + 3:]) - len(code[end + 3:].lstrip())) if end > 0 else -1
    close = match_paren(code, paren) if paren > 0 and code[paren:paren + 1] == "(" else -1
    cfg = [src[start + a:start + b] for a, b in split_args(code[start:end])] if end > 0 else []
    if k0 < 0 or close < 0 or not 2 <= len(cfg) <= 4 or any(not c.strip() for c in cfg):
        site(m.start(), "launch", "", "not routed", "stage 3: cannot parse the kernel, its configuration or its "
             "arguments")
        return
    kind = LEGACY if len(cfg) < 4 else _stream_kind(cfg[3])
    cfg = cfg + ["0"] * (3 - len(cfg)) if len(cfg) < 3 else cfg
    cfg = cfg[:3] + [f"ds4lab_current_stream({cfg[3].strip() if len(cfg) == 4 else '(cudaStream_t)0'})"]
    args = [src[paren + 1 + a:paren + 1 + b] for a, b in split_args(code[paren + 1:close])]
    kernel = src[k0:m.start()]
    edits.append(_Edit(k0, close + 1, rewrite3.launch_text(kernel, cfg, args, line_at(m.start()))))
    base = re.sub(r"\s+", "", kernel).split("<")[0].split("::")[-1]
    site(m.start(), "launch", kind, "routed+deferred" + ("+slots" if base in rewrite3.MOVED else ""))


_KEYWORDS_BEFORE_CALL = {"return", "else", "do", "case", "sizeof"}


def _is_call(code: str, name_at: int) -> tuple[bool, str]:
    """Is the identifier at ``name_at`` (blanked code) a call (not a member, a declaration or a definition)? Returns
    (yes, why not)."""
    k = name_at - 1
    while k >= 0 and code[k] in " \t\r\n":
        k -= 1
    if k >= 0 and (code[k] == "." or code[max(0, k - 1):k + 1] == "->"):
        return False, "member"
    if k >= 0 and (code[k].isalnum() or code[k] == "_"):
        j = k
        while j >= 0 and (code[j].isalnum() or code[j] == "_"):
            j -= 1
        word = code[j + 1:k + 1]
        if word not in _KEYWORDS_BEFORE_CALL:
            return False, f"declaration (after {word!r})"
    return True, ""


def _calls(src: str, code: str, site, edits: list, mmq_entries: dict, line_at, stage: str = "0") -> None:
    names = set(ROUTED) | set(SPLITS) | {"cudaMemset"} | set(mmq_entries)
    pat = re.compile(r"(?<![\w])(" + "|".join(sorted(names, key=len, reverse=True)) + r"|cublas[A-Z]\w*)\s*\(")
    for m in pat.finditer(code):
        name = m.group(1)
        if name.startswith("cublas") and name in CUBLAS_SETUP:
            continue
        ok, why = _is_call(code, m.start(1))
        if not ok:
            continue
        open_at = m.end() - 1
        close = match_paren(code, open_at)
        if close < 0:
            site(m.start(), name, "", "not routed", "no closing parenthesis")
            continue
        base = open_at + 1
        spans = split_args(code[base:close])
        args = [src[base + a:base + b] for a, b in spans]
        if len(args) == 1 and not args[0].strip():
            args, spans = [], []
        inner: list[_Edit] = []  # edits inside the call, offsets in src: the call's own text kept around them

        def wrap_arg(i: int, fn: str) -> None:
            a, b = spans[i]
            lead = len(args[i]) - len(args[i].lstrip())
            trail = len(args[i]) - len(args[i].rstrip())
            inner.append(_Edit(base + a + lead, base + b - trail, f"{fn}({args[i].strip()})"))

        stream = ""
        action = []
        if name.startswith("cublas"):
            if not args:
                site(m.start(), "cublas", "handle", "not routed", "no handle argument")
                continue
            wrap_arg(0, "ds4lab_cublas")
            stream, kind = "handle", "cublas"
            action.append("routed")
        elif name in mmq_entries:
            i = mmq_entries[name]
            if i >= len(args):
                site(m.start(), "mmq-entry", "", "not routed", f"{name} given {len(args)} arguments, stream is #{i + 1}")
                continue
            stream, kind = _stream_kind(args[i]), "mmq-entry"
            wrap_arg(i, "ds4lab_current_stream")
            action.append("routed")
        else:
            kind = name
            if name in ROUTED:
                i, without = ROUTED[name]
                if i < len(args):
                    stream = _stream_kind(args[i])
                    wrap_arg(i, "ds4lab_current_stream")
                elif without is not None and len(args) == without:
                    stream = LEGACY
                    inner.append(_Edit(close, close, ", ds4lab_current_stream((cudaStream_t)0)"))
                else:
                    site(m.start(), name, "", "not routed", f"{len(args)} arguments: cannot find its stream")
                    continue
                action.append("routed")
            if name == "cudaMemset":
                if len(args) != 3:
                    site(m.start(), name, "", "not routed", f"{len(args)} arguments")
                    continue
                stream = LEGACY
                inner.append(_Edit(m.start(1), m.end(1), "ds4lab_memset"))
                action.append("async-when-set")
        call = src[m.start(1):close + 1]
        for e in sorted(inner, key=lambda e: e.start, reverse=True):
            call = call[:e.start - m.start(1)] + e.text + call[e.end - m.start(1):]
        split = name in SPLITS or (name == "cudaMemcpyAsync" and len(args) > 3
                                   and args[3].strip() != "cudaMemcpyDeviceToDevice")
        if split:
            call = f'(ds4lab_split_begin("{name}", {line_at(m.start())}), ds4lab_split_end({call}))'
            action.append("split")
        elif stage == "3" and name not in ("cudaStreamIsCapturing",):
            call, why = _defer3(call, name, kind, line_at(m.start()))
            if why:
                site(m.start(), kind, stream, "not routed", why)
                continue
            action.append("deferred")
        edits.append(_Edit(m.start(1), close + 1, call))
        site(m.start(), kind, stream, "+".join(action))


def _defer3(call: str, name: str, kind: str, line: int) -> tuple[str, str]:
    """A call of the token in stage 3: ``(its deferred text, "")``, or ``("", why)`` when it cannot be deferred (a
    cuBLAS call whose scalar pointers the record does not know)."""
    from . import rewrite3

    if kind == "cublas" and name not in rewrite3.CUBLAS_SCALARS:
        return "", f"stage 3: {name}: where its alpha and beta are is not known, it cannot be deferred"
    if kind not in ("cublas", "mmq-entry") and name not in rewrite3.DEFERRED:
        return call, ""
    return rewrite3.defer_text(call, name, line), ""


def _line_of(src: str, pos: int) -> int:
    return src.count("\n", 0, pos) + 1


def _stream_kind(arg: str) -> str:
    s = arg.strip()
    if s in ("0", "NULL", "nullptr", "cudaStreamLegacy", "(cudaStream_t)0"):
        return LEGACY
    if re.fullmatch(r"cuda_decode_stream\(\s*\)", s):
        return DECODE
    return f"{NAMED}: {s}"


def _hooks(src: str, code: str, site, edits: list) -> None:
    for name, stmt in HOOKS.items():
        m = re.search(r"\b" + name + r"\s*\(\s*void\s*\)\s*\{", code)
        if not m:
            site(0, "hook", "", "not routed", f"{name}(void) {{ ... }} not found: the token cannot be bracketed")
            continue
        edits.append(_Edit(m.end(), m.end(), f" {stmt}"))
        site(m.start(), "hook", "", "hook")
    m = re.search(r"cudaStream_t\s+cuda_decode_stream\s*\(\s*void\s*\)\s*\{", code)
    r = re.compile(r"\breturn\b([^;]*);").search(code, m.end()) if m else None
    if not m or not r or code.find("}", m.end()) < r.start():
        site(m.start() if m else 0, "decode-stream", "", "not routed",
             "cuda_decode_stream() { return ...; } not found: its other uses keep their stream")
        return
    expr = src[r.start(1):r.end(1)].strip()
    edits.append(_Edit(r.start(1), r.end(1), f" ds4lab_current_stream({expr})"))
    site(m.start(), "decode-stream", DECODE, "routed")


def _insert_prologue(out: str, code: str, site, stage: str = "0") -> str:
    """The prologue after the last ``#include`` before the first line of code (so the CUDA and cuBLAS types are
    declared and nothing of ds4's comes before it)."""
    first_code = re.search(r"^[ \t]*[A-Za-z_]", code, re.M)
    limit = first_code.start() if first_code else len(code)
    inc = [m for m in re.finditer(r"^[ \t]*#[ \t]*include\b.*$", code, re.M) if m.start() < limit]
    if not inc:
        site(0, "prologue", "", "not routed", "no #include before the first line of code")
        return out
    at = inc[-1].end()
    text = f"\n#define DS4LAB_REWRITE_VERSION {VERSION}\n" + PROLOGUE
    if stage == "3":
        from .rewrite3 import PROLOGUE3

        text += PROLOGUE3
    return out[:at] + text + out[at:]


def rewrite_checkout(root, *, write: bool = True, stage: str = "0") -> Rewrite:
    """Rewrite ``root/ds4_cuda.cu`` of a checkout copy (the build's, never the user's) in place (``write=False``: an
    inventory only; ``stage``: as :func:`rewrite_source`); returns the :class:`Rewrite`. Raises RewriteError when the
    checkout has no ``ds4_cuda.cu``."""
    root = Path(root)
    target = root / TARGET
    if not target.is_file():
        raise RewriteError(f"{root}: no {TARGET} to rewrite")
    rw = rewrite_source(target.read_text(errors="replace"), file=TARGET, mmq_entries=mmq_stream_entries(root),
                        stage=stage)
    if write:
        tmp = target.with_suffix(".cu.ds4lab-tmp")
        tmp.write_text(rw.text)
        tmp.replace(target)
    return rw


def other_launch_sites(root) -> list[Site]:
    """Kernel launch sites outside :data:`TARGET` (the vendored ``cuda/mmq`` files, not rewritten; their ``stream`` is
    routed at the ``mmq-entry`` call), listed so the inventory names every launch of the build."""
    root = Path(root)
    out = []
    for p in sorted(root.glob("cuda/**/*.cu*")):
        if "test" in p.relative_to(root).parts:
            continue
        text = p.read_text(errors="replace")
        code = blank(text)
        for m in re.finditer(r"<<<", code):
            end = code.find(">>>", m.end())
            args = [code[m.end() + a:m.end() + b].strip() for a, b in split_args(code[m.end():end])] if end > 0 else []
            s = _stream_kind(args[3]) if len(args) == 4 else LEGACY
            ln = _line_of(text, m.start())
            out.append(Site(str(p.relative_to(root)), ln, "launch", s, "not routed",
                            "outside ds4_cuda.cu: its stream is the entry point's parameter",
                            text.splitlines()[ln - 1].strip()[:160]))
    return out
