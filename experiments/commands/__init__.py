"""Subcommands of the stepcal CLI: each module registers its flags and a handler that calls a
library function and prints. They import only argparse at load time, so `stepcal --help` is instant."""
