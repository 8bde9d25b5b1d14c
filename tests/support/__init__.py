"""Helpers shared by test files (no test file imports another): run the CLI in a
subprocess (`support.cli`), compare greedy outputs up to near-ties (`support.greedy`),
drive the live view on a pseudo-terminal (`support.tty`)."""
