"""ds4 itself as a backend of the workbench (``docs/ds4.md``): :mod:`.source`, :mod:`.build`, :mod:`.rewrite`,
:mod:`.rewrite3`, :mod:`.gguf_model`, :mod:`.gguf_writer`, :mod:`.open_check`, :mod:`.engine`, :mod:`.worker`,
:mod:`.configs`, :mod:`.measure`, :mod:`.readout`. ds4's code is never copied here: ds4lab takes the checkout's path
from its user."""
