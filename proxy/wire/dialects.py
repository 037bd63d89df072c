"""The providers' dialects: what differs between whose API a request speaks, beyond the shape of its body.

A codec (proxy/wire/codec.py) is the client's shape; its `dialect` is the
provider side: the name a route's `upstream.api` gives it in config.yaml, the
provider hosts known to speak it (a route's API inferred from its base URL),
the header the proxy puts an operator's key in, and a header only its clients
send (which API's error shape a request without a body of its own gets). A new
provider's API is one more `Dialect` in `DIALECTS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    name: str  # as config.yaml's upstream.api names it, and the telemetry's gen_ai.provider.name
    title: str  # for people, in errors
    domains: tuple[str, ...]  # the provider's own hosts (and their subdomains) speak it
    key_header: str  # where the proxy puts an operator's key (api_key_env)
    key_scheme: str  # before the key in that header ("Bearer " or nothing)
    marker_header: str | None = None  # a header only this API's clients send
    key_query: str | None = None  # a query parameter its clients may send their key in instead (Google's `key`)

    def key(self, key: str) -> tuple[str, str]:
        """The header carrying an injected key."""
        return self.key_header, self.key_scheme + key


OPENAI = Dialect("openai", "the OpenAI API", ("openai.com",), "authorization", "Bearer ")
ANTHROPIC = Dialect("anthropic", "the Anthropic Messages API", ("anthropic.com",), "x-api-key", "",
                    marker_header="anthropic-version")

GOOGLE = Dialect("google", "Google's Gemini API", ("googleapis.com",), "x-goog-api-key", "",
                marker_header="x-goog-api-client", key_query="key")

DIALECTS: dict[str, Dialect] = {d.name: d for d in (OPENAI, ANTHROPIC, GOOGLE)}


def dialect_of_host(host: str) -> Dialect | None:
    """The dialect a provider's own host speaks; None for any other host (a gateway may speak several)."""
    host = host.lower().rstrip(".")
    for d in DIALECTS.values():
        if any(host == dom or host.endswith("." + dom) for dom in d.domains):
            return d
    return None
