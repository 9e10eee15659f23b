"""Write a Flash-shaped GGUF with synthetic weights that ds4 opens, sparse: the ``gguf`` package lays out the file,
ds4lab sets its length with ``ftruncate`` and ``pwrite``s only the ``random`` tensors (the routed experts stay holes),
then checks the layout with ``gguf.GGUFReader`` before the file gets its name. Values: :func:`tensor_bytes`."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import BadInput
from .gguf_model import (ALIGNMENT, MetaKV, TensorSpec, ds4_metadata, ds4_tensors, plan_totals,
                         synthetic_config)

#: Standard deviation of a uniform random byte read as int8 (-128..127).
_INT8_STD = float(np.sqrt((256**2 - 1) / 12.0))
#: Elements generated per step of a large tensor (bounded memory: ~64 MiB of float32).
_CHUNK = 1 << 24
#: Free space kept on top of the bytes written before the writer agrees to start.
DISK_MARGIN = 256 << 20
#: The marker key of files ds4lab wrote (:func:`read_marker`).
MARKER_KEY = "ds4lab.synthetic"


@dataclass(frozen=True)
class SyntheticModel:
    """A synthetic model file as written: ``path``, ``preset``, ``seed``, ``dense`` (``"random"`` or ``"holes"``);
    ``apparent_bytes`` (``st_size``), ``written_bytes`` (metadata plus random tensors), ``allocated_bytes``
    (``st_blocks`` × 512); ``n_tensors``, ``n_hole_tensors``, ``hole_bytes``; ``data_offset`` (where tensor data
    starts), ``metadata_sha256`` (of the bytes before it); ``seconds`` (wall time of the write)."""

    path: Path
    preset: str
    seed: int
    dense: str
    apparent_bytes: int
    written_bytes: int
    allocated_bytes: int
    n_tensors: int
    n_hole_tensors: int
    hole_bytes: int
    data_offset: int
    metadata_sha256: str
    seconds: float


# ----------------------------------------------------------------------------- random values
def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _f16(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f2").tobytes()


def _chunks(n: int, step: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def q8_0_scale(fan_in: int) -> float:
    """The one fp16 scale of a synthetic Q8_0 matrix with ``fan_in`` inputs: uniform int8 quants times it have
    standard deviation 1/sqrt(fan_in) (unit-RMS in, unit-RMS out); above fp16's smallest normal at 4096 inputs."""
    return 1.0 / (_INT8_STD * float(np.sqrt(fan_in)))


