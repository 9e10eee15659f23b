"""Tensor parallelism on ds4's decode token: two ranks, one thread per device (docs/tensor-parallel.md).

* :mod:`.ranks`: a node of devices (sim or GPU) and ranks as threads;
* :mod:`.shard`: which heads, output groups, shared-expert rows and routed experts each rank holds;
* :mod:`.ops`: the launch sites tensor parallelism adds (expand after the reduction, expert ids made local, the peer
  path's sum) and the reductions themselves (NCCL all-reduce or ds4's peer copies);
* :mod:`.model`: one rank's decode token (:class:`~ds4lab.tp.model.TPRankModel`, a
  :class:`~ds4lab.token.model.DecodeModel`);
* :mod:`.group`: the ranks together, the single-GPU token beside them, the reduction bound;
* :mod:`.ladder`: the capture stages per rank, the collective inside the graph or between graphs;
* :mod:`.hazards`: the tensor-parallel hazards.

Nothing is imported here, so ``ds4lab.tp.ranks`` stays light for the conformance scenarios."""
