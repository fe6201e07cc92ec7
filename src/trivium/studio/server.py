"""``trivium studio``: start the Studio app with uvicorn, on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import sys
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["studio_main"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def studio_main(root: str, configs: list[str], host: str, port: int, token: str | None) -> int:
    """Serve Studio until Ctrl-C. A host other than loopback needs an access token (``--token``, or
    ``--token auto`` for a random one): Studio launches processes and writes files."""
    import uvicorn

    from trivium.studio.app import create_app

    if token is not None and not token.strip():
        print(
            "trivium studio: --token is empty or only whitespace: give a real token, or 'auto'",
            file=sys.stderr,
        )
        return 2
    if token == "auto":
        token = secrets.token_urlsafe(24)
    if not _loopback(host) and token is None:
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
    app = create_app(root, configs, token)
    url = f"http://{host}:{port}/" + (f"?token={token}" if token else "")
    print(f"Trivium Studio on {url} (runs under {Path(root).resolve()}; Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
