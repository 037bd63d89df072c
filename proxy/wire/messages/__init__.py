"""The Anthropic Messages API codec (POST /v1/messages)."""
