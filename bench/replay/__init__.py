"""Trajectory replay harness: real agent conversations, turn by turn, through each setting.

Every trajectory of the corpus (``--traces-dir``, default ``$CTXPROXY_TRACES_DIR``) is
replayed as the agent that recorded it would have sent it: for each assistant
message at index ``i``, one non-streaming chat completion with ``messages[:i]``
(plus the trajectory's ``tools`` if it has them), model ``gpt-4o``,
sequentially. The provider's answer is ignored: the recorded assistant message
is what the next turn carries, so every setting sees exactly the same client
traffic.

The provider is the mock in ``tests/mock_upstream.py``, in this process (its
``requests`` list is read after every turn). It bills ``prompt_tokens`` and
``cached_tokens`` from a real token-prefix comparison with earlier prompts of
the same cache scope (``Authorization`` + model) and rejects prompts over its
window with HTTP 400 ``context_length_exceeded``. Each (setting, trajectory)
pair sends its own key, ``Bearer sk-replay-<setting>-<trace>``, so neither
provider caches nor proxy tenants mix, and the mock is reset between settings.

Settings live in a small registry (``settings.SETTINGS``; ``register_setting`` adds
one). Four kinds:

* straight to the mock (``no-proxy``);
* client-side context management, straight to the mock: ``sliding-window-20``
  (system message(s) + the last 20 messages, leading orphan tool results
  dropped) and ``middle-out`` (OpenRouter-style: over the window, whole
  assistant+tool units are removed from the middle until the prompt fits);
* ctxproxy (``proxy_config`` = its config file; ``{}`` = built-in defaults;
  ``window_model`` adds ``models: {gpt-4o: {context_window: <--window>}}``):
  ``ctxproxy-default``, ``ctxproxy-offload-1000``, ``ctxproxy``,
  ``ctxproxy-no-status-bar``, ``ctxproxy-status-replace`` (status bar in
  ``replace`` mode). By default the proxy runs as users run it,
  ``python -m proxy.cli serve`` in a subprocess with ``CTXPROXY_UPSTREAM``
  pointing at the mock and a fresh SQLite store in a temporary directory per
  setting (``--proxy-mode inprocess`` runs ``tests/proxy_server.py`` in a
  thread instead);
* open-source proxies (``bench/external_proxies.py``): ``cliffcompaction``,
  ``cliffcompaction-at-window`` and ``ctxkeeper``, each pip-installed (pinned)
  into its own virtualenv under ``bench/.venvs/`` by the benchmark itself and
  run as a subprocess; one that cannot be installed or started is reported
  with the exact error and skipped.

The proxies' own LLM calls (ctxproxy's summarizer, ctxkeeper's notes) reach
the same mock, which answers them with a deterministic digest of what they
send (``bench/fake_llm.py``: the first line of each message being compacted, ~500
tokens), and everything else with "ok".

Per setting: requests sent, rejected (any non-200; of which
``context_length_exceeded``), provider-side 400s (also those a proxy retried),
prompt and cached tokens billed by the provider (successful requests, the
proxy's own calls included), hit rate = cached / prompt (and for the agent's
requests alone), effective input cost units = uncached + 0.1 x cached, the
proxy's own calls (number, prompt tokens, cost), prompt tokens relative to
``no-proxy`` (all requests, and over only the turns that succeeded in both),
wall time, cache breaks (a served request that re-bills more than 1,024 tokens
of the previous served request's prompt), ctxproxy's compactions by layer
(``x-ctxproxy-compacted``) and each compacted-history message (summary,
notes, cliff summary) with its size, and identifier retention
(``bench/identifiers.py``): the share of file paths, URLs and hashes named in the
user and assistant messages of the trajectory that are still in the last
request the provider served for it (also over identifiers first named after
the head, and over the trajectories that pass 0.85 x the window; for ctxproxy,
why each lost one was lost). Checks, on every request the provider received:

* tool-call pairing (``tool_pairing_problems``): each assistant tool call id
  is answered by a tool message before the next assistant message, and every
  tool message answers a call of the assistant message before it;
* previews (ctxproxy, requests whose messages line up with the client's once
  status-bar messages are set aside): every message whose content was replaced
  by a placeholder (contains ``context_read(handle="``) costs fewer tokens (the
  mock's own tokenizer and rendering) than the trajectory's message at that
  position; the same original is always replaced by the same bytes; no other
  message is altered; no placeholder in a request that offers no read tool.

Usage (from the repo root)::

    python -m bench.replay [--window 128000] [--settings no-proxy,ctxproxy-default,ctxproxy-offload-1000]
                           [--traces 01,19] [--traces-dir DIR] [--json out.json] [--final-turn] [--per-trace]
                           [--proxy-src DIR] [--proxy-mode subprocess|inprocess]
    python -m bench.replay --window 32000 --settings compress [--per-trace] ...   # the compression comparison
    python -m bench.replay --window 32000 --api both [--native DIR] ...   # chat and the Responses API side by side
    python -m bench.replay --window 32000 --api all ...   # chat, Responses and Anthropic's Messages API

``--settings`` takes names or groups (``offload``: the default three;
``compress``: no-proxy, sliding-window-20, middle-out, ctxproxy,
ctxproxy-no-status-bar, cliffcompaction, ctxkeeper; ``status-bar``: ctxproxy,
ctxproxy-no-status-bar, ctxproxy-status-replace, whose table and the status
bar check, hit rate with the status bar within 2 points of without, are printed
when two of them run). ``--final-turn`` also
sends each whole trajectory that ends on a tool or user message (the turn an
agent that kept going would send next: in this corpus the two biggest tool
results are final messages no recorded turn carries). ``--proxy-src DIR`` runs
the ``proxy`` package from DIR (e.g. a ``git archive`` snapshot) instead of
the installed working tree.

``--api responses`` (or ``both``, side by side with chat; default ``chat``)
sends every turn to ``/v1/responses`` instead: the chat trajectories converted
to Responses items (``responses_items``), and the native Codex sessions of
``--native DIR`` (``native``: the input up to each tool output or user turn,
as Codex sent it, ``store: false``, ``prompt_cache_key`` = the session id). Every
check reads the requests as chat messages (``apis``), so the figures are the
same ones for both APIs. The open-source proxies are replayed in chat only, and
the client-side settings not on the native sessions (they cut chat messages).

Modules: ``settings`` (the registry, groups and ``ctxproxy+section.key=value``
names), ``client_side`` (sliding window, middle-out), ``traces`` (loading the
corpus, request bodies), ``checks`` (tool-call pairing, previews), ``targets``
(running ctxproxy, its log), ``turns`` (one trajectory, turn by turn),
``compaction`` (compacted-history messages, lost identifiers), ``run`` (one
setting over every trajectory), ``criteria`` (the offload and compression
checks), ``tables`` (the markdown tables), ``responses_items`` (chat turns as Responses items and back),
``native`` (the native Responses sessions), ``apis`` (what differs between chat and Responses: body, path,
view, prompt chunks, usage), ``messages_items`` (chat turns as Messages requests and back) and ``cli``
(arguments, main).

``--api messages`` (or ``all``: chat, Responses and Messages side by side)
sends every turn to ``/v1/messages``: the chat trajectories converted as
Claude Code would send them (``messages_items``: alternating roles,
``tool_use`` / ``tool_result`` blocks, ``max_tokens``, and Claude Code's cache
breakpoints on the system prompt and the last message, so the no-proxy row's
cache reads are what the client's own breakpoints get), and the native Claude
Code sessions of ``--native DIR`` (``native.NativeMessagesTrace``: the input up
to each user message). The mock bills them as Anthropic does (cache reads and
writes at breakpoints only); the side-by-side table adds the cache writes
Anthropic bills apart.
"""
