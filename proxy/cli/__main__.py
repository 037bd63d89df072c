"""`python -m proxy.cli`: the same as the `ctxproxy` command."""

from proxy.cli import main

main()
