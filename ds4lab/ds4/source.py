"""A ds4 checkout (folder or ``.tar.gz``) as ds4lab takes it: where it is, its commit, a digest of what it holds. The
user's checkout is never written to (:mod:`ds4lab.ds4.build` copies it first)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput

#: Files that make a folder a ds4 checkout: the public API, the engine, the CUDA back end, the Makefile.
REQUIRED = ("ds4.h", "ds4.c", "ds4_cuda.cu", "Makefile")
#: Suffixes of the files whose bytes make up :attr:`Ds4Source.digest`.
SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh", ".inc", "Makefile")
_COMMIT_IN_NAME = re.compile(r"ds4[-_]([0-9a-f]{7,40})(?:\.tar\.gz|\.tgz)?$")


@dataclass(frozen=True)
class Ds4Source:
    """One ds4 checkout: ``path`` (absolute), ``kind`` (``"folder"`` or ``"archive"``), ``commit`` (git's, else the
    ``ds4-<commit>`` part of the name, else ``""``), ``digest`` (SHA-256 of the sorted file names and bytes, 16 hex
    digits: the build cache's key)."""

    path: Path
    kind: str
    commit: str
    digest: str

    @property
    def label(self) -> str:
        """``ds4 <commit>`` or ``ds4 (no commit; sources <digest>)``: how figures name it."""
        return f"ds4 {self.commit}" if self.commit else f"ds4 (no commit; sources {self.digest})"


def locate(path) -> Ds4Source:
    """Check that ``path`` is a ds4 checkout (folder or ``.tar.gz``) and describe it. Raises BadInput: the path does not
    exist, or lacks one of :data:`REQUIRED` (named), or is an archive that cannot be read."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise BadInput(f"--source {path}: no such file or folder")
    if p.is_dir():
        missing = [f for f in REQUIRED if not (p / f).is_file()]
        if missing:
            raise BadInput(f"--source {path}: not a ds4 checkout (missing {', '.join(missing)})")
        return Ds4Source(p, "folder", _git_commit(p) or _commit_from_name(p.name), _folder_digest(p))
    if not p.name.endswith((".tar.gz", ".tgz")):
        raise BadInput(f"--source {path}: give a ds4 checkout folder or a .tar.gz of one")
    try:
        with tarfile.open(p, "r:gz") as tf:
            files = [m for m in tf.getmembers() if m.isfile()]
            root = _archive_root(m.name for m in files)
            members = {_norm(m.name)[len(root):]: m for m in files if _norm(m.name).startswith(root)}
            missing = [f for f in REQUIRED if f not in members]
            if missing:
                raise BadInput(f"--source {path}: archive is not a ds4 checkout (missing {', '.join(missing)})")
            h = hashlib.sha256()
            for name in sorted(members):
                if name.endswith(SOURCE_SUFFIXES):
                    h.update(name.encode() + b"\0")
                    h.update(tf.extractfile(members[name]).read())
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BadInput(f"--source {path}: cannot read the archive ({e})") from None
    return Ds4Source(p, "archive", _commit_from_name(p.name), h.hexdigest()[:16])


def materialize(src: Ds4Source, dest: Path) -> Path:
    """Copy ``src``'s files into ``dest`` (created) and return it: an archive unpacked from the folder that holds its
    ``ds4.h``, a folder without ``.git`` and build outputs. Raises FileExistsError when ``dest`` exists."""
    import shutil

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    if src.kind == "folder":
        shutil.copytree(src.path, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".git", "*.o", "*.so", "*.gguf"))
        return dest
    with tarfile.open(src.path, "r:gz") as tf:
        members = tf.getmembers()
        root = _archive_root(m.name for m in members if m.isfile())
        for m in members:
            name = _norm(m.name)
            if not name.startswith(root):
                continue
            rel = name[len(root):].rstrip("/")
            if not rel or not (m.isfile() or m.isdir()):
                continue
            target = (dest / rel).resolve()
            if dest.resolve() not in target.parents and target != dest.resolve():
                raise BadInput(f"--source {src.path}: archive member {m.name!r} points outside its folder")
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                with tf.extractfile(m) as f_in, open(target, "wb") as f_out:
                    shutil.copyfileobj(f_in, f_out)
                target.chmod(0o644 | (m.mode & 0o111))
    return dest


def _archive_root(names) -> str:
    """The folder inside an archive that holds ``ds4.h`` (``""`` for the archive's top, ``"ds4-x/"`` for a
    release-style archive with one top folder)."""
    cands = sorted((n for n in (_norm(n) for n in names) if n == "ds4.h" or n.endswith("/ds4.h")), key=len)
    return cands[0][: -len("ds4.h")] if cands else ""


def _norm(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def _git_commit(p: Path) -> str:
    if not (p / ".git").exists():
        return ""
    try:
        out = subprocess.run(["git", "-C", str(p), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()[:40] if out.returncode == 0 else ""


def _commit_from_name(name: str) -> str:
    m = _COMMIT_IN_NAME.search(name)
    return m.group(1) if m else ""


def _folder_digest(p: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")):
        if ".git" in f.parts or not f.is_file() or not f.name.endswith(SOURCE_SUFFIXES):
            continue
        h.update(str(f.relative_to(p)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
