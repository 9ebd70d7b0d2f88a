"""Observability: the hook-call recorder (metrics, debug HTTP and the websocket stream read it)."""

from vgpud.observe.recorder import CloseReason, HookCall, Outcome, Recorder, Subscription

__all__ = ["CloseReason", "HookCall", "Outcome", "Recorder", "Subscription"]
