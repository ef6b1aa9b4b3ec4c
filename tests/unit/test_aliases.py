"""Aliases and the deferred judge (``judge_mode="async"``) on the scripted fake backend: a pair the judge has
not seen is not waited for, it is judged when the engine is idle, and an approval is an alias stored in the
library (signed again with the key), that grafts the same question with no judgement in any process. A real
Qwen judge does the same in tests/integration/test_qwen.py."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_engine_fake import ScriptedBackend
from test_fallbacks_fake import ENTRIES, BagOfWords

from kvgraft_plugin import GraftEngine, Library
from kvgraft_plugin.cli import main
from kvgraft_plugin.core.exceptions import BackendError, ConfigError
from kvgraft_plugin.curation.build import build_library
from kvgraft_plugin.engine.worker import Worker
from kvgraft_plugin.library.aliases import Alias, alias_key, parse_aliases
from kvgraft_plugin.routing import library_routing
from kvgraft_plugin.routing.deferred_judge import DeferredJudge
from kvgraft_plugin.routing.judge import JudgeVerdict
from kvgraft_plugin.routing.judge_exam import CHECK_PAIRS, JudgeCheck

DEFERRED = "the judge's verdict is deferred: judged when the engine is idle (an approval becomes an alias)"

PARAPHRASE, NEAR_MISS = "How much do 17 crates of 23 bottles hold?", "What is 17 plus 23?"  # word guards refuse both


class FakeJudge:
    """A judge with set margins per question, counting the pairs it computes."""

    model_id = "fake-judge"

    def __init__(self, margins: dict[str, float]) -> None:
        self.margins, self.computed, self._cache = margins, [], {}

        class _Closed:
            def close(self) -> None:
                pass

        self.backend = _Closed()

    def check(self, threshold: float) -> JudgeCheck:
        """The judge check's result: passed, unless ``fails_check`` is set."""
        same = sum(pair[3] for pair in CHECK_PAIRS)
        near_miss = 9.0 if self.fails_check else -9.0
        return JudgeCheck(self.model_id, threshold, (9.0,) * same, (near_miss,) * (len(CHECK_PAIRS) - same))

    fails_check = False

    def known(self, problem: str, question: str, answer: str | None, threshold: float, *, vouched: bool = False):
        margin = self._cache.get((problem, question))
        return None if margin is None else JudgeVerdict(margin, threshold, 0.0, cached=True)

    def __call__(self, problem: str, question: str, *, answer: str | None, threshold: float, vouched: bool = False):
        if (problem, question) not in self._cache:
            self.computed.append(question)
            self._cache[(problem, question)] = self.margins[question]
        return JudgeVerdict(self._cache[(problem, question)], threshold, 1.0, cached=False)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(library folder, open_engine(library, judge=None, **settings))."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    engines: list[GraftEngine] = []

    def open_engine(library, judge: FakeJudge | None = None, **settings) -> GraftEngine:
        if judge is not None:  # the judge model, as `open_judge` would load it, and its check (passed unless set)
            monkeypatch.setattr(library_routing, "open_judge", lambda model, **_: judge)
            monkeypatch.setattr(library_routing, "check_judge", lambda judge, threshold, folder: judge.check(threshold))
        engine = GraftEngine(
            library, backend=ScriptedBackend(model, b"391."), embedder=BagOfWords(), n_threads=1, decode="step",
            **{"threshold": 0.1, **({"judge_model": judge.model_id, "judge_threshold": 1.0} if judge else {}),
               **settings},
        )  # fmt: skip
        engines.append(engine)
        return engine

    lib = tmp_path / "lib"
    build_library(lib, ENTRIES, engine=open_engine(None))
    yield lib, open_engine
    for engine in engines:
        engine.close()


