"""Decode steps run as a user runs them, for ``ds4lab audit validate``: the scripts of a steps folder
(``ds4lab/data/steps/`` by default; every ``*.py`` not starting with ``_``), each following the contract of
docs/audit-arguments.md ("``ds4lab audit validate --out DIR``"). ds4lab never imports them in its own process.

:func:`run_step` makes one run (family × cache × dtype, into ``<family>-<cache>-<dtype>/``), each part a
subprocess so a step that kills its CUDA context costs only that part: the recording with its passes
(:func:`ds4lab.trace.recording.run_script`), the truth (``--truth truth.json``, untraced) and :func:`check`
(check_replay on ``make_step``, and the argument capture's cost). ``engine.json`` gathers them, with each part's
``seconds``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..errors import BadInput

#: The truth file's outcomes (the contract) → the audit's verdicts.
TRUTH_OUTCOMES = ("refused", "replays right", "replays wrong")
#: Seconds a part of a run may take (a model build, a prefill and eight steps; the truth's timing loops).
PART_TIMEOUT = 900


def steps_folder(folder=None) -> Path:
    """The steps folder: ``folder``, else ``ds4lab/data/steps`` (shipped with the package)."""
    if folder is not None:
        return Path(folder)
    from importlib.resources import files

    return Path(str(files("ds4lab") / "data" / "steps"))


def discover(folder=None, names=()) -> list[Path]:
    """The family scripts of a steps folder, by name; with ``names``, only the scripts one of them names where any
    does (so only those are asked their ``--list``), else all. Raises BadInput: no such folder, or no script in it."""
    d = steps_folder(folder)
    if not d.is_dir():
        raise BadInput(f"steps folder {d}: no such folder")
    out = sorted(p for p in d.glob("*.py") if not p.name.startswith("_"))
    if not out:
        raise BadInput(f"steps folder {d}: no step script in it (*.py not starting with _)")
    named = [p for p in out if p.stem in set(names)]
    return named or out


def _env() -> dict:
    """The environment of a part that records nothing: ds4lab importable, no NVTX injection."""
    env = dict(os.environ)
    env.pop("NVTX_INJECTION64_PATH", None)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH", "")) if x)
    return env


def _run(cmd: list, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout:.0f} s")


def _tail(r: subprocess.CompletedProcess, n: int = 6) -> str:
    return "\n".join(((r.stdout or "") + (r.stderr or "")).strip().splitlines()[-n:])


def listing(script: Path, timeout: float = 300) -> dict:
    """What ``python SCRIPT --list`` prints: ``{"family", "caches", "dtypes", "script"}``. Raises BadInput: the script
    fails or prints no such object (naming it and its last lines)."""
    r = _run([sys.executable, str(script), "--list"], timeout)
    for line in reversed((r.stdout or "").strip().splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and {"family", "caches", "dtypes"} <= set(d):
            return {**d, "script": str(script)}
    raise BadInput(f"{script} --list: exit {r.returncode}, no {{family, caches, dtypes}} object printed: {_tail(r)}")


def run_step(script: Path, family: str, cache: str, dtype: str, out: Path, *, say=print,
             capture_cost: bool = True) -> dict:
    """One run of a family script into ``out/<family>-<cache>-<dtype>/``; returns ``engine.json``'s fields
    (``error`` where a part failed). ``capture_cost``: measure the argument capture's cost per launch."""
    import time

    from ..trace.recording import markers_name, run_script
    from ..trace.sources.common import SourceError

    folder = Path(out) / f"{family}-{cache}-{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(script), "--cache", cache, "--dtype", dtype]
    res = {"family": family, "cache": cache, "dtype": dtype, "script": str(script), "argv": argv,
           "engine": family, "outcome": "", "error": ""}
    errors = []
    seconds: dict = {}
    try:
        rec = run_script(argv, folder, arguments=True, seconds=seconds)
        res["recording"] = str(rec)
        for path, key in ((folder / "arguments.json.gz", "arguments"), (folder / "capture-path.csv.gz", "capture_path"),
                          (markers_name(rec), "markers")):
            if path.is_file():
                res[key] = str(path)
    except SourceError as e:
        errors.append(f"recording: {e}")
    clock = time.monotonic()
    r = _run([sys.executable, *argv, "--truth", str(folder / "truth.json")], PART_TIMEOUT)
    seconds["truth"] = round(time.monotonic() - clock, 1)
    if (folder / "truth.json").is_file():
        t = json.loads((folder / "truth.json").read_text())
        res["truth"] = t
        res.update(outcome=t.get("outcome") or "", detail=t.get("error") or _truth_detail(t),
                   eager_us=t.get("eager_us"), replay_us=t.get("replay_us"), replay_spread=t.get("replay_spread"),
                   replay_bare_us=t.get("replay_bare_us"), loop_body=bool(t.get("loop_body")),
                   first_position=t.get("first_wrong_position"), graph_kernels=t.get("graph_kernels"),
                   cause=t.get("cause"), device={"device": t.get("gpu"), "driver": t.get("driver")})
    else:
        errors.append(f"truth: exit {r.returncode}: {_tail(r)}")
    per_step = _launches_per_step(res.get("recording")) if capture_cost else 0.0
    clock = time.monotonic()
    r = _run([sys.executable, "-m", "ds4lab.audit.steps", "check", str(script), cache, dtype,
              str(folder / "check.json"), str(per_step)], PART_TIMEOUT)
    seconds["check"] = round(time.monotonic() - clock, 1)
    res["seconds"] = seconds
    if (folder / "check.json").is_file():
        c = json.loads((folder / "check.json").read_text())
        res["check"] = c
        res["overhead"] = c.pop("overhead", None) or {}
    else:
        errors.append(f"check_replay: exit {r.returncode}: {_tail(r)}")
    res["error"] = "; ".join(errors)
    (folder / "engine.json").write_text(json.dumps(res, indent=1, default=str))
    say(f"{family}/{cache}/{dtype}: torch {res['outcome'] or '-'}; check_replay "
        f"{(res.get('check') or {}).get('verdict', '-')}; seconds "
        + ", ".join(f"{k} {v:g}" for k, v in seconds.items()) + (f"; {res['error']}" if res["error"] else ""))
    return res


