"""One-off diagnostic tools: each answers one question about committed runs or kernels, importing the kit's
library; nothing in the library imports them (tests/test_layout.py)."""
