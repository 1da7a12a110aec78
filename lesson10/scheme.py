"""The course file: the effective scheme of the course, read once and frozen.

The package ships the default scheme, ``lesson10/course.toml`` (the one place an exercise's
points are written). An instructor's ``course.toml`` overrides it, found in this order:

1. an explicit path: ``--course FILE`` of ``grade``/``build``/``release``/``course``, which
   sets the environment variable ``LESSON10_COURSE`` (so the grader's processes agree);
2. the environment variable ``LESSON10_COURSE``;
3. the nearest ``course.toml`` walking up from the current directory (a student's release
   carries the instructor's at its root);
4. else the default alone.

A key written in the instructor's file replaces the default's; an exercise's entry replaces
its whole entry. :func:`current` is the scheme in force (``Scheme.source`` names its file);
every reader of points, the maximum, the term, the release and the late defaults asks it.
A bad file raises :class:`SchemeError`, one sentence that names the key and what to write.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

try:
    from .errors import Lesson10Error
except ImportError:         # loaded by its path (``python lesson10/course/build.py --check``)
    class Lesson10Error(Exception):  # type: ignore[no-redef]
        """The package's base, where there is no package."""

__all__ = ["DEFAULT", "ENV", "Scheme", "SchemeError", "at", "current", "find", "load", "parse", "use"]

#: the package's default scheme
DEFAULT = Path(__file__).resolve().parent / "course.toml"
#: the environment variable naming the instructor's course file
ENV = "LESSON10_COURSE"
FILE_NAME = "course.toml"
STATUSES = ("counts", "optional", "bonus")
_TOP = {"term": str, "release": dict, "late": dict, "exercises": dict}
_RELEASE = {"repository": str, "ref": str}
_LATE = {"due": str, "penalty": str, "cap": (int, float), "latest_on_time": bool}
_EXERCISE = {"points": int, "status": str}
REPOSITORY_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
REF_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")
_WANT = {str: "a string in quotes", int: "a whole number", (int, float): "a number",
         bool: "true or false", dict: "a table"}
_PENALTY = re.compile(r"^\d+(\.\d+)?/(day|hour)$")


class SchemeError(Lesson10Error, ValueError):
    """A course file that cannot be used: the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Late:
    """The late policy's defaults (``grade`` options override them): ``due`` an ISO time or
    None, ``penalty`` ``"PCT/day"``/``"PCT/hour"`` or None, ``cap`` percent."""
    due: str | None = None
    penalty: str | None = None
    cap: float = 100.0
    latest_on_time: bool = False


@dataclass(frozen=True)
class Scheme:
    """The effective scheme: ``exercises`` maps each exercise id, in the course's order, to
    ``(status, points)``; ``source`` is the file in force (the default's path when none)."""
    source: Path
    term: str
    repository: str
    ref: str
    late: Late
    exercises: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    @property
    def maximum(self) -> int:
        """The course maximum: the points of the counted exercises (a bonus is on top)."""
        return sum(p for s, p in self.exercises.values() if s == "counts")

    @property
    def digest(self) -> str:
        """What of the scheme changes a grade (points, statuses, term), as one line."""
        return repr((self.term, sorted(self.exercises.items())))


# ------------------------------------------------------------------------------ reading
def parse(text: str) -> dict:
    """A TOML document: ``tomllib`` where there is one, else the subset a course file uses."""
    try:
        import tomllib
    except ModuleNotFoundError:                    # Python 3.10: the subset the file uses
        return _parse_subset(text)
    return tomllib.loads(text)


_VALUE = r'"[^"\\]*"|-?\d+(?:\.\d+)?|true|false'


def _value(text: str) -> Any:
    text = text.strip()
    if text.startswith('"'):
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    return float(text) if "." in text else int(text)


def _uncommented(line: str) -> str:
    """The line without its ``# comment`` (a ``#`` inside quotes is kept)."""
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            return line[:i].strip()
    return line.strip()


def _parse_subset(text: str) -> dict:
    """``[table]`` headers, ``key = value`` (a string, number, boolean, or an inline table
    of those), comments: what a course file needs, for Python 3.10 (no ``tomllib``)."""
    doc: dict = {}
    table = doc
    for n, raw in enumerate(text.splitlines(), start=1):
        line = _uncommented(raw)
        if not line:
            continue
        if m := re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line):
            table = doc
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.fullmatch(rf"([A-Za-z0-9_-]+)\s*=\s*(\{{.*\}}|{_VALUE})", line)
        if not m:
            raise ValueError(f"line {n}: cannot read {raw.strip()!r}")
        key, value = m.groups()
        if value.startswith("{"):
            items = [i for i in value[1:-1].split(",") if i.strip()]
            pairs = [re.fullmatch(rf"\s*([A-Za-z0-9_-]+)\s*=\s*({_VALUE})\s*", i) for i in items]
            if not all(pairs):
                raise ValueError(f"line {n}: cannot read {raw.strip()!r}")
            table[key] = {p.group(1): _value(p.group(2)) for p in pairs if p}
        else:
            table[key] = _value(value)
    return doc


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemeError(f"{path}: cannot read the course file ({exc}); write a course.toml "
                          f"there or point --course / {ENV} at one") from None
    try:
        return parse(text)
    except ValueError as exc:                      # tomllib.TOMLDecodeError is a ValueError
        raise SchemeError(f"{path}: not a TOML file ({exc}); write it as the package's "
                          f"default lesson10/course.toml is written") from None


