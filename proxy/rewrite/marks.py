"""The text marks the proxy writes into a prompt, so any transform (and accounting) can recognise its own."""

PLACEHOLDER_MARK = "[ctxproxy:"  # opens every placeholder; such text is never cleared or offloaded again
STATUS_OPEN = "<agent_status>"  # opens the status bar's message
SUMMARY_OPEN = "<context_summary>"  # opens a compaction summary
SYNTHETIC_RESULT = "[ctxproxy: no result was recorded for this tool call]"  # a call's missing result, filled in
