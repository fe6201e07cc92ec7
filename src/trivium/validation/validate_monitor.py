"""Checks of ``monitor.backends``: each a known tracker whose library is installed (found, not imported:
validation runs no library code)."""

from __future__ import annotations

import importlib.util

from trivium.config.errors import Problem


def check_monitor(cfg, at) -> list[Problem]:
    from trivium.monitor.trackers import TRACKERS

    out = []
    seen = set()
    for i, name in enumerate(cfg.monitor.backends):
        path = at(f"monitor.backends[{i}]")
        if name in seen:
            out.append(Problem(path, name, "listed twice", "list each backend once"))
            continue
        seen.add(name)
        if name == "jsonl":
            continue
        problem = TRACKERS.problem(name)
        if problem:
            fix = problem.fix.replace("valid: ", "valid: jsonl, ", 1)
            out.append(Problem(path, name, problem.rule, fix))
            continue
        tracker = TRACKERS.get(name)
        if tracker.requires and importlib.util.find_spec(tracker.requires) is None:
            extra = (
                f"pip install 'trivium[{tracker.extra}]'"
                if tracker.extra
                else f"pip install {tracker.requires}"
            )
            out.append(
                Problem(
                    path,
                    name,
                    f"the {name} backend needs the {tracker.requires} package, which is not installed",
                    f"{extra} (or remove {name!r} from monitor.backends)",
                )
            )
    return out
