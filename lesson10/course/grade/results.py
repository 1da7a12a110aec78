"""Typed results: what grading a class gives, as frozen records with one JSON form.

The records nest as the outputs do::

    ClassResult(notebooks=(NotebookResult, ...), students=(StudentRow, ...))
    NotebookResult.exercises, StudentRow.exercises: (Entry, ...)   one per exercise
    Entry.parts, Entry.judged_parts: (PartEntry, ...)              one per part

:meth:`Entry.from_json` and friends are the JSON boundary: they check every key a record
needs (a clear :class:`ResultsError` naming the key, never a wrong answer later), keep the
keys they do not know in ``extra``, and :meth:`to_json` gives back the same dict, keys in
the order they were read, so an output written from a record is byte-identical to one
written from the dict. :class:`ClassResult` carries ``"version": 1``; another version is
refused with what to do.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from ...checks.verdict import Status
from ...errors import Lesson10Error

#: the version of :meth:`ClassResult.to_json`
VERSION = 1

R = TypeVar("R", bound="_Record")


class ResultsError(Lesson10Error, ValueError):
    """A results document that is not what this version of the grader writes."""


@dataclass(frozen=True)
class _Record:
    """A record read from (and written back to) one JSON object."""
    #: keys every object of the record has (the rest are optional)
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    #: the keys a new record writes first (the rest in the order of the fields)
    FIRST: ClassVar[tuple[str, ...]] = ()
    #: key -> record type of a list of nested records
    NESTED: ClassVar[dict[str, type[_Record]]] = {}
    #: keys not a field of the record, verbatim
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: the keys in the order they were read (an output keeps it)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def _names(cls) -> list[str]:
        rest = [f.name for f in fields(cls) if f.name not in ("extra", "order", *cls.FIRST)]
        return [*cls.FIRST, *rest]

    @classmethod
    def from_json(cls: type[R], doc: Any, where: str = "") -> R:
        """The record of one JSON object; :class:`ResultsError` for a missing key."""
        what = where or cls.__name__
        if not isinstance(doc, Mapping):
            raise ResultsError(f"{what}: an object was expected, not {type(doc).__name__}; "
                               f"grade the class again to rewrite its results")
        absent = [k for k in cls.REQUIRED if k not in doc]
        if absent:
            raise ResultsError(f"{what}: no {', '.join(absent)}; grade the class again to "
                               f"rewrite its results")
        names = set(cls._names())
        kw: dict[str, Any] = {}
        for k in names & set(doc):
            v = doc[k]
            sub = cls.NESTED.get(k)
            if sub is not None and v is not None:
                v = tuple(sub.from_json(x, f"{what}.{k}[{i}]") for i, x in enumerate(v))
            elif k == "status":
                v = Status.of(v)
            kw[k] = v
        return cls(**kw, extra={k: v for k, v in doc.items() if k not in names},
                   order=tuple(doc))

    def to_json(self) -> dict:
        """The JSON object: the keys read, in their order, then any new ones."""
        out: dict[str, Any] = {}
        given = set(self.order)
        for k in [*self.order, *(n for n in self._names() if n not in given)]:
            if k in self.extra:
                out[k] = self.extra[k]
                continue
            v = getattr(self, k, None)
            if v is None and k not in given and k not in self.REQUIRED:
                continue                            # an optional key never set
            if k in self.NESTED and v is not None:
                v = [x.to_json() for x in v]
            elif isinstance(v, Status):
                v = v.value
            out[k] = v
        return out


@dataclass(frozen=True)
class _Verdict(_Record):
    """What a part and an exercise have alike: the judge's verdict on it."""
    status: Status = Status.NOT_JUDGED
    passed: bool = False
    points: int = 0
    max_points: int = 0
    message: str = ""
    mistake: str | None = None


@dataclass(frozen=True)
class PartEntry(_Verdict):
    """One part of an exercise with parts: ``points`` of ``max_points`` when passed."""
    REQUIRED: ClassVar[tuple[str, ...]] = ("part", "status", "passed", "points", "max_points")
    FIRST: ClassVar[tuple[str, ...]] = ("part",)
    part: str = ""


