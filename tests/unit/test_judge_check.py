"""The judge check (no model): which pairs are asked, when it stops, and its verdict kept per runtime."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.library.template import Entry
from kvgraft_plugin.routing import library_routing
from kvgraft_plugin.routing.judge import JUDGE_PROMPT, VETO_THRESHOLD, JudgeVerdict
from kvgraft_plugin.routing.judge_exam import CHECK_PAIRS, check_judge


class ScriptedJudge:
    """Says ``same`` of a paraphrase and ``different`` of a near-miss, and counts what it was asked."""

    model_id = "scripted"

    def __init__(self, same: float, different: float, runtime: str = "a") -> None:
        self.same, self.different, self.asked = same, different, 0
        self.fingerprint = {"gguf_sha256": runtime}
        self.backend = SimpleNamespace(close=lambda: setattr(self, "closed", True))
        self.closed = False
        self._labels = {(p, q): s for p, _, q, s in CHECK_PAIRS}

    def __call__(self, problem, question, *, answer=None, threshold=None) -> JudgeVerdict:
        self.asked += 1
        margin = self.same if self._labels[(problem, question)] else self.different
        return JudgeVerdict(margin, threshold, 1.0, False)


def test_a_judge_that_refuses_near_misses_and_lets_paraphrases_through_passes():
    judge = ScriptedJudge(same=2.0, different=-3.0)
    check = check_judge(judge, -1.0)
    assert check.passed and len(check.different) == 8 and len(check.same) == 4  # it stops once half pass
    assert judge.asked == 12 and "passes" in check.reason


def test_a_judge_fails_at_its_first_near_miss_let_through_or_when_it_refuses_most_paraphrases():
    yes_man = ScriptedJudge(same=2.0, different=0.5)
    check = check_judge(yes_man, -1.0)
    assert not check.passed and yes_man.asked == 1 and "let through 1 of 1 near-misses" in check.reason
    naysayer = ScriptedJudge(same=-2.0, different=-3.0)
    assert not check_judge(naysayer, -1.0).passed and naysayer.asked == 16
    assert check_judge(ScriptedJudge(same=-0.5, different=-3.0), -1.0).passed  # the threshold decides
    assert not check_judge(ScriptedJudge(same=-0.5, different=-3.0), 0.0).passed


def test_the_verdict_is_kept_per_runtime_and_threshold(tmp_path):
    first = ScriptedJudge(same=2.0, different=-3.0)
    saved = check_judge(first, -1.0, tmp_path)
    again = ScriptedJudge(same=2.0, different=-3.0)
    assert check_judge(again, -1.0, tmp_path) == saved and again.asked == 1  # one margin, checked bitwise
    other = ScriptedJudge(same=2.0, different=0.5, runtime="b")
    assert not check_judge(other, -1.0, tmp_path).passed and other.asked == 1  # another runtime: asked
    assert check_judge(ScriptedJudge(2.0, -3.0), 0.5, tmp_path).threshold == 0.5  # another threshold: asked
    for path in tmp_path.glob("check-*.json"):
        path.write_text("{")  # damaged: asked again
    damaged = ScriptedJudge(same=2.0, different=-3.0)
    assert check_judge(damaged, -1.0, tmp_path) == saved and damaged.asked == 12


def test_the_check_pairs_are_half_paraphrases_and_half_near_misses():
    assert sum(same for *_, same in CHECK_PAIRS) == 8 and len(CHECK_PAIRS) == 16
    assert len({(p, q) for p, _, q, _ in CHECK_PAIRS}) == 16


def test_the_served_model_is_opened_as_a_judge_only_when_it_may_be_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    opened: list[Path] = []
    monkeypatch.setattr(
        library_routing, "open_judge", lambda path, **_: opened.append(path) or ScriptedJudge(2.0, -3.0)
    )
    stub = Entry("rle", 'def rle(text):\n    """Encode runs as char+count."""', "    ...")
    library = SimpleNamespace(routing={}, aliases={}, revoked={}, entries={"rle": SimpleNamespace(entry=stub)})
    served = Path("served.gguf")
    # only function prompts: the router never asks a judge about those, so none is opened
    assert library_routing.LibraryRouting(library, "minilm", served=served).judge(EngineConfig()) is None and not opened
    library.entries["boil"] = SimpleNamespace(entry=Entry("boil", "At what temperature does water boil?", "100"))
    routing = library_routing.LibraryRouting(library, "minilm", served=served)
    judge, threshold, profile = routing.judge(EngineConfig())
    assert opened == [served] and (judge.model_id, threshold, profile) == ("scripted", -1.0, "none")
    assert library_routing.LibraryRouting(library, "minilm").judge(EngineConfig()) is None  # not an instruct model
    assert routing.judge(EngineConfig(judge_model="off")) is None
    yes_man = ScriptedJudge(2.0, 0.5, runtime="yes-man")
    monkeypatch.setattr(library_routing, "open_judge", lambda path, **_: yes_man)
    failed = library_routing.LibraryRouting(library, "minilm", served=served)
    assert failed.judge(EngineConfig()) is None and yes_man.closed  # it fails the check: its context is freed
    assert failed.judge(EngineConfig()) is None and yes_man.asked == 1  # and it is not asked again


def test_behind_the_word_guards_the_judge_is_a_veto_with_a_threshold_of_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(library_routing, "open_judge", lambda model, **_: ScriptedJudge(2.0, -3.0))
    boil = Entry("boil", "At what temperature does water boil?", "100")
    library = SimpleNamespace(routing={}, aliases={}, revoked={}, entries={"boil": SimpleNamespace(entry=boil)})
    served = library_routing.LibraryRouting(library, "minilm", served=Path("served.gguf"))
    # the served model is checked at its own default, then vetoes at VETO_THRESHOLD
    assert served.judge(EngineConfig(profile="math"))[1:] == (VETO_THRESHOLD, "math")
    assert served.judge(EngineConfig(profile="math", judge_threshold=-2.0))[1:] == (-2.0, "math")
    record = {"model": "qwen", "prompt": JUDGE_PROMPT, "threshold": 0.5, "profile": "none"}
    library.routing = {"judge": record}
    calibrated = library_routing.LibraryRouting(library, "minilm")
    assert calibrated.judge(EngineConfig())[1:] == (0.5, "none")
    # a threshold calibrated for the judge alone is not lent to the judge behind the word guards
    assert calibrated.judge(EngineConfig(profile="math"))[1:] == (VETO_THRESHOLD, "math")
    library.routing = {"judge": {**record, "profile": "math", "threshold": -2.5}}
    assert library_routing.LibraryRouting(library, "minilm").judge(EngineConfig())[1:] == (-2.5, "math")


def test_a_forged_or_malformed_check_is_never_trusted_and_never_fails_a_command(tmp_path):
    """Issue 49: a forged 92-byte check file made SmolLM2 the served judge; a malformed one crashed commands."""
    yes_man = ScriptedJudge(same=2.0, different=0.5)  # fails the check: it lets near-misses through
    assert not check_judge(yes_man, -1.0, tmp_path).passed
    (path,) = tmp_path.glob("check-*.json")
    forged = {"model": "scripted", "threshold": -1.0, "same": [9.0] * 4, "different": [-9.0] * 8}
    for text in (json.dumps(forged), '{"model": 1, "threshold": -1.0, "same": ["a"], "different": ["b"]}',
                 json.dumps({**forged, "same": [float("nan")]}), "[" * 5000, "null"):  # fmt: skip
        path.write_text(text)
        again = ScriptedJudge(same=2.0, different=0.5)
        check = check_judge(again, -1.0, tmp_path)
        assert not check.passed and again.asked >= 1, text[:40]