def test_async_judging_answers_at_once_then_the_approval_is_an_alias_in_the_library(served):
    lib, open_engine = served
    judge = FakeJudge({PARAPHRASE: 3.0, NEAR_MISS: -2.0})
    engine = open_engine(lib, judge, judge_mode="async")
    first = engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    # on first sight the word guards decide (they refuse this paraphrase); the judge reads it when idle
    assert first.route == "plain" and "the query mentions" in first.fallback_reason
    first_sight = DEFERRED + "; the word guards decide now"
    assert {"guard": "judge", "entry_id": "mul", "passed": True, "reason": first_sight} in first.match
    assert first.phases_ms["judge"] == 0.0  # nothing was judged on the request's path

    engine.judge_deferred()  # what the idle worker has not judged yet
    approved = list(engine.aliases.values())
    assert [(a.question, a.entry_id, a.margin, a.judge) for a in approved] == [(PARAPHRASE, "mul", 3.0, "fake-judge")]
    again = engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    assert (again.route, again.entry_id) == ("graft", "mul")
    assert [v["guard"] for v in again.match] == ["alias"] and "fake-judge" in again.match[0]["reason"]
    assert judge.computed == [PARAPHRASE]  # judged once

    # stored in the manifest: another process grafts it with no judge at all
    stored = Library.open(lib)
    assert list(stored.aliases) == [alias_key(PARAPHRASE)]
    assert open_engine(lib, judge_model="off").ask("How much is 17 crates of 23?", max_tokens=4).route == "plain"
    other = open_engine(lib, judge_model="off").ask(f"  {PARAPHRASE} ", max_tokens=4, stop=[])
    assert (other.route, other.entry_id) == ("graft", "mul")


def test_a_refused_pair_is_no_alias_and_is_not_judged_again(served):
    lib, open_engine = served
    judge = FakeJudge({NEAR_MISS: -2.0})
    engine = open_engine(lib, judge, judge_mode="async")
    engine.ask(NEAR_MISS, max_tokens=4, stop=[])
    engine.judge_deferred()
    assert not engine.aliases and not Library.open(lib).aliases
    later = engine.ask(NEAR_MISS, max_tokens=4, stop=[])
    assert later.route == "plain" and "judge margin -2.00" in later.fallback_reason
    assert judge.computed == [NEAR_MISS] and engine.judge_deferred() == []


def test_the_engine_judges_deferred_pairs_by_itself_when_idle(served):
    lib, open_engine = served
    judge = FakeJudge({PARAPHRASE: 3.0})
    engine = open_engine(lib, judge, judge_mode="async")
    engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    for _ in range(100):  # the worker runs it after this request, unasked
        if engine.aliases:
            break
        threading.Event().wait(0.02)
    assert alias_key(PARAPHRASE) in engine.aliases


def test_a_signed_library_is_signed_again_with_the_key_and_left_alone_without_it(served, tmp_path):
    lib, open_engine = served
    key_file = tmp_path / "key"
    key_file.write_bytes(b"k" * 32)
    Library.open(lib).sign(b"k" * 32)

    unkeyed = open_engine(lib, FakeJudge({PARAPHRASE: 3.0}), judge_mode="async")
    unkeyed.ask(PARAPHRASE, max_tokens=4, stop=[])
    unkeyed.judge_deferred()
    assert list(unkeyed.aliases) == [alias_key(PARAPHRASE)]  # routed here, from memory
    assert not Library.open(lib).aliases and Library.open(lib, key=b"k" * 32).trusted  # the manifest is untouched

    keyed = open_engine(lib, FakeJudge({PARAPHRASE: 3.0}), judge_mode="async", key_file=str(key_file))
    keyed.ask(PARAPHRASE, max_tokens=4, stop=[])
    keyed.judge_deferred()
    signed = Library.open(lib, key=b"k" * 32)
    assert signed.trusted and list(signed.aliases) == [alias_key(PARAPHRASE)]


