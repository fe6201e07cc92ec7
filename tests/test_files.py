"""trivium/files.py: atomic writes (whole or not at all) and JSONL files cut back to a point."""

import json
import threading

import pytest

from trivium.files import atomic_path, rewrite_jsonl, write_atomically


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_atomically(path, '{"a": 1}')
    write_atomically(path, b'{"a": 2}', durable=True)
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "explore_state.pt"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="killed mid-write"), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["explore_state.pt"]


def test_writers_in_several_threads_never_mix_their_files(tmp_path):
    path = tmp_path / "status.json"
    bodies = [json.dumps({"writer": i, "pad": "x" * 100_000}) for i in range(8)]
    threads = [threading.Thread(target=write_atomically, args=(path, body)) for body in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_text() in bodies and len(list(tmp_path.iterdir())) == 1


def test_a_jsonl_file_is_cut_back_to_what_is_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"global_step": s}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"global_step": 5, "cut sh')  # the last line torn by a kill
    assert rewrite_jsonl(path, lambda r: r["global_step"] <= 2) == 3
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"
    before = path.stat().st_mtime_ns
    assert rewrite_jsonl(path, lambda r: True) == 0 and path.stat().st_mtime_ns == before  # not rewritten
    assert rewrite_jsonl(tmp_path / "none.jsonl", lambda r: True) == 0
