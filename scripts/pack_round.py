"""Pack a GPU round's folder into the archives the device tool brings back: ``OUT/round-1.tgz``,
``round-2.tgz``, ... each under the 16 MiB a returned file may have and at most seven of them (the
tool returns eight files), files placed largest first into the first archive with room. SVG and PDF
figures are dropped (the PNGs stay). Each archive is written beside its name and renamed, so a round
cut short keeps the last whole set; archives of an earlier, larger packing are removed.

    python3 scripts/pack_round.py /tmp/round "$OUT"
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

LIMIT = 15 << 20  # under the tool's 16 MiB per file, for the archive's own overhead
MAX_ARCHIVES = 7


def main(root: str, out: str) -> int:
    root_p, out_p = Path(root), Path(out)
    for f in list(root_p.rglob("*")):
        if f.is_file() and f.suffix in (".svg", ".pdf"):
            f.unlink()
    files = sorted((f for f in root_p.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size, reverse=True)
    bins: list[list] = []
    left_out = []
    for f in files:
        size = f.stat().st_size
        b = next((b for b in bins if b[0] + size <= LIMIT), None)
        if b is None:
            if size > LIMIT or len(bins) == MAX_ARCHIVES:
                left_out.append(f)
                continue
            b = [0, []]
            bins.append(b)
        b[0] += size
        b[1].append(f)
    for i, (_, members) in enumerate(bins, 1):
        tmp = out_p / f".round-{i}.tgz"
        with tarfile.open(tmp, "w:gz") as t:
            for f in sorted(members):
                t.add(f, arcname=str(Path(root_p.name) / f.relative_to(root_p)))
        tmp.rename(out_p / f"round-{i}.tgz")
    for old in out_p.glob("round-*.tgz"):
        n = old.stem.split("-")[-1]
        if n.isdigit() and int(n) > len(bins):
            old.unlink()
    for f in left_out:
        print(f"WARNING: {f} ({f.stat().st_size / (1 << 20):.1f} MiB) does not fit the returned archives: left out")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