def test_an_alias_lapses_when_its_entry_text_changes(served):
    lib, open_engine = served
    engine = open_engine(lib, FakeJudge({PARAPHRASE: 3.0}), judge_mode="async")
    engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    engine.judge_deferred()
    library = Library.open(lib)
    alias = library.aliases[alias_key(PARAPHRASE)]
    library.aliases[alias.key] = Alias(**{**alias.to_json(), "entry_sha256": "0" * 64})  # judged another text
    library.save()
    answer = open_engine(lib, judge_model="off").ask(PARAPHRASE, max_tokens=4, stop=[])
    assert answer.route == "plain" and "alias" not in {v["guard"] for v in answer.match}


def test_kvgraft_aliases_lists_and_revokes(served):
    lib, open_engine = served
    engine = open_engine(lib, FakeJudge({PARAPHRASE: 3.0}), judge_mode="async")
    engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    engine.judge_deferred()
    listed = CliRunner().invoke(main, ["aliases", "--library", str(lib), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [a["entry_id"] for a in json.loads(listed.output)["aliases"]] == ["mul"]
    missing = CliRunner().invoke(main, ["aliases", "--library", str(lib), "--revoke", "never asked"])
    assert missing.exit_code != 0 and "no alias" in missing.output
    revoked = CliRunner().invoke(main, ["aliases", "--library", str(lib), "--revoke", PARAPHRASE, "--json"])
    assert revoked.exit_code == 0, revoked.output
    assert [a["question"] for a in json.loads(revoked.output)["revoked"]] == [PARAPHRASE]
    assert not Library.open(lib).aliases


def test_alias_keys_and_parsing():
    assert alias_key(" Multiply\u00a017  by 23. ") == "Multiply 17 by 23."
    assert JudgeVerdict(float("nan"), 1.0, 0.0, cached=False, deferred=True).reason == DEFERRED
    assert alias_key("What is ＡＢ?") == "What is AB?" and alias_key("US") != alias_key("us")
    good = {"question": "q", "entry_id": "mul", "entry_sha256": "s", "margin": 2.0, "threshold": 1.0,
            "judge": "j", "prompt": "p", "score": 0.8, "added": "2026-12-03T00:00:00+00:00"}  # fmt: skip
    assert list(parse_aliases([good, {**good, "question": "r", "entry_id": "gone"}], {"mul": 1})) == ["q"]
    for bad in ("x", [1], [{**good, "margin": "nan"}], [{k: v for k, v in good.items() if k != "judge"}]):
        with pytest.raises(ValueError):
            parse_aliases(bad, {"mul": 1})
    # a small edit the rewording check passed keeps its score; aliases stored before it have none
    assert parse_aliases([good], {"mul": 1})["q"].rewording is None
    reworded = parse_aliases([{**good, "margin": -0.4, "threshold": 0.0, "rewording": 2.5}], {"mul": 1})["q"]
    assert reworded.rewording == 2.5 and "read as a rewording: +2.50" in reworded.reason
    assert reworded.to_json()["rewording"] == 2.5
    with pytest.raises(ValueError):
        parse_aliases([{**good, "rewording": "inf"}], {"mul": 1})
    # a question whose numbers in words read as the entry's says so; only true, false or null is read
    read = parse_aliases([{**good, "margin": -1.5, "threshold": 0.0, "numerals": True}], {"mul": 1})["q"]
    assert read.numerals is True and "its numbers in words read as the entry's digits" in read.reason
    assert parse_aliases([good], {"mul": 1})["q"].numerals is None
    with pytest.raises(ValueError):
        parse_aliases([{**good, "numerals": "yes"}], {"mul": 1})


def test_a_pair_passed_by_the_rewording_check_becomes_an_alias_with_its_score():
    class RewordingJudge(FakeJudge):
        def __call__(self, problem, question, *, answer, threshold, vouched=False):
            verdict = super().__call__(problem, question, answer=answer, threshold=threshold, vouched=vouched)
            return dataclasses.replace(verdict, threshold=0.0, clear_yes="a small edit of the entry", rewording=3.0)

    deferred = DeferredJudge(RewordingJudge({"q": -0.5}), -1.0)
    assert deferred(ENTRIES[0], "q", 0.9).deferred
    alias = deferred.judge_next(model="m", prompt="p", entry_sha256=lambda e: "sha")
    assert alias is not None and (alias.margin, alias.threshold, alias.rewording) == (-0.5, 0.0, 3.0)


def test_a_pair_whose_numbers_in_words_read_back_becomes_an_alias_that_says_so():
    class NumeralsJudge(FakeJudge):
        def __call__(self, problem, question, *, answer, threshold, vouched=False):
            verdict = super().__call__(problem, question, answer=answer, threshold=threshold, vouched=vouched)
            return dataclasses.replace(verdict, threshold=0.0, clear_yes="a small edit of the entry", numerals=True)

    deferred = DeferredJudge(NumeralsJudge({"q": -1.5}), -1.0)
    assert deferred(ENTRIES[0], "q", 0.9).deferred
    alias = deferred.judge_next(model="m", prompt="p", entry_sha256=lambda e: "sha")
    assert alias is not None and (alias.margin, alias.numerals, alias.rewording) == (-1.5, True, None)
    assert alias.to_json()["numerals"] is True


def test_the_deferred_queue_is_bounded_and_keeps_the_newest():
    judge = FakeJudge({f"q{i}": 1.0 for i in range(5)})
    deferred = DeferredJudge(judge, 0.5, capacity=3)
    for i in range(5):
        assert deferred(ENTRIES[0], f"q{i}", 0.9).deferred
    assert deferred.pending == 3
    alias = deferred.judge_next(model="m", prompt="p", entry_sha256=lambda e: "sha")
    assert alias is not None and alias.question == "q2" and judge.computed == ["q2"]


def test_when_idle_work_waits_for_every_queued_call():
    worker, order, gate = Worker(), [], threading.Event()
    worker.submit(gate.wait)  # the worker is busy
    worker.when_idle(lambda: order.append("idle"))
    worker.submit(lambda: order.append("request 1"))
    worker.submit(lambda: order.append("request 2"))
    gate.set()
    worker.close(lambda: order.append("last"))
    assert order.index("idle") > order.index("request 2")


# -- an alias is a verdict on record, not a bypass (issue 49, finding 1) ---------------------------------------


def _approved(served, judge: FakeJudge | None = None) -> tuple:
    """A library where the judge approved PARAPHRASE for "mul" at margin 3.0 (judge threshold 1.0)."""
    lib, open_engine = served
    engine = open_engine(lib, judge or FakeJudge({PARAPHRASE: 3.0}), judge_mode="async")
    engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    engine.judge_deferred()
    return lib, open_engine


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"threshold": 1.0}, "its similarity"),  # a stricter similarity threshold
        ({"judge_threshold": 5.0}, "below the judge threshold +5.00"),  # a stricter judge (none opened)
        ({"match_check": lambda q, e, s: False}, "refused by match_check"),  # the user's hook
    ],
)
def test_an_alias_grafts_only_under_the_settings_in_force(served, settings, why):
    lib, open_engine = _approved(served)
    assert open_engine(lib, judge_model="off").ask(PARAPHRASE, max_tokens=4, stop=[]).route == "graft"
    answer = open_engine(lib, judge_model="off", **settings).ask(PARAPHRASE, max_tokens=4, stop=[])
    assert answer.route == "plain"
    assert any(why in (v["reason"] or "") for v in answer.match), answer.match


