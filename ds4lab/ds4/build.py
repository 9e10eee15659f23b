"""Build ds4's engine, from its own Makefile, into one shared library ds4lab can load (:func:`build`, command lines by
:func:`build_plan`), cached by source digest, architecture and flags. Step by step: ``docs/ds4.md``."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput
from .source import Ds4Source, materialize

#: ds4lab's driver source, compiled into the library.
DRIVER_SOURCE = Path(__file__).with_name("csrc") / "ds4lab_ds4.c"
#: The library's file name inside a build folder.
LIBRARY_NAME = "libds4lab_ds4.so"
#: A makefile read after ds4's own: prints ``CORE_OBJS`` as ds4's Makefile computes it.
_PRINT_OBJS = "ds4lab-print-objs:\n\t@echo $({var})\n"
#: ``arch`` of a build for ds4's CPU back end (tests of the driver against ds4's own code, no GPU).
CPU = "cpu"


class BuildError(RuntimeError):
    """ds4 did not build: the message names the step and the log that holds the compiler's output."""


@dataclass(frozen=True)
class Toolchain:
    """The compilers a build uses: ``nvcc`` (from ``$CUDA_HOME``, ``/usr/local/cuda`` or ``PATH``), ``cc``, and the
    CUDA folder whose ``lib64`` holds cudart and cuBLAS."""

    nvcc: str
    cc: str
    cuda_home: str

    @classmethod
    def find(cls) -> "Toolchain":
        """The toolchain on this machine. Raises BadInput naming what is missing."""
        home = os.environ.get("CUDA_HOME") or ("/usr/local/cuda" if Path("/usr/local/cuda/bin/nvcc").exists() else "")
        nvcc = str(Path(home) / "bin" / "nvcc") if home else (shutil.which("nvcc") or "")
        if not nvcc or not Path(nvcc).exists():
            raise BadInput("ds4lab ds4 builds ds4 with nvcc: none found (set CUDA_HOME or put nvcc on PATH)")
        if not home:
            home = str(Path(nvcc).resolve().parent.parent)
        return cls(nvcc, _cc(), home)


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or ""
    if not cc:
        raise BadInput("ds4lab ds4 builds ds4 with a C compiler: no cc or gcc on PATH")
    return cc


