"""Token-in, token-out transcripts and the chat-template checker."""

import pytest
from transformers import AutoTokenizer

from trivium.models.chat import TemplateError
from trivium.models.protocol import Generation
from trivium.models.transcript import Transcript, check_template, probe_conversation, render_ids


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def fake_generation(tok, prompt, text, eos=True):
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    return Generation(tuple(prompt), tuple(ids), tuple(-0.5 for _ in ids), "eos" if eos else "length", text)


def test_transcript_equals_the_template_rendering_when_turns_match_it(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "2 + 3?"}]
    t = Transcript(tok, msgs)
    t.add_generation(fake_generation(tok, t.ids, "5"))
    t.add_messages([{"role": "user", "content": "times 4?"}])
    t.add_generation(fake_generation(tok, t.ids, "20"))
    full = [*msgs, {"role": "assistant", "content": "5"}, {"role": "user", "content": "times 4?"}]
    full.append({"role": "assistant", "content": "20"})
    rendered = render_ids(tok, full, False)
    # The transcript stops at the model's eos; the template adds its closing glue after it.
    assert rendered[: len(t.tokens)] == t.tokens
    assert len(t.mask) == len(t.tokens) - t.prompt_length == len(t.logprobs)
    assert t.turns == 2


def test_a_turn_cut_without_eos_gets_the_end_of_turn_token_masked(tok):
    t = Transcript(tok, [{"role": "user", "content": "hi"}])
    t.add_generation(fake_generation(tok, t.ids, "abc", eos=False))
    added = t.add_messages([{"role": "tool", "content": "7"}])
    assert added[0] == tok.eos_token_id and t.mask[-len(added) :] == [False] * len(added)


def test_generation_from_another_prompt_is_refused(tok):
    t = Transcript(tok, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="another prompt"):
        t.add_generation(fake_generation(tok, [1, 2, 3], "x"))
    with pytest.raises(RuntimeError, match="model turn must come first"):
        t.add_messages([{"role": "user", "content": "x"}])


def test_fork_is_independent(tok):
    t = Transcript(tok, [{"role": "user", "content": "hi"}])
    t.add_generation(fake_generation(tok, t.ids, "a"))
    other = t.fork()
    other.add_messages([{"role": "user", "content": "b"}])
    assert len(other.tokens) > len(t.tokens) and len(t.messages) == 2


def test_tiny_template_is_prefix_stable(tok):
    report = check_template(tok)
    assert report.stable, str(report)


STRIPPING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{% set c = m['content'] %}"
    "{% if not loop.last and '</think>' in c %}{% set c = c.split('</think>')[-1].lstrip() %}{% endif %}"
    "<|assistant|>\n{{ c }}<|end|>\n"
    "{% elif m['role'] == 'tool' %}<|user|>\n{{ m['content'] }}\n"
    "{% else %}<|user|>\n{{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_a_template_that_strips_reasoning_is_detected(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = STRIPPING_TEMPLATE
    report = check_template(tok, probe_conversation(reasoning=True))
    assert not report.stable
    assert "assistant turn 4" in str(report) and "think" in str(report)
    assert check_template(tok, probe_conversation(reasoning=False)).stable


def test_a_template_without_end_of_turn_token_is_refused(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}\n"
        "{% else %}<|user|>\n{{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    t = Transcript(tok, [{"role": "user", "content": "hi"}])
    t.add_generation(fake_generation(tok, t.ids, "x"))
    with pytest.raises(TemplateError, match="end-of-turn"):
        t.add_messages([{"role": "user", "content": "y"}])


def test_check_template_command_reports_and_exits_by_stability(tiny_model_dir, tmp_path, capsys):
    from trivium.cli import main

    assert main(["check-template", str(tiny_model_dir)]) == 0
    assert "is prefix-stable" in capsys.readouterr().out
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = STRIPPING_TEMPLATE
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    assert main(["check-template", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "NOT prefix-stable" in out and "allow_unstable_template" in out
    assert main(["check-template", str(tmp_path / "missing")]) == 2
