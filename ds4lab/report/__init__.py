"""What ds4lab writes and shows: result folders (``results``), provenance, figures (``plots``), side-by-side
comparisons (``compare``), the Chrome/Perfetto trace export, headless notebook runs."""
