"""ds4 itself as a backend of the workbench: its source located (:mod:`.source`), built into one
library with ds4lab's driver (:mod:`.build`), a synthetic Flash-shaped model ds4 opens
(:mod:`.gguf_model`), its decode token run per configuration in worker processes (:mod:`.engine`,
:mod:`.worker`, :mod:`.configs`, :mod:`.measure`) and read into ds4lab's tables (:mod:`.results`).
ds4's code is never copied here: ds4lab takes the checkout's path from its user."""
