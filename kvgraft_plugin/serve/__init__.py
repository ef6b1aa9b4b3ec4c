"""``kvgraft serve``: the OpenAI-compatible server (``pip install 'kvgraft-plugin[server]'``)."""

from __future__ import annotations

from .app import MODEL_ID, create_app, http_protocol, serve

__all__ = ["MODEL_ID", "create_app", "http_protocol", "serve"]