@dataclass(frozen=True)
class BuildPlan:
    """What a build runs, before it runs: the make variables and the two commands after ``make``."""

    arch: str
    jobs: int
    make_vars: dict
    toolchain: Toolchain
    extra_include: tuple = ()
    extra_lib: tuple = ()
    #: apply ds4lab's stage-0 rewrite (:mod:`ds4lab.ds4.rewrite`) to the build's copy of ``ds4_cuda.cu``
    rewrite: bool = False
    #: which rewrite: ``"0"``, or ``"3"`` (stage 0 with argument slots and the dry pass: :mod:`ds4lab.ds4.rewrite3`)
    rewrite_stage: str = "0"

    @property
    def flags_digest(self) -> str:
        """First 12 hex digits of SHA-256 over the make variables and the toolchain: what ds4's objects depend on
        besides the sources (not ds4lab's driver, which is relinked with the same objects)."""
        h = hashlib.sha256(json.dumps(self.make_vars, sort_keys=True).encode())
        h.update(json.dumps([self.toolchain.nvcc, self.toolchain.cc, list(self.extra_include),
                             list(self.extra_lib)]).encode())
        return h.hexdigest()[:12]

    @property
    def driver_digest(self) -> str:
        """First 12 hex digits of SHA-256 over ds4lab's driver source (``csrc/ds4lab_ds4.c``, and the headers it
        includes, ``csrc/ds4lab_hooks.h`` and ``csrc/ds4lab_dry.h``)."""
        h = hashlib.sha256(DRIVER_SOURCE.read_bytes())
        for name in ("ds4lab_hooks.h", "ds4lab_dry.h"):
            header = DRIVER_SOURCE.with_name(name)
            if header.is_file():
                h.update(header.read_bytes())
        return h.hexdigest()[:12]

    def make_command(self, src: Path, targets) -> list[str]:
        """``make -C src -j N VAR=... targets`` (ds4's own Makefile)."""
        return ["make", "-C", str(src), f"-j{self.jobs}", *(f"{k}={v}" for k, v in self.make_vars.items()), *targets]

    @property
    def objects_var(self) -> str:
        """The Makefile variable that lists the engine's objects: ``CORE_OBJS`` (CUDA), ``CPU_CORE_OBJS``."""
        return "CPU_CORE_OBJS" if self.arch == CPU else "CORE_OBJS"

    def driver_command(self, src: Path, out: Path) -> list[str]:
        """Compile ds4lab's driver against ds4's header (position-independent)."""
        inc = [f"-I{src}", f"-I{Path(__file__).with_name('csrc')}", f"-I{self.toolchain.cuda_home}/include",
               *(f"-I{d}" for d in self.extra_include)]  # csrc: the hooks' header the driver includes
        cpu = ["-DDS4LAB_CPU_ONLY"] if self.arch == CPU else []
        return [self.toolchain.cc, "-O2", "-fPIC", "-std=c11", "-D_GNU_SOURCE", "-Wall", *cpu, *inc, "-c",
                str(DRIVER_SOURCE), "-o", str(out)]

    def link_command(self, src: Path, objects, driver_obj: Path, out: Path) -> list[str]:
        """``nvcc -shared`` of the driver and ds4's objects with cudart and cuBLAS (ds4's ``CUDA_LDLIBS``)."""
        if self.arch == CPU:
            return [self.toolchain.cc, "-shared", "-o", str(out), str(driver_obj), *(str(src / o) for o in objects),
                    "-lm", "-pthread"]
        dirs = [f"{self.toolchain.cuda_home}/lib64", *self.extra_lib]
        libs = [*(f"-L{d}" for d in dirs), *(f"-Xlinker -rpath={d}" for d in dirs)]
        # the rpath: the library finds cudart and cuBLAS where it was linked, whatever LD_LIBRARY_PATH says
        return [self.toolchain.nvcc, "-shared", f"-arch={self.arch}", "-o", str(out), str(driver_obj),
                *(str(src / o) for o in objects), *" ".join(libs).split(), "-lcudart", "-lcublas", "-lm",
                "-Xcompiler", "-pthread"]


def build_plan(arch: str, *, jobs: int | None = None, toolchain: Toolchain | None = None,
               extra_include=(), extra_lib=(), rewrite: bool = False, host_march: str = "native",
               rewrite_stage: str = "0") -> BuildPlan:
    """The build for GPU architecture ``arch`` (``sm_90`` for an H100/H200), or :data:`CPU` (ds4's CPU objects, for
    testing the driver without a GPU). The make variables restate ds4's own Linux flags whole, with ``-fPIC`` added and
    the debug flags left out; ``host_march`` replaces ``-march=native``; ``rewrite`` applies stage 0
    (:mod:`ds4lab.ds4.rewrite`) to the build's copy of ``ds4_cuda.cu``, with ``rewrite_stage="3"`` stage 3's argument
    slots and dry pass too. Raises BadInput: ``arch`` is not ``sm_<digits>[a]``, ``host_march`` is not a plain
    ``-march`` value, or ``rewrite_stage`` is not a rewrite stage."""
    from .rewrite import STAGES
    import re

    if arch != CPU and not re.fullmatch(r"sm_\d{2,3}a?", arch):
        raise BadInput(f"--arch {arch}: give a CUDA architecture such as sm_90")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", host_march):
        raise BadInput(f"--host-march {host_march!r}: give a -march value such as native or x86-64-v3")
    if rewrite_stage not in STAGES:
        raise BadInput(f"rewrite stage {rewrite_stage!r}: choose from {', '.join(STAGES)}")
    march = f"-march={host_march}"
    tc = toolchain or (Toolchain(nvcc="", cc=_cc(), cuda_home="") if arch == CPU else Toolchain.find())
    inc = " ".join(f"-I{d}" for d in extra_include)
    make_vars = {
        "CC": tc.cc,
        "NVCC": tc.nvcc,
        "CUDA_HOME": tc.cuda_home,
        "CUDA_ARCH": arch,
        "CFLAGS": f"-O3 -ffast-math {march} -Wall -Wextra -std=c99 -D_GNU_SOURCE -fno-finite-math-only -fPIC {inc}".strip(),
        "NVCCFLAGS": f"-O3 --use_fast_math -arch={arch} -Xcompiler {march} -Xcompiler -pthread "
                     f"-Xcompiler -fPIC {inc}".strip(),
    }
    if arch == CPU:
        make_vars = {"CC": tc.cc, "CFLAGS": make_vars["CFLAGS"]}
    return BuildPlan(arch, jobs or os.cpu_count() or 4, make_vars, tc, tuple(extra_include), tuple(extra_lib),
                     rewrite=bool(rewrite), rewrite_stage=str(rewrite_stage))


