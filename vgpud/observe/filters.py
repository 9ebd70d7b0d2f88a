"""The hook-call filter of `/debug/calls`, `/debug/stream` and `vgpud debug tail`: one definition, so the
ring buffer, the live stream and the CLI agree on what `--pod x` means.

Every field is optional; a call matches when every given field matches:

- `hook`: the call name (`CreateContainer`, `Prepare`, `RegisterContainerDevice`...), any case
- `component`: `nri`, `dra`, `registry`, `hotplug`, any case
- `pod`: the pod UID, the pod name, or `namespace/name`
- `claim`: the claim UID
- `outcome`: `ok`, `error`, `skipped`, `rejected`, `cancelled`
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from urllib.parse import parse_qs, urlencode

from vgpud.recorder import HookCall, Outcome


@dataclass(frozen=True)
class CallFilter:
    hook: str = ""
    component: str = ""
    pod: str = ""
    claim: str = ""
    outcome: str = ""

    def __post_init__(self) -> None:
        if self.outcome and self.outcome.lower() not in {o.value for o in Outcome}:
            known = ", ".join(o.value for o in Outcome)
            raise ValueError(f"outcome {self.outcome!r} is not one of {known}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_query(cls, query: str | bytes, *, extra: frozenset[str] = frozenset()) -> CallFilter:
        """The filter in a URL query string; ValueError names an unknown or repeated parameter.
        Parameters in `extra` are allowed and ignored here (the route reads them)."""
        text = query.decode("latin-1") if isinstance(query, bytes) else query
        params = parse_qs(text, keep_blank_values=True, strict_parsing=False)
        values: dict[str, str] = {}
        for name, given in params.items():
            if name in extra:
                continue
            if name not in cls.names():
                raise ValueError(f"unknown parameter {name!r}; filters: {', '.join(cls.names())}")
            if len(given) > 1:
                raise ValueError(f"parameter {name!r} given {len(given)} times")
            values[name] = given[0]
        return cls(**values)

    def to_query(self) -> str:
        """The query string `from_query` reads back ("" for no filter)."""
        return urlencode({name: value for name, value in asdict(self).items() if value})

    def __call__(self, call: HookCall) -> bool:
        return (
            (not self.hook or call.call.lower() == self.hook.lower())
            and (not self.component or call.component.lower() == self.component.lower())
            and (not self.claim or call.claim_uid == self.claim)
            and (not self.outcome or call.outcome.value == self.outcome.lower())
            and (not self.pod or self.pod in _pod_names(call))
        )

    def __bool__(self) -> bool:
        return any(asdict(self).values())


def _pod_names(call: HookCall) -> tuple[str, ...]:
    names = tuple(n for n in (call.pod_uid, call.pod_name) if n)
    if call.pod_namespace and call.pod_name:
        names += (f"{call.pod_namespace}/{call.pod_name}",)
    return names
