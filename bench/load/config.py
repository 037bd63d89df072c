"""What the load benchmark sends, its targets, and how long each phase runs (full and ``--quick``)."""

from __future__ import annotations

MODEL = "gpt-4o"
AUTH = {"authorization": "Bearer sk-bench-load", "content-type": "application/json"}
SMALL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say ok."},
]
# The mock's answer to any request without tools: 17 words, so a stream is 20 data
# chunks (role, 17 words, finish, usage) plus [DONE].
ANSWER = "Sure, here is a short answer, long enough to arrive in about twenty separate chunks over HTTP."
ANSWER_WORDS = len(ANSWER.split())
STREAM_DATA_CHUNKS = ANSWER_WORDS + 3

TARGET_RPS = 500
TARGET_STREAMS = 200
TARGET_RSS_MB = 300
FLAT_MB = 5.0  # last third's mean RSS at most this far above the first third's

FULL = dict(duration=15.0, warmup=1.0, stream_rounds=3, long_duration=60.0, long_warmup=5.0,
            profile_seconds=10.0)
QUICK = dict(duration=5.0, warmup=1.0, stream_rounds=1, long_duration=15.0, long_warmup=3.0,
             profile_seconds=5.0)
MAX_REQUESTS_PER_RUN = 200_000  # a closed loop never sends more than this, whatever the duration
REQUEST_TIMEOUT = 30.0
