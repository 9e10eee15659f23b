"""Tensor parallelism on ds4's decode token: two ranks, one thread per device (``docs/tensor-parallel.md``).

Modules: :mod:`.ranks`, :mod:`.shard`, :mod:`.ops`, :mod:`.reduce`, :mod:`.model`, :mod:`.group`, :mod:`.stages`,
:mod:`.ladder`, :mod:`.hazards`, :mod:`.trace`. Nothing is imported here, so ``ds4lab.tp.ranks`` stays light for the
conformance scenarios."""
