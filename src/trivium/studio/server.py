"""``trivium studio``: start the Studio app with uvicorn, on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import logging
import secrets
import sys
from pathlib import Path

from trivium.net import is_loopback

log = logging.getLogger(__name__)

__all__ = ["studio_main"]


def studio_main(
    root: str,
    configs: list[str],
    host: str,
    port: int,
    token: str | None,
    allowed_hosts: list[str] | None = None,
) -> int:
    """Serve Studio until Ctrl-C. A host other than loopback needs an access token (``--token``, or
    ``--token auto`` for a random one): Studio launches processes and writes files. On loopback without
    one, a random token still guards every change and config validation (which imports plugins): the
    printed URL carries it (a cookie keeps it), and read-only pages open without it. Requests addressed to
    a name other than the loopback ones, the bound host and ``allowed_hosts`` are refused (DNS rebinding)."""
    import uvicorn

    from trivium.studio.app import create_app

    if token is not None and not token.strip():
        print(
            "trivium studio: --token is empty or only whitespace: give a real token, or 'auto'",
            file=sys.stderr,
        )
        return 2
    token_for_reads = token is not None  # a token the user chose guards every request
    if token == "auto" or token is None:
        token = secrets.token_urlsafe(24)
    if not is_loopback(host) and not token_for_reads:
        print(
            f"trivium studio: --host {host} opens Studio to the network, and Studio launches runs and writes "
            "files: give --token TOKEN (or --token auto), or bind 127.0.0.1 and use an SSH tunnel",
            file=sys.stderr,
        )
        return 2
    missing = [d for d in configs if not Path(d).is_dir()]
    if missing:
        print(f"trivium studio: --configs {missing[0]} is not a folder", file=sys.stderr)
        return 2
    names = [*(allowed_hosts or []), *([host] if host not in ("0.0.0.0", "::") else [])]
    app = create_app(root, configs, token, token_for_reads=token_for_reads, allowed_hosts=tuple(names))
    url = f"http://{host}:{port}/?token={token}"
    print(f"Trivium Studio on {url} (runs under {Path(root).resolve()}; Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
