"""Studio in a real browser (headless Chromium driven by Playwright): load the quickstart's config in the
builder, see an error appear on a wrong field, fix and save it, launch it from the Runs page for a few steps
of each stage (SFT, then the quickstart's GRPO stage), watch its chart grow, find a token's advantage on the
Trajectories page, annotate three pairs and train DPO on them, compare runs; screenshots of every page (into TRIVIUM_STUDIO_SCREENSHOTS, e.g. docs/studio, when it is set).

Needs Debian's chromium (.ci/run installs it); without it the test is skipped, unless
TRIVIUM_REQUIRE_BROWSER=1 (set by .ci/run), where a missing browser fails it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.studio.conftest import quickstart_config, wait_for

from trivium.monitor.metrics import read_metrics
from trivium.monitor.trajectories import read_trajectories

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("TRIVIUM_REQUIRE_BROWSER") != "1":
    pytest.skip("no chromium on this machine (apt-get install chromium)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, **options):
    """A page whose waits last up to 2 min (playwright's default is 30 s): each returns as soon as its
    condition holds, and on a loaded 2-core machine a Studio request behind a training run can take longer."""
    page = browser.new_page(**options)
    page.set_default_timeout(120_000)
    return page


def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("TRIVIUM_STUDIO_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.integration
def test_the_shipped_examples_open_in_place_with_no_problem(browser, tmp_path):
    """Issue 27 item 1: with the README's `--configs examples`, the builder took a config's relative paths
    from the configs root, so the quickstart showed five 'file not found' problems. Each example is loaded
    where it ships (nothing is copied), and the builder must say valid."""
    from tests.studio.conftest import Studio

    examples = Path(__file__).resolve().parents[2] / "examples"
    # (decoupled/grpo.yaml starts from the quickstart's checkpoint, agents/ from make_data.py: not here)
    names = ["quickstart/grpo_word_problems.yaml", "countdown/countdown.yaml", "plugins/plugins.yaml"]
    with Studio(tmp_path / "runs", examples) as studio:
        page = open_page(browser, viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{studio.url}/#/builder")
        # The empty form is checked too (300 ms after the page draws): wait for its answer first, or it can
        # land after a load and be read as that config's problems (CI saw exactly that once).
        page.wait_for_selector("#problems li")
        for name in names:
            # the previous answer is wiped, so the next one on the page can only be this config's own check
            page.evaluate(
                "() => { document.getElementById('verdict').textContent = '…'; "
                "document.getElementById('problems').replaceChildren(); }"
            )
            page.select_option("#load-config", str(examples / name))
            page.click("text=load")
            page.wait_for_selector('#verdict:has-text("valid"), #problems li')
            problems = page.locator("#problems li").all_inner_texts()
            assert not problems, (name, problems)
        assert not errors


@pytest.mark.integration
def test_annotating_calls_of_a_run_that_serves_none_explains_and_offers_no_form(studio, browser):
    """Issue 27 item 5: the serve-calls page of a run that is not a serve run showed a red error banner and
    still offered its send form."""
    page = open_page(browser)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{studio.url}/#/annotate?id=p/none&source=calls")
    text = page.locator("#annotate-not-serve").inner_text()
    assert "has no served calls" in text and "mode=serve" in text
    assert page.locator("#sample").count() == 0 and not errors


@pytest.mark.integration
def test_each_stage_has_its_own_charts_and_compare_aligns_stages(studio, browser):
    """Issue 27 items 2 and 3: an SFT and a GRPO loss shared one line on one scale (the GRPO loss flat, no
    stage marked), phase times showed the first 6 keys alphabetically, and Compare could only put runs on the
    global step, where a stage of a two-stage run never overlaps a one-stage run of the same algorithm."""
    from tests.studio.conftest import tiny_run_config

    two = tiny_run_config(studio.configs, "two")  # SFT 4 steps, then GRPO 3
    cfg = yaml.safe_load(two.read_text())
    cfg["name"], cfg["stages"] = "one", cfg["stages"][1:]  # the same GRPO stage alone
    (studio.configs / "one.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    for name in ("two", "one"):
        launched = studio.http.post("/api/runs/launch", json={"config": str(studio.configs / f"{name}.yaml")})
        assert launched.status_code == 200, launched.text
    states = lambda: {r["id"]: r["state"] for r in studio.http.get("/api/runs").json()}  # noqa: E731
    wait_for(lambda: states() == {"e2e/two": "finished", "e2e/one": "finished"}, what="both runs to finish")

    page = open_page(browser, viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{studio.url}/#/run?id=e2e%2Ftwo")
    sft = page.locator('svg[data-key="train/loss"][data-stage="sft"] polyline')
    sft.wait_for()
    grpo = page.locator('svg[data-key="train/loss"][data-stage="grpo"] polyline')
    assert (sft.get_attribute("data-points"), grpo.get_attribute("data-points")) == ("4", "3")
    assert (grpo.get_attribute("data-first"), grpo.get_attribute("data-last")) == ("5", "7")
    assert "sft: steps 1–4 · grpo: steps 5–7" in page.inner_text("#stage-strip")
    keys = ("train/grad_norm", "train/lr", "time/step", "time/train", "time/rollout")
    tail = ("rollout/task_seconds_p95", "rollout/task_seconds_max", "rollout/timed_out_tasks")  # (issue 30)
    for key in (*keys, *tail):
        assert page.locator(f'svg[data-key="{key}"] polyline').count() >= 1, key

    page.goto(f"{studio.url}/#/compare?ids=e2e/two,e2e/one")
    one = page.locator('svg[data-key="train/loss"] polyline[data-run="e2e/one"]')
    one.wait_for(state="attached")  # (a flat line has no height: playwright calls it hidden)
    assert page.locator('svg[data-key="train/loss"] polyline').count() == 3  # two's sft and grpo, one's grpo
    two_grpo = page.locator('svg[data-key="train/loss"] polyline[data-run="e2e/two"][data-stage="grpo"]')
    assert two_grpo.get_attribute("data-first") == "5" and one.get_attribute("data-first") == "1"
    assert two_grpo.get_attribute("stroke-dasharray") != "none"  # a run's second stage is dashed
    page.select_option("#compare-x", "step")
    page.wait_for_selector(
        'svg[data-key="train/loss"] polyline[data-run="e2e/two"][data-stage="grpo"][data-first="1"]',
        state="attached",
    )
    assert one.get_attribute("data-first") == "1" and two_grpo.get_attribute("data-last") == "3"
    assert not errors, errors


@pytest.mark.integration
@pytest.mark.slow
def test_build_a_config_launch_it_and_watch_it_learn(studio, browser, tmp_path):
    config = quickstart_config(studio.configs)
    short = (
        "stages.0.buffer.total_steps=20; stages.0.trainer.warmup_steps=2; stages.1.buffer.total_steps=6; "
        "stages.1.buffer.batch_size=16"  # half the quickstart's GRPO batch: the charts need steps, not size
    )
    run_id, run_dir = "quickstart/word-problems", studio.root / "quickstart" / "word-problems"
    out = shots(tmp_path)
    page = open_page(browser, viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    # the builder: load the config, break a field, see the problem on it, fix it, save under a new name
    page.goto(f"{studio.url}/#/builder")
    page.select_option("#load-config", str(config))
    page.click("text=load")
    page.wait_for_selector('#verdict:has-text("valid")')
    page.click('fieldset[data-path="trainer"] > legend')
    lr = page.locator('input[data-path="trainer.lr"]')
    lr.fill("-1")
    lr.press("Tab")
    problem = page.locator('.field.problem[data-field="trainer.lr"] .problem-text')
    problem.wait_for()
    assert "greater than 0" in problem.inner_text()
    assert "trainer.lr" in page.inner_text("#problems")
    page.screenshot(path=str(out / "builder.png"), full_page=False)
    lr.fill("0.002")
    lr.press("Tab")
    page.wait_for_selector('#verdict:has-text("valid")')
    assert "lr: 0.002" in page.inner_text("#yaml")
    page.fill("#save-name", "built.yaml")
    page.click("#save")
    page.wait_for_selector("#flash.ok")
    page.click("#run-doctor")
    page.wait_for_selector('#doctor:has-text("MiB")')
    assert "experiences per step" in page.inner_text("#doctor").lower()
    page.locator("#doctor").scroll_into_view_if_needed()
    page.screenshot(path=str(out / "doctor.png"))
    saved = yaml.safe_load((studio.configs / "built.yaml").read_text())
    assert saved["trainer"]["lr"] == 0.002 and saved["stages"][1]["name"] == "grpo"

    # the runs page: launch the saved config, 20 SFT steps then 6 of the quickstart's GRPO stage, with
    # trajectories recorded every 2 steps
    page.goto(f"{studio.url}/#/runs")
    page.select_option("#launch-config", str(studio.configs / "built.yaml"))
    page.fill("#launch-overrides", f"{short}; monitor.trajectories.every=2; monitor.trajectories.per_step=8")
    page.click("#launch")
    page.wait_for_selector(f'tr[data-run="{run_id}"]')
    page.screenshot(path=str(out / "runs.png"))

    # the run page: its loss chart grows while it runs, then it finishes
    page.click('a[href="#/run?id=quickstart%2Fword-problems"]')
    line = page.locator('svg[data-key="train/loss"] polyline').first  # SFT's, while only SFT has run
    line.wait_for(timeout=120_000)
    first = int(line.get_attribute("data-points"))
    wait_for(lambda: int(line.get_attribute("data-points")) > first, what="the loss chart to grow")
    page.wait_for_selector(".state.finished", timeout=300_000)
    page.wait_for_selector('svg[data-key="rollout/reward_mean"] polyline')
    sft, grpo = (f'svg[data-key="train/loss"][data-stage="{s}"] polyline' for s in ("sft", "grpo"))
    assert (
        page.locator(sft).get_attribute("data-points"),
        page.locator(grpo).get_attribute("data-points"),
    ) == (
        "20",
        "6",
    )
    page.screenshot(path=str(out / "run.png"), full_page=True)

    # the trajectories page: find a token's advantage, coloured by advantage, the best-rewarded sample first
    page.click("#open-trajectories")
    page.wait_for_selector(".sample")
    page.select_option("#traj-measure", "advantage")
    legend = page.locator("#colour-legend").inner_text()  # what the colours mean (issue 27 item 4)
    assert legend.startswith("advantage:") and "negative" in legend and "positive" in legend, legend
    page.select_option("#traj-sort", "reward")
    page.select_option("#traj-order", "true")
    page.wait_for_selector(".sample .tok[data-advantage]")
    first = page.locator(".sample").first
    token = first.locator(".tok[data-advantage]").nth(0)
    shown = float(token.get_attribute("data-advantage"))
    assert f"advantage {token.get_attribute('data-advantage')}" in token.get_attribute("title")
    records = read_trajectories(run_dir)
    assert len(records) == 3 * 8  # GRPO steps 2, 4, 6; 8 samples each (2 of each of 4 of the 16 groups)
    best = max(r["reward"] for r in records)
    match = next(
        r
        for r in records
        if r["global_step"] == int(first.get_attribute("data-global-step"))
        and r["group_id"] == int(first.get_attribute("data-group"))
        and r["run_index"] == int(first.get_attribute("data-run-index"))
    )
    assert match["reward"] == best and match["advantage"][0] == shown
    page.select_option("#traj-sort", "advantage")
    page.wait_for_timeout(500)
    page.screenshot(path=str(out / "trajectories.png"), full_page=False)

    # annotate: three picks by keyboard, then DPO trains on the pairs they wrote
    page.goto(f"{studio.url}/#/annotate?id={run_id}")
    page.wait_for_selector("#annotate [data-answer]")
    page.screenshot(path=str(out / "annotate.png"))
    for _ in range(3):
        key = page.locator("#annotate [data-key]").get_attribute("data-key")
        # the first answer with text (an empty sampled answer is refused as the chosen one, rightly)
        texts = page.locator("#annotate [data-answer] pre").all_inner_texts()
        page.keyboard.press(str(next(i for i, t in enumerate(texts, 1) if t.strip())))
        page.wait_for_function(f"!document.querySelector('#annotate [data-key=\"{key}\"]')")
    pairs = [
        json.loads(x)
        for x in (studio.configs / "annotations" / "quickstart__word-problems.jsonl").read_text().splitlines()
    ]
    assert len({p["source"]["key"] for p in pairs}) == 3 and all(p["chosen"] != p["rejected"] for p in pairs)
    dpo = {
        "project": "e2e",
        "name": "dpo",
        "checkpoint_root": str(tmp_path / "dpo-runs"),
        "mode": "train",
        "model": {"path": str(run_dir / "checkpoints" / "grpo" / "step_6" / "model")},
        "algorithm": {"algorithm_type": "dpo"},
        "buffer": {
            "batch_size": 2,
            "total_steps": 2,
            "preference_dataset": {"path": "annotations/quickstart__word-problems.jsonl"},
        },
        "monitor": {"progress_bar": False},
    }
    (studio.configs / "dpo.yaml").write_text(yaml.safe_dump(dpo))
    trained = subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(studio.configs / "dpo.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path / "dpo-runs" / "e2e" / "dpo") if "dpo/loss" in r] == [
        1,
        2,
    ]

    # compare: two runs overlaid
    page.goto(f"{studio.url}/#/runs")
    page.select_option("#launch-config", str(studio.configs / "built.yaml"))
    page.fill("#launch-overrides", f"name=word-problems-2; {short}; stages.1.trainer.lr=0.001")
    page.click("#launch")
    page.wait_for_selector('tr[data-run="quickstart/word-problems-2"] .state.finished', timeout=300_000)
    page.goto(f"{studio.url}/#/compare?ids={run_id},quickstart/word-problems-2")
    page.wait_for_selector('svg[data-key="train/loss"] polyline[data-run="quickstart/word-problems-2"]')
    assert page.locator('svg[data-key="train/loss"] polyline').count() == 4  # each run's SFT and GRPO
    page.select_option("#compare-x", "step")  # the stages overlaid
    page.wait_for_selector(
        'svg[data-key="train/loss"] polyline[data-stage="grpo"][data-first="1"]', state="attached"
    )
    page.screenshot(path=str(out / "compare.png"), full_page=True)
    assert not errors, errors


@pytest.mark.integration
@pytest.mark.slow
def test_reward_serve_calls_by_keyboard_and_view_the_buffer(studio, browser, tiny_model_dir, tmp_path):
    """A serve-mode run's pending calls rewarded from the annotation page (g: good; 2: the second choice
    good, the first bad), then the run's SQL buffer shown token by token on the Trajectories page."""
    import openai
    from tests.studio.conftest import QUESTION, serving_run

    from trivium.buffer.storage_sql import SqlStorage

    out = shots(tmp_path)
    page = open_page(browser, viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with serving_run(studio, tiny_model_dir, tmp_path) as info:
        client = openai.OpenAI(base_url=info["base_url"], api_key="EMPTY", max_retries=0)
        one, two = (client.chat.completions.create(model="live", messages=QUESTION, n=n) for n in (1, 2))
        page.goto(f"{studio.url}/#/annotate?id=serve/live&source=calls")
        page.wait_for_selector(f'#annotate [data-call="{two.id}"]')  # the newest first
        assert page.locator("#annotate [data-answer]").count() == 2
        page.screenshot(path=str(out / "annotate_calls.png"))
        page.keyboard.press("2")
        page.wait_for_selector(f'#annotate [data-call="{one.id}"]')
        page.keyboard.press("g")
        page.wait_for_selector("#annotate-done")
        with SqlStorage(studio.root / "serve" / "live" / "buffer.sqlite") as storage:
            rewards = {(e.task_id, e.run_index): e.reward for e in storage.peek("ready")}
        assert rewards == {(two.id, 0): 0.0, (two.id, 1): 1.0, (one.id, 0): 1.0}

        page.goto(f"{studio.url}/#/trajectories?id=serve/live")
        page.select_option("#traj-source", "buffer")
        page.wait_for_selector(".sample .tok")
        assert page.locator(".sample").count() == 3
        assert "rollout log-prob" in page.locator(".sample .tok:not(.prompt)").first.get_attribute("title")
    assert not errors, errors


@pytest.mark.integration
def test_a_vision_agents_samples_show_their_pictures(studio, browser, tmp_path):
    """The FrozenLake-from-pictures example (shortened) under Studio's root: the Trajectories page shows each
    picture in place of its visual tokens (the environment's pictures marked as not trained), served from
    the run's image store; a bad or unknown image reference is answered 400 / 404."""
    from tests.examples.test_vision_example import short_frozenlake

    from trivium.cli import main as cli

    assert cli(["run", "--config", str(short_frozenlake(tmp_path, studio.root))]) == 0
    records = read_trajectories(studio.root / "vision" / "frozenlake")
    ref = records[0]["images"][0]
    answer = studio.http.get("/api/run/image", params={"id": "vision/frozenlake", "ref": ref})
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/png"
    assert (
        answer.content
        == (studio.root / "vision" / "frozenlake" / "images" / ref[:2] / f"{ref}.png").read_bytes()
    )
    bad = studio.http.get("/api/run/image", params={"id": "vision/frozenlake", "ref": "../../status.json"})
    assert bad.status_code == 400 and "not an image reference" in bad.json()["error"]
    missing = studio.http.get("/api/run/image", params={"id": "vision/frozenlake", "ref": "0" * 64})
    assert missing.status_code == 404 and "has no image" in missing.json()["error"]

    page = open_page(browser, viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{studio.url}/#/trajectories?id=vision/frozenlake")
    page.wait_for_selector(".sample img.pic")
    pictures = sum(len(r["images"]) for r in records[: page.locator(".sample").count()])
    assert page.locator(".sample img.pic").count() == pictures
    assert page.locator(".sample img.pic.env").count() == pictures - page.locator(".sample").count()
    page.wait_for_function(
        "[...document.querySelectorAll('img.pic')].every((i) => i.complete && i.naturalWidth === 84)"
    )
    first = page.locator(".sample img.pic").first
    assert "9 visual tokens" in first.get_attribute("title") and first.get_attribute("data-ref") == ref
    # no token of a picture is shown as text: the placeholder runs are replaced whole
    assert "image_pad" not in page.locator("#samples").inner_text()
    page.screenshot(path=str(shots(tmp_path) / "trajectories_pictures.png"))
    assert not errors, errors
