"""Zip submissions: unpacked before planning, their files counted for their student.

A ``.zip`` named on the command line, or found in a folder given (searched as notebooks are),
is unpacked into a temporary folder, and a zip inside it too (a Canvas download: one zip of
the class holding a zip per student), up to :data:`MAX_NESTING` levels. Every file inside
then stands where the zip stands: ``class/carol/hw.zip`` holding ``notebooks/03_x.ipynb`` is
``class/carol/hw.zip/notebooks/03_x.ipynb``, carol's (whose files a zip holds is
:mod:`.identity`'s: the student's folder or zip of the class, never a folder inside a zip),
and that is the path the outputs show.

Limits (an archive over one is refused, with a sentence, and listed among the student's
files not graded): no member outside the archive's folder (absolute names, ``..``: zip-slip)
and no links, at most :data:`MAX_MEMBERS` files and :data:`MAX_UNPACKED_BYTES` unpacked
bytes per hand-in (counted while they are written, whatever the archive claims): the zips
under one entry of a folder named on the command line (a student's folder) share one budget
with the zips inside them; each zip inside a zip named on the command line (a Canvas
download) has its own. No encrypted member, nothing that is no zip. A zip found in a folder
that is a symbolic link is never unpacked (it may point at another student's hand-in).
Every unpacked file gets the time of the zip it came from (the outermost one), so its
hand-in time and the copy rule see the zip's time, not the moment of unpacking.
Member names that are not UTF-8 (Windows' zips) are decoded
with surrogate escapes, as a file system's are.
"""
from __future__ import annotations

import os
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import Lesson10Error
from .accounting import SKIP_FOLDERS

#: files and bytes unpacked from the archives of one hand-in, and zips within zips
MAX_MEMBERS, MAX_UNPACKED_BYTES, MAX_NESTING = 5000, 1 << 30, 3


class UnsafeArchive(Lesson10Error, ValueError):
    """The archive is refused; the message says why (one sentence)."""


@dataclass
class Unpacked:
    """What the archives of a batch hold: ``roots`` (folders to search, as the command line's
    folders are), ``shown`` (real path -> the path inside the zip that the outputs show),
    ``zips`` (every zip unpacked, as shown: where its files stand, see :mod:`.identity`) and
    ``refused`` (zip as shown (its absolute path) -> why it was not unpacked)."""
    roots: list[Path] = field(default_factory=list)
    shown: dict[str, Path] = field(default_factory=dict)
    zips: list[Path] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    def show(self, path: Path) -> Path:
        """The path the outputs show for the real ``path`` (itself outside any zip)."""
        real = os.path.abspath(path)
        for top in self.roots:
            top_s = str(top)
            if real == top_s or real.startswith(top_s + os.sep):
                return Path(str(self.shown[top_s]), os.path.relpath(real, top_s))
        return Path(path)


@dataclass
class Budget:
    """What one hand-in's archives have unpacked so far (see the module's limits)."""
    members: int = 0
    size: int = 0


def find_zips(paths, links: list | None = None) -> list[Path]:
    """The ``.zip`` files named in ``paths`` or under its folders, in path order; a zip found
    in a folder that is a symbolic link is left out (appended to ``links`` when given)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for top, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_FOLDERS)
                for f in sorted(f for f in files if f.lower().endswith(".zip")
                                and not f.startswith(".")):
                    link = os.path.islink(os.path.join(top, f))
                    if not link:
                        out.append(Path(top) / f)
                    elif links is not None:
                        links.append(Path(top) / f)
        elif p.suffix.lower() == ".zip" and (p.is_file() or p.is_symlink()):
            out.append(p)
    return list(dict.fromkeys(out))


def member_name(info: zipfile.ZipInfo) -> str:
    """The member's name as a file system would decode it: UTF-8 where the archive says so
    (or where its bytes are), else its bytes with surrogate escapes."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        raw = info.filename.encode("cp437")            # what zipfile decoded it with
    except UnicodeEncodeError:
        return info.filename
    return raw.decode("utf-8", "surrogateescape")


