"""The ds4 configurations ``ds4lab ds4`` measures (:data:`VARIANTS`): ds4 as it ships with environment switches ds4
itself reads (``islands-off``, ``islands-on``, ``moe-profile``, ``moe-graph``), and the capture ladder's stages on
ds4 rewritten by ds4lab (``stage-0``, ``stage-i``, ``stage-3u``, ``stage-3``: :mod:`ds4lab.ds4.rewrite`), each held to
``islands-off`` bit for bit. What each switch does in ``ds4_cuda.cu`` at ``b0309611``: ``docs/ds4.md``."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput


@dataclass(frozen=True)
class Ds4Variant:
    """One configuration: its name, the environment it adds, what it is, and the routed-expert formats it applies to
    (``None``: all)."""

    name: str
    env: tuple
    what: str
    expert_bits: tuple | None = None
    #: which build runs it: ``shipped`` (ds4 as it ships), ``rewritten`` (ds4lab's stage 0 applied) or ``rewritten-3``
    #: (stage 0 with stage 3's argument slots and dry pass: :mod:`ds4lab.ds4.rewrite3`)
    build: str = "shipped"
    #: the driver's capture mode (:data:`ds4lab.ds4.engine.EAGER` 0, ``WHOLE_TOKEN_UPDATE`` 1, ``DRY_PASS`` 2)
    capture: int = 0
    #: its rung on the capture ladder (``0``, ``i``, ``3u``, ``3``), or ``""`` outside the ladder
    stage: str = ""

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
    Ds4Variant("stage-0", (("DS4_CUDA_DECODE_GRAPHS", "0"),),
              "ds4 rewritten (stage 0), accessor unset, islands off: eager", build="rewritten", stage="0"),
    Ds4Variant("stage-i", (("DS4_CUDA_DECODE_GRAPH_LOG", "1"),),
              "ds4 rewritten (stage 0), accessor unset, ds4's islands on", build="rewritten", stage="i"),
    Ds4Variant("stage-3u", (("DS4_CUDA_DECODE_GRAPHS", "0"),),
              "ds4 rewritten, islands off, every token captured whole and replayed, its graph updated "
              "per token shape", build="rewritten", capture=1, stage="3u"),
    Ds4Variant("stage-3", (("DS4_CUDA_DECODE_GRAPHS", "0"),),
              "ds4 rewritten with argument slots, islands off, every token a dry pass of its host code and one "
              "graph per token signature, its changing arguments read from device memory, never updated",
              build="rewritten-3", capture=2, stage="3"),
)}

#: The rewrite stage each build applies (:func:`ds4lab.ds4.rewrite.rewrite_source`); ``None``: ds4 as it ships.
BUILD_STAGES = {"shipped": None, "rewritten": "0", "rewritten-3": "3"}

#: The configuration every stage's logits are compared with: ds4 as it ships, eager.
REFERENCE = "islands-off"
#: Ladder stages ``--stages`` takes, and the configuration each runs.
STAGES = {v.stage: v.name for v in VARIANTS.values() if v.stage}
#: Stages of the plan not built for ds4 itself, and why (``--stages`` names them and refuses).
NOT_BUILT = {
    "3p": "stage 3p sets programmatic dependent launch on ds4's launches: not built (it needs stage 3 and "
          "a launch through cudaLaunchKernelEx at every site)",
}


#: What ``ds4lab ds4`` runs when ``--configs`` is not given.
DEFAULT_CONFIGS = ("islands-off", "islands-on", "moe-profile")


def parse_stages(text: str) -> tuple[str, ...]:
    """``"0,i,3u"`` → the configurations of those ladder stages, after :data:`REFERENCE` (ds4 as it ships). Raises
    BadInput: an unknown stage (named, with the known ones), a stage not built (named, with why), an empty list,
    an empty item or a stage named twice."""
    items = [n.strip() for n in str(text).split(",")]
    names = [n for n in items if n]
    if not names:
        raise BadInput(f"--stages {text!r}: name at least one of {', '.join(STAGES)}")
    if len(names) != len(items) or len(set(names)) != len(names):
        raise BadInput(f"--stages {text!r}: an empty or repeated stage; name each once, e.g. 0,i,3u,3")
    missing = [n for n in names if n in NOT_BUILT]
    if missing:
        raise BadInput("--stages: " + "; ".join(f"{n}: {NOT_BUILT[n]}" for n in missing))
    bad = [n for n in names if n not in STAGES]
    if bad:
        raise BadInput(f"--stages: unknown {', '.join(bad)}; choose from {', '.join(STAGES)}")
    return tuple(dict.fromkeys([REFERENCE] + [STAGES[n] for n in names]))


def parse_configs(text: str) -> tuple[str, ...]:
    """``"islands-off,islands-on"`` → the names, in order, each once. Raises BadInput: an unknown name (named, with the
    known ones) or an empty list."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise BadInput(f"--configs {text!r}: name at least one of {', '.join(VARIANTS)}")
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise BadInput(f"--configs: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    return tuple(dict.fromkeys(names))
