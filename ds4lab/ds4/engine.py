"""ds4's engine in this process, through ds4lab's driver library (:mod:`ds4lab.ds4.build`) and ctypes.

One :class:`Ds4Engine` is one ``ds4_engine`` with one ``ds4_session`` (ds4.h). Positions advance only by ds4's own
calls: :meth:`Ds4Engine.sync` (``ds4_session_sync``: prefill up to a prefix) and :meth:`Ds4Engine.eval_timed`
(``ds4_session_eval``: one decode token, between two CUDA events on the legacy stream). ds4 reads its environment once
per process (``DS4_CUDA_DECODE_GRAPHS`` is read into a static at first use, ``ds4_cuda.cu``
``ds4_gpu_decode_graphs_supported``), so each configuration runs in a process of its own (:mod:`ds4lab.ds4.worker`)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from ..errors import BadInput


class Ds4Error(RuntimeError):
    """A ds4 call failed; the message is ds4's (or the CUDA status the driver checked)."""


class TokenStats(ctypes.Structure):
    """``ds4lab_token_stats`` of ``csrc/ds4lab_ds4.c``: what the driver's whole-token capture did for the last token."""

    _fields_ = [("segments", ctypes.c_int), ("splits", ctypes.c_int), ("instantiated", ctypes.c_int),
                ("updated", ctypes.c_int), ("update_refused", ctypes.c_int), ("nodes", ctypes.c_longlong),
                ("kernel_nodes", ctypes.c_longlong), ("nodes_changed", ctypes.c_longlong),
                ("kernels_shape", ctypes.c_longlong), ("kernels_uncompared", ctypes.c_longlong),
                ("diffed_segments", ctypes.c_int), ("breaks", (ctypes.c_char * 64) * 8),
                ("replayed", ctypes.c_int), ("records", ctypes.c_longlong), ("moved", ctypes.c_longlong),
                ("slot_bytes", ctypes.c_longlong)]

    def as_dict(self) -> dict:
        """The fields, ``breaks`` as ``"call:line"`` strings joined by spaces (ds4_cuda.cu's lines)."""
        d = {k: getattr(self, k) for k, _ in self._fields_ if k != "breaks"}
        d["breaks"] = " ".join(b.value.decode() for b in self.breaks[:min(self.splits, 8)])
        return d


#: Capture modes of the driver (``ds4lab_capture_mode``): 0 ds4's tokens as they run; 1 every token
#: captured whole and replayed, its executable graph updated per token shape (stage 3u); 2 every token a dry
#: pass of ds4's host code, then the graph of its signature, never updated (stage 3: a stage-3 build).
EAGER, WHOLE_TOKEN_UPDATE, DRY_PASS = 0, 1, 2


