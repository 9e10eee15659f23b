"""The stage-0 stream accessor: flag gating, scoped overrides, thread locality, env re-read."""

from __future__ import annotations

import threading

import pytest

from ds4lab.capture import stream as S


class Tok:
    """A stand-in stream object (the accessor is backend-neutral)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Tok({self.name})"


@pytest.fixture(autouse=True)
def restore_stream_state():
    """Restore the module flag and this thread's override after every test."""
    was_flag = S.graphs_flag()
    was_override = S.capture_get_override()
    yield
    S.set_graphs_enabled(was_flag)
    S.capture_set_stream(was_override)


def test_legacy_marker():
    assert repr(S.LEGACY_STREAM) == "LEGACY_STREAM"
    assert S.LEGACY_STREAM is not None


def test_flag_off_ignores_override():
    S.set_graphs_enabled(False)
    assert S.graphs_flag() is False
    s = Tok("a")
    S.capture_set_stream(s)
    assert S.capture_get_override() is s  # set, but not applied
    assert S.current_stream() is S.LEGACY_STREAM
    with S.stream_override(Tok("b")):
        assert S.current_stream() is S.LEGACY_STREAM


def test_flag_on_no_override_is_legacy():
    S.set_graphs_enabled(True)
    S.capture_set_stream(None)
    assert S.current_stream() is S.LEGACY_STREAM


def test_flag_on_with_override():
    assert S.set_graphs_enabled(True) is True
    s = Tok("a")
    prev = S.capture_set_stream(s)
    assert S.current_stream() is s
    # Clearing returns the one that was set.
    assert S.capture_set_stream(prev) is s
    if prev is None:
        assert S.current_stream() is S.LEGACY_STREAM


def test_capture_set_stream_returns_previous():
    S.set_graphs_enabled(True)
    S.capture_set_stream(None)
    a, b = Tok("a"), Tok("b")
    assert S.capture_set_stream(a) is None
    assert S.capture_set_stream(b) is a
    assert S.current_stream() is b
    assert S.capture_set_stream(None) is b
    assert S.current_stream() is S.LEGACY_STREAM


def test_stream_override_scopes_and_nests():
    S.set_graphs_enabled(True)
    S.capture_set_stream(None)
    a, b = Tok("a"), Tok("b")
    with S.stream_override(a) as got:
        assert got is a
        assert S.current_stream() is a
        with S.stream_override(b):
            assert S.current_stream() is b
        assert S.current_stream() is a
    assert S.current_stream() is S.LEGACY_STREAM
    assert S.capture_get_override() is None


def test_stream_override_restores_on_error():
    S.set_graphs_enabled(True)
    outer, inner = Tok("outer"), Tok("inner")
    S.capture_set_stream(outer)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with S.stream_override(inner):
            assert S.current_stream() is inner
            raise Boom()
    assert S.capture_get_override() is outer
    assert S.current_stream() is outer


def test_override_is_thread_local():
    S.set_graphs_enabled(True)
    S.capture_set_stream(None)
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[str, list] = {}
    errors: list[BaseException] = []
    mine = {"t0": Tok("t0"), "t1": Tok("t1")}

    def worker(name):
        try:
            # Before: a fresh thread has no override.
            before = S.current_stream()
            with S.stream_override(mine[name]):
                barrier.wait()  # both overrides are set now
                during = [S.current_stream(), S.capture_get_override()]
                barrier.wait()  # both have read before either restores
                during.append(S.current_stream())
            seen[name] = [before] + during + [S.current_stream()]
        except BaseException as e:  # surfaced below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(n,)) for n in mine]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors, errors
    for name, s in mine.items():
        before, during, override, after_barrier, after = seen[name]
        assert before is S.LEGACY_STREAM
        assert during is s and override is s and after_barrier is s
        assert after is S.LEGACY_STREAM
    # The main thread never saw either override.
    assert S.current_stream() is S.LEGACY_STREAM


def test_main_override_invisible_to_other_thread():
    S.set_graphs_enabled(True)
    s = Tok("main")
    S.capture_set_stream(s)
    out = []
    t = threading.Thread(target=lambda: out.append((S.current_stream(), S.capture_get_override())))
    t.start()
    t.join(timeout=10)
    assert out == [(S.LEGACY_STREAM, None)]
    assert S.current_stream() is s


def test_set_graphs_enabled_rereads_environment(monkeypatch):
    monkeypatch.setenv(S.ENV_FLAG, "1")
    S.set_graphs_enabled(False)
    assert S.set_graphs_enabled(None) is True
    assert S.graphs_flag() is True
    monkeypatch.setenv(S.ENV_FLAG, "0")
    assert S.set_graphs_enabled(None) is False
    assert S.graphs_flag() is False
    monkeypatch.setenv(S.ENV_FLAG, "1")
    assert S.set_graphs_enabled() is True  # None is the default
    monkeypatch.delenv(S.ENV_FLAG)
    assert S.set_graphs_enabled(None) is False


def test_set_graphs_enabled_reread_gates_override(monkeypatch):
    s = Tok("x")
    S.capture_set_stream(s)
    monkeypatch.setenv(S.ENV_FLAG, "1")
    S.set_graphs_enabled(None)
    assert S.current_stream() is s
    monkeypatch.setenv(S.ENV_FLAG, "yes")  # only "1" turns it on
    S.set_graphs_enabled(None)
    assert S.current_stream() is S.LEGACY_STREAM


def test_set_graphs_enabled_coerces_to_bool():
    assert S.set_graphs_enabled(1) is True
    assert S.set_graphs_enabled(0) is False


def test_env_name():
    assert S.ENV_FLAG == "DS4_CUDA_GRAPHS"
