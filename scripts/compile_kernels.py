#!/usr/bin/env python3
"""Compile every ``kernels/*.cu`` with NVRTC, for each target GPU architecture, without a GPU.

Why: CI (and most developer machines) have no GPU, so the GPU tests that load the kernels
through ``cupy.RawModule`` are skipped there, and a kernel that no longer compiles would go
unnoticed until someone runs on a lent GPU machine. NVRTC itself needs no GPU and no driver:
it is a library (``nvidia-cuda-nvrtc-cu12``) that turns CUDA C++ into a cubin for any
``sm_XX`` it supports. This script compiles each kernel file the way the ``cupy`` backend
does (``-std=c++17``, ``-I<kernels dir>``), plus the include folder that holds
``cuda_fp16.h`` (NVRTC 12 does not carry that header itself; the
``nvidia-cuda-runtime-cu12`` wheel ships it under ``site-packages/nvidia/cuda_runtime/include``),
for ``sm_80`` and ``sm_90`` by default.

Each file is compiled in two variants: ``plain`` (as every stage loads it) and ``pdl``
(``-DDS4_PDL=1``: the device-side half of programmatic dependent launch compiled in, the build the
``3p`` stages launch; ``kernels/common.cuh``, ``DS4_PDL_ENTRY``).

It prints one line per (file, arch, variant): ``OK`` with the cubin size and the kernels the file
defines, or ``FAIL`` followed by NVRTC's full compile log. It exits 0 when everything
compiled, 1 when any compile failed, 2 when it could not run at all (no NVRTC bindings, no
``cuda_fp16.h``, no ``.cu`` files, a bad ``--arch``).

Usage::

    python scripts/compile_kernels.py                       # sm_80 and sm_90
    python scripts/compile_kernels.py --arch sm_90
    python scripts/compile_kernels.py --arch sm_80 sm_90 --kernels-dir kernels
    python scripts/compile_kernels.py --variant pdl           # the PDL build only

Needs ``pip install -e ".[nvrtc12]"`` (``cuda-bindings`` 12.x, whose ``cuda.bindings.nvrtc`` finds the
NVRTC library of the ``nvidia-cuda-nvrtc-cu12`` wheel), or ``".[nvrtc13]"`` on a CUDA 13 machine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

DEFAULT_ARCHS = ("sm_80", "sm_90")
DEFAULT_KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
STD = "-std=c++17"
FP16_HEADER = "cuda_fp16.h"
#: Build variants: the extra options of each (``pdl``: ``kernels/common.cuh``'s DS4_PDL_ENTRY compiled in,
#: as ``ds4lab/backends/cupy_device_graphs.py`` builds the modules the programmatic launches use).
VARIANTS = {"plain": (), "pdl": ("-DDS4_PDL=1",)}

_ARCH_RE = re.compile(r"^sm_\d{2,3}[a-z]?$")
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# `__global__ void name(`, allowing extern "C" before and __launch_bounds__(...) on either side of `void`.
_KERNEL_RE = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    r"([A-Za-z_]\w*)\s*\("
)


class NvrtcUnavailable(RuntimeError):
    """``cuda.bindings.nvrtc`` cannot be imported or cannot load the NVRTC library."""


@dataclass
class CompileResult:
    """Outcome of compiling one kernel file for one architecture."""

    path: Path
    arch: str
    ok: bool
    log: str = ""
    kernels: list[str] = field(default_factory=list)
    cubin_size: int = 0
    not_in_cubin: list[str] = field(default_factory=list)
    seconds: float = 0.0
    variant: str = "plain"

    def describe(self) -> str:
        """The report for this (file, arch): one line, then the log (indented) when there is one."""
        name = self.path.name
        if self.ok:
            line = (f"OK    {name:<16} {self.arch:<6} {self.variant:<5} cubin {self.cubin_size:>7} B  "
                    f"{self.seconds:5.2f}s  kernels ({len(self.kernels)}): {', '.join(self.kernels) or '-'}")
            if self.not_in_cubin:
                line += f"  [note: not found in the cubin: {', '.join(self.not_in_cubin)}]"
        else:
            line = f"FAIL  {name:<16} {self.arch:<6} {self.variant:<5} ({self.path}) compile log:"
        log = self.log.strip()
        if log:
            line += "\n" + "\n".join("    " + ln for ln in log.splitlines())
        return line


# ------------------------------------------------------------------ environment


def load_nvrtc() -> Any:
    """The ``cuda.bindings.nvrtc`` module, checked to load the NVRTC library.

    Raises:
        NvrtcUnavailable: the bindings are missing, or the library cannot be loaded.
    """
    try:
        from cuda.bindings import nvrtc
    except Exception as e:  # ImportError, or a broken install raising at import
        raise NvrtcUnavailable(
            f"cuda.bindings.nvrtc is not importable ({type(e).__name__}: {e}); "
            'install it with: pip install -e ".[nvrtc12]" (".[nvrtc13]" for CUDA 13)'
        ) from e
    try:
        err, _major, _minor = nvrtc.nvrtcVersion()
    except Exception as e:  # the shared library itself could not be found/loaded
        raise NvrtcUnavailable(
            f"cuda.bindings.nvrtc cannot load the NVRTC library ({type(e).__name__}: {e}); "
            "install it with: pip install nvidia-cuda-nvrtc-cu12"
        ) from e
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcUnavailable(f"nvrtcVersion failed: {err}")
    return nvrtc


def nvrtc_version(nvrtc: Any) -> str:
    _err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _site_dirs() -> list[Path]:
    seen: list[Path] = []
    for p in [*sys.path, sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")]:
        if p and Path(p).is_dir() and Path(p) not in seen:
            seen.append(Path(p))
    return seen


def find_cuda_include_dir() -> Path | None:
    """The folder that holds ``cuda_fp16.h`` (and the headers it includes), or None.

    Search order: the ``nvidia-cuda-runtime-cu12`` wheel (``<site-packages>/nvidia/cuda_runtime/include``,
    the headers that match the cu12 NVRTC wheel); then ``cuda.pathfinder``'s header lookup
    where the installed version has one; then ``$CUDA_HOME`` / ``$CUDA_PATH`` and
    ``/usr/local/cuda``.
    """
    for site in _site_dirs():
        cand = site / "nvidia" / "cuda_runtime" / "include"
        if (cand / FP16_HEADER).is_file():
            return cand
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found and (Path(found) / FP16_HEADER).is_file():
            return Path(found)
    except Exception:  # not installed, too old to have the function, or the name unknown
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / FP16_HEADER).is_file():
            return Path(root) / "include"
    return None


# ------------------------------------------------------------------ compiling


def kernel_names(source: str) -> list[str]:
    """Names of the ``__global__`` functions defined in ``source`` (comments ignored), in order."""
    return _KERNEL_RE.findall(_COMMENT_RE.sub(" ", source))


def normalize_arch(arch: str) -> str:
    """``"90"`` or ``"sm_90"`` → ``"sm_90"``. Raises ValueError on anything else."""
    a = arch.strip().lower()
    if a.isdigit():
        a = f"sm_{a}"
    if not _ARCH_RE.match(a):
        raise ValueError(f"bad architecture {arch!r}: expected sm_NN (e.g. sm_80, sm_90, sm_90a)")
    return a


def _call(nvrtc: Any, result: Any, what: str) -> Any:
    """Unpack a cuda-bindings result tuple ``(err, *values)``; raise on an error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _e, msg = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{what} failed: {msg.decode(errors='replace') if isinstance(msg, bytes) else msg}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _decode(buf: bytes) -> str:
    return buf.rstrip(b"\x00").decode(errors="replace")


