"""NVTX ranges: one domain ``ds4lab``, one category per cluster, payloads for layer and position.

Ranges nest token → layer → cluster → op. The layer index (and, for the token range, the
position) travels as the range's integer payload, not in its message, so Nsight Systems groups
ranges by name and the numbers stay searchable. With annotation off, no NVTX call is made at
all: :class:`NullAnnotator` has empty methods, and the launch layer does not even call those
on its per-launch path.
"""

from __future__ import annotations

#: Clusters of one decode layer, in launch order (context file, "Anatomy of one decode layer").
CLUSTERS = ("token", "layer", "embed", "hc_attn", "query", "kv", "attention", "output",
            "hc_ffn", "router", "moe", "shared", "final", "profile")

_COLORS = {
    "token": 0x4C72B0, "layer": 0x8172B2, "embed": 0x937860, "hc_attn": 0xCCB974,
    "query": 0x64B5CD, "kv": 0x55A868, "attention": 0xC44E52, "output": 0xDD8452,
    "hc_ffn": 0xCCB974, "router": 0xDA8BC3, "moe": 0xD62728, "shared": 0x2CA02C,
    "final": 0x7F7F7F, "profile": 0x17BECF,
}


class NullAnnotator:
    """Annotation off: every method does nothing."""

    enabled = False

    def push(self, message: str, cluster: str, payload: int | None = None) -> None:
        pass

    def pop(self) -> None:
        pass


class NvtxAnnotator:
    """Pushes and pops NVTX ranges in the ``ds4lab`` domain.

    Event attributes are built once per (message, cluster, payload) and reused: building them
    is the expensive part of an NVTX call from Python.

    Raises:
        ImportError: when the ``nvtx`` package is missing (it is a declared dependency).
    """

    enabled = True
    DOMAIN = "ds4lab"

    def __init__(self) -> None:
        import nvtx  # a required dependency; imported here so a missing one names itself

        self._domain = nvtx.get_domain(self.DOMAIN)
        self._categories = {c: self._domain.get_category_id(c) for c in CLUSTERS}
        self._attrs: dict[tuple, object] = {}

    def push(self, message: str, cluster: str, payload: int | None = None) -> None:
        key = (message, cluster, payload)
        a = self._attrs.get(key)
        if a is None:
            a = self._domain.get_event_attributes(
                message=message, color=_COLORS.get(cluster, 0x999999),
                category=self._categories.get(cluster), payload=payload)
            self._attrs[key] = a
        self._domain.push_range(a)

    def pop(self) -> None:
        self._domain.pop_range()


def make_annotator(enabled: bool):
    """An :class:`NvtxAnnotator` when ``enabled``, else a :class:`NullAnnotator`."""
    return NvtxAnnotator() if enabled else NullAnnotator()
