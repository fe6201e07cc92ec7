import hashlib
import json
import re
from collections import defaultdict

import pytest

from trivium.tasks import corpus, generate_rows, write_word_problems
from trivium.tasks.word_problems import ITEMS, SLIP_PROB, VERBS

EQUATION = re.compile(r"^(\d+)([+-])(\d+)=(\d+)$")


def parse_question(question: str) -> tuple[int, list[tuple[int, int]]]:
    """Independent reading of a question: start value and (verb index, operand) per step."""
    sentences = [s.strip() for s in question.split(".") if s.strip()]
    head = re.fullmatch(r"(\w+) has (\d+) (\w+)", sentences[0])
    assert head, question
    name, start, item = head.group(1), int(head.group(2)), head.group(3)
    assert item in ITEMS and sentences[-1] == f"How many {item} does {name} have now?"
    steps = []
    for sentence in sentences[1:-1]:
        body = sentence.removeprefix("Then ").removeprefix(f"{name} ")
        hits = [
            (v, int(m.group(1)))
            for v, verb in enumerate(VERBS)
            if (
                m := re.fullmatch(
                    re.escape(verb.phrase).replace(r"\{n\}", r"(\d+)").replace(r"\{item\}", item), body
                )
            )
        ]
        assert len(hits) == 1, sentence
        steps.append(hits[0])
    assert 1 <= len(steps) <= 2
    return start, steps


def parse_answer(answer: str) -> tuple[list[tuple[int, str, int, int]], int]:
    *lines, final = answer.split("\n")
    assert final.startswith("#### ")
    equations = []
    for line in lines:
        m = EQUATION.fullmatch(line)
        assert m, answer
        equations.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))))
    return equations, int(final.removeprefix("#### "))


def test_same_seed_gives_identical_files_and_other_seeds_differ(tmp_path):
    small = {"n_train": 300, "n_test": 50, "n_sft": 300}
    a = write_word_problems(tmp_path / "a", seed=3, **small)
    b = write_word_problems(tmp_path / "b", seed=3, **small)
    c = write_word_problems(tmp_path / "c", seed=4, **small)
    assert set(a) == {"train", "test", "sft"}
    for split in a:
        assert a[split].read_bytes() == b[split].read_bytes()
        assert a[split].read_bytes() != c[split].read_bytes()
    assert len(a["train"].read_text().splitlines()) == 300
    assert len(a["test"].read_text().splitlines()) == 50


def test_splits_do_not_share_questions(tmp_path):
    paths = write_word_problems(tmp_path, seed=0, n_train=2000, n_test=256, n_sft=2000)
    questions = {
        s: [line.split('"answer"')[0] for line in p.read_text().splitlines()] for s, p in paths.items()
    }
    assert not set(questions["test"]) & (set(questions["train"]) | set(questions["sft"]))
    assert questions["train"][:50] != questions["sft"][:50]


def test_gold_answers_follow_from_the_question():
    for row in generate_rows(2000, seed=1):
        start, steps = parse_question(row["question"])
        equations, final = parse_answer(row["answer"])
        value = start
        for (verb, operand), (lhs, op, rhs, result) in zip(steps, equations, strict=True):
            assert (lhs, op, rhs) == (value, VERBS[verb].op, operand)
            value = value + operand if op == "+" else value - operand
            assert result == value
        assert final == value


def test_noisy_teacher_confuses_each_verb_at_its_configured_rate():
    n = 4000
    gold, noisy = generate_rows(n, seed=2), generate_rows(n, seed=2, noisy=True)
    wrong, seen = defaultdict(int), defaultdict(int)
    slips = 0
    for g, x in zip(gold, noisy, strict=True):
        assert g["question"] == x["question"]
        _, steps = parse_question(x["question"])
        equations, final = parse_answer(x["answer"])
        for (verb, _), (_, op, _, _) in zip(steps, equations, strict=True):
            seen[verb] += 1
            wrong[verb] += op != VERBS[verb].op
        slips += final != equations[-1][3]
    for v, verb in enumerate(VERBS):
        # ~600 steps per verb: binomial std <= 0.02, so 0.08 is a 4-sigma band
        assert wrong[v] / seen[v] == pytest.approx(verb.confusion, abs=0.08), verb.phrase
    assert slips / n == pytest.approx(SLIP_PROB, abs=0.02)