def _truth_detail(t: dict) -> str:
    errs = t.get("rel_err") or []
    if t.get("first_wrong_position") is not None:
        return f"from position {t['first_wrong_position']} the replay differs from eager"
    return f"{len(errs)} positions compared (max relative error {max(errs):.1e})" if errs else ""


def _launches_per_step(recording) -> float:
    """Kernel launches per token of a recording (its tokens found as the audit finds them), 0 where unknown."""
    if not recording:
        return 0.0
    try:
        from ..trace.sources import read_events
        from .arguments import token_launches

        tl = token_launches(read_events(Path(recording)))
        return sum(len(t) for t in tl.tokens) / max(len(tl.tokens), 1)
    except Exception:  # noqa: BLE001 - the cost is then not divided per launch
        return 0.0


def load_step(script: Path):
    """The module of a family script, imported under a name of its own (its folder on ``sys.path``)."""
    import importlib.util

    sys.path.insert(0, str(Path(script).resolve().parent))
    spec = importlib.util.spec_from_file_location(f"_ds4lab_step_{Path(script).stem.replace('-', '_')}", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "make_step"):
        raise BadInput(f"{script}: no make_step (the contract: make_step(cache, dtype, *, prompt, seed, device))")
    return mod


def check(script: Path, cache: str, dtype: str, out: Path, launches_per_step: float = 0.0) -> dict:
    """check_replay of the script's ``make_step(cache, dtype)`` and the argument capture's cost per launch on it,
    written to ``out`` (JSON); a refused state is its outcome (``error``)."""
    import torch

    from .replay_check import StateError, check_replay

    mod = load_step(script)
    s = mod.make_step(cache, dtype)
    res: dict = {}
    try:
        r = check_replay(s.step, s.state, advance=s.advance, start=s.start, capacity=getattr(s, "capacity", None))
        res = {"outcome": r.outcome, "verdict": r.verdict, "detail": r.detail, "first_position": r.first_position,
               "replay_us": r.replay_us, "replay_sync_us": r.replay_sync_us, "replay_device_us": r.replay_device_us,
               "graph_kernels": r.graph_kernels, "positions_compared": r.positions_compared,
               "steps_timed": r.steps_timed, "errors": r.errors, "error": r.error}
    except StateError as e:
        res = {"outcome": "", "verdict": "", "error": str(e)}
    if launches_per_step and res.get("outcome"):
        try:  # the cost of argument capture on this step (a fresh one: the check's positions are spent)
            from .arguments import measure_overhead

            s2 = mod.make_step(cache, dtype)
            pos = [s2.start]

            def one():
                s2.advance(pos[0])
                s2.step()
                pos[0] += 1
                if s2.capacity is not None and pos[0] >= s2.capacity - 1:
                    raise RuntimeError("the cache is full before the cost was measured")

            with torch.no_grad():
                res["overhead"] = measure_overhead(one, launches_per_step, sync=torch.cuda.synchronize, rounds=6,
                                                   steps=2)
        except Exception as e:  # noqa: BLE001 - the cost unmeasured is said
            res["overhead"] = {"text": f"not measured ({type(e).__name__}: {e})"}
    Path(out).write_text(json.dumps(res, indent=1, default=str))
    return res


def main(argv=None) -> int:
    """``python -m ds4lab.audit.steps check SCRIPT CACHE DTYPE OUT.json [LAUNCHES_PER_STEP]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 5 or argv[0] != "check":
        print(main.__doc__, file=sys.stderr)
        return 2
    check(Path(argv[1]), argv[2], argv[3], Path(argv[4]), float(argv[5]) if len(argv) > 5 else 0.0)
    return 0


__all__ = ["PART_TIMEOUT", "TRUTH_OUTCOMES", "check", "discover", "listing", "load_step", "run_step", "steps_folder"]


if __name__ == "__main__":
    sys.exit(main())
