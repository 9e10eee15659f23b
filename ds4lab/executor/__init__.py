"""What every backend is: the contract (:mod:`.base`, :mod:`.device_graphs`), the kernels with a programmatic device
half (:mod:`.kernel_pdl`), the CPU reference executor (:mod:`.numpy_backend`). Everything that runs on a backend
imports it; it imports none of them."""