@dataclass(frozen=True)
class Entry(_Verdict):
    """One exercise's verdict (:meth:`lesson10.checks.verdict.Verdict.as_dict`), with what
    the grader and the instructor add: its notebook, the time it took, its parts, an
    override or a late penalty and the judge's own verdict (``judged``) beside them."""
    REQUIRED: ClassVar[tuple[str, ...]] = ("exercise", "status", "passed", "points",
                                           "max_points")
    FIRST: ClassVar[tuple[str, ...]] = ("exercise",)
    NESTED: ClassVar[dict[str, type[_Record]]] = {"parts": PartEntry, "judged_parts": PartEntry}
    exercise: str = ""
    notebook: str | None = None
    seconds: float | None = None
    parts: tuple[PartEntry, ...] | None = None
    judged_parts: tuple[PartEntry, ...] | None = None
    judged: Mapping[str, Any] | None = None
    override: Mapping[str, Any] | None = None
    late_penalty: int | None = None

    @classmethod
    def of(cls, entry: Entry | Mapping[str, Any]) -> Entry:
        """An entry as the record (a report's dict read at the JSON boundary)."""
        return entry if isinstance(entry, Entry) else cls.from_json(entry)

    @classmethod
    def missing(cls, exercise: str, notebook: str, max_points: int) -> Entry:
        """The entry of an exercise whose notebook was not handed in (0 points)."""
        return cls(exercise=exercise, status=Status.MISSING, passed=False, points=0,
                   max_points=max_points, message=f"no {notebook} notebook was handed in",
                   notebook=notebook, order=("exercise", "notebook", "status", "passed", "points", "max_points",
                          "message"))


@dataclass(frozen=True)
class NotebookResult(_Record):
    """The report of one graded file (:func:`lesson10.course.grade.notebook.notebook_report`)."""
    REQUIRED: ClassVar[tuple[str, ...]] = ("notebook", "student", "exercises", "ok")
    NESTED: ClassVar[dict[str, type[_Record]]] = {"exercises": Entry}
    notebook: str = ""
    student: str = ""
    course_notebook: str | None = None
    exercises: tuple[Entry, ...] = ()
    points: int = 0
    max_points: int = 0
    feedback: tuple[str, ...] | list[str] = ()
    ok: bool = True
    error: str | None = None
    sandboxed: bool = True
    seconds: float | None = None


@dataclass(frozen=True)
class StudentRow(_Record):
    """One student's gradebook row (:func:`lesson10.course.grade.gradebook.rows`): every
    course exercise, the points of the row and the course's maximum."""
    REQUIRED: ClassVar[tuple[str, ...]] = ("student", "points", "max_points", "exercises")
    NESTED: ClassVar[dict[str, type[_Record]]] = {"exercises": Entry}
    student: str = ""
    points: int = 0
    max_points: int = 0
    exercises: tuple[Entry, ...] = ()
    notebooks: Mapping[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    ignored: list[dict] | None = None
    unknown: list[str] | None = None
    not_graded: list[dict] | None = None
    #: the collisions that concern the student (:mod:`lesson10.course.grade.identity`)
    notes: list[str] | None = None
    ok: bool = True
    on_roster: bool | None = None
    #: the late policy's (:mod:`lesson10.course.grade.late`): the due time, each late notebook
    due: str | None = None
    late: list[dict] | None = None

    @classmethod
    def of(cls, row: StudentRow | Mapping[str, Any]) -> StudentRow:
        """A row as the record (a gradebook row's dict read at the JSON boundary)."""
        return row if isinstance(row, StudentRow) else cls.from_json(row)


@dataclass(frozen=True)
class ClassResult(_Record):
    """A graded class: one :class:`NotebookResult` per graded file, one :class:`StudentRow`
    per student, and ``"version"`` (:data:`VERSION`) in its JSON form."""
    REQUIRED: ClassVar[tuple[str, ...]] = ("version", "notebooks", "students")
    NESTED: ClassVar[dict[str, type[_Record]]] = {"notebooks": NotebookResult,
                                                  "students": StudentRow}
    version: int = VERSION
    notebooks: tuple[NotebookResult, ...] = ()
    students: tuple[StudentRow, ...] = ()

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> ClassResult:
        version = doc.get("version") if isinstance(doc, Mapping) else None
        if version != VERSION:
            raise ResultsError(f"results of version {version!r}: this grader reads version "
                               f"{VERSION}; grade the class again with this version of "
                               f"lesson10")
        return super().from_json(doc, where)