@dataclass
class Build:
    """A finished build: the library, and what made it (``build.json``)."""

    folder: Path
    library: Path
    info: dict = field(default_factory=dict)
    cached: bool = False


def cache_root() -> Path:
    """``$DS4LAB_CACHE`` or ``~/.cache/ds4lab``."""
    return Path(os.environ.get("DS4LAB_CACHE") or Path.home() / ".cache" / "ds4lab")


def folder_name(src: Ds4Source, plan: BuildPlan) -> str:
    """The build's folder in the cache: ``build-<commit>-<source digest>-<arch>[-rw<rewritten digest>]-<flags digest>``
    (a rewritten build keyed by the text it compiles too: :func:`rewritten_digest`)."""
    rw = f"-rw{rewritten_digest(src, plan.rewrite_stage)}" if plan.rewrite else ""
    return f"build-{src.commit[:12] or 'nocommit'}-{src.digest}-{plan.arch}{rw}-{plan.flags_digest}"


def build(src: Ds4Source, plan: BuildPlan, *, cache: Path | None = None, say=print,
          cached_only: bool = False) -> Build:
    """Build ``src`` with ``plan`` into the cache, or return the cached build; builds of one cache folder take turns.
    ``cached_only``: never run ds4's make (a cached build whose driver changed is still relinked). Raises BuildError: a
    step failed (the message names it and the kept log, ``build.log``), or with ``cached_only`` the build is not in the
    cache (the folder looked for is named)."""
    import fcntl

    root = Path(cache or cache_root()) / "ds4"
    name = folder_name(src, plan)
    root.mkdir(parents=True, exist_ok=True)
    # one build of a folder at a time: a second run waits for the first and then finds its build
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(src, plan, root, name, say, cached_only)


