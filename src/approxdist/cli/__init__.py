"""The `approxdist` command line: one module per subcommand."""