def _check(info: zipfile.ZipInfo, name: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
        raise UnsafeArchive(f"its member {name!r} would be written outside the archive's "
                            f"folder (zip-slip)")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise UnsafeArchive(f"its member {name!r} is a symbolic link")
    if info.flag_bits & 0x1:
        raise UnsafeArchive(f"its member {name!r} is encrypted")


def _copy(src, dst: Path, budget: Budget) -> None:
    with open(dst, "wb") as out:
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            budget.size += len(chunk)
            if budget.size > MAX_UNPACKED_BYTES:
                raise UnsafeArchive(f"it unpacks to more than {MAX_UNPACKED_BYTES >> 20} MB (with "
                                    f"the other archives of the same hand-in)")
            out.write(chunk)


def _extract(archive: Path, target: Path, budget: Budget) -> None:
    """Unpack ``archive`` into ``target`` within the limits, or raise UnsafeArchive; every
    file written gets ``archive``'s modification time."""
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UnsafeArchive(f"it is not a zip archive that can be read ({exc})") from None
    when = os.stat(archive).st_mtime
    with zf:
        infos = zf.infolist()
        budget.members += len(infos)
        if budget.members > MAX_MEMBERS:
            raise UnsafeArchive(f"it holds more than {MAX_MEMBERS} files (with the other "
                                f"archives of the same hand-in)")
        names = [(info, member_name(info)) for info in infos]
        for info, name in names:
            _check(info, name)
        for info, name in names:
            dest = target.joinpath(*[p for p in name.replace("\\", "/").split("/") if p])
            try:
                if info.is_dir() or name.endswith(("/", "\\")):
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src:
                    _copy(src, dest, budget)
                os.utime(dest, (when, when))
            except (zipfile.BadZipFile, OSError, ValueError, RuntimeError, EOFError,
                    NotImplementedError) as exc:
                raise UnsafeArchive(f"its member {name!r} cannot be unpacked "
                                    f"({getattr(exc, 'strerror', None) or exc})") from None


#: why a zip that is a link is not unpacked
LINKED = ("a symbolic link, not unpacked: a link may point at another student's hand-in; "
          "hand in the zip itself")


def unpack(paths, tmp: Path) -> Unpacked:
    """Unpack every zip of ``paths`` (nested ones too) into ``tmp``; see the module."""
    out = Unpacked()
    given = {os.path.abspath(p) for p in paths if not Path(p).is_dir()}
    links: list[Path] = []
    todo = [(z, Path(z), 1, _owner(z, paths)) for z in find_zips(paths, links)]
    out.refused.update({os.path.abspath(z): f"an archive the grader does not unpack: {LINKED}"
                        for z in links})
    budgets: dict[str, Budget] = {}
    while todo:
        real, shown, level, owner = todo.pop(0)
        target = Path(tmp) / f"zip{len(out.roots) + len(out.refused)}"
        try:
            if level > MAX_NESTING:
                raise UnsafeArchive(f"it is a zip inside {MAX_NESTING} zips")
            target.mkdir(parents=True)
            _unpack_one(real, target, budgets.setdefault(owner, Budget()))
        except UnsafeArchive as exc:
            shutil.rmtree(target, ignore_errors=True)
            out.refused[os.path.abspath(shown)] = (f"an archive the grader does not unpack: "
                                                   f"{exc}; unzip it and hand in the files")
            continue
        out.roots.append(Path(os.path.abspath(target)))
        out.shown[str(out.roots[-1])] = shown
        out.zips.append(shown)
        named = level == 1 and os.path.abspath(shown) in given
        # the zips a named zip holds are its hand-ins, each with a budget of its own
        todo += [(z, out.show(z), level + 1,
                  os.path.abspath(out.show(z)) if named else owner) for z in find_zips([target])]
    return out


def _owner(zip_path: Path, paths) -> str:
    """The hand-in a zip found in ``paths`` is part of: the entry of the folder named on the
    command line that holds it (a student's folder of a class folder), or the zip itself."""
    z = os.path.abspath(zip_path)
    for p in paths:
        top = os.path.abspath(p)
        if Path(p).is_dir() and z.startswith(top + os.sep):
            return os.path.join(top, os.path.relpath(z, top).split(os.sep)[0])
    return z


def _unpack_one(real: Path, target: Path, budget: Budget) -> None:
    """``_extract``, any failure as UnsafeArchive (one archive never stops the batch)."""
    try:
        _extract(real, target, budget)
    except UnsafeArchive:
        raise
    except Exception as exc:  # noqa: BLE001 - one archive never stops the batch
        raise UnsafeArchive(f"it cannot be unpacked ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None


@dataclass
class Batch:
    """The files of a batch, zips unpacked: ``paths`` (the notebooks, as shown), ``others``
    (the files that are not notebooks, as shown; the zips unpacked are not among them, a zip
    refused is), ``contents`` (shown path -> bytes, None where unreadable), ``real`` (shown
    path -> the file on disk) and ``unpacked`` (:class:`Unpacked`)."""
    paths: list[Path]
    others: list[Path]
    contents: dict
    real: dict
    unpacked: Unpacked


def gather(notebooks, tmp: Path, limit: int | None = None) -> Batch:
    """Every file of the batch named by ``notebooks`` (files and folders), read before any
    student code runs; zips are unpacked into ``tmp``; ``limit``: the largest notebook read
    (a larger one is unreadable here, and its reader says why)."""
    from .accounting import find_others
    from .gradebook import find_notebooks
    from .submission_files import read_regular
    unpacked = unpack(notebooks, tmp)
    named = [p for p in notebooks if Path(p).is_dir() or Path(p).suffix.lower() != ".zip"]
    real = {unpacked.show(p): p for p in find_notebooks(named + unpacked.roots)}
    done = {os.path.abspath(z) for z in unpacked.zips}
    beside = {os.path.dirname(os.path.abspath(p)) for p in real.values()}
    others = [o for o in find_others(notebooks) if os.path.abspath(o) not in done]
    for o in find_others(unpacked.roots):
        shown = unpacked.show(o)
        helper = o.suffix == ".py" and os.path.dirname(os.path.abspath(o)) in beside
        if os.path.abspath(shown) not in done and not helper:
            others.append(shown)
    listed = {os.path.abspath(o) for o in others}
    others += [Path(z) for z in unpacked.refused if z not in listed]     # a zip named, refused
    contents: dict = {}
    for shown, path in real.items():
        try:                                    # a link or a device is no notebook of theirs
            contents[shown] = read_regular(path, limit)
        except OSError:
            contents[shown] = None
    return Batch(list(real), others, contents, real, unpacked)
