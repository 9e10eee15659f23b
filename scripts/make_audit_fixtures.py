"""Write the audit's argument fixtures from a GPU run (``tests/data/audit_args/<family>-<cache>-<dtype>/``):
for each step script asked (a family of the steps folder, ``ds4lab/data/steps`` or ``--steps``; default: ds4lab's
hand-written decoder's three caches and Llama with a static cache, float32: small enough to ship), the run
``ds4lab audit validate`` makes of it on the user's path (:func:`ds4lab.audit.steps.run_step`): the timed
recording, the argument pass (``arguments.csv.gz``, ``arguments.json.gz``), the capture-path pass where one
was recorded (``capture-path.csv.gz``), the markers pass (``recording.markers.csv.gz``: the loop's NVTX
ranges untraced), the script's own truth (``truth.json``), check_replay's
(``check.json``) and ``engine.json``. ``tests/test_audit_args_fixtures.py`` then holds the audit to them on
the CPU, whichever fixtures are there.

    python scripts/make_audit_fixtures.py [--out tests/data/audit_args] [--dtype float32] [--steps DIR] [FAMILY/CACHE ...]
    python scripts/make_audit_fixtures.py --from results/audit-validate [FAMILY/CACHE ...]

Needs a GPU, torch and cupti-python (transformers for its families), except with ``--from``: the runs a finished
``ds4lab audit validate`` saved there are copied (no GPU). Files larger than ``--max-mb`` (default 4) are not
kept (a fixture should stay small: pass fewer families or a smaller model).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT = ("ds4lab-handwritten/host-counter", "ds4lab-handwritten/device-counter", "ds4lab-handwritten/host-read",
           "ds4lab-llama/static")
FILES = ("recording.csv.gz", "arguments.csv.gz", "arguments.json.gz", "engine.json")
#: Kept where the run wrote them (a step that asks whether the stream captures: ds4lab.trace.capture_path; the
#: script's truth and check_replay's result).
OPTIONAL = ("capture-path.csv.gz", "recording.markers.csv.gz", "truth.json", "check.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", default=list(DEFAULT), help="FAMILY/CACHE (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "data" / "audit_args")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--steps", type=Path, default=None, help="the steps folder (default: ds4lab/data/steps)")
    ap.add_argument("--max-mb", type=float, default=4.0)
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="a finished ds4lab audit validate folder: copy its runs instead of running them")
    a = ap.parse_args(argv)
    from ds4lab.audit.engines import available
    from ds4lab.audit.steps import discover, listing, run_step
    from ds4lab.audit.validate import saved_run

    ok, why = (True, "") if a.source is not None else available()
    if not ok:
        print(f"make_audit_fixtures: {why}", file=sys.stderr)
        return 2
    bad = [r for r in a.runs if r.count("/") != 1]
    if bad:
        print(f"make_audit_fixtures: {', '.join(bad)}: give FAMILY/CACHE", file=sys.stderr)
        return 2
    scripts = {}
    if a.source is None:  # which script is which family, and its caches (its --list)
        for s in discover(a.steps):
            ls = listing(s)
            scripts[ls["family"]] = (s, ls["caches"])
        bad = [r for r in a.runs if r.split("/")[1] not in scripts.get(r.split("/")[0], (None, ()))[1]]
        if bad:
            print(f"make_audit_fixtures: unknown run(s) {', '.join(bad)}; families: "
                  + "; ".join(f"{f}: {', '.join(c)}" for f, (_, c) in scripts.items()), file=sys.stderr)
            return 2
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run in a.runs:
            family, cache = run.split("/")
            name = f"{family}-{cache}-{a.dtype}"
            if a.source is not None:
                src = a.source / name
                r = saved_run(src) if (src / "engine.json").is_file() else {"error": f"{src}: no such run"}
            else:
                r = run_step(scripts[family][0], family, cache, a.dtype, Path(tmp))
                src = Path(tmp) / name
            if not (src / "engine.json").is_file() or not (src / "recording.csv.gz").is_file():
                print(f"{name}: failed: {r.get('error') or 'no engine.json or recording'}", file=sys.stderr)
                status = 1
                continue
            dst = a.out / name
            dst.mkdir(parents=True, exist_ok=True)
            for f in FILES + tuple(x for x in OPTIONAL if (src / x).is_file()):
                p = src / f
                if not p.is_file():
                    print(f"{name}: {f} missing", file=sys.stderr)
                    status = 1
                elif p.stat().st_size > a.max_mb * (1 << 20):
                    print(f"{name}: {f} is {p.stat().st_size / (1 << 20):.1f} MiB, over --max-mb: not kept",
                          file=sys.stderr)
                    status = 1
                else:
                    shutil.copy2(p, dst / f)
            # the paths inside engine.json named the run's folder: name the fixture's own files
            e = json.loads((dst / "engine.json").read_text())
            e["recording"], e["arguments"] = "recording.csv.gz", "arguments.json.gz"
            if "capture_path" in e:
                e["capture_path"] = "capture-path.csv.gz"
            if "markers" in e:
                e["markers"] = "recording.markers.csv.gz"
            if "script" in e:
                e["script"] = Path(e["script"]).name
                e["argv"] = [Path(e["script"]).name, *e.get("argv", [])[1:]]
            (dst / "engine.json").write_text(json.dumps(e, indent=1))
            print(f"{name}: {r.get('outcome')} -> {dst}" + (f" ({r['error']})" if r.get("error") else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
