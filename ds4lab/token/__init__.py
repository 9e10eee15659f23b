"""The decode token: model dimensions (``config``), weights and their formats (``weights``), the NumPy reference of
every op (``reference``), one launch site per op (``ops``) and the token's launch sequence with its buffers and
options (``model``)."""