def _typed(path: Path, table: dict, allowed: dict, where: str) -> None:
    """Every key of ``table`` known and of its type, else one sentence naming it."""
    for key, value in table.items():
        name = f"{where}{key}"
        if key not in allowed:
            raise SchemeError(f"{path}: unknown key {name!r}; write one of "
                              f"{', '.join(where + k for k in allowed)}")
        kinds = allowed[key]
        wrong_bool = isinstance(value, bool) and kinds is not bool
        if wrong_bool or not isinstance(value, kinds):
            want = _WANT[kinds]
            raise SchemeError(f"{path}: {name} = {value!r} is not {want}; write {name} as {want}")


def _exercise(path: Path, name: str, entry: Any) -> tuple[str, int]:
    """``(status, points)`` of one ``[exercises]`` entry, validated."""
    key = f"exercises.{name}"
    if not isinstance(entry, dict):
        raise SchemeError(f"{path}: {key} = {entry!r} is not a table; write "
                          f'{key} = {{ points = 1 }} or {{ status = "optional" }}')
    _typed(path, entry, _EXERCISE, key + ".")
    status = entry.get("status", "counts")
    if status not in STATUSES:
        raise SchemeError(f"{path}: {key}.status = {status!r} is no status; write one of "
                          f"{', '.join(repr(s) for s in STATUSES)}")
    points = entry.get("points", 0 if status == "optional" else None)
    if points is None:
        raise SchemeError(f"{path}: {key} has no points; write {key} = {{ points = 1 }} "
                          f"(or status = \"optional\" for practice worth nothing)")
    if points < 0:
        raise SchemeError(f"{path}: {key}.points = {points} is negative; write 0 or more")
    if status == "optional" and points:
        raise SchemeError(f"{path}: {key} is optional with points = {points}; an optional "
                          f"exercise is worth 0: drop its points, or write status = \"counts\"")
    if status != "optional" and not points:
        raise SchemeError(f"{path}: {key} {'counts' if status == 'counts' else 'is a bonus'} "
                          f"with 0 points; write points = 1 or more, or status = \"optional\"")
    return status, points


def _late(path: Path, table: dict) -> Late:
    _typed(path, table, _LATE, "late.")
    due, penalty = table.get("due") or None, table.get("penalty") or None
    if due is not None:
        try:
            datetime.fromisoformat(due)
        except ValueError:
            raise SchemeError(f"{path}: late.due = {due!r} is no time; write an ISO 8601 time "
                              f"like \"2026-03-01T23:59\", or \"\" for none") from None
    if penalty is not None and not _PENALTY.match(penalty.replace(" ", "")):
        raise SchemeError(f"{path}: late.penalty = {penalty!r} is no penalty; write "
                          f"\"10/day\" or \"2/hour\" (percent of the notebook's points), or \"\"")
    cap = float(table.get("cap", 100))
    if not 0 <= cap <= 100:
        raise SchemeError(f"{path}: late.cap = {cap:g} is not a percentage; write 0 to 100")
    return Late(due, penalty, cap, bool(table.get("latest_on_time", False)))


