"""The ds4 configurations ``ds4lab ds4`` measures: each is ds4 as it ships plus environment switches
ds4 itself reads (``ds4_cuda.cu`` at ``b0309611``), nothing of ds4lab's.

=================  =================================================================================
``islands-off``    ``DS4_CUDA_DECODE_GRAPHS=0``: every decode kernel eager on the legacy stream
``islands-on``     ds4's default: two decode islands per layer captured at their second sight and
                   replayed after (``DS4_CUDA_DECODE_GRAPH_LOG=1`` logs each capture; it prints only
                   when a graph is captured or fails, never per replay)
``moe-profile``    islands on with ``DS4_CUDA_MOE_PROFILE=1``: ds4's seven events around its routed
                   MoE, synchronized on every call, one profile line per call on stderr
``moe-graph``      islands on with ``DS4_CUDA_MOE_DECODE_GRAPH=1``: the hand-built routed-MoE decode
                   graph of ``36ee8c14``, which ds4 takes for Q4_K experts only
=================  =================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput


@dataclass(frozen=True)
class Ds4Variant:
    """One configuration: its name, the environment it adds, what it is, and the routed-expert
    formats it applies to (``None``: all)."""

    name: str
    env: tuple
    what: str
    expert_bits: tuple | None = None

    @property
    def environ(self) -> dict:
        """The added environment as a dict."""
        return dict(self.env)


VARIANTS = {c.name: c for c in (
    Ds4Variant("islands-off", (("DS4_CUDA_DECODE_GRAPHS", "0"),), "decode islands off: every kernel eager"),
    Ds4Variant("islands-on", (("DS4_CUDA_DECODE_GRAPH_LOG", "1"),), "ds4's default: decode islands on"),
    Ds4Variant("moe-profile", (("DS4_CUDA_MOE_PROFILE", "1"), ("DS4_CUDA_DECODE_GRAPH_LOG", "1")),
              "islands on, with ds4's routed-MoE profile"),
    Ds4Variant("moe-graph", (("DS4_CUDA_MOE_DECODE_GRAPH", "1"), ("DS4_CUDA_DECODE_GRAPH_LOG", "1")),
              "islands on, with the hand-built routed-MoE decode graph (Q4_K experts)", expert_bits=(4,)),
)}

#: What ``ds4lab ds4`` runs when ``--configs`` is not given.
DEFAULT_CONFIGS = ("islands-off", "islands-on", "moe-profile")


def parse_configs(text: str) -> tuple[str, ...]:
    """``"islands-off,islands-on"`` → the names, in order, each once.

    Raises:
        BadInput: an unknown name (named, with the known ones) or an empty list.
    """
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise BadInput(f"--configs {text!r}: name at least one of {', '.join(VARIANTS)}")
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise BadInput(f"--configs: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    return tuple(dict.fromkeys(names))
