"""The argument pass's hot path (:class:`ds4lab.trace.arguments.ArgumentCapture`) does the least per launch:
a stack is formatted once per launch site (not at every launch whose bytes are new), yet names the site
each launch came from; the digests are made after the pass, once per distinct value; the callback data is
read from its bytes (cupti-python's NumPy record, or its address through
:class:`ds4lab.trace.cupti.NativeCallbacks`), never through cupti-python's per-field properties; and every
way of being handed the callback data stores the same pass. Behaviour, not timings: the host cost itself is
``scripts/bench_arguments_host.py``'s (host-only) and ``scripts/arguments_cost.py``'s (paired, on the GPU)."""

from __future__ import annotations

import struct
import sys

import pytest

import audit_args_synth as S
from ds4lab.trace import arguments as A
from ds4lab.trace import cupti as C
from ds4lab.trace import stacks as ST


def _record(monkeypatch, callbacks: str = "python", **kw):
    """:func:`audit_args_synth.record` with the callback data handed as ``callbacks`` says: ``"python"`` (an
    object with the fields and ``ptr``), ``"numpy"`` (also cupti-python's NumPy view, ``_data``), ``"native"``
    (its address, through :class:`ds4lab.trace.cupti.NativeCallbacks` over :class:`fake_cupti.FakeLibcupti`)."""
    real = S.fake_cupti.install

    def install(mp, refuse=()):
        m = real(mp, refuse)
        m.numpy_callback_data = callbacks == "numpy"
        if callbacks == "native":
            C.CuptiSession.get().api = C.NativeCallbacks(S.fake_cupti.FakeLibcupti(m))
        return m

    monkeypatch.setattr(S.fake_cupti, "install", install)
    return S.record(monkeypatch, **kw)


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def wrapped(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def test_a_stack_is_formatted_once_per_launch_site_and_kept_for_every_launch_with_new_bytes(monkeypatch):
    made = _counting(monkeypatch, ST, "python_stack")
    rec, _, _ = S.record(monkeypatch, tokens=6)
    st = rec.arguments
    # embed (a new temporary; the first token's is the warm-up's), rope (the position) and kv_write (the
    # slot) have new bytes at every token, and keep their stacks (they differ between tokens)
    assert len(st.stacks) == 3 * 6 - 1
    # ... but each launch site's text was made once: the warm-up's embed, and the step's four launches
    assert len(made) == 5 and len(set(st.stacks.values())) == 3
    rope = [st.stacks[c] for c in sorted(st.stacks) if st.params(c)[0] == "rope"]
    assert len(rope) == 6 and len(set(rope)) == 1 and " step" in rope[0]


def test_each_launch_gets_the_stack_of_its_own_call_site(monkeypatch):
    """The same kernel reached from two lines of the user's loop (a prefill-like call and the decode
    loop), each through the same 30 frames of a framework: the site is the whole stack, so the second
    line's launches never get the first line's stack."""
    from ds4lab.audit import arguments as REC

    m = S.fake_cupti.install(monkeypatch)
    monkeypatch.setattr(C, "current_context", lambda: 0x55)
    q = S.queries()
    monkeypatch.setattr(A, "CudaQueries", lambda: q)
    monkeypatch.setattr(A, "SKIP_FILES", (S.fake_cupti.__file__,))
    lines = {}
    with REC.recording(arguments=True, token_range="decode_step") as rec:
        for t in range(3):
            lines.setdefault("first", sys._getframe().f_lineno + 1)
            _framework(30, S.step, m, 17 + t, t)
        for t in range(3, 6):
            lines.setdefault("second", sys._getframe().f_lineno + 1)
            _framework(30, S.step, m, 17 + t, t)
    st = rec.arguments
    rope = [c for c in sorted(st.launches) if st.params(c)[0] == "rope"]
    here = __file__.rsplit("/", 1)[-1]
    for i, c in enumerate(rope):
        line = lines["first" if i < 3 else "second"]
        assert f"{here}:{line} " in st.stacks[c], (i, st.stacks[c])


def _framework(depth, fn, *args):
    return _framework(depth - 1, fn, *args) if depth else fn(*args)


def test_digests_are_made_after_the_pass_once_per_distinct_value(monkeypatch):
    made = _counting(monkeypatch, A, "digest")
    seen_inside = []
    real_step = S.step

    def step(m, pos, token, **kw):
        real_step(m, pos, token, **kw)
        seen_inside.append(len(made))

    monkeypatch.setattr(S, "step", step)
    rec, _, _ = S.record(monkeypatch, tokens=5)
    assert set(seen_inside) == {0}  # none during the pass
    st = rec.arguments
    distinct = {d for _, d in st.launches.values() if d}
    assert len(made) == len(distinct) < len(st.launches)
    # the store keeps what it always kept: a digest per launch, the bytes of the launches that differ
    rope = sorted(c for c in st.launches if st.params(c)[0] == "rope")
    assert [struct.unpack("<i", st.params(c)[2][8:12])[0] for c in rope] == [17, 18, 19, 20, 21]
    assert all(A.digest(st.blobs[d]) == d for d in st.blobs)


@pytest.mark.parametrize("callbacks", ["numpy", "native"])
def test_every_way_of_handing_the_callback_data_stores_the_same_pass(monkeypatch, callbacks):
    base, _, _ = S.record(monkeypatch, tokens=4)
    monkeypatch.undo()
    other, m, _ = _record(monkeypatch, callbacks, tokens=4)
    a, b = base.arguments, other.arguments
    # correlation ids restart with each fake: compare in launch order
    la = [a.launches[c] for c in sorted(a.launches)]
    lb = [b.launches[c] for c in sorted(b.launches)]
    assert la == lb and a.blobs == b.blobs and len(a.stacks) == len(b.stacks) > 0
    assert [f["name"] for f in a.functions.values()] == [f["name"] for f in b.functions.values()]
    # the hazard-class calls' stacks still come through (the step's cudaStreamSynchronize)
    assert len(other.stacks) == len(base.stacks) > 0
    if callbacks == "native":
        session = C.CuptiSession.get()
        assert isinstance(session.api, C.NativeCallbacks)
        assert any(c[0] == "subscribe" for c in session.api.lib.calls)


def test_cupti_python_field_properties_are_not_read_at_launches(monkeypatch):
    """cupti-python's CallbackData fields cost microseconds each (a NumPy record): with its ``_data`` there,
    a launch callback reads the bytes once and no field."""
    from types import SimpleNamespace

    touched = []

    class Data(SimpleNamespace):
        def __getattribute__(self, name):
            if name in ("callback_site", "correlation_id", "symbol_name", "function_name", "ptr"):
                touched.append(name)
            return super().__getattribute__(name)

    real = S.fake_cupti.R
    monkeypatch.setattr(S.fake_cupti, "R", lambda **k: Data(**k) if "symbol_name" in k else real(**k))
    rec, _, _ = _record(monkeypatch, "numpy", tokens=3)
    assert len(rec.arguments.launches) == 1 + 3 * 4 and touched == []


def test_callback_struct_reads_cuptis_offsets():
    s = C.callback_struct()
    assert s.size == 72
    raw = bytearray(72)
    struct.pack_into("<i", raw, 0, 1)
    struct.pack_into("<Q", raw, 16, 0xABC)
    struct.pack_into("<I", raw, 64, 99)
    assert s.unpack(bytes(raw)) == (1, 0, 0xABC, 0, 99)
    # offsets as cupti.callback_data_dtype gives them
    dt = type("D", (), {"fields": {"function_params": (None, 24), "correlation_id": (None, 68)}, "itemsize": 80})
    s2 = C.callback_struct(dt)
    raw = bytearray(80)
    struct.pack_into("<Q", raw, 24, 7)
    struct.pack_into("<I", raw, 68, 5)
    assert s2.size == 80 and s2.unpack(bytes(raw))[2] == 7 and s2.unpack(bytes(raw))[4] == 5


def test_the_cost_counts_launches_and_names_its_parts(monkeypatch):
    m = S.fake_cupti.install(monkeypatch)
    q = S.queries()
    t = [0.0]

    def step():
        for _ in range(3):
            m.launch("cudaLaunchKernel_v7000", S.EMBED, [S.p64(S.IDS), S.p64(S.TEMP)], kernel="embed")
        t[0] += 300e-6 + (15e-6 if m.callbacks_on else 0.0)

    cost = A.measure_overhead(step, None, session=C.CuptiSession.get(), rounds=4, steps=2, clock=lambda: t[0],
                              queries=q, parts=A.PASS_PARTS)
    assert cost["launches_per_step"] == cost["launches_counted"] == 3
    assert cost["per_launch_us"] == pytest.approx(5.0, abs=0.01)
    assert cost["parts"] == ["launches"] and "launch handler" in cost["text"]  # no torch loaded here
    with pytest.raises(ValueError, match="'stacks'"):
        A.measure_overhead(step, 1, session=C.CuptiSession.get(), parts=("launches", "stacks"), queries=q)


@pytest.mark.parametrize("case", ["native", "asked for python", "no library", "no cupti-python"])
def test_the_session_subscribes_through_cuptis_c_api_where_it_can(monkeypatch, case):
    """cupti-python's module (a file), its CUPTI library mapped: NativeCallbacks; asked for cupti-python's
    wrapper (DS4LAB_CUPTI_CALLBACKS=python), no library, or a module that is no cupti-python: the module's own
    subscribe."""
    from pathlib import Path

    m = S.fake_cupti.install(monkeypatch)
    if case != "no cupti-python":
        m.__file__ = "/site-packages/cupti/cupti.cpython-312-x86_64-linux-gnu.so"
    monkeypatch.setattr(C, "_loaded_cupti", lambda: None if case == "no library" else Path("/lib/libcupti.so.13"))
    monkeypatch.setattr(C.NativeCallbacks, "load",
                        classmethod(lambda cls, p: cls(S.fake_cupti.FakeLibcupti(m)) if p is not None else None))
    if case == "asked for python":
        monkeypatch.setenv(C.CALLBACKS_ENV, "python")
    else:
        monkeypatch.delenv(C.CALLBACKS_ENV, raising=False)
    session = C.CuptiSession.get()
    watch = session.watch_calls({"cudaStreamSynchronize"}, ())
    try:
        corr = m.call("cudaStreamSynchronize_v3020")
        assert isinstance(session.api, C.NativeCallbacks) == (case == "native")
        assert " test_the_session_subscribes" in watch.stacks[corr]  # the hazard stacks either way
        assert watch.names[corr] == "cudaStreamSynchronize"
    finally:
        watch.close()
    assert m.subscribers == {}
