"""ds4 itself: what its loader asks of a model file, and a synthetic model file it accepts.

ds4 (the C/CUDA engine ds4lab studies) has no random-weights mode: it opens a DeepSeek V4 Flash
GGUF of exactly Flash's shape or refuses. :mod:`ds4lab.ds4.gguf_model` declares, as data read from
ds4's loader and validator (``ds4.c`` at ``b0309611``), every tensor and metadata key ds4 asks for;
:mod:`ds4lab.ds4.gguf_writer` writes such a file with synthetic weights, sparse (the routed experts
are holes), through the ``gguf`` package. ``csrc/open_check.c`` is ds4lab's own probe that opens a
file through ds4's public API (``ds4.h``) only.
"""
