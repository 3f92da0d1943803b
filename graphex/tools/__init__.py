"""The `graphex` command-line tools: one module per subcommand (see graphex/cli.py)."""
