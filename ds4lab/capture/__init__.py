"""Stream capture: the thread-local stream accessor (``stream``), the launch layer every launch goes through
(``launch``, with NVTX ranges from ``annotate``), the one place a capture begins and always ends (``scope``), and
the graph cache with its guard and eager fallback (``cache``)."""
