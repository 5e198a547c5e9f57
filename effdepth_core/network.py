"""Whether the Hugging Face hub can be reached: asked before a hub id or a hub data set is fetched."""

from __future__ import annotations


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (a hub id then fails in seconds, not
    after a minute of retries, on an offline machine)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False