def _bind(lib) -> None:
    H = ctypes.c_void_p
    sigs = {
        "ds4lab_open": (H, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
        "ds4lab_close": (None, [H]),
        "ds4lab_error": (ctypes.c_char_p, [H]),
        "ds4lab_vocab_size": (ctypes.c_int, [H]),
        "ds4lab_layer_count": (ctypes.c_int, [H]),
        "ds4lab_routed_quant_bits": (ctypes.c_int, [H]),
        "ds4lab_pos": (ctypes.c_int, [H]),
        "ds4lab_argmax": (ctypes.c_int, [H]),
        "ds4lab_model_bytes": (ctypes.c_ulonglong, [H]),
        "ds4lab_sync": (ctypes.c_int, [H, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_double)]),
        "ds4lab_eval": (ctypes.c_int, [H, ctypes.c_int]),
        "ds4lab_eval_timed": (ctypes.c_int, [H, ctypes.c_int, ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_double)]),
        "ds4lab_logits": (ctypes.c_int, [H, ctypes.POINTER(ctypes.c_float), ctypes.c_int]),
        "ds4lab_rewritten": (ctypes.c_int, []),
        "ds4lab_capture_mode": (ctypes.c_int, [H, ctypes.c_int]),
        "ds4lab_capture_stats": (ctypes.c_int, [H, ctypes.POINTER(TokenStats), ctypes.c_int]),
        "ds4lab_capture_tally": (ctypes.c_int, [H, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                                ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_longlong)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _int_query(fn: str, doc: str) -> property:
    """A read-only property answering ds4's integer query ``fn`` of the driver (on the open handle)."""
    return property(lambda self: int(getattr(self.lib, fn)(self.h)), doc=doc)


class Ds4Engine:
    """ds4's engine and one session on the CUDA back end: ``library`` (a build's ``libds4lab_ds4.so``), ``model`` (the
    GGUF), ``ctx_size`` (tokens), ``threads`` (0: ds4's default), ``resident`` (open every layer as a layer slice,
    which ``DS4_CUDA_COPY_MODEL`` copies into GPU memory; False: ds4's whole-model open).

    Raises:
        BadInput: the library or the model file does not exist.
        Ds4Error: ds4 refused the model or the session (ds4's own message is on stderr)."""

    def __init__(self, library, model, ctx_size: int, threads: int = 0, resident: bool = False) -> None:
        lib_path, model_path = Path(library), Path(model)
        if not lib_path.is_file():
            raise BadInput(f"ds4 library {lib_path}: no such file (build it with ds4lab ds4 --source ...)")
        if not model_path.is_file():
            raise BadInput(f"model {model_path}: no such file")
        self.lib = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_GLOBAL)
        _bind(self.lib)
        err = ctypes.c_char_p()
        self.h = self.lib.ds4lab_open(str(model_path).encode(), int(ctx_size), int(threads), int(bool(resident)),
                                      ctypes.byref(err))
        if not self.h:
            raise Ds4Error((err.value or b"ds4lab_open failed").decode(errors="replace"))
        self.ctx_size = int(ctx_size)
        self._gpu = ctypes.c_float()
        self._host = ctypes.c_double()

    def _error(self) -> str:
        return (self.lib.ds4lab_error(self.h) or b"").decode(errors="replace")

    vocab_size = _int_query("ds4lab_vocab_size", "``ds4_engine_vocab_size``.")
    layer_count = _int_query("ds4lab_layer_count", "``ds4_engine_layer_count``.")
    routed_quant_bits = _int_query("ds4lab_routed_quant_bits", "``ds4_engine_routed_quant_bits``: 2 for IQ2_XXS/Q2_K "
                                   "routed experts, 4 for Q4_K.")
    model_bytes = _int_query("ds4lab_model_bytes", "``ds4_engine_model_bytes``.")
    pos = _int_query("ds4lab_pos", "``ds4_session_pos``: tokens in the session so far.")

    def argmax(self) -> int:
        """``ds4_session_argmax`` of the last logits."""
        return int(self.lib.ds4lab_argmax(self.h))

    def sync(self, tokens) -> float:
        """Prefill the session to the prefix ``tokens`` (ints); returns seconds on the host, a device synchronize
        included. Raises Ds4Error with ds4's message."""
        arr = (ctypes.c_int * len(tokens))(*[int(t) for t in tokens])
        secs = ctypes.c_double()
        if self.lib.ds4lab_sync(self.h, arr, len(tokens), ctypes.byref(secs)) != 0:
            raise Ds4Error(f"ds4_session_sync to {len(tokens)} tokens: {self._error()}")
        return secs.value

    def eval(self, token: int) -> None:
        """One decode token with nothing of ds4lab's around it (no events, no synchronization: the tokens a trace
        records). Raises Ds4Error with ds4's message."""
        if self.lib.ds4lab_eval(self.h, int(token)) != 0:
            raise Ds4Error(f"ds4_session_eval at position {self.pos}: {self._error()}")

    def eval_timed(self, token: int) -> tuple[float, float]:
        """One decode token. Returns ``(gpu_us, host_us)``: µs between CUDA events recorded on the legacy stream before
        and after ``ds4_session_eval``, and µs of the call on the host clock. Raises Ds4Error with ds4's message or
        the failed CUDA call."""
        if self.lib.ds4lab_eval_timed(self.h, int(token), ctypes.byref(self._gpu), ctypes.byref(self._host)) != 0:
            raise Ds4Error(f"ds4_session_eval at position {self.pos}: {self._error()}")
        return self._gpu.value * 1e3, self._host.value * 1e6

    def logits(self):
        """The last token's logits (``ds4_session_copy_logits``): float32 array of the vocabulary's size. Raises
        Ds4Error when ds4 gives none."""
        import numpy as np

        out = np.empty(self.vocab_size, dtype=np.float32)
        n = self.lib.ds4lab_logits(self.h, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
        if n != out.size:
            raise Ds4Error(f"ds4_session_copy_logits gave {n} of {out.size} logits")
        return out

    @property
    def rewritten(self) -> int:
        """The version of ds4lab's stage-0 rewrite in this build of ds4 (0: ds4 as it ships)."""
        return int(self.lib.ds4lab_rewritten())

    def capture_mode(self, mode: int) -> None:
        """Set the driver's capture mode (:data:`EAGER`, :data:`WHOLE_TOKEN_UPDATE`, :data:`DRY_PASS`) on this thread.
        Raises Ds4Error when the build lacks the rewrite the mode needs (stage 0; stage 3 for :data:`DRY_PASS`)."""
        if self.lib.ds4lab_capture_mode(self.h, int(mode)) != 0:
            raise Ds4Error(self._error())

    def capture_stats(self, diff: bool = True) -> dict:
        """What the whole-token capture did for the last token (:class:`TokenStats` as a dict); with ``diff``, each
        updated graph is compared node by node with the one its exec held before (host work: call it outside the
        timed token)."""
        st = TokenStats()
        self.lib.ds4lab_capture_stats(self.h, ctypes.byref(st), int(bool(diff)))
        return st.as_dict()

    def capture_tally(self) -> list[dict]:
        """Every (kernel, argument index) whose value changed between compared tokens, with the number of changes: what
        a graph replayed without update would hold stale."""
        out, i = [], 0
        name, param, changes = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_longlong()
        while self.lib.ds4lab_capture_tally(self.h, i, ctypes.byref(name), ctypes.byref(param),
                                            ctypes.byref(changes)) == 0:
            out.append({"kernel": (name.value or b"?").decode(errors="replace"), "param": param.value,
                        "changes": changes.value})
            i += 1
        return out

    def close(self) -> None:
        """Free the session and the engine (idempotent)."""
        if getattr(self, "h", None):
            self.lib.ds4lab_close(self.h)
            self.h = None

    def __enter__(self) -> "Ds4Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
