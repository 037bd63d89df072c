"""The Chat Completions API: /v1/chat/completions bodies, replies and streams."""
