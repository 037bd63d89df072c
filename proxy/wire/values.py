"""The two values every wire module speaks of: a parsed request body and one item of its conversation.

Their own module, below the codec and the read-back shapes alike, so neither imports the other for them.
"""

from __future__ import annotations

from typing import Any

Item = Any  # one element of the conversation, in its API's own shape; only a codec looks inside
Body = dict[str, Any]  # a parsed request body
