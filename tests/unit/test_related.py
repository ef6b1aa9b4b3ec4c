"""The ``related`` route over the scripted fake backend: when it applies, what it restores and prefills, how it
stops, and how it is forced, turned off and refused. The bitwise equality with text RAG on a real model is in
tests/integration/test_formats.py; the measurement that turns it on is `kvgraft calibrate --related`."""

from __future__ import annotations

import pytest
from test_aliases import served  # noqa: F401  (the fixture: a library built on the scripted fake backend)
from test_engine_fake import ScriptedBackend
from test_fallbacks_fake import BagOfWords

from kvgraft_plugin import ConfigError, GraftEngine, Library
from kvgraft_plugin.library.template import RELATED

NEAR_MISS = "What is 17 plus 23?"  # the word guards refuse it for `mul` ("What is 17 times 23?")


def prompt(engine) -> str:
    """The text of everything the last request's sampler saw: restored or prefilled."""
    return bytes(t for t in engine.backend.history if t < 256).decode()


def test_off_until_calibrated_and_the_result_says_why(served):  # noqa: F811
    lib, open_engine = served
    result = open_engine(lib).ask(NEAR_MISS, max_tokens=4, stop=[])
    assert result.route == "plain" and result.cue is None
    assert "related route off for entry mul: not calibrated on this library" in result.notes[0]


def test_on_a_near_miss_restores_its_neighbour_and_asks_a_new_problem(served):  # noqa: F811
    lib, open_engine = served
    engine = open_engine(lib, related=True)
    result = engine.ask(NEAR_MISS, max_tokens=4)
    assert (result.route, result.entry_id, result.cue) == ("related", "mul", "related")
    assert result.restored_tokens == len(engine.library.get("mul").tokens) and result.fallback_reason is None
    text = prompt(engine)
    assert text.endswith(f"Problem: {NEAR_MISS}\n{RELATED}\nSolution:")  # a solution, never the answer first
    assert "This is the problem solved above" not in text  # the entry is not restated as this problem
    twin = engine.ask(NEAR_MISS, mode="text-rag", entry_id="mul", cue="related", max_tokens=4)
    assert (twin.route, twin.cue, twin.text) == ("text-rag", "related", result.text)
    assert twin.prefill_tokens == result.prefill_tokens + result.restored_tokens and prompt(engine) == text


def test_the_same_problem_still_grafts_and_mode_related_forces_the_cue(served):  # noqa: F811
    lib, open_engine = served
    engine = open_engine(lib, related=True)
    same = engine.ask("What is 17 times 23?", max_tokens=4)
    assert (same.route, same.cue) == ("graft", "same")
    forced = engine.ask("What is 17 times 23?", mode="related", max_tokens=4)
    assert (forced.route, forced.entry_id, forced.cue) == ("related", "mul", "related")
    by_id = open_engine(lib).ask("Anything at all", mode="related", entry_id="gcd", max_tokens=4)
    assert (by_id.route, by_id.entry_id) == ("related", "gcd")  # forced where the library has it off


def test_nothing_close_enough_stays_plain(served):  # noqa: F811
    lib, open_engine = served
    engine = open_engine(lib, related=True, threshold=0.99)  # the related threshold defaults to routing's
    result = engine.ask(NEAR_MISS, max_tokens=4)
    assert result.route == "plain" and result.fallback_reason.startswith("no-match")
    assert not result.notes


def test_the_library_calibration_turns_it_on_or_off_and_a_revocation_wins(served):  # noqa: F811
    lib, open_engine = served
    library = Library.open(lib)
    library.routing = {**library.routing, "related": {"on": False, "why": "measured: copies rose, 5 vs 1"}}
    library.save()
    assert "copies rose, 5 vs 1" in open_engine(lib).ask(NEAR_MISS, max_tokens=4).notes[0]
    library.routing = {**library.routing, "related": {"on": True, "threshold": 0.1}}
    library.revoked = {"What is 17 plus 23?": "mul"}
    library.save()
    assert open_engine(lib).ask(NEAR_MISS, max_tokens=4).route == "plain"  # revoked for that entry
    library.revoked = {}
    library.save()
    assert open_engine(lib).ask(NEAR_MISS, max_tokens=4).route == "related"
    assert open_engine(lib).ask(NEAR_MISS, max_tokens=4, routing={"related": False}).route == "plain"


@pytest.mark.parametrize(("mode", "cue"), [("auto", "related"), ("plain", "same"), ("graft", "other")])
def test_a_cue_needs_a_forced_route(served, mode, cue):  # noqa: F811
    lib, open_engine = served
    with pytest.raises(ConfigError, match="cue is 'same' or 'related'"):
        open_engine(lib).ask(NEAR_MISS, mode=mode, cue=cue)


def test_a_related_answer_is_a_solution_that_ends_where_the_entrys_does(served):  # noqa: F811
    lib, _ = served
    script = b"17 + 23 = 40.\nAnswer: 40\n\nProblem: next"
    backend = ScriptedBackend(lib.parent / "fake.gguf", script)
    with GraftEngine(lib, backend=backend, embedder=BagOfWords(), n_threads=1, threshold=0.1, related=True) as engine:
        # the text template's answer format: an answer ends at its newline, a solution at its blank line
        assert engine.ask(NEAR_MISS, max_tokens=64).text == "17 + 23 = 40.\nAnswer: 40"
        assert engine.ask(NEAR_MISS, mode="text-rag", entry_id="mul", max_tokens=64).text == "17 + 23 = 40."
        assert engine.ask(NEAR_MISS, max_tokens=64, stop=["="]).text == "17 + 23 "  # the caller's stop wins


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("v = 150 / 12 = 12.5 m/s.\nAnswer: 12.5 m/s", 12.5),
        ("Answer: $1,234.50 in all", 1234.5),
        ("Le total est de 1 200 €, soit 10,55 € par personne.", 10.55),
        ("0,125 kg", 0.125),
        ("x = 3, then x + 1 = 4", 4.0),
        ("the volume is 45 x 3.14 = 141.3 m^3.", 141.3),  # a unit's exponent is no result
        ("a = 2.5 m/s^2 and v = 24 m/s", 24.0),
        ("no number here", None),
    ],
)
def test_a_worked_solution_is_read_by_its_final_number(text, number):
    from kvgraft_plugin.curation.answer_checks import final_number

    assert final_number(text) == number


def test_calibration_turns_the_route_on_only_for_more_right_answers_and_no_more_copies(served):  # noqa: F811
    from kvgraft_plugin.tools.calibrate import RelatedCalibration, calibrate_related

    assert RelatedCalibration(0.5, 20, (9, 15), (1, 1), "m").on
    assert not RelatedCalibration(0.5, 20, (9, 15), (1, 2), "m").on  # copies rose
    assert not RelatedCalibration(0.5, 20, (9, 9), (1, 0), "m").on  # no more right
    lib, open_engine = served
    queries = [
        {"id": "n1", "question": NEAR_MISS, "expect_entry": None, "value": 40},  # the fake says "391." to all
        {"id": "p1", "question": "What is 17 times 23?", "expect_entry": "mul", "value": 391},  # same: not asked
        {"id": "u1", "question": "Name a colour.", "expect_entry": None, "answer": "blue"},  # no number: left out
    ]
    measured = calibrate_related(open_engine(lib), queries, max_tokens=8)
    assert (measured.asked, measured.right, measured.copied, measured.on) == (1, (0, 0), (1, 1), False)
    assert "right 0 with the related entry vs 0 plain, the entry's answer copied 1 vs 1" in measured.why