def _build_locked(src: Ds4Source, plan: BuildPlan, root: Path, name: str, say, cached_only: bool = False) -> Build:
    folder = root / name
    info_path = folder / "build.json"
    if info_path.is_file() and (folder / LIBRARY_NAME).is_file():
        info = json.loads(info_path.read_text())
        if info.get("driver_digest") == plan.driver_digest:
            say(f"ds4 build: cached ({folder})")
            return Build(folder, folder / LIBRARY_NAME, info, cached=True)
        if all((folder / "src" / o).is_file() for o in info.get("objects", ())) and info.get("objects"):
            return _relink(folder, info, plan, say)
        say("ds4 build: ds4lab's driver changed and ds4's objects are not kept: building again")
    if cached_only:
        raise BuildError(f"no cached build of ds4 at {folder} (--no-build: ds4 is not built here); a build "
                         "carried from another machine must be made with the same toolchain paths and flags")
    if folder.exists():  # an earlier build stopped before build.json: start again
        shutil.rmtree(folder)
    folder.mkdir()
    log_path = folder / "build.log"
    steps = []
    t_all = time.monotonic()
    with open(log_path, "w") as log:
        def failed(step: str, rc: int, tail: str) -> BuildError:
            kept = _set_aside(folder)
            return BuildError(f"ds4 build failed at {step} (exit {rc}); compiler output kept in "
                              f"{kept / 'build.log'}:\n{tail}")

        def run(step: str, cmd: list[str], cwd=None) -> str:
            return _run_step(log, steps, step, cmd, failed, cwd=cwd)

        src_dir = materialize(src, folder / "src")
        rewritten = _apply_rewrite(src_dir, folder, say, plan.rewrite_stage) if plan.rewrite else None
        (folder / "print-objs.mk").write_text(_PRINT_OBJS.format(var=plan.objects_var))
        out = run(f"list {plan.objects_var}", ["make", "-s", "--no-print-directory", "-C", str(src_dir), "-f", "Makefile",
                                     "-f", str(folder / "print-objs.mk"), *(f"{k}={v}" for k, v in plan.make_vars.items()),
                                     "ds4lab-print-objs"])
        objects = out.split()
        if not objects or not all(o.endswith(".o") for o in objects):
            failed = _set_aside(folder)
            raise BuildError(f"ds4's Makefile gave no object list for {plan.objects_var} ({out.strip()!r}); "
                             f"see {failed / 'build.log'}")
        say(f"ds4 build: make {len(objects)} objects with -j{plan.jobs} for {plan.arch} (about 3.5 min on 16 cores)")
        run(f"make {plan.objects_var}", plan.make_command(src_dir, objects))
        driver_obj = folder / "ds4lab_ds4.o"
        run("compile ds4lab's driver", plan.driver_command(src_dir, driver_obj))
        run("link the library", plan.link_command(src_dir, objects, driver_obj, folder / LIBRARY_NAME))
    info = {
        "schema": 1,
        "ds4_commit": src.commit,
        "ds4_source": str(src.path),
        "ds4_source_digest": src.digest,
        "arch": plan.arch,
        "flags_digest": plan.flags_digest,
        "driver_digest": plan.driver_digest,
        "make_vars": plan.make_vars,
        "objects": objects,
        "steps": steps,
        "seconds": round(time.monotonic() - t_all, 1),
        "nvcc": _first_line([plan.toolchain.nvcc, "--version"], last=True) if plan.toolchain.nvcc else "",
        "cc": _first_line([plan.toolchain.cc, "--version"]),
        "library_bytes": (folder / LIBRARY_NAME).stat().st_size,
        "rewrite": rewritten,
    }
    tmp = info_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(info_path)  # written last: its presence marks a complete build
    say(f"ds4 build: done in {info['seconds']:.0f} s ({folder / LIBRARY_NAME})")
    return Build(folder, folder / LIBRARY_NAME, info)


def rewritten_digest(src: Ds4Source, stage: str = "0") -> str:
    """First 12 hex digits of SHA-256 over ``ds4_cuda.cu`` as the rewrite of ``stage`` makes it from ``src``: a
    rewrite change that changes its output is a new build."""
    import tempfile

    from . import rewrite as RW

    with tempfile.TemporaryDirectory(prefix="ds4lab-rewrite-") as tmp:
        rw = RW.rewrite_checkout(materialize(src, Path(tmp) / "src"), write=False, stage=stage)
    return hashlib.sha256(rw.text.encode()).hexdigest()[:12]


