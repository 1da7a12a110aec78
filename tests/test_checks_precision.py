"""The precision rule of the checks (lesson10/checks/precision.py), how a refusal shows its
numbers, counts that wrap around, and the hint chosen over all failing cases."""
import re

import answers_01_03 as a1
import numpy as np
import pytest
import test_checks_answers as T

from lesson10 import checks
from lesson10.checks import CheckFailed, core, diagnosis, precision

# exercises whose results are floats (the others return ids, counts or masks)
FLOAT_OUT = [ex for ex in T.RIGHT if ex not in ("zigzag_positions", "causal_work", "capacity")]


def _cast(x, dtype):
    """``x`` with every float array and float number in it converted to ``dtype``."""
    if isinstance(x, np.ndarray):
        return x.astype(dtype) if x.dtype.kind == "f" else x
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, dtype) for y in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    if isinstance(x, float):
        return dtype(x)
    return x


def _returns(fn, dtype):
    def answer(*args, **kwargs):
        with np.errstate(over="ignore"):
            return _cast(fn(*args, **kwargs), dtype)
    answer.__name__ = fn.__name__
    return answer


@pytest.mark.parametrize("exercise", sorted(T.RIGHT))
def test_a_right_answer_in_float32_is_accepted(exercise):
    for fn in T.RIGHT[exercise][:2]:
        checks.EXERCISES[exercise].body(_returns(fn, np.float32), np.random.default_rng(3))


@pytest.mark.parametrize("exercise", FLOAT_OUT)
def test_a_right_answer_in_float16_is_refused_and_told_why(exercise):
    with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
        getattr(checks, f"check_{exercise}")(_returns(T.RIGHT[exercise][0], np.float16))
    assert "is float16" in str(info.value) and "hint: compute in float64" in str(info.value)


