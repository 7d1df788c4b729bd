"""One module per subcommand: HELP, EXAMPLES, add_arguments(parser), run(args) -> int."""
