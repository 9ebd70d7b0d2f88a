"""The label vgpud puts on every claim it prepares: what lets a node watch only its own claims.

The API offers no field selector on a ResourceClaim's allocation (only metadata.name and
metadata.namespace), so a node that needs the changes of the claims it prepared (the NRI admission's
reservations, the registry) either watches every claim of the cluster, or marks its claims and
watches the mark. Prepare writes `<driver>/node=<node>` in the same metadata patch as its other
writes; the node's claim cache selects on it, so its cost is its own claims, whatever the cluster's
size. A label value is at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric; a
node name is a DNS subdomain of up to 253, so a name that is no valid label value is replaced by its
SHA-256 (both sides compute the value here).
"""

from __future__ import annotations

import hashlib
import re

#: the label's name under the driver's own prefix
NODE_LABEL_NAME = "node"
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_HASHED_PREFIX = "sha256-"


def node_label_key(driver: str) -> str:
    return f"{driver}/{NODE_LABEL_NAME}"


def node_label_value(node_name: str) -> str:
    """`node_name` itself when it is a valid label value, else 'sha256-' and 56 hex digits of it."""
    if node_name and _LABEL_VALUE.match(node_name):
        return node_name
    return _HASHED_PREFIX + hashlib.sha256(node_name.encode()).hexdigest()[:56]


def node_claim_labels(driver: str, node_name: str) -> dict[str, str]:
    """The labels of a claim prepared on `node_name`: what its claim cache selects."""
    return {node_label_key(driver): node_label_value(node_name)}