def _apply_rewrite(src_dir: Path, folder: Path, say, stage: str = "0") -> dict:
    """Stage 0 (or 3) on the build's copy; every site into ``rewrite-sites.csv`` (with the other CUDA files' launch
    sites). Returns the summary ``build.json`` keeps; an unroutable site is named by file and line."""
    import csv

    from . import rewrite as RW

    rw = RW.rewrite_checkout(src_dir, stage=stage)
    rows = rw.rows() + [s.__dict__.copy() for s in RW.other_launch_sites(src_dir)]
    with open(folder / "rewrite-sites.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    counts: dict = {}
    for (kind, stream, action), n in rw.counts().items():  # named streams together (the CSV names each)
        key = " / ".join((kind, RW.NAMED if stream.startswith(RW.NAMED) else stream, action))
        counts[key] = counts.get(key, 0) + n
    unrouted = [f"{s.file}:{s.line} {s.kind}: {s.why}" for s in rw.unrouted]
    say(f"ds4 build: rewrite (stage {stage}) routed {sum(rw.launches().values())} launch sites "
        f"({', '.join(f'{v} {k}' for k, v in rw.launches().items())}), {len(rw.sites)} sites in all"
        + (f"; NOT routed: {'; '.join(unrouted)}" if unrouted else ""))
    return {"version": RW.VERSION, "stage": stage,
            "rewritten_digest": hashlib.sha256(rw.text.encode()).hexdigest()[:12],
            "launch_sites": rw.launches(), "sites": len(rw.sites), "counts": counts, "unrouted": unrouted}


def _run_step(log, steps: list, step: str, cmd: list[str], failed, cwd=None) -> str:
    """Run one build command: its command line and output into ``log``, its record (step, command, seconds, exit
    status) onto ``steps``; returns its output. A non-zero exit raises ``failed(step, returncode, last 15 lines)``.
    """
    log.write(f"\n$ {shlex.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(p.stdout)
    log.flush()
    steps.append({"step": step, "command": shlex.join(cmd), "seconds": round(time.monotonic() - t0, 1),
                  "returncode": p.returncode})
    if p.returncode != 0:
        raise failed(step, p.returncode, "\n".join(p.stdout.strip().splitlines()[-15:]))
    return p.stdout


def _relink(folder: Path, info: dict, plan: BuildPlan, say) -> Build:
    """A cached build whose ds4 objects stand and whose driver changed: compile the driver and link the library again
    (seconds), the library replaced only once linked. Raises BuildError with the log."""
    src_dir, lib = folder / "src", folder / LIBRARY_NAME
    new_lib = folder / (LIBRARY_NAME + ".new")
    steps = []

    def failed(step: str, rc: int, tail: str) -> BuildError:
        return BuildError(f"ds4 relink failed at {step} (exit {rc}); output in {folder / 'build.log'}:\n{tail}")

    with open(folder / "build.log", "a") as log:
        for step, cmd in (("compile ds4lab's driver", plan.driver_command(src_dir, folder / "ds4lab_ds4.o")),
                          ("link the library", plan.link_command(src_dir, info["objects"], folder / "ds4lab_ds4.o",
                                                                 new_lib))):
            _run_step(log, steps, step, cmd, failed)
    new_lib.replace(lib)
    info = {**info, "driver_digest": plan.driver_digest, "relinked": steps, "library_bytes": lib.stat().st_size}
    tmp = folder / "build.json.tmp"
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(folder / "build.json")
    say(f"ds4 build: ds4's objects cached, ds4lab's driver compiled and linked again ({lib})")
    return Build(folder, lib, info, cached=True)


def _set_aside(folder: Path) -> Path:
    dest = folder.with_name(f"{folder.name}.failed-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(dest)
    return dest


def _first_line(cmd, last: bool = False) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out[-1] if last else out[0]) if out else ""


def gpu_arch() -> str:
    """``sm_<major><minor>`` of GPU 0 (``nvidia-smi --query-gpu=compute_cap``). Raises BadInput when no GPU answers."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(f"ds4lab ds4 runs ds4 on an NVIDIA GPU: nvidia-smi did not answer ({e})") from None
    cap = p.stdout.strip().splitlines()[0].strip() if p.returncode == 0 and p.stdout.strip() else ""
    if not cap or "." not in cap:
        raise BadInput("ds4lab ds4 runs ds4 on an NVIDIA GPU: none found (nvidia-smi lists no GPU)")
    major, minor = cap.split(".", 1)
    return f"sm_{major}{minor}"
