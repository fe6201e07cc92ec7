"""Network addresses, as the servers (the OpenAI-compatible endpoint, Studio) and their config checks see them."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