def test_a_refused_alias_raises_under_fallback_raise_instead_of_grafting(served):
    from kvgraft_plugin import NoMatchError

    lib, open_engine = _approved(served)
    engine = open_engine(lib, judge_model="off", threshold=1.0, fallback="raise")
    with pytest.raises(NoMatchError, match="no library entry matches"):
        engine.ask(PARAPHRASE, max_tokens=4, stop=[])


def test_a_structural_veto_refuses_an_alias_whose_numbers_were_replaced(served):
    lib, open_engine = _approved(served)
    library = Library.open(lib)
    alias = library.aliases[alias_key(PARAPHRASE)]
    wrong = "What is 18 times 23?"  # a wrong alias, as a failing judge once wrote one
    library.aliases[alias_key(wrong)] = Alias(**{**alias.to_json(), "question": wrong})
    library.save()
    answer = open_engine(lib, judge_model="off").ask(wrong, max_tokens=4, stop=[])
    assert answer.route == "plain" and any("numbers replaced" in (v["reason"] or "") for v in answer.match)


def test_a_judge_that_fails_its_check_writes_no_alias(served):
    lib, open_engine = served
    judge = FakeJudge({PARAPHRASE: 3.0})
    judge.fails_check = True
    engine = open_engine(lib, judge, judge_mode="async")
    engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    assert engine.judge_deferred() == [] and judge.computed == []  # its queue is dropped unjudged
    assert not engine.aliases and not Library.open(lib).aliases