def test_no_negative_values_even_in_noisy_rows():
    for row in generate_rows(3000, seed=5, noisy=True):
        start, _ = parse_question(row["question"])  # EQUATION has no sign, so a negative would fail to parse
        equations, final = parse_answer(row["answer"])
        assert start >= 6 and final >= 0
        assert equations[0][0] == start


def test_corpus_has_question_and_solution_per_row():
    rows = generate_rows(3, seed=0)
    texts = list(corpus(rows))
    assert texts == [f"{r['question']}\n{r['answer']}" for r in rows]


def test_exclude_redraws_listed_questions():
    first = generate_rows(20, seed=7)
    redrawn = generate_rows(20, seed=7, exclude={r["question"] for r in first[:5]})
    assert not {r["question"] for r in first[:5]} & {r["question"] for r in redrawn}
    with pytest.raises(ValueError, match="n must be >= 0"):
        generate_rows(-1, seed=0)


def test_generated_files_load_as_a_task_set_and_gold_scores_one(tmp_path, monkeypatch):
    import datasets

    from trivium.buffer import TaskSetReader
    from trivium.rewards import get_reward_fn

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    paths = write_word_problems(tmp_path, seed=0, n_train=200, n_test=20, n_sft=200)
    reader = TaskSetReader(
        str(paths["train"]),
        name="word_problems",
        fields={"question": "question", "answer": "answer"},
        required={"question": (str,), "answer": (str,)},
        workflow="math",
        reward_fn="math_verify",
        repeat_times=8,
    )
    assert len(reader) == 200
    for name in ("math_verify", "exact_match"):
        reward = get_reward_fn(name)
        assert all(reward(t.data["answer"], t.data).reward == 1.0 for t in reader.all_tasks())


def test_explained_style_narrates_three_to_five_correct_steps():
    """The engine benchmark's long-answer workload: every step a sentence with its equation, gold right,
    the noisy teacher's rows the same questions, and no intermediate value below zero."""
    gold = generate_rows(200, seed=5, style="explained")
    noisy = generate_rows(200, seed=5, noisy=True, style="explained")
    assert [r["question"] for r in gold] == [r["question"] for r in noisy]
    step = re.compile(r"^(\w+) (.+), so (add|subtract): (\d+)([+-])(\d+)=(\d+)\.$")
    flips = 0
    for g, nz in zip(gold, noisy):
        start = int(re.match(r"\w+ has (\d+) ", g["question"]).group(1))
        assert 20 <= start <= 40
        for row in (g, nz):
            head, *steps, tail, final = row["answer"].split("\n")
            assert head.endswith(f"starts with {start} {head.split()[-1]}") and 3 <= len(steps) <= 5
            value = start
            for line in steps:
                m = step.fullmatch(line)
                assert m and int(m.group(4)) == value and (m.group(3) == "add") == (m.group(5) == "+")
                value = value + int(m.group(6)) if m.group(5) == "+" else value - int(m.group(6))
                assert int(m.group(7)) == value >= 0
            assert tail.startswith(f"So {head.split()[0]} has {value} ")
            if row is g:
                assert final == f"#### {value}"
        flips += g["answer"] != nz["answer"]
    assert flips > 50  # the confused teacher is confused
    with pytest.raises(ValueError, match="style is 'short' or 'explained'"):
        generate_rows(1, seed=0, style="long")


def test_explained_steps_sets_the_number_of_steps_and_the_default_keeps_the_files():
    """``steps`` draws that many steps per problem (the w25m learning check's 2-3); the default is the
    engine benchmark's 3-5, drawn from the same random stream as before the option existed."""
    counts = {
        r["question"].count(". Then ") + 1
        for r in generate_rows(300, seed=3, style="explained", steps=(2, 3))
    }
    assert counts == {2, 3}
    # The rows the generator gave before ``steps`` existed (the engine benchmark's files stay the same).
    rows = generate_rows(50, seed=3, style="explained")
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16] == "e3e67dfeeb6cefef"
    assert {r["question"].count(". Then ") + 1 for r in generate_rows(100, seed=3, style="explained")} == {
        3,
        4,
        5,
    }
    with pytest.raises(ValueError, match="need 1 <= fewest <= most steps"):
        generate_rows(1, seed=0, style="explained", steps=(3, 2))
