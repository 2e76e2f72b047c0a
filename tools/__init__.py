"""The `dstore` command line: thin wrappers that parse, call library functions and print."""
