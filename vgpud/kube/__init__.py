"""Trio facade over the Kubernetes API: see `api` for the interface."""

from vgpud.kube.api import (
    RESOURCE_API,
    Conflict,
    Gone,
    JsonObject,
    KubeApi,
    KubeError,
    Listing,
    NotFound,
    WatchEvent,
    WatchEventType,
)

__all__ = [
    "RESOURCE_API",
    "Conflict",
    "Gone",
    "JsonObject",
    "KubeApi",
    "KubeError",
    "Listing",
    "NotFound",
    "WatchEvent",
    "WatchEventType",
]