def tensor_bytes(spec: TensorSpec, seed: int, *, n_experts: int | None = None) -> Iterator[tuple[int, bytes]]:
    """The synthetic bytes of one ``random`` tensor, as ``(byte offset within the tensor, bytes)`` pieces of at most
    :data:`_CHUNK` elements, seeded per tensor (``default_rng([seed, crc32(name)])``). By ``spec.init`` (E = fan-in,
    ``spec.shape[0]``): ``norm`` F32 1 + 0.1·U(-1, 1); ``embedding`` F16 N(0, 1) clipped to ±4; ``q8_0`` uniform int8
    quants with the fp16 scale :func:`q8_0_scale`; ``f16_matrix`` F16 N(0, 1/E); ``bias`` F32 N(0, 0.1²); ``sinks`` F32
    N(0, 1); ``hc_scale`` F32 U(0.5, 1.5); ``hc_base`` F32 N(0, 0.5²); ``ape`` F16 N(0, 0.5²); ``tid2eid`` I32
    ``shape[0]`` distinct experts per row; ``experts``: random super-blocks with fp16 scale fields
    (:data:`~ds4lab.ds4.gguf_model.EXPERT_BLOCKS`) set to 2⁻¹⁰. Raises BadInput: a spec that is a hole, an ``init`` this
    writer has no values for, or a ``tid2eid`` table without ``n_experts`` (or with fewer experts than a row holds)."""
    if spec.fill != "random":
        raise BadInput(f"tensor {spec.name} is a {spec.fill}, it has no bytes to write")
    rng = _rng(seed, spec.name)
    n = spec.n_elements
    init = spec.init
    if init == "q8_0":
        nb = n // 32
        scale = np.frombuffer(_f16(np.array([q8_0_scale(spec.shape[0])])), dtype=np.uint8)
        step = _CHUNK // 32
        for lo, hi in _chunks(nb, step):
            blk = np.empty((hi - lo, 34), dtype=np.uint8)
            blk[:, :2] = scale
            blk[:, 2:] = np.frombuffer(rng.bytes((hi - lo) * 32), dtype=np.uint8).reshape(-1, 32)
            yield lo * 34, blk.tobytes()
        return
    if init == "experts":
        from .gguf_model import EXPERT_BLOCKS

        size, scales = EXPERT_BLOCKS[spec.ggml_type]
        nb = n // 256
        small = np.frombuffer(_f16(np.array([2.0 ** -10])), dtype=np.uint8)
        for lo, hi in _chunks(nb, max(1, _CHUNK // 256)):
            blk = np.frombuffer(rng.bytes((hi - lo) * size), dtype=np.uint8).reshape(-1, size).copy()
            for off in scales:
                blk[:, off:off + 2] = small
            yield lo * size, blk.tobytes()
        return
    if init == "tid2eid":
        k, rows = spec.shape
        if n_experts is None or n_experts < k:
            raise BadInput(f"tensor {spec.name}: n_experts={n_experts!r}; a hash table of {k} experts per "
                           f"token needs at least {k}")
        n_exp = int(n_experts)
        ids = rng.integers(0, n_exp, size=(rows, k), dtype=np.int64)
        while True:  # redraw the rows that picked an expert twice
            s = np.sort(ids, axis=1)
            dup = (s[:, 1:] == s[:, :-1]).any(axis=1)
            if not dup.any():
                break
            ids[dup] = rng.integers(0, n_exp, size=(int(dup.sum()), k), dtype=np.int64)
        yield 0, ids.astype("<i4").tobytes()
        return
    f16 = spec.ggml_type == "F16"
    esize = 2 if f16 else 4
    fan_in = spec.shape[0]
    for lo, hi in _chunks(n, _CHUNK):
        m = hi - lo
        if init == "norm":
            v = 1.0 + 0.1 * rng.uniform(-1.0, 1.0, m)
        elif init == "embedding":
            v = np.clip(rng.standard_normal(m, dtype=np.float32), -4.0, 4.0)
        elif init == "f16_matrix":
            v = rng.standard_normal(m, dtype=np.float32) / np.float32(np.sqrt(fan_in))
        elif init == "bias":
            v = 0.1 * rng.standard_normal(m)
        elif init == "sinks":
            v = rng.standard_normal(m)
        elif init == "hc_scale":
            v = rng.uniform(0.5, 1.5, m)
        elif init in ("hc_base", "ape"):
            v = 0.5 * rng.standard_normal(m)
        else:
            raise BadInput(f"tensor {spec.name}: no synthetic values for init={init!r}")
        yield lo * esize, (_f16(v) if f16 else np.ascontiguousarray(v, dtype="<f4").tobytes())


# ----------------------------------------------------------------------------- marker
def read_marker(path: str | os.PathLike) -> dict | None:
    """ds4lab's marker keys (``ds4lab.*``, string and uint32) of a GGUF file, or None for any other file; reads only
    the header and the first 16 metadata keys, so it is cheap on any file."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except (IsADirectoryError, PermissionError, FileNotFoundError):
        return None
    if len(head) < 24 or head[:4] != b"GGUF":
        return None
    (n_kv,) = struct.unpack_from("<Q", head, 16)
    pos, found = 24, {}
    try:
        for _ in range(min(n_kv, 16)):
            (klen,) = struct.unpack_from("<Q", head, pos)
            key = head[pos + 8:pos + 8 + klen].decode("utf-8")
            pos += 8 + klen
            (vt,) = struct.unpack_from("<I", head, pos)
            pos += 4
            if vt == 8:  # STRING
                (slen,) = struct.unpack_from("<Q", head, pos)
                val: object = head[pos + 8:pos + 8 + slen].decode("utf-8")
                pos += 8 + slen
            elif vt == 4:  # UINT32
                (val,) = struct.unpack_from("<I", head, pos)
                pos += 4
            else:
                break
            if key.startswith("ds4lab."):
                found[key] = val
    except (struct.error, UnicodeDecodeError):
        return None
    return found if MARKER_KEY in found else None


# ----------------------------------------------------------------------------- writer
def _add_kv(w, kv: MetaKV) -> None:
    if kv.key == "general.architecture":
        return  # GGUFWriter writes it first, from its arch argument
    if kv.vtype == "UINT32":
        w.add_uint32(kv.key, kv.value)
    elif kv.vtype == "FLOAT32":
        w.add_float32(kv.key, kv.value)
    elif kv.vtype == "BOOL":
        w.add_bool(kv.key, kv.value)
    elif kv.vtype == "STRING":
        w.add_string(kv.key, kv.value)
    elif kv.vtype == "ARRAY":
        w.add_array(kv.key, kv.value)
    else:
        raise BadInput(f"metadata {kv.key}: unsupported value type {kv.vtype!r}")


def _check_target(path: Path) -> None:
    if path.exists() or path.is_symlink():
        if path.is_dir():
            raise BadInput(f"path={str(path)!r} is a directory; give a file name for the model")
        if read_marker(path) is None:
            raise BadInput(f"path={str(path)!r} exists and was not written by ds4lab (no {MARKER_KEY} key); "
                           "refusing to overwrite it: remove it yourself or choose another path")
    if not path.parent.is_dir():
        raise BadInput(f"path={str(path)!r}: folder {str(path.parent)!r} does not exist")


def write_synthetic_model(path: str | os.PathLike, *, preset: str = "ds4-flash", seed: int = 0,
                          dense: str = "random", random_expert_layers=(),
                          progress: Callable[[str, int, int], None] | None = None) -> SyntheticModel:
    """Write a GGUF that ds4 accepts, with synthetic weights, as a sparse file at ``path`` (tensors and metadata:
    :func:`ds4lab.ds4.gguf_model.ds4_tensors`, :func:`~ds4lab.ds4.gguf_model.ds4_metadata`). Written under a temporary
    name and renamed when whole; on any error the temporary file is removed and ``path`` left as it was.

    ``path``: replaced only if ds4lab wrote it (:func:`read_marker`); ``preset``: ds4 opens ``ds4-flash`` and
    ``ds4-flash-q4k``; ``seed``: 0..2**32-1; ``dense``: the large Q8_0 matrices ``"random"`` or ``"holes"``;
    ``random_expert_layers``: layers whose routed experts are random blocks; ``progress(name, written, total)``.
    Returns a :class:`SyntheticModel`.

    Raises:
        BadInput: bad ``preset``/``seed``/``dense``; ``path`` a directory, in a missing folder, or an existing file
            ds4lab did not write; less free disk than the bytes to write plus :data:`DISK_MARGIN`.
        OSError: the write itself failed (the temporary file is removed)."""
    cfg = synthetic_config(preset)
    specs = ds4_tensors(cfg, dense=dense, random_expert_layers=random_expert_layers)
    meta = ds4_metadata(cfg, seed=seed, dense=dense)
    return write_gguf(path, specs, meta, seed=seed, n_experts=cfg.n_experts, progress=progress)


def write_gguf(path: str | os.PathLike, specs: list[TensorSpec], meta: list[MetaKV], *, seed: int = 0,
               n_experts: int | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> SyntheticModel:
    """Write ``meta`` and ``specs`` as a sparse GGUF at ``path``, as :func:`write_synthetic_model` does, for any
    (edited) tensor list; ``meta`` must start with ``general.architecture`` and carry ds4lab's marker keys. Same
    errors as :func:`write_synthetic_model`."""
    import gguf

    t0 = time.perf_counter()  # wall time of the write, reported; nothing measured with it
    path = Path(path)
    marks = {kv.key: kv.value for kv in meta if kv.key.startswith("ds4lab.")}
    if MARKER_KEY not in marks or not meta or meta[0].key != "general.architecture":
        raise BadInput(f"metadata for {str(path)!r} must start with general.architecture and carry {MARKER_KEY}")
    _check_target(path)
    totals = plan_totals(specs)
    free = shutil.disk_usage(path.parent).free
    need = totals["random_bytes"] + DISK_MARGIN
    if free < need:
        raise BadInput(f"not enough free disk in {str(path.parent)!r} for {path.name}: it writes "
                       f"{totals['random_bytes']} bytes ({totals['random_bytes'] / 2**30:.2f} GiB; the file's "
                       f"apparent size is {totals['tensor_bytes'] / 2**30:.1f} GiB, mostly holes) and keeps "
                       f"{DISK_MARGIN >> 20} MiB spare, but {free} bytes ({free / 2**30:.2f} GiB) are free")
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    fd = -1
    try:
        w = gguf.GGUFWriter(tmp, arch=str(meta[0].value))
        for kv in meta:
            _add_kv(w, kv)
        w.data_alignment = ALIGNMENT
        for s in specs:
            # the writer takes numpy-order shapes and writes them reversed (GGUF order)
            w.add_tensor_info(s.name, tuple(reversed(s.shape)), np.dtype(np.float32), s.nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[s.ggml_type])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        header_end = w.fout[0].tell()
        w.close()
        data_offset = gguf.GGUFWriter.ggml_pad(header_end, ALIGNMENT)
        offsets, pos = [], 0
        for s in specs:  # the layout write_ti_data_to_file wrote
            offsets.append(data_offset + pos)
            pos += gguf.GGUFWriter.ggml_pad(s.nbytes, ALIGNMENT)
        total = data_offset + pos

        fd = os.open(tmp, os.O_RDWR)
        os.ftruncate(fd, total)
        _verify_layout(tmp, specs, offsets, meta)
        sha = hashlib.sha256(os.pread(fd, data_offset, 0)).hexdigest()

        written = 0
        for s, off in zip(specs, offsets):
            if s.fill != "random":
                continue
            for rel, buf in tensor_bytes(s, seed, n_experts=n_experts):
                _pwrite_all(fd, buf, off + rel)
                written += len(buf)
            if progress is not None:
                progress(s.name, written, totals["random_bytes"])
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    st = os.stat(path)
    holes = [s for s in specs if s.fill != "random"]
    return SyntheticModel(
        path=path, preset=str(marks.get("ds4lab.preset", "")), seed=seed, dense=str(marks.get("ds4lab.dense", "")),
        apparent_bytes=st.st_size, written_bytes=header_end + written, allocated_bytes=st.st_blocks * 512,
        n_tensors=len(specs), n_hole_tensors=len(holes), hole_bytes=sum(s.nbytes for s in holes),
        data_offset=data_offset, metadata_sha256=sha, seconds=time.perf_counter() - t0)


def _pwrite_all(fd: int, buf: bytes, offset: int) -> None:
    view = memoryview(buf)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _fsync_dir(folder: Path) -> None:
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _verify_layout(path: Path, specs: list[TensorSpec], offsets: list[int], meta: list[MetaKV]) -> None:
    """Read the file back with ``gguf.GGUFReader``: tensor names, types, shapes and data offsets must be what ds4lab
    declared and is about to write at (the library's layout, not a copy of it)."""
    import gguf

    r = gguf.GGUFReader(path, "r")
    if len(r.tensors) != len(specs):
        raise RuntimeError(f"{path}: GGUFReader reads {len(r.tensors)} tensors, {len(specs)} were declared")
    for t, s, off in zip(r.tensors, specs, offsets):
        if (t.name != s.name or t.tensor_type.name != s.ggml_type or tuple(int(d) for d in t.shape) != s.shape
                or int(t.data_offset) != off or int(t.n_bytes) != s.nbytes):
            raise RuntimeError(f"{path}: tensor {s.name}: GGUFReader reads {t.name} {t.tensor_type.name} "
                               f"{tuple(int(d) for d in t.shape)} at {int(t.data_offset)} ({int(t.n_bytes)} bytes); "
                               f"declared {s.ggml_type} {s.shape} at {off} ({s.nbytes} bytes)")
    if r.alignment != ALIGNMENT:
        raise RuntimeError(f"{path}: GGUFReader reads alignment {r.alignment}, declared {ALIGNMENT}")
    missing = [kv.key for kv in meta if kv.key not in r.fields]
    if missing:
        raise RuntimeError(f"{path}: metadata keys missing after writing: {', '.join(missing)}")


def main(argv: list[str] | None = None) -> int:
    """``python -m ds4lab.ds4.gguf_writer PATH [--preset P] [--seed N] [--dense random|holes]``: write a synthetic
    model and print what was written. Exit 2 on bad input."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ds4lab.ds4.gguf_writer", description=main.__doc__)
    ap.add_argument("path")
    ap.add_argument("--preset", default="ds4-flash")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dense", default="random")
    a = ap.parse_args(argv)
    last = [0.0]

    def show(name: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] > 5 or done == total:
            last[0] = now
            print(f"  {done / 2**30:6.2f} / {total / 2**30:.2f} GiB  {name}", flush=True)

    try:
        m = write_synthetic_model(a.path, preset=a.preset, seed=a.seed, dense=a.dense, progress=show)
    except BadInput as e:
        print(f"error: {e}")
        return 2
    print(f"{m.path}: {m.n_tensors} tensors ({m.n_hole_tensors} holes), apparent {m.apparent_bytes} bytes "
          f"({m.apparent_bytes / 2**30:.2f} GiB), written {m.written_bytes} ({m.written_bytes / 2**30:.2f} GiB), "
          f"allocated {m.allocated_bytes} ({m.allocated_bytes / 2**30:.2f} GiB), metadata sha256 "
          f"{m.metadata_sha256}, {m.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
