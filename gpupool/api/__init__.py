"""The scheduler's HTTP API (tornado): ``make_app(core)`` and its OpenAPI document."""

from gpupool.api.app import ROUTES, make_app
from gpupool.api.openapi import build_document

__all__ = ["ROUTES", "build_document", "make_app"]