def test_a_revocation_is_remembered_until_the_user_allows_the_question_again(served):
    lib, open_engine = _approved(served)
    runner = CliRunner()
    revoked = runner.invoke(main, ["aliases", "--library", str(lib), "--revoke", PARAPHRASE])
    assert revoked.exit_code == 0, revoked.output
    assert Library.open(lib).revoked == {alias_key(PARAPHRASE): "mul"}
    # the same judge approves it again on its next sighting: not stored, not grafted
    again = open_engine(lib, FakeJudge({PARAPHRASE: 3.0}), judge_mode="async")
    first = again.ask(PARAPHRASE, max_tokens=4, stop=[])
    assert first.route == "plain" and "revoked" in first.fallback_reason
    assert again.judge_deferred() == [] and not Library.open(lib).aliases
    assert again.ask(PARAPHRASE, max_tokens=4, stop=[]).route == "plain"
    # until the user allows it: then a judge may approve it once more
    unknown = runner.invoke(main, ["aliases", "--library", str(lib), "--allow", "never revoked"])
    assert unknown.exit_code != 0 and "is not revoked" in unknown.output
    allowed = runner.invoke(main, ["aliases", "--library", str(lib), "--allow", PARAPHRASE])
    assert allowed.exit_code == 0, allowed.output and not Library.open(lib).revoked
    _approved(served)
    assert list(Library.open(lib).aliases) == [alias_key(PARAPHRASE)]


def test_revoking_an_unknown_entry_is_an_error(served):
    lib, _ = served
    result = CliRunner().invoke(main, ["aliases", "--library", str(lib), "--revoke-entry", "nope"])
    assert result.exit_code != 0 and "no entry 'nope'" in result.output


def test_a_running_engine_sees_a_revocation_without_a_restart(served, monkeypatch):
    lib, open_engine = _approved(served)
    monkeypatch.setattr(library_routing, "REFRESH_SECONDS", 0.0)
    serving = open_engine(lib, judge_model="off")
    assert serving.ask(PARAPHRASE, max_tokens=4, stop=[]).route == "graft"
    Library.open(lib).revoke_aliases([alias_key(PARAPHRASE)])  # another process: `kvgraft aliases --revoke`
    answer = serving.ask(PARAPHRASE, max_tokens=4, stop=[])
    assert answer.route == "plain" and "revoked" in answer.fallback_reason


def test_an_entrys_own_problem_grafts_with_no_judge_even_where_the_word_guards_cannot_read(served):
    lib, open_engine = served
    engine = open_engine(lib, judge_model="off")
    exact = engine.ask("  What is the greatest common divisor of 84 and 126? ", max_tokens=4, stop=[])
    assert (exact.route, exact.entry_id) == ("graft", "gcd") and exact.match[0]["guard"] == "exact"


def test_a_judge_that_fails_mid_request_is_a_refusal_not_a_failed_request(served):
    lib, open_engine = served

    class Broken(FakeJudge):
        def __call__(self, problem, question, *, answer, threshold, vouched=False):
            raise BackendError("llama_decode returned -3")

    engine = open_engine(lib, Broken({}), judge_mode="inline", guards=True)
    answer = engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    assert answer.route == "plain" and "the judge failed (llama_decode returned -3)" in answer.fallback_reason


