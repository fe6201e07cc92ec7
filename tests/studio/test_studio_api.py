"""Studio's API on a real server: paths outside its folders, invalid configs, launches and stops that do not
fit the run's state, the access token, and a run launched, watched and finished."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.studio.conftest import Studio, tiny_run_config, wait_for

from trivium.monitor.status import read_status


def test_paths_outside_the_root_and_config_folders_are_refused(studio, tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text("project: x\n")
    for url in (
        f"/api/configs/read?path={secret}",
        "/api/configs/read?path=../secret.yaml",
        "/api/run?id=../configs",
        "/api/run/metrics?id=/etc",
    ):
        answer = studio.http.get(url)
        assert answer.status_code == 403, (url, answer.text)
        assert "outside the folders Studio may use" in answer.json()["error"]
    saved = studio.http.post(
        "/api/configs/save", json={"path": str(tmp_path / "evil.yaml"), "text": "a: 1\n"}
    )
    assert saved.status_code == 403 and not (tmp_path / "evil.yaml").exists()
    launched = studio.http.post("/api/runs/launch", json={"config": str(secret)})
    assert launched.status_code == 403
    assert not any((tmp_path / "runs").iterdir())  # nothing written


def test_validation_puts_each_problem_on_its_field_and_save_keeps_only_yaml(studio):
    text = "project: p\nname: n\nmodel:\n  path: nowhere\ntrainer:\n  lr: -1\n  strategy: mpi\n"
    result = studio.http.post("/api/validate", json={"text": text}).json()
    paths = {p["path"] for p in result["problems"]}
    assert not result["ok"] and {"trainer.lr", "trainer.strategy"} <= paths
    strategy = next(p for p in result["problems"] if p["path"] == "trainer.strategy")
    assert "single" in strategy["rule"] + strategy["fix"]  # the choices are named
    broken = studio.http.post("/api/validate", json={"text": "trainer: [unclosed\n"}).json()
    assert broken["parse_error"] and "YAML" in broken["problems"][0]["rule"]
    target = studio.configs / "sub" / "new.yaml"
    answer = studio.http.post("/api/configs/save", json={"path": str(target), "text": "trainer: [unclosed\n"})
    assert answer.status_code == 409 and not target.exists()
    answer = studio.http.post("/api/configs/save", json={"path": str(target), "text": text})
    assert answer.status_code == 200 and yaml.safe_load(target.read_text())["trainer"]["lr"] == -1
    assert not answer.json()["ok"]  # saved with its problems listed
    assert (
        studio.http.post(
            "/api/configs/save", json={"path": str(studio.configs / "x.txt"), "text": text}
        ).status_code
        == 409
    )


def test_a_plugin_that_ends_the_process_on_import_does_not_end_studio(studio):
    """Issue 26 item 7: /api/validate imports a config's plugins in Studio's process; one calling
    os._exit() on import ended Studio. It is imported in a child process first and named as a problem."""
    (studio.configs / "ender.py").write_text("import os\nos._exit(3)\n")
    text = "plugins: [ender]\nmodel: {path: Qwen/Qwen2.5-0.5B}\n"
    result = studio.http.post("/api/validate", json={"text": text}).json()
    problem = next(p for p in result["problems"] if p["path"] == "plugins[0]")
    assert "ended the Python process" in problem["rule"] and "exit code 3" in problem["rule"]
    assert studio.http.get("/api/info").status_code == 200  # Studio still answers


@pytest.mark.slow
def test_a_run_launched_from_studio_is_listed_watched_and_cannot_be_launched_twice(studio):
    path = tiny_run_config(studio.configs, sft_steps=3, grpo_steps=2)
    started = studio.http.post("/api/runs/launch", json={"config": str(path)})
    assert started.status_code == 200, started.text
    run_id = started.json()["id"]
    assert run_id == "e2e/tiny"
    wait_for(
        lambda: (read_status(studio.root / run_id) or {}).get("state") == "running", what="the run to start"
    )
    again = studio.http.post("/api/runs/launch", json={"config": str(path)})
    assert again.status_code == 409 and "already running" in again.json()["error"]
    finished = wait_for(
        lambda: (r := studio.http.get(f"/api/run?id={run_id}").json())["state"] == "finished" and r,
        what="the run to finish",
    )
    assert finished["last"]["stage"] == "grpo" and finished["last"]["step"] == 2
    records = studio.http.get(f"/api/run/metrics?id={run_id}").json()
    assert [(r["stage"], r["step"]) for r in records if "train/loss" in r][-2:] == [("grpo", 1), ("grpo", 2)]
    assert "run finished" in studio.http.get(f"/api/run/log?id={run_id}").json()["log"]
    assert "grpo" in studio.http.get(f"/api/run/config?id={run_id}").text
    assert [r["id"] for r in studio.http.get("/api/runs").json()] == [run_id]
    stop = studio.http.post(f"/api/run/stop?id={run_id}")
    assert stop.status_code == 409 and "not running (finished)" in stop.json()["error"]
    assert read_status(studio.root / run_id)["state"] == "finished"  # unchanged
    assert studio.http.post("/api/run/stop?id=e2e/none").status_code == 404


def test_the_access_token_is_required_and_a_network_bind_needs_one(tmp_path):
    configs = tmp_path / "c"
    configs.mkdir()
    with Studio(tmp_path / "runs", configs, token="s3cret") as s:
        import httpx

        assert httpx.get(f"{s.url}/api/runs").status_code == 401
        assert s.http.get("/api/runs").status_code == 200  # Bearer header
        page = httpx.get(f"{s.url}/?token=s3cret")
        assert page.status_code == 200 and "trivium_studio" in page.headers["set-cookie"]
    for extra in (["--host", "0.0.0.0"], ["--token", "  "]):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "trivium.cli",
                "studio",
                "--root",
                str(tmp_path / "r"),
                "--configs",
                str(configs),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert "--token" in result.stderr


def test_a_foreign_page_cannot_reach_studio_by_dns_rebinding_or_a_cross_site_post(tmp_path):
    """Issue 26 item 7: Studio did not check Host and had no token on 127.0.0.1, so a page of another site
    could reach /api/validate (which imports a config's plugins) through DNS rebinding."""
    import httpx

    configs = tmp_path / "c"
    configs.mkdir()
    body = {"text": "model: {path: Qwen/Qwen2.5-0.5B}\n"}
    with Studio(tmp_path / "runs", configs, token="t0k", token_for_reads=False) as s:
        for name in ("127.0.0.1", "localhost", "studio.localhost"):
            assert httpx.get(f"{s.url}/api/info", headers={"Host": f"{name}:{s.port}"}).status_code == 200
        rebound = httpx.get(f"{s.url}/api/info", headers={"Host": f"evil.example:{s.port}"})
        assert rebound.status_code == 403 and "DNS rebinding" in rebound.json()["error"]
        assert "--allowed-host evil.example" in rebound.json()["error"]
        assert httpx.get(f"{s.url}/api/runs").status_code == 200  # reads on loopback need no token
        assert httpx.post(f"{s.url}/api/validate", json=body).status_code == 401  # imports plugins: token
        foreign = {"Origin": "http://evil.example", "Authorization": "Bearer t0k"}
        assert httpx.post(f"{s.url}/api/validate", json=body, headers=foreign).status_code == 403
        own = {"Origin": s.url, "Authorization": "Bearer t0k"}
        assert httpx.post(f"{s.url}/api/validate", json=body, headers=own).status_code == 200
        page = httpx.get(f"{s.url}/?token=t0k")  # the printed URL: its cookie carries the token after
        cookies = {"trivium_studio": page.cookies["trivium_studio"]}
        assert httpx.post(f"{s.url}/api/validate", json=body, cookies=cookies).status_code == 200
    with Studio(tmp_path / "runs", configs, token_for_reads=False, allowed_hosts=("box.lan",)) as s:
        assert httpx.get(f"{s.url}/api/info", headers={"Host": "box.lan"}).status_code == 200


def test_studio_on_loopback_prints_a_url_with_its_token(tmp_path):
    configs = tmp_path / "c"
    configs.mkdir()
    from tests.studio.conftest import free_port

    args = ["studio", "--root", str(tmp_path / "r"), "--configs", str(configs), "--port", str(free_port())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trivium.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert line.startswith("Trivium Studio on http://127.0.0.1:") and "/?token=" in line, line


def test_the_schema_has_every_field_with_its_doc(studio):
    schema = studio.http.get("/api/schema").json()
    lr = schema["$defs"]["TrainerConfig"]["properties"]["lr"]
    assert lr["default"] > 0 and lr["description"] and "exclusiveMinimum" in lr
    assert json.dumps(schema).count('"description"') > 150


def test_the_doctor_explains_a_config_and_refuses_an_invalid_one(studio):
    path = tiny_run_config(studio.configs)
    answer = studio.http.post("/api/doctor", json={"text": path.read_text()})
    assert answer.status_code == 200, answer.text
    text = answer.json()["text"]
    assert "grpo" in text and "experiences per step" in text.lower() and "MiB" in text
    bad = studio.http.post("/api/doctor", json={"text": "trainer:\n  lr: -1\n"})
    assert bad.status_code == 422 and any(p["path"] == "trainer.lr" for p in bad.json()["problems"])


def test_an_empty_answer_is_never_written_as_rejected(tmp_path):
    """The preference reader refuses empty text, so a pair with an empty rejected answer would stop the DPO
    run that reads the annotations: such answers are left out, and a group with nothing else is refused."""
    from trivium.studio.annotate import pending_items, write_pick
    from trivium.studio.files import Guard

    run = tmp_path / "runs" / "p" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    chat = [{"role": "user", "content": "2+2?"}]
    rows = [(1, 0, "#### 4"), (1, 1, ""), (1, 2, "#### 5"), (2, 0, "#### 4"), (2, 1, " ")]
    (run / "trajectories.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "global_step": 1,
                    "group_id": g,
                    "run_index": i,
                    "messages": chat,
                    "response": text,
                    "reward": 0.0,
                }
            )
            + "\n"
            for g, i, text in rows
        )
    )
    guard = Guard.of(tmp_path / "runs", [tmp_path / "configs"])
    done = write_pick(guard, "p/r", "1:1", chosen=0)
    assert (done["pairs"], done["empty_left_out"]) == (1, 1)
    written = [json.loads(x) for x in Path(done["file"]).read_text().splitlines()]
    assert [(p["chosen"], p["rejected"]) for p in written] == [("#### 4", "#### 5")]
    assert pending_items(guard, "p/r")["items"] == []  # 1:1 is done; 1:2 has one answer with text
    with pytest.raises(FileNotFoundError, match="no group '1:2'"):
        write_pick(guard, "p/r", "1:2", chosen=0)
    # an edit equal to the only other answer with text leaves nothing to pair against
    (run / "trajectories.jsonl").write_text(
        (run / "trajectories.jsonl").read_text().replace('"group_id": 1', '"group_id": 3')
    )
    with pytest.raises(ValueError, match="nothing to pair it against"):
        write_pick(guard, "p/r", "1:3", chosen=0, edited="#### 5")


def test_a_run_started_from_the_command_line_shows_its_log(studio, tiny_model_dir, word_problem_dir):
    """Issue 27 item 2: Studio's log box was empty for a run started with `trivium run` (no log file)."""
    from tests.launch.helpers import tiny_run_config

    from trivium.cli import main as cli

    cfg = tiny_run_config(studio.root.parent, tiny_model_dir, "cli", "sft")
    cfg.update(checkpoint_root=str(studio.root), mode="train", algorithm={"algorithm_type": "sft"})
    sft = {
        "path": str(word_problem_dir / "sft.jsonl"),
        "fields": {"prompt": "question", "response": "answer"},
    }
    cfg["buffer"] = {"batch_size": 2, "total_steps": 1, "sft_dataset": sft}
    path = studio.root.parent / "cli.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "-c", str(path)]) == 0
    assert (studio.root / "cli" / "sft" / "run.log").exists()
    log = studio.http.get("/api/run/log", params={"id": "cli/sft"}).json()["log"]
    assert "stage main" in log and "run finished" in log