# --------------------------------------------------------------------------- computed in float32
def attn_float32(q, k, v, q_pos, k_pos, causal=True):
    q, k, v = (np.asarray(x, dtype=np.float32) for x in (q, k, v))
    s = np.einsum("iad,jad->aij", q, k) / np.float32(np.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.asarray(k_pos)[None, None, :] <= np.asarray(q_pos)[None, :, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    w = np.exp(s - m)
    total = w.sum(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        out = np.einsum("aij,jad->iad", np.where(total > 0, w / total, 0), v)
        lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(total[..., 0]), -np.inf).T
    return out.astype(np.float32), lse.astype(np.float32)


def merge_float32(o1, l1, o2, l2):
    o1, l1, o2, l2 = (np.asarray(x, dtype=np.float32) for x in (o1, l1, o2, l2))
    m = np.maximum(l1, l2)
    m = np.where(np.isfinite(m), m, np.float32(0))
    w1, w2 = np.exp(l1 - m), np.exp(l2 - m)
    total = w1 + w2
    with np.errstate(all="ignore"):
        o = np.where(total[..., None] > 0, (w1[..., None] * o1 + w2[..., None] * o2)
                     / total[..., None], 0)
        lse = np.where(total > 0, m + np.log(total), -np.inf)
    return o.astype(np.float32), lse.astype(np.float32)


@pytest.mark.parametrize("exercise,fn", [("block_attention", attn_float32),
                                         ("merge", merge_float32)])
def test_an_answer_computed_in_float32_is_accepted_with_scores_of_1000(exercise, fn, capsys):
    for seed in (None, 1, 2):
        getattr(checks, f"check_{exercise}")(fn, seed=seed)
    assert capsys.readouterr().out.count("passed") == 3


def test_the_float32_drop_rate_is_accepted(capsys):
    import answers_04_05 as a4
    for fn in (a4.moe_float32, a4.moe_float32_item):
        checks.check_moe_stats(fn)
        assert checks.OUTCOMES[-1]["passed"], checks.OUTCOMES[-1]["message"]


# --------------------------------------------------------------------------- showing the numbers
@pytest.mark.parametrize("yours,target", [(float(np.float32(0.7)), 0.7), (np.float32(0.7), 0.7),
                                          (1.0 + 3e-12, 1.0), (123456.0000001, 123456.0),
                                          (np.array(2.10141141), np.array(2.10141144))])
def test_a_refusal_never_shows_two_equal_numbers(yours, target):
    text = core.failure_message("ring_time", "here", "ring time differs", yours, target)
    shown = dict(re.findall(r"^  (yours |target): (\S+)", text, re.M))
    assert shown["yours "] != shown["target"], text
    assert "relative error" in text, text


def test_a_slightly_wrong_float64_answer_is_refused_with_its_relative_error():
    def ring_time(work):
        return float(np.asarray(work).max(axis=1).sum()) * (1 + 3e-9)
    with pytest.raises(CheckFailed) as info:
        checks.check_ring_time(ring_time)
    lines = str(info.value).splitlines()
    assert lines[1].split(":")[1].split()[0] != lines[2].split(":")[1].strip()
    assert re.search(r"relative error 3e-09", lines[1]), lines


def test_counts_shown_as_counts():
    text = core.failure_message("causal_work", "", "work differs", 44.0, 300.0)
    assert "yours : 44\n" in text + "\n" and "relative error" not in text


# --------------------------------------------------------------------------- counts that wrap
def test_a_count_that_wrapped_around_is_named():
    target = np.array([[300, 5], [70000, 1]])
    u8 = precision.wrapped_count(np.array([[300 % 256, 5], [70000 % 256, 1]], dtype=np.uint8), target)
    assert u8.startswith("your array is uint8, which holds only 0..255")
    u16 = precision.wrapped_count(target.astype(np.uint16).astype(np.int64), target)
    assert u16.startswith("your numbers look like they went through uint16")
    assert precision.wrapped_count(target, target) is None          # nothing wrapped
    assert precision.wrapped_count(target + 1, target) is None       # another mistake


def test_notebook_03s_c_64_cell_is_refused_with_uint8():
    with pytest.raises(CheckFailed) as info:
        checks.check_causal_work(a1.work_uint8)
    assert "uint8" in str(info.value)


# --------------------------------------------------------------------------- grammar
def test_count_messages_agree_with_their_number():
    with pytest.raises(CheckFailed) as info:
        core.as_shard_list("all_gather", [np.zeros(2)] * 3, 1, "", "your list")
    assert "should hold 1 array (one per rank), got 3" in str(info.value)
    with pytest.raises(CheckFailed) as info:
        core.compare_arrays("x", np.array([1.0]), np.array([2.0]), where="", what="v")
    assert "(1 of 1 entry wrong)" in str(info.value)
    assert precision.plural(1, "copy", "copies") == "1 copy"
    assert precision.plural(2, "copy", "copies") == "2 copies"


# --------------------------------------------------------------------------- the hint of all cases
def _failure(mistakes, general="general of this case"):
    exc = CheckFailed("x")
    exc.head, exc.mistakes, exc.general = "head", tuple(mistakes), general
    return exc


def test_the_hint_is_the_mistake_that_explains_every_failing_case():
    assert diagnosis.choose([_failure(["a", "b"]), _failure(["b"]), _failure(["c", "b"])]) == "b"
    # a mistake that fits the first case only is not named: the general hint is
    assert diagnosis.choose([_failure(["a"], "first general"), _failure(["b"])]) == "first general"
    # the numbers of a case are not part of a mistake's identity
    assert diagnosis.choose([_failure(["keeps 22 copies"]), _failure(["keeps 9 copies"])]) == \
        "keeps 22 copies"
    # two mistakes, each failing cases of its own: the one that explains most of them
    many = [_failure(["no shift"]), _failure(["no shift"]), _failure(["nan rows"])]
    assert diagnosis.choose(many) == "no shift"
    assert diagnosis.choose(many[1:] + many[2:]) == "general of this case"   # 1 of 3: not named


def test_cases_goes_on_after_a_failing_case_and_counts_them():
    run = diagnosis.Cases("ring_time")
    for i in range(4):
        with run.case():
            if i % 2:
                raise _failure(["odd"])
    with pytest.raises(CheckFailed) as info:
        run.verdict()
    assert str(info.value).splitlines() == ["head", "  2 of the 4 cases fail", "hint: odd"]