def _release(path: Path, table: dict) -> tuple[str, str]:
    _typed(path, table, _RELEASE, "release.")
    repository, ref = table.get("repository", ""), table.get("ref", "")
    if not REPOSITORY_RE.match(repository) or any(p.strip(".") == "" for p in repository.split("/")):
        raise SchemeError(f"{path}: release.repository = {repository!r} is no GitHub repository; "
                          f"write \"owner/name\"")
    if not REF_RE.match(ref) or ".." in ref:
        raise SchemeError(f"{path}: release.ref = {ref!r} is no git ref; write a branch, tag or "
                          f"commit, e.g. \"v1.0.0\"")
    return repository, ref


def _merged(default: dict, own: dict) -> dict:
    """The default with the instructor's keys written over it (tables key by key)."""
    out = dict(default)
    for key, value in own.items():
        out[key] = {**default.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def load(path: Path | str | None = None) -> Scheme:
    """The scheme of the default overridden by the course file ``path`` (None: the default
    alone). Raises :class:`SchemeError` for a bad file."""
    base = _read(DEFAULT)
    source = Path(path).resolve() if path is not None else DEFAULT
    own = _read(source) if path is not None else {}
    _typed(source, own, _TOP, "")
    unknown = [k for k in own.get("exercises", {}) if k not in base["exercises"]]
    if unknown:
        raise SchemeError(f"{source}: exercises.{unknown[0]} is no exercise of the course; "
                          f"write one of {', '.join(base['exercises'])}")
    doc = _merged(base, own)
    term = doc.get("term", "")
    if not term.strip():
        raise SchemeError(f"{source}: term = {term!r} is empty; write the term, e.g. "
                          f"term = \"2027-spring\"")
    repository, ref = _release(source, doc.get("release", {}))
    exercises = {name: _exercise(source, name, entry) for name, entry in doc["exercises"].items()}
    return Scheme(source, term, repository, ref, _late(source, doc.get("late", {})),
                  MappingProxyType(exercises))


def find(start: Path | None = None) -> Path | None:
    """The course file in force: ``$LESSON10_COURSE``, else the nearest ``course.toml``
    from ``start`` (the current directory) up, else None (the default alone)."""
    named = os.environ.get(ENV)
    return Path(named) if named else nearest(start)


def nearest(start: Path | None = None) -> Path | None:
    """The nearest ``course.toml`` from ``start`` (the current directory) up, or None."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / FILE_NAME
        if candidate.is_file() and candidate.resolve() != DEFAULT:
            return candidate
    return None


_CACHE: dict[tuple, Scheme] = {}


def current() -> Scheme:
    """The effective scheme, found from the current directory (read again whenever the file
    in force or its bytes change)."""
    return at(None)


def at(folder: Path | None) -> Scheme:
    """The scheme in force for the course repository ``folder`` (None: the current
    directory): ``$LESSON10_COURSE``, else the nearest ``course.toml`` from there up."""
    path = find(folder)
    try:
        st = path.stat() if path is not None else None
    except OSError:
        st = None
    key = (str(path), st and st.st_mtime_ns, st and st.st_size)
    if key not in _CACHE:
        if len(_CACHE) > 8:
            _CACHE.clear()
        _CACHE[key] = load(path)
    return _CACHE[key]


#: the file :func:`use` last pinned (its own ``$LESSON10_COURSE`` is no instructor's choice)
_PINNED: list[str | None] = [None]


def use(path: Path | str | None, root: Path | None = None) -> Scheme:
    """Pin the course file for this process and the ones it starts (a command's first step):
    ``path`` (the ``--course FILE`` option), else ``$LESSON10_COURSE`` as the instructor set
    it, else the nearest for ``root`` (None: the current directory), else the default.
    Pinned, a later ``chdir`` (the grader's into a submission, whose own ``course.toml`` must
    never count) changes nothing. Returns the scheme, checked."""
    named = os.environ.get(ENV)
    if path is None and named and named != _PINNED[0]:
        path = named
    if path is not None and not Path(path).is_file():
        raise SchemeError(f"course file {path}: no such file; give the path of a course.toml "
                          f"(--course FILE or {ENV})")
    chosen = Path(path) if path is not None else (nearest(root) or DEFAULT)
    os.environ[ENV] = _PINNED[0] = str(chosen.resolve())
    return current()
