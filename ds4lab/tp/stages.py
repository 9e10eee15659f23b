"""The capture stages under tensor parallelism (:class:`TPStage`): a stage of :data:`ds4lab.experiments.stages.STAGES`
on every rank with the collectives inside the graph (``:in``) or between graphs (``:out``): ``0``, ``i:in`` /
``i:out`` (thread-local capture: rule nccl_global_multithread), ``3:in`` / ``3:out``, ``3c:in`` / ``3c:out``. Each
stage: ``docs/tensor-parallel.md``, "Stages under TP"."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import BadInput
from ..experiments.stages import STAGES, Stage

_ISLAND1_OUT = ("island0", "island1.out", "island1.ffn", "island1.post")


@dataclass(frozen=True)
class TPStage:
    """A stage on every rank (``stage``) and where the collectives sit (``placement``)."""

    name: str
    stage: Stage
    placement: str
    description: str
    long_context_only: bool = False

    @property
    def captures_collectives(self) -> bool:
        """Whether the stage's graphs hold collectives (``inside`` with something captured)."""
        return self.placement == "inside" and bool(self.stage.capture)


def _tp_stages() -> dict[str, TPStage]:
    i = replace(STAGES["i"], policy=STAGES["i"].policy.with_(mode="thread_local"))
    out = [TPStage("0", STAGES["0"], "inside", "eager on the legacy stream; every reduction eager")]
    out.append(TPStage("i:in", replace(i, name="i:in"), "inside",
                       "ds4's islands (thread-local capture); island 1 holds both reductions"))
    out.append(TPStage("i:out", replace(i, name="i:out", policy=i.policy.with_(clusters=_ISLAND1_OUT)), "outside",
                       "ds4's islands with island 1 in three graphs around the reductions, which stay eager"))
    for base in ("3", "3c"):
        st = STAGES[base]
        lc = st.long_context_only
        out.append(TPStage(f"{base}:in", replace(st, name=f"{base}:in"), "inside",
                           f"stage {base}: the whole token one graph, every collective inside", lc))
        out.append(TPStage(f"{base}:out", replace(st, name=f"{base}:out", policy=st.policy.with_(clusters=("tp_seg",))),
                           "outside",
                           f"stage {base}: the segments between reductions as graphs, the collectives between them",
                           lc))
    return {s.name: s for s in out}


#: Every tensor-parallel stage, in ladder order.
TP_STAGES: dict[str, TPStage] = _tp_stages()
#: What the tensor-parallel ladder runs by default (``3c:*`` with ``--long-context``).
TP_LADDER_DEFAULT = "0,i:in,i:out,3:in,3:out"


def parse_tp_stages(text: str, *, long_context: bool = False) -> list[TPStage]:
    """``"0,i:in,3:out"`` → stages. Raises BadInput for an unknown or repeated name, or a long-context stage without
    ``long_context``."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    bad = [n for n in names if n not in TP_STAGES]
    if bad or not names:
        raise BadInput(f"unknown tensor-parallel stage(s) {', '.join(bad) or '(none)'}; choose from: "
                       f"{', '.join(TP_STAGES)}")
    if len(set(names)) != len(names):
        raise BadInput(f"a stage listed twice in {text!r}")
    lc = [n for n in names if TP_STAGES[n].long_context_only and not long_context]
    if lc:
        raise BadInput(f"stage(s) {', '.join(lc)} exist on the long-context token only: add --long-context")
    return [TP_STAGES[n] for n in names]


__all__ = ["TPStage", "TP_LADDER_DEFAULT", "TP_STAGES", "parse_tp_stages"]