def _out_buffer(size: int) -> bytes:
    """A bytes object NVRTC may write ``size`` bytes into: a fresh one, never shorter than two bytes.
    CPython shares one object per single byte (``b" " * 1`` is the interpreter's ``b" "``): an empty
    log (size 1, its terminating NUL) written into it would turn every single-byte ``b" "`` of the
    process into ``b"\\x00"`` (a file's spaces read one byte at a time, among others)."""
    return b" " * max(int(size), 2)


def compile_kernel(path: Path, arch: str, include_dirs: Sequence[Path], nvrtc: Any = None,
                   variant: str = "plain") -> CompileResult:
    """Compile one ``.cu`` file for one ``sm_XX`` with NVRTC, in one of :data:`VARIANTS`, returning the
    outcome (never raising on a compile error: that is ``ok=False`` with NVRTC's log).

    Raises:
        KeyError: an unknown ``variant``.
    """
    nvrtc = nvrtc or load_nvrtc()
    path = Path(path)
    t0 = time.perf_counter()
    source = path.read_text()
    names = kernel_names(source)
    options = [f"--gpu-architecture={arch}", STD, *VARIANTS[variant]] + [f"-I{d}" for d in include_dirs]
    opts = [o.encode() for o in options]
    # The program name is the file's path, so NVRTC's messages read "<path>(line): error ...".
    prog = _call(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), str(path).encode(), 0, [], []),
                 f"nvrtcCreateProgram({path.name})")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _call(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = _out_buffer(size)
        _call(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = _decode(buf)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _e, msg = nvrtc.nvrtcGetErrorString(err)
            status = msg.decode(errors="replace") if isinstance(msg, bytes) else str(msg)
            log = f"{log.rstrip()}\n{status} (options: {' '.join(options)})".strip()
            return CompileResult(path, arch, False, log, names, seconds=time.perf_counter() - t0, variant=variant)
        n = _call(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = _out_buffer(n)
        _call(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    # extern "C" kernels keep their plain name as an ELF symbol; mangled C++ ones contain it.
    missing = [k for k in names if k.encode() not in cubin]
    if not cubin.strip(b" \x00"):
        return CompileResult(path, arch, False, (log + "\nNVRTC returned an empty cubin").strip(), names,
                             seconds=time.perf_counter() - t0, variant=variant)
    return CompileResult(path, arch, True, log, names, len(cubin), missing, time.perf_counter() - t0, variant)


def ptx_of(path: Path, arch: str, include_dirs: Sequence[Path], nvrtc: Any = None, variant: str = "plain") -> str:
    """The PTX NVRTC makes of one ``.cu`` file (one arch, one variant): what the device-side checks
    read (``tests/test_kernels_compile.py``: every kernel of the ``pdl`` build waits first).

    Raises:
        RuntimeError: the file does not compile (with NVRTC's log).
    """
    nvrtc = nvrtc or load_nvrtc()
    path = Path(path)
    options = [f"--gpu-architecture={arch}", STD, *VARIANTS[variant]] + [f"-I{d}" for d in include_dirs]
    opts = [o.encode() for o in options]
    prog = _call(nvrtc, nvrtc.nvrtcCreateProgram(path.read_text().encode(), str(path).encode(), 0, [], []),
                 f"nvrtcCreateProgram({path.name})")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _call(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            buf = _out_buffer(size)
            _call(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            raise RuntimeError(f"{path.name} [{arch}, {variant}] does not compile:\n{_decode(buf)}")
        n = _call(nvrtc, nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        buf = _out_buffer(n)
        _call(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        return _decode(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def kernel_files(kernels_dir: Path) -> list[Path]:
    """The ``*.cu`` files of ``kernels_dir``, sorted by name."""
    return sorted(Path(kernels_dir).glob("*.cu"))


def compile_all(kernels_dir: Path = DEFAULT_KERNELS_DIR, archs: Iterable[str] = DEFAULT_ARCHS,
                include_dirs: Sequence[Path] | None = None, nvrtc: Any = None,
                variants: Iterable[str] = ("plain",)) -> list[CompileResult]:
    """Compile every ``kernels_dir/*.cu`` for every arch and variant (:data:`VARIANTS`); one result per
    (file, arch, variant), in that order.

    ``include_dirs`` defaults to ``[kernels_dir, <folder of cuda_fp16.h>]``.

    Raises:
        NvrtcUnavailable: no usable NVRTC bindings.
        FileNotFoundError: no ``.cu`` file, or no ``cuda_fp16.h`` found.
        ValueError: a bad arch.
    """
    nvrtc = nvrtc or load_nvrtc()
    kernels_dir = Path(kernels_dir).resolve()
    archs = [normalize_arch(a) for a in archs]
    files = kernel_files(kernels_dir)
    if not files:
        raise FileNotFoundError(f"no .cu files in {kernels_dir}")
    if include_dirs is None:
        cuda_inc = find_cuda_include_dir()
        if cuda_inc is None:
            raise FileNotFoundError(
                f"{FP16_HEADER} not found (NVRTC 12 does not ship it); "
                "install it with: pip install nvidia-cuda-runtime-cu12"
            )
        include_dirs = [kernels_dir, cuda_inc]
    variants = list(variants)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variant(s) {', '.join(bad)}: choose from {', '.join(VARIANTS)}")
    return [compile_kernel(f, a, include_dirs, nvrtc, v) for f in files for a in archs for v in variants]


# ------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Compile kernels/*.cu with NVRTC for each GPU architecture (no GPU needed).")
    ap.add_argument("--arch", nargs="+", default=list(DEFAULT_ARCHS), metavar="SM",
                    help="target architectures, e.g. sm_80 sm_90 (default: %(default)s)")
    ap.add_argument("--kernels-dir", type=Path, default=DEFAULT_KERNELS_DIR,
                    help="folder of the .cu files and common.cuh (default: %(default)s)")
    ap.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="build variants: plain (every stage), pdl (-DDS4_PDL=1, the programmatic-launch stages); "
                         "default: both")
    ap.add_argument("--cuda-include", type=Path, default=None,
                    help=f"folder holding {FP16_HEADER} (default: found in the nvidia-cuda-runtime-cu12 wheel)")
    args = ap.parse_args(argv)

    try:
        archs = [normalize_arch(a) for a in args.arch]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        nvrtc = load_nvrtc()
    except NvrtcUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kernels_dir = args.kernels_dir.resolve()
    cuda_inc = args.cuda_include or find_cuda_include_dir()
    if cuda_inc is None or not (Path(cuda_inc) / FP16_HEADER).is_file():
        where = f" in {cuda_inc}" if cuda_inc else ""
        print(f"error: {FP16_HEADER} not found{where} (NVRTC 12 does not ship it); "
              "install it with: pip install nvidia-cuda-runtime-cu12", file=sys.stderr)
        return 2
    if not kernel_files(kernels_dir):
        print(f"error: no .cu files in {kernels_dir}", file=sys.stderr)
        return 2

    print(f"NVRTC {nvrtc_version(nvrtc)}; kernels: {kernels_dir}; {FP16_HEADER} from: {cuda_inc}; "
          f"archs: {' '.join(archs)}; variants: {' '.join(args.variant)}", flush=True)
    t0 = time.perf_counter()
    results = []
    for f in kernel_files(kernels_dir):
        for a in archs:
            for v in args.variant:
                r = compile_kernel(f, a, [kernels_dir, Path(cuda_inc)], nvrtc, v)
                print(r.describe(), flush=True)
                results.append(r)
    failed = [r for r in results if not r.ok]
    n_kernels = len({k for r in results for k in r.kernels})
    print(f"{len(results) - len(failed)}/{len(results)} compiles OK ({len(kernel_files(kernels_dir))} files x "
          f"{len(archs)} archs x {len(args.variant)} variants, {n_kernels} kernels) in {time.perf_counter() - t0:.1f}s")
    if failed:
        print("FAILED: " + ", ".join(f"{r.path.name} [{r.arch}, {r.variant}]" for r in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
