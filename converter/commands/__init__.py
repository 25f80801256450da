"""One module per CLI subcommand: `register(subparsers)` adds it, `main(args)` runs it."""
