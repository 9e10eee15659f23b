"""Write the audit's argument fixtures from a GPU run (``tests/data/audit_args/<family>-<cache>-<dtype>/``):
for each family asked (default: the hand-written decoder's three caches, float32: small enough to ship), the timed recording, the argument pass (``arguments.csv.gz`` and
``arguments.json.gz``), the capture-path pass where one was recorded (``capture-path.csv.gz``) and what
torch.cuda.graph did (``engine.json``), as ``ds4lab audit validate``
records them (:func:`ds4lab.audit.engines.run_isolated`). ``tests/test_audit_args_fixtures.py`` then holds
the audit's verdict to torch's outcome on the CPU.

    python scripts/make_audit_fixtures.py [--out tests/data/audit_args] [--dtype float32] [FAMILY/CACHE ...]
    python scripts/make_audit_fixtures.py --from results/audit-validate [FAMILY/CACHE ...]

Needs a GPU, torch, transformers and cupti-python, except with ``--from``: the runs a finished
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

DEFAULT = ("handwritten/host-counter", "handwritten/device-counter", "handwritten/host-read")
FILES = ("recording.csv.gz", "arguments.csv.gz", "arguments.json.gz", "engine.json")
#: Kept where the run recorded it (a step that asks whether the stream captures: ds4lab.trace.capture_path).
OPTIONAL = ("capture-path.csv.gz",)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", default=list(DEFAULT), help="FAMILY/CACHE (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "data" / "audit_args")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--max-mb", type=float, default=4.0)
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="a finished ds4lab audit validate folder: copy its runs instead of running them")
    a = ap.parse_args(argv)
    from ds4lab.audit.engines import available, run_isolated
    from ds4lab.audit.families import FAMILIES
    from ds4lab.audit.validate import saved_run

    ok, why = (True, "") if a.source is not None else available()
    if not ok:
        print(f"make_audit_fixtures: {why}", file=sys.stderr)
        return 2
    bad = [r for r in a.runs if r.count("/") != 1 or r.split("/")[1] not in FAMILIES.get(r.split("/")[0], ())]
    if bad:
        print(f"make_audit_fixtures: unknown run(s) {', '.join(bad)}; families: {FAMILIES}", file=sys.stderr)
        return 2
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run in a.runs:
            engine, cache = run.split("/")
            name = f"{engine}-{cache}-{a.dtype}"
            if a.source is not None:
                src = a.source / name
                r = saved_run(src) if (src / "engine.json").is_file() else {"error": f"{src}: no such run"}
            else:
                r = run_isolated(engine, cache, Path(tmp), dtype=a.dtype)
                src = Path(tmp) / name
            if r.get("error") or not (src / "engine.json").is_file():
                print(f"{name}: failed: {r.get('error', 'no engine.json')}", file=sys.stderr)
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
            # the paths inside engine.json named the temporary folder: name the fixture's own files
            e = json.loads((dst / "engine.json").read_text())
            e["recording"], e["arguments"] = "recording.csv.gz", "arguments.json.gz"
            if "capture_path" in e:
                e["capture_path"] = "capture-path.csv.gz"
            (dst / "engine.json").write_text(json.dumps(e, indent=1))
            print(f"{name}: {r.get('outcome')} -> {dst}")
    return status


if __name__ == "__main__":
    sys.exit(main())
