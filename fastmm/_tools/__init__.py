"""The command line's measuring tools: the bench sub-commands and autotuning. Never imported by a product."""
