"""Context read: the proxy-owned read-back tool, and the hidden rounds that answer it."""
