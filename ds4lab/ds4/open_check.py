"""Ask ds4 itself whether it opens a model file: build ds4's CPU objects from its tarball (outside the repository, as
its Makefile does) and ds4lab's probe ``csrc/open_check.c``, which calls only ``ds4.h``; run it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput

#: ds4's source tarball as the project keeps it, relative to the repository root.
TARBALL_REL = Path("..") / "shared" / "ds4" / "ds4-b0309611.tar.gz"
#: The ds4 sources of its CPU build (Makefile ``CPU_CORE_OBJS``), object name → source.
CPU_OBJECTS = {"ds4_cpu.o": "ds4.c", "ds4_distributed.o": "ds4_distributed.c", "ds4_tp.o": "ds4_tp.c",
               "ds4_ssd.o": "ds4_ssd.c", "ds4_layer_pack.o": "ds4_layer_pack.c"}
#: Flags of ds4's Makefile on Linux, less ``-march=native`` and debug info (portable, smaller).
CFLAGS = ["-O2", "-std=c99", "-D_GNU_SOURCE", "-ffast-math", "-fno-finite-math-only", "-w"]
_PROBE = Path(__file__).with_name("csrc") / "open_check.c"


def default_tarball() -> Path:
    """``DS4LAB_DS4_TARBALL`` if set, else ``../shared/ds4/ds4-b0309611.tar.gz`` from the checkout."""
    env = os.environ.get("DS4LAB_DS4_TARBALL")
    if env:
        return Path(env)
    return (Path(__file__).resolve().parents[2] / TARBALL_REL).resolve()


def _sha12(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()[:12]


def build_open_check(tarball: str | os.PathLike | None = None, build_dir: str | os.PathLike | None = None,
                     cc: str | None = None) -> Path:
    """Compile ds4's CPU objects and ``open_check`` (reusing what is built); return the probe's path. Defaults:
    ``tarball`` :func:`default_tarball`, ``build_dir`` ``$TMPDIR/ds4lab-ds4-cpu-<tarball sha>``, ``cc`` ``$CC``, else
    ``gcc``, else ``cc``.

    Raises:
        BadInput: no tarball at that path, or no C compiler.
        subprocess.CalledProcessError: a compile failed (its output in the exception)."""
    tb = Path(tarball) if tarball is not None else default_tarball()
    if not tb.is_file():
        raise BadInput(f"ds4 source tarball={str(tb)!r} not found (set DS4LAB_DS4_TARBALL)")
    cc = cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc or not shutil.which(cc):
        raise BadInput(f"no C compiler (cc={cc!r}); install gcc or set CC")
    bd = Path(build_dir) if build_dir is not None else Path(tempfile.gettempdir()) / f"ds4lab-ds4-cpu-{_sha12(tb)}"
    src = bd / "src"
    if not (src / "ds4.h").is_file():
        bd.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="src-", dir=bd))
        with tarfile.open(tb) as t:
            try:
                t.extractall(tmp, filter="data")
            except TypeError:  # Python without extraction filters
                t.extractall(tmp)
        if src.exists():
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, src)
    objs = []
    for obj, c in CPU_OBJECTS.items():
        out = bd / obj
        objs.append(out)
        if out.is_file():
            continue
        extra = ["-Wno-unused-function", "-DDS4_NO_GPU"] if obj == "ds4_cpu.o" else []
        part = out.with_name(f"{obj}.{os.getpid()}.tmp")
        subprocess.run([cc, *CFLAGS, *extra, "-c", "-o", str(part), str(src / c)], check=True,
                       capture_output=True, text=True)
        os.replace(part, out)
    exe = bd / "open_check"
    if not exe.is_file() or exe.stat().st_mtime < _PROBE.stat().st_mtime:
        part = exe.with_name(f"open_check.{os.getpid()}.tmp")
        subprocess.run([cc, "-O2", "-std=c99", "-D_GNU_SOURCE", "-Wall", "-Wextra", f"-I{src}", "-o", str(part),
                        str(_PROBE), *map(str, objs), "-lm", "-pthread"], check=True, capture_output=True, text=True)
        os.replace(part, exe)
    return exe


@dataclass
class OpenCheck:
    """What ``open_check`` reported: ``rc`` (ds4 exits 1 on the first check a file fails), ``opened``, ``stdout``,
    ``stderr``, ``info`` (its ``open_check:`` lines' ``key=value`` pairs, as strings), ``evals`` (per evaluated token:
    ``pos``, ``token``, ``argmax``, ``nonfinite``, ``min``, ``max``, ``rms``, ``seconds``, ``top``)."""

    rc: int
    opened: bool
    stdout: str
    stderr: str
    info: dict = field(default_factory=dict)
    evals: list = field(default_factory=list)

    @property
    def refusal(self) -> str:
        """ds4's own message(s) on stderr (``ds4: ...`` lines)."""
        return "\n".join(ln for ln in self.stderr.splitlines() if ln.startswith("ds4:"))


def run_open_check(exe: str | os.PathLike, model: str | os.PathLike, mode: str = "inspect", *,
                   n_tokens: int = 0, ctx: int = 64, threads: int | None = None,
                   timeout: float | None = 600) -> OpenCheck:
    """Run ``open_check MODEL MODE [N CTX]`` and parse what it printed. ``mode``: ``"inspect"`` (metadata and tensor
    checks) or ``"cpu"`` (ds4's CPU backend; ``n_tokens`` > 0: a greedy decode from token 0).

    Raises:
        BadInput: a bad ``mode``.
        subprocess.TimeoutExpired: past ``timeout`` seconds."""
    if mode not in ("inspect", "cpu"):
        raise BadInput(f"mode={mode!r}; choose inspect or cpu")
    env = dict(os.environ, DS4_LOCK_FILE=str(Path(exe).with_name("ds4.lock")))
    if threads is not None:
        env["OPEN_CHECK_THREADS"] = str(int(threads))
    args = [str(exe), str(model), mode] + ([str(int(n_tokens)), str(int(ctx))] if mode == "cpu" else [])
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    res = OpenCheck(rc=p.returncode, opened="open_check: OK open" in p.stdout, stdout=p.stdout, stderr=p.stderr)
    for ln in p.stdout.splitlines():
        if not ln.startswith("open_check: "):
            continue
        pairs = dict(re.findall(r"(\w+)=(\S+)", ln))
        if ln.startswith("open_check: eval "):
            res.evals.append(pairs)
        else:
            res.info.update(pairs)
    return res


def main(argv: list[str] | None = None) -> int:
    """``python -m ds4lab.ds4.open_check MODEL [inspect|cpu] [--tokens N] [--ctx C]``: build the probe (once) and ask
    ds4 whether it opens MODEL. Prints ds4's output; exit status is the probe's."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ds4lab.ds4.open_check", description=main.__doc__)
    ap.add_argument("model")
    ap.add_argument("mode", nargs="?", default="inspect", choices=("inspect", "cpu"))
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tarball", default=None)
    ap.add_argument("--build-dir", default=None)
    a = ap.parse_args(argv)
    try:
        exe = build_open_check(a.tarball, a.build_dir)
    except BadInput as e:
        print(f"error: {e}")
        return 2
    print(f"probe: {exe}")
    r = run_open_check(exe, a.model, a.mode, n_tokens=a.tokens, ctx=a.ctx, threads=a.threads, timeout=None)
    print(r.stdout, end="")
    print(r.stderr, end="")
    return r.rc


if __name__ == "__main__":
    raise SystemExit(main())
