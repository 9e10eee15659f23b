"""ds4 itself as a backend of the workbench.

* :mod:`.source` locates a checkout (folder or archive) and its commit; :mod:`.build` builds it, from ds4's own
  Makefile objects and ds4lab's driver (``csrc/ds4lab_ds4.c``), into one library;
* :mod:`.gguf_model` declares, as data read from ds4's loader, every tensor and metadata key of a Flash-shaped GGUF;
  :mod:`.gguf_writer` writes it as a sparse file with synthetic weights; :mod:`.open_check` holds it to ds4's own
  loader on the CPU;
* :mod:`.engine`, :mod:`.worker`, :mod:`.configs` and :mod:`.measure` run its decode token per configuration, one
  process each; :mod:`.results` reads what ds4 did into ds4lab's tables.

ds4's code is never copied here: ds4lab takes the checkout's path from its user."""
