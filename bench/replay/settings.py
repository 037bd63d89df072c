"""The replay's settings: each a way of sending the trajectories to the provider.

A small registry (``SETTINGS``; ``register_setting`` adds one), the named
groups ``--settings`` accepts (``offload``, ``compress``, ``status-bar``,
``frontier``), and ``derived_setting`` for names of the form
``ctxproxy+section.key=value+...``, so a trade-off is reproduced by naming
settings on the command line rather than by editing this file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from bench.replay.client_side import middle_out, sliding_window

MODEL = "gpt-4o"
BASELINE = "no-proxy"
DEFAULT_OFFLOAD_TOOL_TOKENS = 20_000  # proxy/rewrite/offload.py defaults, for the "missed" check
DEFAULT_OFFLOAD_USER_TOKENS = 50_000


@dataclass(frozen=True)
class Setting:
    """One way of sending the trajectories to the provider.

    ``proxy_config`` None: not through ctxproxy. A mapping: ctxproxy's config
    file (YAML) for this setting; ``{}`` is the proxy's built-in defaults, and
    ``window_model`` adds ``models: {gpt-4o: {context_window: <--window>}}``.
    ``transform`` (client-side context management, straight to the mock):
    ``(messages, tools, window) -> messages`` applied to each request's messages.
    ``external``: the name of an open-source proxy in ``external_proxies.EXTERNALS``,
    installed into its own virtualenv and run in front of the mock.
    """

    name: str
    description: str
    proxy_config: dict[str, Any] | None = None
    transform: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, int], list[dict[str, Any]]] | None = None
    external: str | None = None
    window_model: bool = False

    @property
    def proxied(self) -> bool:
        """Through ctxproxy."""
        return self.proxy_config is not None

    @property
    def kind(self) -> str:
        """direct, client (client-side transform), external (another proxy) or ctxproxy."""
        return ("ctxproxy" if self.proxied else "external" if self.external else
                "client" if self.transform else "direct")

    def config_for(self, window: int) -> dict[str, Any]:
        """ctxproxy's config file for this setting at this window."""
        config = dict(self.proxy_config or {})
        if self.window_model:
            models = dict(config.get("models") or {})
            models[MODEL] = {**(models.get(MODEL) or {}), "context_window": window}
            config["models"] = models
        return config

    def offload_thresholds(self) -> tuple[int, int] | None:
        """(tool_result_tokens, user_message_tokens) when offload is on, for the checks."""
        if self.proxy_config is None:
            return None
        off = (self.proxy_config.get("defaults") or {}).get("offload") or {}
        if off.get("enabled", True) is False:
            return None
        return (int(off.get("tool_result_tokens", DEFAULT_OFFLOAD_TOOL_TOKENS)),
                int(off.get("user_message_tokens", DEFAULT_OFFLOAD_USER_TOKENS)))


SETTINGS: dict[str, Setting] = {}


def register_setting(setting: Setting) -> Setting:
    """Add a setting to the registry."""
    if setting.name in SETTINGS:
        raise ValueError(f"setting {setting.name!r} already registered")
    SETTINGS[setting.name] = setting
    return setting


register_setting(Setting(BASELINE, "straight to the mock provider"))
register_setting(Setting("ctxproxy-default", "ctxproxy, built-in defaults (offload on, tool results > 20k tokens)",
                         {}))
register_setting(Setting("ctxproxy-offload-1000", "ctxproxy, offload.tool_result_tokens: 1000",
                         {"defaults": {"offload": {"tool_result_tokens": 1000}}}))
register_setting(Setting("sliding-window-20", "client-side: system message(s) + last 20 messages (leading orphan "
                                              "tool results dropped), straight to the mock",
                         transform=sliding_window(20)))
register_setting(Setting("middle-out", "client-side, OpenRouter-style: over the window, middle messages removed "
                                       "(whole assistant+tool units) until it fits, straight to the mock",
                         transform=middle_out))
register_setting(Setting("ctxproxy", "ctxproxy, built-in defaults + models: {gpt-4o: {context_window: <window>}}",
                         {}, window_model=True))
register_setting(Setting("ctxproxy-no-status-bar", "as ctxproxy, with defaults.status_bar.enabled: false (proxy "
                                                   "commits with a status bar, 23f7ccd and later)",
                         {"defaults": {"status_bar": {"enabled": False}}}, window_model=True))
register_setting(Setting("ctxproxy-status-replace", "as ctxproxy, with defaults.status_bar.mode: replace (only the "
                                                    "latest status message is sent)",
                         {"defaults": {"status_bar": {"mode": "replace"}}}, window_model=True))
register_setting(Setting("ctxproxy-previous-defaults", "as ctxproxy, with the defaults before issue 27: a full "
                                                       "status every turn, compress.trigger 0.85, precompute 0.78, "
                                                       "summaries up to 2,000 tokens (window / 16 at 32k)",
                         {"defaults": {"status_bar": {"full_every": 1},
                                       "compress": {"trigger": 0.85, "precompute": 0.78,
                                                    "summary_max_tokens": 2000}}}, window_model=True))
register_setting(Setting("cliffcompaction", "cliffcompaction==0.1.0 (cliff serve --threshold 0.85 x window)",
                         external="cliffcompaction"))
register_setting(Setting("cliffcompaction-at-window", "cliffcompaction==0.1.0 (cliff serve --threshold <window>)",
                         external="cliffcompaction-at-window"))
register_setting(Setting("ctxkeeper", "ctxkeeper==1.2.0 (--recipe agent --budget <window>)", external="ctxkeeper"))


DEFAULT_SETTINGS = [BASELINE, "ctxproxy-default", "ctxproxy-offload-1000"]


COMPRESS_SETTINGS = [BASELINE, "sliding-window-20", "middle-out", "ctxproxy", "ctxproxy-no-status-bar",
                     "ctxproxy-previous-defaults", "cliffcompaction", "ctxkeeper"]


STATUS_BAR_SETTINGS = ["ctxproxy", "ctxproxy-no-status-bar", "ctxproxy-status-replace"]


FRONTIER_SETTINGS = [f"ctxproxy+compress.trigger={t}" + extra for extra in ("", "+status_bar.enabled=false")
                     for t in (0.5, 0.6, 0.7)]


SETTING_GROUPS = {"offload": DEFAULT_SETTINGS, "compress": COMPRESS_SETTINGS, "status-bar": STATUS_BAR_SETTINGS,
                  "frontier": FRONTIER_SETTINGS}


def derived_setting(name: str) -> Setting | None:
    """`ctxproxy+section.key=value+...`: ctxproxy with those defaults overridden (values read as YAML).

    So a trade-off (e.g. the compaction trigger against hit rate and cost) is reproduced by naming the
    settings on the command line, with nothing edited.
    """
    base, _, rest = name.partition("+")
    if base != "ctxproxy" or not rest:
        return None
    defaults: dict[str, Any] = {}
    for item in rest.split("+"):
        key, eq, value = item.partition("=")
        section, dot, field_ = key.partition(".")
        if not (eq and dot and section and field_):
            raise ValueError(f"setting {name!r}: expected section.key=value, got {item!r}")
        defaults.setdefault(section, {})[field_] = yaml.safe_load(value)
    return register_setting(Setting(name, f"as ctxproxy, with defaults {json.dumps(defaults)}",
                                    {"defaults": defaults}, window_model=True))
