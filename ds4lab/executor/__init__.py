"""What every backend is, below everything that runs on one: the contract (:mod:`.base`: ``Executor``, ``RuntimeApi``,
``ModeledTime``, ``DeviceClock``; :mod:`.device_graphs`: ``DeviceGraphApi``), which kernels carry the device-side
half of a programmatic launch (:mod:`.kernel_pdl`), and the CPU reference executor the sim builds on
(:mod:`.numpy_backend`). ``capture/``, ``token/``, ``sim/`` and ``backends/`` (the GPU's implementation and
:func:`ds4lab.backends.make_backend`, the one factory) all import it; it imports none of them."""