def test_a_recorded_judge_that_cannot_be_opened_routes_without_a_judge(served, monkeypatch):
    lib, open_engine = served
    library = Library.open(lib)
    library.routing = {**library.routing, "judge": {"model": "corrupt.gguf", "prompt": "x", "threshold": 0.0}}
    library.save()

    def corrupt(model, **_):
        raise BackendError("failed to load model from corrupt.gguf")

    monkeypatch.setattr(library_routing, "open_judge", corrupt)
    engine = open_engine(lib)
    for question in (PARAPHRASE, ENTRIES[0].problem.lower()):  # refused by the word guards; passed by them
        answer = engine.ask(question, max_tokens=4, stop=[])
        assert answer.text  # answered, not failed, and the trail says why no judge decided
        note = "no judge: the judge corrupt.gguf cannot be opened (failed to load model from corrupt.gguf)"
        assert {"guard": "judge", "entry_id": "mul", "passed": True, "reason": note} in answer.match, answer.match
    assert engine.ask(PARAPHRASE, max_tokens=4, stop=[]).route == "plain"


def test_a_served_model_that_cannot_judge_routes_without_a_judge(served, monkeypatch):
    lib, open_engine = served

    def failing(model, **_):
        raise BackendError("cannot allocate the judge's context")

    monkeypatch.setattr(library_routing, "open_judge", failing)
    engine = open_engine(lib)
    engine.routing.served = Path(engine.backend.model_path)  # as for an instruct model with a chat template
    engine.routing.serving = False  # as while the engine opens, where the served model is opened as its judge
    answer = engine.ask(PARAPHRASE, max_tokens=4, stop=[])  # before: the BackendError failed the request
    assert answer.route == "plain" and answer.text
    assert any("the served model cannot judge" in (v["reason"] or "") for v in answer.match), answer.match


def test_no_judge_model_is_opened_inside_a_request(served, monkeypatch):
    """A judge the engine did not open when it opened (here: the served model, found instruct only later) is
    never loaded by a request: it is answered without a judge, and the trail says why."""
    lib, open_engine = served
    engine = open_engine(lib)
    opened = []
    monkeypatch.setattr(library_routing, "open_judge", lambda model, **_: opened.append(model))
    engine.routing.served = Path(engine.backend.model_path)
    answer = engine.ask(PARAPHRASE, max_tokens=4, stop=[])
    assert opened == [] and answer.route == "plain" and answer.text
    assert any("was not opened with the engine" in (v["reason"] or "") for v in answer.match), answer.match


def test_per_request_judge_settings_are_bounded(served):
    lib, open_engine = served
    engine = open_engine(lib, judge_model="off")
    for routing in ({"judge_model": "/tmp/another.gguf"}, {"judge_threshold": float("nan")},
                    {"judge_threshold": "abc"}, {"judge_threshold": float("-inf")}):  # fmt: skip
        with pytest.raises(ConfigError):
            engine.ask(PARAPHRASE, max_tokens=4, routing=routing)
    assert engine.ask(PARAPHRASE, max_tokens=4, routing={"judge_model": "off"}).route == "plain"


def test_distinct_per_request_thresholds_keep_a_bounded_number_of_routers_and_deferred_judges(served):
    lib, open_engine = served
    engine = open_engine(lib, FakeJudge({PARAPHRASE: 3.0}), judge_mode="async")
    for i in range(library_routing.MAX_ROUTERS + 8):  # each a setting of its own, as a client may send
        routing = {"threshold": 0.1 + i / 1000, "judge_threshold": 1.0 + i / 1000}
        engine.ask(PARAPHRASE, max_tokens=2, stop=[], routing=routing)
    assert len(engine.routing._routers) == len(engine.routing._deferred) == library_routing.MAX_ROUTERS
