"""The rewrite stage: the ordered transforms a request passes through on its way upstream (see pipeline.py)."""
